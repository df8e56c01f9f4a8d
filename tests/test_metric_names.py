"""The GenAI metrics under the conventions' current names (open-telemetry/semantic-conventions-genai main:
gen_ai.client.inference.*, the usage counters by gen_ai.token.modality), and llmtap's extensions: the
cost counter and the limit gauges."""

from __future__ import annotations

import pytest

from proxy.observe.metrics import PrometheusMetrics
from proxy.record.recorder import on_rows
from .serving import RunningProxy

from .conftest import rows
from .test_deploy import PRICED_AND_LIMITED
from .test_metrics import MIX, lbl, samples, send_mix, value

otel = pytest.importorskip("opentelemetry.sdk.metrics")
from .test_otel import in_memory  # noqa: E402


async def scrape(proxy: RunningProxy) -> dict:
    metrics = PrometheusMetrics(store_stats=proxy.store.stats)
    proxy.state.recorder.observe(on_rows(metrics.observe))
    await send_mix(proxy, [*MIX, *PRICED_AND_LIMITED])
    assert proxy.flush(10)
    return samples(metrics.render()[0].decode())


async def test_current_names_after_real_requests(proxy: RunningProxy) -> None:
    found = await scrape(proxy)
    chat = lbl("/", "gpt-x", "openai-python", "2xx")
    claude = lbl("/", "claude-x", "claude-code", "2xx")
    limited = lbl("/", "gpt-x", "openai-python", "4xx")
    for labels in (chat, claude, limited):
        assert value(found, "gen_ai_client_inference_duration_seconds_count", **labels) == 1
    assert value(found, "gen_ai_client_inference_time_to_first_chunk_seconds_count", **chat) == 1
    assert value(found, "gen_ai_client_inference_time_per_output_chunk_seconds_count", **chat) == 1
    unknown = {"gen_ai_token_modality": "unknown"}
    assert value(found, "gen_ai_client_inference_usage_output_tokens_total", **chat, **unknown) == 6
    assert value(found, "gen_ai_client_inference_usage_cache_read_input_tokens_total", **chat, **unknown) == 40
    assert value(found, "gen_ai_client_inference_usage_input_tokens_total", **chat, **unknown) >= 100
    assert value(found, "gen_ai_client_inference_usage_cache_write_input_tokens_total", **claude, **unknown) == 0
    assert value(found, "gen_ai_client_inference_operation_output_tokens_sum", **claude) == 5
    assert value(found, "gen_ai_client_inference_operation_input_tokens_count", **claude) == 1
    names = {name for name, _ in found}
    assert not {n for n in names if n.startswith(("gen_ai_client_operation_", "gen_ai_client_token_usage"))}

    # the cost: the list price of the priced rows (the views' cost_usd), by billing
    (api, subscription) = (lbl("/", "claude-haiku-4-5", "aiohttp", "2xx", billing=b) for b in ("api", "subscription"))
    priced = rows(proxy, "SELECT credential_kind FROM requests WHERE request_model = 'claude-haiku-4-5'")
    assert {r["credential_kind"] for r in priced} == {"api_key", "claude_login"}
    cost_api = value(found, "llmtap_client_inference_cost_usd_total", **api)
    assert cost_api > 0 and value(found, "llmtap_client_inference_cost_usd_total", **subscription) == cost_api

    # the limits each key was told
    gauges = {(n, dict(labels).get("window")): v for (n, labels), v in found.items() if n.startswith("llmtap_ratelimit_")}
    assert gauges[("llmtap_ratelimit_limit_requests", None)] == 30_000
    assert gauges[("llmtap_ratelimit_remaining_requests", None)] == 29_999
    assert 0 < gauges[("llmtap_ratelimit_window_utilization", "5h")] < 1
    keys = {dict(labels)["key_fingerprint"] for (n, labels) in found if n.startswith("llmtap_ratelimit_")}
    assert len(keys) == 2 and all(k.startswith("k:") for k in keys)


async def test_otlp_current_names(proxy: RunningProxy) -> None:
    exporter, spans, reader = in_memory()
    proxy.state.recorder.observe(on_rows(exporter.observe))
    await send_mix(proxy, [*MIX, *PRICED_AND_LIMITED])
    data = reader.get_metrics_data()
    found = {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert {"gen_ai.client.inference.duration", "gen_ai.client.inference.time_to_first_chunk",
            "gen_ai.client.inference.time_per_output_chunk", "gen_ai.client.inference.usage.input_tokens",
            "gen_ai.client.inference.usage.cache_write.input_tokens", "gen_ai.client.inference.operation.output_tokens",
            "llmtap.client.inference.cost_usd"} <= set(found)
    assert not [n for n in found if n.startswith(("gen_ai.client.operation.", "gen_ai.client.token."))]
    points = found["gen_ai.client.inference.usage.output_tokens"].data.data_points
    assert {p.attributes["gen_ai.token.modality"] for p in points} == {"unknown"}
    cost = found["llmtap.client.inference.cost_usd"].data.data_points
    assert {p.attributes["llmtap.billing"] for p in cost} == {"api", "subscription"}
    attrs = [dict(s.attributes) for s in spans.get_finished_spans()]
    assert any("gen_ai.usage.cache_write.input_tokens" in a for a in attrs)
    assert not any("gen_ai.usage.cache_creation.input_tokens" in a for a in attrs)
    assert any(a.get("llmtap.cost_usd", 0) > 0 for a in attrs)
