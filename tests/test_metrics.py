"""Prometheus metrics: real requests through the real proxy, read back from the scrape text
(tests/test_metric_names.py has every GenAI name and llmtap's extensions)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.record.recorder import on_rows
from proxy.observe.metrics import DURATION_BUCKETS, TOKEN_BUCKETS, PrometheusMetrics
from proxy.relay.app_state import AppState
from proxy.common.schema import REQUEST_COLUMN_NAMES
from .serving import RunningProxy
from proxy.simulator.app import Simulator

from .cli_traffic import claude_tools
from .conftest import proxy_config, rows
from .waiting import wait_until

PROMPT = "x" * 400  # 100 input tokens by the simulator's count
CHAT = {"model": "gpt-x", "messages": [{"role": "user", "content": PROMPT}]}
MESSAGES = {"model": "claude-x", "max_tokens": 100, "messages": [{"role": "user", "content": PROMPT}]}

# (method, path, body, headers): a streamed chat with cache reads, a plain Messages call,
# a 429, and a request that is not a generation (no model).
MIX: list[tuple[str, str, dict[str, Any] | None, dict[str, str]]] = [
    ("POST", "/v1/chat/completions", {**CHAT, "stream": True, "stream_options": {"include_usage": True}},
     {"x-sim-ttft-ms": "30", "x-sim-itl-ms": "5", "x-sim-tokens": "6", "x-sim-cache-read-tokens": "40",
      "user-agent": "OpenAI/Python 1.99.0"}),
    ("POST", "/v1/messages", {**MESSAGES, "tools": claude_tools()}, {"x-sim-tokens": "5", "user-agent": "claude-cli/2.1.0 (external, cli)"}),
    ("POST", "/v1/chat/completions", CHAT, {"x-sim-status": "429", "user-agent": "OpenAI/Python 1.99.0"}),
    ("GET", "/v1/models", None, {"user-agent": "curl/8.5.0"}),
]


async def send_mix(proxy: RunningProxy, mix: list[tuple[str, str, dict[str, Any] | None, dict[str, str]]] = MIX,
                   timeout: float = 10.0) -> None:
    """Send each request, read each answer to the end, and wait until the proxy has recorded them all."""
    before = proxy.state.requests_seen
    async with aiohttp.ClientSession() as session:
        for method, path, body, headers in mix:
            async with session.request(method, proxy.url + path, json=body, headers=headers) as response:
                await response.read()
    deadline = asyncio.get_running_loop().time() + timeout
    while proxy.state.requests_seen < before + len(mix):
        assert asyncio.get_running_loop().time() < deadline, "the proxy did not record every request"
        await asyncio.sleep(0.01)


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the scrape, keyed by (sample name, labels)."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(found: dict, name: str, **labels: str) -> float:
    return found[(name, frozenset(labels.items()))]


def lbl(route: str, model: str, tool: str, status_class: str, **more: str) -> dict[str, str]:
    return {"route": route, "model": model, "tool": tool, "status_class": status_class, **more}


async def test_scrape_after_real_requests(proxy: RunningProxy) -> None:
    metrics = PrometheusMetrics(store_stats=proxy.store.stats, loop_lag=proxy.state.loop_lag.summary)
    proxy.state.recorder.observe(on_rows(metrics.observe))
    await send_mix(proxy)
    assert proxy.flush(10)
    # the lag gauge appears once the loop has been measured
    await wait_until(lambda: proxy.state.loop_lag.samples, what="a loop lag sample")
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain; version=0.0.4")
    found = samples(body.decode())

    chat = lbl("/", "gpt-x", "openai-python", "2xx")
    claude = lbl("/", "claude-x", "claude-code", "2xx")
    limited = lbl("/", "gpt-x", "openai-python", "4xx")
    models = lbl("/", "none", "curl", "2xx")
    assert value(found, "llmtap_requests_total", **chat, outcome="ok") == 1
    assert value(found, "llmtap_requests_total", **claude, outcome="ok") == 1
    assert value(found, "llmtap_requests_total", **limited, outcome="http_error") == 1
    assert value(found, "llmtap_requests_total", **models, outcome="ok") == 1

    # every generation has a duration; only the stream has a TTFT (30 ms simulated); the models list is
    # no GenAI operation (kind model_list): counted above, in no histogram
    for labels in (chat, claude, limited):
        assert value(found, "gen_ai_client_inference_duration_seconds_count", **labels) == 1
    assert ("gen_ai_client_inference_duration_seconds_count", frozenset(models.items())) not in found
    assert value(found, "gen_ai_client_inference_time_to_first_chunk_seconds_count", **chat) == 1
    assert ("gen_ai_client_inference_time_to_first_chunk_seconds_count", frozenset(claude.items())) not in found
    assert value(found, "gen_ai_client_inference_time_to_first_chunk_seconds_bucket", **chat, le="0.02") == 0
    assert value(found, "gen_ai_client_inference_time_to_first_chunk_seconds_bucket", **chat, le="81.92") == 1
    (stream,) = rows(proxy, "SELECT ttft_ms, tpot_ms, e2e_ms FROM requests WHERE stream")
    ttft = value(found, "gen_ai_client_inference_time_to_first_chunk_seconds_sum", **chat)
    assert ttft == pytest.approx(stream["ttft_ms"] / 1000) and ttft >= 0.03
    tpot = value(found, "gen_ai_client_inference_time_per_output_chunk_seconds_sum", **chat)
    assert tpot == pytest.approx(stream["tpot_ms"] / 1000) and 0 < tpot < 0.05
    e2e = value(found, "gen_ai_client_inference_duration_seconds_sum", **chat)
    assert e2e == pytest.approx(stream["e2e_ms"] / 1000)

    # the store's counters and the loop lag, read at scrape time
    assert value(found, "llmtap_store_requests_written_total") == 4
    assert value(found, "llmtap_store_requests_dropped_total") == 0
    assert ("llmtap_event_loop_lag_seconds", frozenset({("quantile", "0.99")})) in found
    assert value(found, "llmtap_metrics_observe_errors_total") == 0


def test_buckets_follow_the_genai_advice() -> None:
    assert DURATION_BUCKETS[0] == 0.01 and DURATION_BUCKETS[-1] == 81.92 and len(DURATION_BUCKETS) == 14
    assert TOKEN_BUCKETS[0] == 1 and TOKEN_BUCKETS[-1] == 67108864 and len(TOKEN_BUCKETS) == 14
    text = PrometheusMetrics().render()[0].decode()
    assert "gen_ai_client_inference_duration_seconds histogram" in text


def row(**values: Any) -> dict[str, Any]:
    base = dict.fromkeys(REQUEST_COLUMN_NAMES)
    base.update(route="/", status=200, outcome="ok", e2e_ms=100.0)
    base.update(values)
    return base


def test_label_cardinality_is_bounded() -> None:
    metrics = PrometheusMetrics(max_label_values=2)
    for n in range(5):
        metrics.observe(row(request_model=f"model-{n}", tool="curl"))
    metrics.observe(row(request_model="model-0", tool="curl"))
    found = samples(metrics.render()[0].decode())
    count = "gen_ai_client_inference_duration_seconds_count"
    assert value(found, count, **lbl("/", "model-0", "curl", "2xx")) == 2
    assert value(found, count, **lbl("/", "model-1", "curl", "2xx")) == 1
    assert value(found, count, **lbl("/", "other", "curl", "2xx")) == 3
    models = {dict(k[1]).get("model") for k in found if k[0] == count}
    assert models == {"model-0", "model-1", "other"}


@pytest.mark.parametrize(("status", "expected"), [(None, "none"), (101, "1xx"), (204, "2xx"), (503, "5xx")])
def test_status_class(status: int | None, expected: str) -> None:
    metrics = PrometheusMetrics()
    metrics.observe(row(status=status, outcome="upstream_unreachable" if status is None else "ok"))
    found = samples(metrics.render()[0].decode())
    assert [dict(k[1])["status_class"] for k in found if k[0] == "llmtap_requests_total"] == [expected]


def test_observe_never_raises() -> None:
    metrics = PrometheusMetrics()
    metrics.observe(row(e2e_ms="not a number"))
    metrics.observe({})  # no keys at all: counted with "none" labels, no duration
    found = samples(metrics.render()[0].decode())
    assert value(found, "llmtap_metrics_observe_errors_total") == 1
    assert value(found, "llmtap_requests_total", **lbl("none", "none", "none", "none", outcome="none")) == 1


WIRED = "metrics" in AppState.__dataclass_fields__


@pytest.mark.skipif(not WIRED, reason="GET /_llmtap/metrics is not wired into AppState/admin.py yet")
async def test_admin_endpoint_serves_the_scrape(sim: Simulator, tmp_path: Path) -> None:
    """What Prometheus does: GET /_llmtap/metrics with the admin token as a Bearer credential."""
    async with RunningProxy(proxy_config(sim.url, tmp_path, admin_token="s3cret")) as proxy:
        await send_mix(proxy)
        url = proxy.url + "/_llmtap/metrics"
        async with aiohttp.ClientSession() as session:
            async with session.get(url, headers={"Authorization": "Bearer s3cret"}) as response:
                assert response.status == 200
                assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                found = samples(await response.text())
            async with session.get(url, headers={"X-Llmtap-Admin-Token": "s3cret"}) as response:
                assert response.status == 200
            for wrong in ({"Authorization": "Bearer nope"}, {}):
                async with session.get(url, headers=wrong) as response:
                    assert response.status == 403, wrong
    assert sum(v for (name, _), v in found.items() if name == "llmtap_requests_total") == 4
    assert value(found, "llmtap_store_requests_dropped_total") == 0


def test_histogram_buckets_are_cumulative_and_inclusive() -> None:
    """A value equal to a bound counts in that bound's bucket (Prometheus `le`), each bucket
    counts everything below it, +Inf counts all, and the sum is exact."""
    metrics = PrometheusMetrics()
    for e2e_ms in (10.0, 10.0001, 640.0, 100_000.0):  # 0.01 s is the first bound, 0.64 s another
        metrics.observe(row(e2e_ms=e2e_ms))
    found = samples(metrics.render()[0].decode())
    labels = lbl("/", "none", "none", "2xx")
    bucket = "gen_ai_client_inference_duration_seconds_bucket"
    assert [value(found, bucket, **labels, le=le) for le in ("0.01", "0.02", "0.64", "81.92", "+Inf")] == [1, 2, 3, 3, 4]
    assert value(found, "gen_ai_client_inference_duration_seconds_count", **labels) == 4
    assert value(found, "gen_ai_client_inference_duration_seconds_sum", **labels) == pytest.approx(100.6600001)
