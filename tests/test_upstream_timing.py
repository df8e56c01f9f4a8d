"""What the upstream says it spent (proxy/meter/upstream_timing.py), over real sockets: a test upstream
per source waits a known time before its headers and states a known processing time; the row, the
breakdown, the web UI's waterfall data and compare show the stated part and the path's rest, the
parts still add up, and hostile values keep the row and move no figure. The simulator states its
own (SimConfig.state_processing), over HTTP and in the Responses WebSocket's timing frame."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import orjson
import pytest
from aiohttp import web

from analysis.bench.channels import bench_channels
from analysis.bench.runner import Budget
from analysis.breakdown import build_breakdown, to_json as breakdown_json, to_table as breakdown_table
from analysis.compare import Side, compare, headline, to_table as compare_table
from analysis.web import api
from proxy.simulator.app import Simulator
from proxy.simulator.config import SimConfig

from .conftest import proxy_config, rows
from .serving import RunningProxy
from .test_breakdown import assert_adds_up

CHAT = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
FAST = {"ttft_ms": 5, "itl_ms": 1, "tokens": 4, "prefill_us_per_token": 0}
SQL = "SELECT * FROM requests ORDER BY started_at"
NOTE = "upstream timing not kept"


def _chunk(delta: dict, finish: str | None = None) -> bytes:
    event = {"id": "c1", "object": "chat.completion.chunk", "model": "m",
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + orjson.dumps(event) + b"\n\n"


async def _stating(request: web.Request) -> web.StreamResponse:
    """A Chat Completions stream whose headers wait `x-test-wait-ms` and carry `x-test-state` (a JSON
    list of [header, value]): the time a server states, and the wait the client sees."""
    await request.read()
    await asyncio.sleep(float(request.headers.get("x-test-wait-ms", "0")) / 1000)
    headers = {"content-type": "text/event-stream"}
    stated = web.StreamResponse(headers=headers)
    for name, value in json.loads(request.headers.get("x-test-state", "[]")):
        stated.headers.add(name, value)
    await stated.prepare(request)
    for data in (_chunk({"role": "assistant", "content": ""}), _chunk({"content": "hello"}),
                 _chunk({}, "stop"), b"data: [DONE]\n\n"):
        await stated.write(data)
    await stated.write_eof()
    return stated


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def stating_proxy(tmp_path: Path, **routes: str) -> AsyncIterator[RunningProxy]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _stating)
    async with serving(app) as url:
        config = proxy_config(url, tmp_path, routes={f"/{r}": url for r in routes})
        async with RunningProxy(config) as p:
            yield p


async def send(session: aiohttp.ClientSession, url: str, wait_ms: float, state: list[list[str]]) -> None:
    headers = {"Authorization": "Bearer sk-test", "x-test-wait-ms": str(wait_ms), "x-test-state": json.dumps(state)}
    async with session.post(url + "/v1/chat/completions", json=CHAT, headers=headers) as r:
        assert r.status == 200, await r.text()
        await r.read()


def waterfall(p: RunningProxy, request_id: str) -> list[dict]:
    """The request page's waterfall, as the web UI gets it (its API's JSON)."""
    assert p.store is not None
    status, body = api.request(p.store.query, {}, request_id)
    assert status == 200
    return json.loads(body)["waterfall"]


def breakdown(p: RunningProxy) -> dict:
    assert p.store is not None
    return json.loads(breakdown_json(build_breakdown(p.store.query, "route", "route")))["groups"][0]


def assert_split(row: dict, stated_ms: float, column: str = "upstream_wait_ms") -> None:
    """The stated part and the path add up to the part they split, and the waterfall draws them."""
    assert_adds_up(row)
    assert row[column] >= stated_ms


SOURCES = {
    "openai-processing-ms": ([["openai-processing-ms", "80"]], "openai-processing-ms"),
    "server-timing": ([["Server-Timing", 'cache;desc="hit", db;dur=3'], ["Server-Timing", "app-total;dur=80.0"]],
                      "server-timing app-total"),
    "x-envoy-upstream-service-time": ([["x-envoy-upstream-service-time", "80"]], "x-envoy-upstream-service-time"),
}


@pytest.mark.parametrize("source", list(SOURCES))
async def test_each_source_states_its_part_of_the_wait(tmp_path: Path, source: str) -> None:
    """An upstream that holds its headers 120 ms and states 80: the row keeps 80, the wait is split
    into 80 stated and the rest (>= 40) on the path, in the row, the breakdown and the waterfall."""
    state, recorded_source = SOURCES[source]
    async with stating_proxy(tmp_path) as p, aiohttp.ClientSession() as s:
        for _ in range(3):
            await send(s, p.url, 120, state)
        recorded = rows(p, SQL)
        groups = breakdown(p)
        drawn = waterfall(p, recorded[0]["id"])
    for row in recorded:
        assert (row["upstream_processing_ms"], row["upstream_processing_source"]) == (80.0, recorded_source)
        assert row["parse_error"] is None and row["upstream_wait_ms"] >= 120
        assert_adds_up(row)
    assert groups["stated_requests"] == 3
    means = groups["mean_ms"]
    assert means["upstream_stated_ms"] == 80 and means["upstream_wait_ms"] == 0 and means["path_ms"] >= 40
    assert sum(means[name] for name in means if name != "ttft") == pytest.approx(means["ttft"], abs=0.01)
    parts = {w["part"]: w for w in drawn}
    stated, path = parts["upstream's stated time"], parts["path"]
    assert stated["ms"] == 80 and stated["column"] == "upstream_processing_ms" and "upstream wait" not in parts
    assert stated["ms"] + path["ms"] == pytest.approx(recorded[0]["upstream_wait_ms"], abs=0.002)
    assert path["start_ms"] == pytest.approx(stated["start_ms"] + stated["ms"], abs=0.002)


async def test_compare_places_the_difference_on_the_path(tmp_path: Path) -> None:
    """Two channels to one server that states 15 ms on each: the far one's headers come 100 ms later.
    compare puts the whole difference outside the upstream's stated processing."""
    state = [["openai-processing-ms", "15"]]
    async with stating_proxy(tmp_path, near="", far="") as p, aiohttp.ClientSession() as s:
        for _ in range(12):
            await send(s, p.url + "/near", 20, state)
            await send(s, p.url + "/far", 120, state)
        rows(p, SQL)
        assert p.store is not None
        c = compare(p.store.query, [Side("/near", "route = '/near'"), Side("/far", "route = '/far'")], "TRUE", "route")
    parts = c.ttft_parts[0]
    ttft = next(d for d in c.differences if d.metric == "ttft")
    assert ttft.call == "slower" and 95 <= ttft.median_diff_ms <= 130
    assert parts["upstream_stated"] == 0 and parts["path"] == pytest.approx(ttft.median_diff_ms, abs=5)
    assert parts["outside_stated"] == pytest.approx(ttft.median_diff_ms, abs=5)
    said = headline(c, "/far")
    assert said is not None and said.endswith("ms of it is outside the upstream's stated processing")
    assert "where the upstream stated its time (ms): stated +0" in compare_table(c)


async def test_the_order_decides_and_a_value_kept_aside_passes_to_the_next(tmp_path: Path) -> None:
    state = [["x-envoy-upstream-service-time", "40"], ["server-timing", "db;dur=2, upstream;dur=30"],
             ["openai-processing-ms", "-5"]]
    async with stating_proxy(tmp_path) as p, aiohttp.ClientSession() as s:
        await send(s, p.url, 60, state)
        (row,) = rows(p, SQL)
    assert (row["upstream_processing_ms"], row["upstream_processing_source"]) == (30.0, "server-timing upstream")
    assert row["parse_error"] == f"{NOTE}: openai-processing-ms '-5' is negative"


HOSTILE = {
    "negative": ("-5", "is negative"),
    "huge": ("1e308", "is more than the"),
    "text": ("fast", "is not a number"),
    "not finite": ("nan", "is not finite"),
    "longer than the wait": ("5000", "is more than the"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
async def test_hostile_values_keep_the_row_and_move_no_figure(tmp_path: Path, case: str) -> None:
    value, why = HOSTILE[case]
    async with stating_proxy(tmp_path) as p, aiohttp.ClientSession() as s:
        await send(s, p.url, 50, [["openai-processing-ms", value]])
        (row,) = rows(p, SQL)
        groups = breakdown(p)
        drawn = waterfall(p, row["id"])
    assert row["outcome"] == "ok" and row["output_events"] >= 1
    assert row["upstream_processing_ms"] is None and row["upstream_processing_source"] is None
    assert row["parse_error"].startswith(f"{NOTE}: openai-processing-ms {value!r} {why}")
    assert_adds_up(row)
    assert row["upstream_wait_ms"] >= 50
    assert groups["stated_requests"] == 0 and groups["mean_ms"]["upstream_stated_ms"] == 0
    assert groups["mean_ms"]["upstream_wait_ms"] == round(row["upstream_wait_ms"], 3)
    assert [w["part"] for w in drawn if w["column"] == "upstream_wait_ms"] == ["upstream wait"]


async def test_no_statement_changes_nothing(tmp_path: Path) -> None:
    async with stating_proxy(tmp_path) as p, aiohttp.ClientSession() as s:
        await send(s, p.url, 10, [])
        (row,) = rows(p, SQL)
        assert p.store is not None
        table = breakdown_table(build_breakdown(p.store.query, "route", "route"))
    assert row["upstream_processing_ms"] is None and row["parse_error"] is None
    assert "stated" not in table and "path" not in table


async def ws_turn(url: str, headers: dict[str, str] | None = None) -> list[dict]:
    async with aiohttp.ClientSession() as s:
        async with s.ws_connect(url + "/v1/responses", headers={"Authorization": "Bearer sk-test", **(headers or {})}) as ws:
            await ws.send_json({"type": "response.create", "model": "m", "input": "hi"})
            frames = [await ws.receive_json(timeout=10)]
            while frames[-1]["type"] != "response.completed":
                frames.append(await ws.receive_json(timeout=10))
    return frames


async def test_a_codex_websocket_turn_through_the_simulator(tmp_path: Path) -> None:
    """The simulator's timing frame (Codex's shape) before response.completed: the engine's TTFT
    splits the turn's wait to its first token; the 60 ms the channel holds each response is the path."""
    async with Simulator(SimConfig(**FAST, state_processing=True, headers_delay_ms=60)) as sim:
        async with RunningProxy(proxy_config(sim.url, tmp_path)) as p:
            frames = await ws_turn(p.url)
            (row,) = rows(p, SQL)
            groups = breakdown(p)
            drawn = waterfall(p, row["id"])
    timing = next(f for f in frames if f["type"] == "responsesapi.websocket_timing")
    assert frames[-2] is timing and set(timing["timing_metrics"]) >= {
        "responses_duration_excl_engine_and_client_tool_time_ms", "engine_service_total_ms",
        "engine_iapi_ttft_total_ms", "engine_service_ttft_total_ms", "engine_iapi_tbt_across_engine_calls_ms",
        "engine_service_tbt_across_engine_calls_ms"}
    metrics = timing["timing_metrics"]
    assert row["status"] == 101 and row["upstream_processing_source"] == "websocket_timing" and row["parse_error"] is None
    assert row["upstream_processing_ms"] == metrics["engine_service_total_ms"] and row["upstream_overhead_ms"] == 0
    # the row holds what the frame stated (the simulator times its 5 ms on its own clock, a ms or two either way)
    assert row["upstream_engine_ttft_ms"] == metrics["engine_service_ttft_total_ms"] > 0
    assert_adds_up(row)
    path = row["headers_to_first_token_ms"] - row["upstream_engine_ttft_ms"]
    assert path >= 60
    assert groups["mean_ms"]["path_ms"] == pytest.approx(path, abs=0.002)
    assert groups["mean_ms"]["headers_to_first_token_ms"] == 0
    parts = {w["part"]: w for w in drawn}
    assert parts["upstream's stated time"]["column"] == "upstream_engine_ttft_ms"
    assert parts["path"]["ms"] == pytest.approx(path, abs=0.002)


async def _hostile_ws(request: web.Request) -> web.WebSocketResponse:
    ws = web.WebSocketResponse()
    await ws.prepare(request)
    async for msg in ws:
        if msg.type != aiohttp.WSMsgType.TEXT:
            continue
        timing = {"engine_service_ttft_total_ms": -3, "engine_service_total_ms": 99_999,
                  "responses_duration_excl_engine_and_client_tool_time_ms": "12", "engine_iapi_ttft_total_ms": 1}
        for frame in ({"type": "response.created", "response": {"id": "r", "status": "in_progress"}},
                      {"type": "response.output_text.delta", "item_id": "m", "output_index": 0, "content_index": 0,
                       "delta": "hi"},
                      {"type": "responsesapi.websocket_timing", "timing_metrics": timing},
                      {"type": "response.completed", "response": {"id": "r", "status": "completed", "output": []}}):
            await ws.send_str(json.dumps(frame))
    return ws


async def test_a_hostile_timing_frame_keeps_the_turn_and_moves_no_figure(tmp_path: Path) -> None:
    app = web.Application()
    app.router.add_get("/v1/responses", _hostile_ws)
    async with serving(app) as url, RunningProxy(proxy_config(url, tmp_path)) as p:
        await ws_turn(p.url)
        (row,) = rows(p, SQL)
        drawn = waterfall(p, row["id"])
    assert row["status"] == 101 and row["outcome"] == "ok"
    assert [row[c] for c in ("upstream_processing_ms", "upstream_engine_ttft_ms", "upstream_overhead_ms")] == [None] * 3
    note = row["parse_error"]
    assert note.startswith(NOTE) and "responses_duration_excl_engine_and_client_tool_time_ms '12' is not a number" in note
    assert "engine_service_total_ms '99999' is more than the" in note and "engine_service_ttft_total_ms '-3' is negative" in note
    assert_adds_up(row)
    assert "path" not in {w["part"] for w in drawn}


@pytest.mark.parametrize(("path", "body", "source"), [
    ("/v1/chat/completions", CHAT, "openai-processing-ms"),
    ("/v1/messages", {"model": "m", "stream": True, "max_tokens": 50, "messages": CHAT["messages"]},
     "server-timing total"),
])
async def test_the_simulator_states_its_time_and_the_channel_is_the_path(tmp_path: Path, path: str, body: dict,
                                                                          source: str) -> None:
    async with Simulator(SimConfig(**FAST, headers_delay_ms=60)) as sim:
        async with RunningProxy(proxy_config(sim.url, tmp_path)) as p, aiohttp.ClientSession() as s:
            for state in ("1", "0"):
                async with s.post(p.url + path, json=body, headers={"x-sim-state-processing": state}) as r:
                    assert r.status == 200, await r.text()
                    await r.read()
            stated, silent = rows(p, SQL)
    assert stated["upstream_processing_source"] == source and stated["parse_error"] is None
    assert stated["upstream_wait_ms"] - stated["upstream_processing_ms"] >= 60  # the channel's hold: path
    assert silent["upstream_processing_ms"] is None


async def test_bench_routes_shows_where_the_delay_is(tmp_path: Path) -> None:
    """`bench` over two simulated channels to the same server, one 150 ms further away: its verdict
    puts the difference outside the upstream's stated processing."""
    config = {**FAST, "tokens": 100_000, "state_processing": True}
    async with Simulator(SimConfig(**config)) as near, Simulator(SimConfig(**config, headers_delay_ms=150)) as far:
        run = await bench_channels("openai", "sim-gpt", None, ("/direct", "/router"), (near.url + "/v1", far.url + "/v1"),
                                   tmp_path / "bench.duckdb", Budget(), rounds=12, input_tokens=200, max_tokens=8)
    parts = run.comparison.ttft_parts[0]
    ttft = next(d for d in run.comparison.differences if d.metric == "ttft")
    # medians of different quantities: a busy machine moves each by some ms, never by the 150 ms placed
    assert ttft.call == "slower" and parts["outside_stated"] == pytest.approx(ttft.median_diff_ms, abs=30)
    assert abs(parts["upstream_stated"]) < 30 and parts["path"] >= 120
    said = headline(run.comparison, "/router")
    assert said is not None and "ms of it is outside the upstream's stated processing" in said


async def test_the_stated_time_is_a_histogram_in_prometheus_and_otel(tmp_path: Path) -> None:
    otel = pytest.importorskip("opentelemetry.sdk.metrics")
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider

    from proxy.observe.metrics import PrometheusMetrics
    from proxy.observe.otel import OtelExporter
    from proxy.record.recorder import on_rows
    from .test_metrics import samples

    reader = InMemoryMetricReader()
    exporter = OtelExporter(TracerProvider(), otel.MeterProvider(metric_readers=[reader]))
    async with stating_proxy(tmp_path) as p, aiohttp.ClientSession() as s:
        prometheus = PrometheusMetrics()
        p.state.recorder.observe(on_rows(prometheus.observe))
        p.state.recorder.observe(on_rows(exporter.observe))
        for state in ([["openai-processing-ms", "80"]], [["openai-processing-ms", "40"]], []):
            await send(s, p.url, 90, state)
        assert p.flush(10)
    name = "llmtap_client_inference_upstream_processing_duration_seconds"
    found = samples(prometheus.render()[0].decode())
    assert sum(v for (n, _), v in found.items() if n == f"{name}_count") == 2
    assert sum(v for (n, _), v in found.items() if n == f"{name}_sum") == pytest.approx(0.12)
    metrics = {m.name: m for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics
               for m in sm.metrics}
    (point,) = metrics["llmtap.client.inference.upstream_processing.duration"].data.data_points
    assert (point.count, point.sum) == (2, pytest.approx(0.12))
