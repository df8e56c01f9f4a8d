"""OpenTelemetry export: spans and GenAI metrics from real requests through the real proxy."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import timezone
from types import SimpleNamespace

import pytest
from aiohttp import web

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest  # noqa: E402
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import SpanKind, StatusCode  # noqa: E402

from proxy.record.recorder import on_rows
from proxy.settings.config import ServeConfig  # noqa: E402
from proxy.observe.metrics import DURATION_BUCKETS, TOKEN_BUCKETS  # noqa: E402
from proxy.observe.otel import OtelExporter, OtelSettings  # noqa: E402
from .serving import RunningProxy  # noqa: E402

from .conftest import rows  # noqa: E402
from .test_metrics import send_mix  # noqa: E402


def in_memory() -> tuple[OtelExporter, InMemorySpanExporter, InMemoryMetricReader]:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    return OtelExporter(tracer_provider, MeterProvider(metric_readers=[reader])), spans, reader


@pytest.fixture
def memory() -> tuple[OtelExporter, InMemorySpanExporter, InMemoryMetricReader]:
    return in_memory()


async def test_spans_from_real_requests(proxy: RunningProxy, memory) -> None:
    exporter, spans, _ = memory
    proxy.state.recorder.observe(on_rows(exporter.observe))
    await send_mix(proxy)
    recorded = {r["id"]: r for r in rows(proxy)}
    by_name = {s.name: s for s in spans.get_finished_spans()}
    assert set(by_name) == {"chat gpt-x", "chat claude-x", "GET"}
    assert exporter.errors == 0

    chat = [s for s in spans.get_finished_spans() if s.name == "chat gpt-x"]
    stream = next(s for s in chat if s.attributes["gen_ai.request.stream"])
    limited = next(s for s in chat if not s.attributes["gen_ai.request.stream"])
    a = stream.attributes
    assert stream.kind == SpanKind.CLIENT
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "openai"
    assert a["openai.api.type"] == "chat_completions" and a["server.address"] == "127.0.0.1"
    assert a["gen_ai.request.model"] == "gpt-x" and a["gen_ai.response.model"]
    assert a["gen_ai.usage.output_tokens"] == 6 and a["gen_ai.usage.cache_read.input_tokens"] == 40
    assert a["gen_ai.usage.input_tokens"] >= 100 and a["gen_ai.response.finish_reasons"] == ("stop",)
    assert "error.type" not in a and stream.status.status_code != StatusCode.ERROR
    row = recorded[a["llmtap.request.id"]]
    assert a["gen_ai.response.time_to_first_chunk"] == pytest.approx(row["ttft_ms"] / 1000)
    started = row["started_at"].astimezone(timezone.utc)
    assert abs(stream.start_time / 1000 - started.timestamp() * 1_000_000) <= 1
    assert (stream.end_time - stream.start_time) / 1e6 == pytest.approx(row["e2e_ms"], abs=0.001)

    assert limited.attributes["error.type"] and limited.attributes["http.response.status_code"] == 429
    assert limited.status.status_code == StatusCode.ERROR

    claude = by_name["chat claude-x"].attributes
    assert claude["gen_ai.provider.name"] == "anthropic" and "openai.api.type" not in claude
    assert claude["gen_ai.request.stream"] is False and "gen_ai.response.time_to_first_chunk" not in claude
    assert "gen_ai.operation.name" not in by_name["GET"].attributes


async def test_the_operation_is_the_requests_kind(proxy: RunningProxy, memory) -> None:
    """A token count is no GenAI operation (plain span, no metrics); an embedding is `embeddings`;
    Codex's WebSocket turn is a streamed `chat` with its time to first chunk, its prewarm is not."""
    import aiohttp

    from .cli_traffic import CLAUDE_HEADERS, MESSAGES, codex_websocket_turn

    exporter, spans, reader = memory
    proxy.state.recorder.observe(on_rows(exporter.observe))
    async with aiohttp.ClientSession() as s:
        async with s.post(proxy.url + "/v1/messages/count_tokens", headers=CLAUDE_HEADERS,
                          json={"model": "claude-x", "messages": MESSAGES}) as r:
            assert r.status == 200
        async with s.post(proxy.url + "/v1/embeddings", json={"model": "emb-x", "input": "hi"}) as r:
            await r.read()  # the simulator has no embeddings: a 404 all the same
        await codex_websocket_turn(s, proxy.url, model="gpt-ws")
    recorded = rows(proxy)
    assert sorted(r["kind"] for r in recorded) == ["embedding", "generation", "prewarm", "token_count"]
    names = sorted(span.name for span in spans.get_finished_spans())
    assert names == ["GET", "POST", "chat gpt-ws", "embeddings emb-x"]
    turn = next(sp for sp in spans.get_finished_spans() if sp.name == "chat gpt-ws").attributes
    assert turn["gen_ai.request.stream"] is True and turn["gen_ai.response.time_to_first_chunk"] > 0
    found = histograms(reader)
    assert [p.attributes["gen_ai.request.model"] for p in found["gen_ai.client.inference.duration"]] == ["gpt-ws"]
    assert [p.attributes["gen_ai.request.model"] for p in found["gen_ai.client.embeddings.duration"]] == ["emb-x"]
    assert [p.attributes["gen_ai.request.model"] for p in found["gen_ai.client.inference.time_to_first_chunk"]] == [
        "gpt-ws"]


def histograms(reader: InMemoryMetricReader) -> dict[str, list]:
    data = reader.get_metrics_data()
    return {m.name: list(m.data.data_points)
            for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}


async def test_metrics_from_real_requests(proxy: RunningProxy, memory) -> None:
    exporter, _, reader = memory
    proxy.state.recorder.observe(on_rows(exporter.observe))
    await send_mix(proxy)
    found = histograms(reader)
    usage = {f"gen_ai.client.inference.usage.{part}" for part in (
        "input_tokens", "output_tokens", "cache_read.input_tokens", "cache_write.input_tokens", "reasoning.output_tokens")}
    assert set(found) == {"gen_ai.client.inference.duration", "gen_ai.client.inference.time_to_first_chunk",
                          "gen_ai.client.inference.time_per_output_chunk", "gen_ai.client.inference.operation.input_tokens",
                          "gen_ai.client.inference.operation.output_tokens", *usage}
    duration = found["gen_ai.client.inference.duration"]
    assert sum(p.count for p in duration) == 3  # the generations, not GET /v1/models
    assert tuple(duration[0].explicit_bounds) == DURATION_BUCKETS
    errors = [p for p in duration if "error.type" in p.attributes]
    assert len(errors) == 1 and errors[0].attributes["gen_ai.request.model"] == "gpt-x"
    ttft = found["gen_ai.client.inference.time_to_first_chunk"]
    assert [p.count for p in ttft] == [1] and 0.03 <= ttft[0].sum < 0.5
    def by_model(name: str) -> dict:
        return {p.attributes["gen_ai.request.model"]: p for p in found[name] if "error.type" not in p.attributes}
    assert by_model("gen_ai.client.inference.usage.cache_read.input_tokens")["gpt-x"].value == 40
    assert by_model("gen_ai.client.inference.usage.output_tokens")["claude-x"].value == 5
    output = by_model("gen_ai.client.inference.operation.output_tokens")
    assert tuple(output["gpt-x"].explicit_bounds) == TOKEN_BUCKETS
    assert output["claude-x"].attributes["gen_ai.provider.name"] == "anthropic"


@pytest.fixture
async def collector() -> AsyncIterator[tuple[str, list[tuple[str, dict[str, str], bytes]]]]:
    """A local OTLP/HTTP receiver that keeps what it is sent."""
    received: list[tuple[str, dict[str, str], bytes]] = []

    async def accept(request: web.Request) -> web.Response:
        received.append((request.path, dict(request.headers), await request.read()))
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/{tail:.*}", accept)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}", received
    await runner.cleanup()


async def test_otlp_http_export_to_a_collector(proxy: RunningProxy, collector) -> None:
    url, received = collector
    settings = OtelSettings(endpoint=url, headers={"Authorization": "Bearer t0ken"}, service_name="gw-1")
    exporter = OtelExporter.from_settings(settings)
    proxy.state.recorder.observe(on_rows(exporter.observe))
    await send_mix(proxy)
    await asyncio.get_running_loop().run_in_executor(None, exporter.shutdown)  # flushes both
    paths = {path for path, _, _ in received}
    assert paths == {"/v1/traces", "/v1/metrics"}
    assert all(h["Authorization"] == "Bearer t0ken" for _, h, _ in received)
    traces = ExportTraceServiceRequest()
    for path, _, body in received:
        if path == "/v1/traces":
            traces.MergeFromString(body)
    names = sorted(s.name for rs in traces.resource_spans for ss in rs.scope_spans for s in ss.spans)
    assert names == ["GET", "chat claude-x", "chat gpt-x", "chat gpt-x"]
    service = {a.key: a.value.string_value for a in traces.resource_spans[0].resource.attributes}
    assert service["service.name"] == "gw-1"
    metrics = ExportMetricsServiceRequest()
    metrics.MergeFromString(next(body for path, _, body in received if path == "/v1/metrics"))
    exported = {m.name for rm in metrics.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert "gen_ai.client.inference.duration" in exported


def test_settings_from_config() -> None:
    assert OtelSettings.from_config(ServeConfig(upstream="http://x")) is None  # off unless configured
    config = SimpleNamespace(otel_endpoint="http://collector:4318/", otel_headers={"x-key": "k"},
                             otel_service_name=None)  # the ServeConfig fields, by name
    assert OtelSettings.from_config(config) == OtelSettings(
        endpoint="http://collector:4318", headers={"x-key": "k"}, service_name="llmtap")
    config.otel_headers = "Authorization=Bearer%20abc, x-team = infra"  # as OTEL_EXPORTER_OTLP_HEADERS
    assert OtelSettings.from_config(config).headers == {"Authorization": "Bearer abc", "x-team": "infra"}


def test_runs_without_the_extra() -> None:
    """With opentelemetry not importable, the module loads and says how to install the extra."""
    code = (
        "import sys\n"
        "for name in ('opentelemetry', 'opentelemetry.sdk', 'opentelemetry.trace'): sys.modules[name] = None\n"
        "from proxy.observe import otel\n"
        "assert not otel.available()\n"
        "try:\n"
        "    otel.OtelExporter.from_settings(otel.OtelSettings(endpoint='http://127.0.0.1:4318'))\n"
        "except otel.OtelUnavailable as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert "pip install 'llmtap[otel]'" in out.stdout
