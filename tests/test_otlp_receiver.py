"""OTLP received for real: a collector on loopback decodes what llmtap sends, and one that is down or
slow holds up neither the relay nor the stop.

The receiver is an aiohttp app speaking OTLP/HTTP with protobuf bodies (`opentelemetry-proto`'s
messages): POST /v1/traces and /v1/metrics, answered with the Export*ServiceResponse messages.
"""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http")

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (  # noqa: E402
    ExportMetricsServiceRequest, ExportMetricsServiceResponse)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: E402
    ExportTraceServiceRequest, ExportTraceServiceResponse)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue  # noqa: E402
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status  # noqa: E402

from proxy.observe.metrics import DURATION_BUCKETS, TOKEN_BUCKETS  # noqa: E402
from proxy.observe.otel import OtelExporter, OtelSettings  # noqa: E402
from .serving import RunningProxy  # noqa: E402
from proxy.simulator.app import Simulator  # noqa: E402

from .cli_traffic import CLAUDE_HEADERS  # noqa: E402
from .conftest import proxy_config  # noqa: E402
from .test_serve_process import start_serve, stream_once  # noqa: E402

CLIENT_KEY = "sk-live-OTLP-NEVER-4f9a8b7c6d5e3a2b"
ANTHROPIC_KEY = "sk-ant-api03-OTLP-NEVER-9d8c7b6a"
COLLECTOR_TOKEN = "collector-token-7e6d5c4b"
FAILING = re.compile(r"^llmtap: OpenTelemetry export to http://127\.0\.0\.1:\d+ is failing \((connection refused|timed"
                     r" out)\): spans and metrics are dropped until it answers \(said once\)$")
GAVE_UP = re.compile(r"^llmtap: OpenTelemetry: stopped flushing to http://127\.0\.0\.1:\d+ after 4 s;"
                     r" the rest is dropped$")
CHAT = {"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]}
MESSAGES = {"model": "claude-x", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}


@dataclass
class Receiver:
    url: str
    traces: list[ExportTraceServiceRequest] = field(default_factory=list)
    metrics: list[ExportMetricsServiceRequest] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    hold: asyncio.Event | None = None  # when set up, each POST waits for it: a collector that does not answer
    refuse: int = 0  # answer this many POSTs 401 first
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def spans(self) -> list[Span]:
        return [s for t in self.traces for rs in t.resource_spans for ss in rs.scope_spans for s in ss.spans]

    def metric(self) -> dict[str, Any]:
        """The last export of each metric (cumulative), by name."""
        found: dict[str, Any] = {}
        for m in self.metrics:
            for rm in m.resource_metrics:
                for sm in rm.scope_metrics:
                    assert sm.scope.name == "llmtap"
                    for metric in sm.metrics:
                        found[metric.name] = metric
        return found


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    found = Receiver(url="")

    async def accept(request: web.Request, message: type, answer: type, kept: list) -> web.Response:
        body = await request.read()
        found.arrived.set()
        if found.hold is not None:
            await found.hold.wait()
        if found.refuse > 0:
            found.refuse -= 1
            return web.Response(status=401, reason="Unauthorized")
        assert request.headers["Content-Type"] == "application/x-protobuf"
        decoded = message()
        decoded.ParseFromString(body)
        kept.append(decoded)
        found.headers.append(dict(request.headers))
        found.bodies.append(body)
        return web.Response(body=answer().SerializeToString(), content_type="application/x-protobuf")

    app = web.Application()
    async def traces(request: web.Request) -> web.Response:  # aiohttp deprecates a plain function as a handler
        return await accept(request, ExportTraceServiceRequest, ExportTraceServiceResponse, found.traces)

    async def metrics(request: web.Request) -> web.Response:
        return await accept(request, ExportMetricsServiceRequest, ExportMetricsServiceResponse, found.metrics)

    app.router.add_post("/v1/traces", traces)
    app.router.add_post("/v1/metrics", metrics)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    found.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield found
    if found.hold is not None:
        found.hold.set()
    await runner.cleanup()


def value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return tuple(value(x) for x in v.array_value.values)
    return getattr(v, kind)


def attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: value(kv.value) for kv in kvs}


async def send_requests(base: str) -> None:
    """A stream and a 429 with an OpenAI key, a message with an Anthropic key, a model list."""
    bearer = {"Authorization": f"Bearer {CLIENT_KEY}", "user-agent": "OpenAI/Python 1.99.0"}
    async with aiohttp.ClientSession() as s:
        stream = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
        async with s.post(f"{base}/v1/chat/completions", json=stream,
                          headers={**bearer, "x-sim-tokens": "6", "x-sim-cache-read-tokens": "40"}) as r:
            assert r.status == 200
            await r.read()
        async with s.post(f"{base}/v1/chat/completions", json=CHAT, headers={**bearer, "x-sim-status": "429"}) as r:
            assert r.status == 429
        async with s.post(f"{base}/v1/messages", json=MESSAGES,
                          headers={**CLAUDE_HEADERS, "x-api-key": ANTHROPIC_KEY, "x-sim-tokens": "5"}) as r:
            assert r.status == 200
        async with s.get(f"{base}/v1/models", headers=bearer) as r:
            await r.read()


async def test_the_collector_decodes_spans_and_metrics(sim: Simulator, receiver: Receiver, tmp_path: Path) -> None:
    lines: list[str] = []
    config = proxy_config(sim.url, tmp_path, otel_endpoint=receiver.url, otel_service_name="gw-eu",
                          otel_headers=f"Authorization=Bearer%20{COLLECTOR_TOKEN}")
    async with RunningProxy(config, report=lines.append) as proxy:
        await send_requests(proxy.url)
    # the stop flushed both signals to the collector
    assert not [line for line in lines if "OpenTelemetry" in line], lines
    assert {h["Authorization"] for h in receiver.headers} == {f"Bearer {COLLECTOR_TOKEN}"}

    resource = attributes(receiver.traces[0].resource_spans[0].resource.attributes)
    assert resource["service.name"] == "gw-eu"
    spans = {s.name: s for s in receiver.spans()}
    assert sorted(s.name for s in receiver.spans()) == ["GET", "chat claude-x", "chat gpt-x", "chat gpt-x"]
    assert all(s.kind == Span.SPAN_KIND_CLIENT for s in receiver.spans())
    chats = [s for s in receiver.spans() if s.name == "chat gpt-x"]
    stream = next(s for s in chats if attributes(s.attributes)["gen_ai.request.stream"])
    limited = next(s for s in chats if s is not stream)
    a = attributes(stream.attributes)
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "openai"
    assert a["gen_ai.request.model"] == "gpt-x" and a["openai.api.type"] == "chat_completions"
    assert a["gen_ai.usage.output_tokens"] == 6 and a["gen_ai.usage.cache_read.input_tokens"] == 40
    assert isinstance(a["gen_ai.usage.input_tokens"], int) and a["gen_ai.response.finish_reasons"] == ("stop",)
    e2e_s = (stream.end_time_unix_nano - stream.start_time_unix_nano) / 1e9
    assert 0 < a["gen_ai.response.time_to_first_chunk"] < e2e_s
    assert a["http.request.method"] == "POST" and a["http.response.status_code"] == 200
    assert a["url.path"] == "/v1/chat/completions" and a["server.address"] == "127.0.0.1"
    assert len(a["llmtap.request.id"]) >= 16 and a["llmtap.outcome"] == "ok"
    assert stream.status.code != Status.STATUS_CODE_ERROR
    failed = attributes(limited.attributes)
    assert limited.status.code == Status.STATUS_CODE_ERROR and failed["error.type"]
    assert failed["http.response.status_code"] == 429
    claude = attributes(spans["chat claude-x"].attributes)
    assert claude["gen_ai.provider.name"] == "anthropic" and claude["gen_ai.usage.output_tokens"] == 5
    assert "gen_ai.operation.name" not in attributes(spans["GET"].attributes)

    metrics = receiver.metric()
    units = {name: m.unit for name, m in metrics.items()}
    usage = {f"gen_ai.client.inference.usage.{part}": "{token}" for part in (
        "input_tokens", "output_tokens", "cache_read.input_tokens", "cache_write.input_tokens", "reasoning.output_tokens")}
    assert units == {"gen_ai.client.inference.duration": "s", "gen_ai.client.inference.time_to_first_chunk": "s",
                     "gen_ai.client.inference.time_per_output_chunk": "s", **usage,
                     "gen_ai.client.inference.operation.input_tokens": "{token}",
                     "gen_ai.client.inference.operation.output_tokens": "{token}"}  # gpt-x and claude-x have no price
    duration = list(metrics["gen_ai.client.inference.duration"].histogram.data_points)
    assert sum(p.count for p in duration) == 3  # the generations, not the model list
    assert tuple(duration[0].explicit_bounds) == DURATION_BUCKETS
    by_model = {attributes(p.attributes)["gen_ai.request.model"] for p in duration}
    assert by_model == {"gpt-x", "claude-x"}
    assert {attributes(p.attributes).get("error.type") is not None for p in duration} == {True, False}
    ttft = list(metrics["gen_ai.client.inference.time_to_first_chunk"].histogram.data_points)
    assert [p.count for p in ttft] == [1]

    def counted(name: str) -> dict[str, float]:
        points = metrics[f"gen_ai.client.inference.usage.{name}"].sum.data_points
        assert {attributes(p.attributes)["gen_ai.token.modality"] for p in points} == {"unknown"}
        return {attributes(p.attributes)["gen_ai.request.model"]: p.as_int for p in points if p.as_int}

    assert counted("cache_read.input_tokens") == {"gpt-x": 40} and counted("output_tokens")["claude-x"] == 5
    output = list(metrics["gen_ai.client.inference.operation.output_tokens"].histogram.data_points)
    assert tuple(output[0].explicit_bounds) == TOKEN_BUCKETS

    # no credential anywhere: not in an attribute, not in the bytes sent
    every = [resource, *(attributes(s.attributes) for s in receiver.spans()),
             *(attributes(p.attributes) for m in metrics.values() for p in m.histogram.data_points)]
    text = repr(every)
    body = b"".join(receiver.bodies)
    for secret in (CLIENT_KEY, ANTHROPIC_KEY, COLLECTOR_TOKEN, CLIENT_KEY[8:], ANTHROPIC_KEY[10:]):
        assert secret not in text and secret.encode() not in body


async def test_a_collector_that_does_not_answer_holds_up_neither_relay_nor_stop(
        sim: Simulator, receiver: Receiver, tmp_path: Path) -> None:
    receiver.hold = asyncio.Event()
    lines: list[str] = []
    config = proxy_config(sim.url, tmp_path, otel_endpoint=receiver.url)
    proxy = RunningProxy(config, report=lines.append)
    async with proxy:
        await send_requests(proxy.url)
        assert proxy.otel is not None
        threading.Thread(target=proxy.otel.tracer_provider.force_flush, daemon=True).start()
        await asyncio.wait_for(receiver.arrived.wait(), 30)  # an export is waiting on the collector ...
        await send_requests(proxy.url)  # ... and the relay answers all the same
        assert not receiver.hold.is_set() and receiver.traces == []
    # the stop gave up on the collector (its exports timed out, or the flush's bound came first), said in
    # at most two lines
    said = [line for line in lines if "OpenTelemetry" in line]
    assert 1 <= len(said) <= 2 and all(FAILING.match(line) or GAVE_UP.match(line) for line in said), lines


async def test_failing_then_working_export_is_said_once_each(receiver: Receiver) -> None:
    """A collector that refuses, then accepts: one line for the failure (with its reason), one when it works
    again, and none of the exporter's own lines."""
    lines: list[str] = []
    exporter = OtelExporter.from_settings(OtelSettings(endpoint=receiver.url), report=lines.append)
    row = {"id": "r1", "kind": "generation", "dialect": "openai_chat", "request_model": "gpt-x", "e2e_ms": 12.0,
           "started_at": datetime.now(timezone.utc), "outcome": "ok", "status": 200}
    receiver.refuse = 2
    for n in range(3):
        exporter.observe({**row, "id": f"r{n}"})
        await asyncio.to_thread(exporter.tracer_provider.force_flush)
    assert lines == [f"llmtap: OpenTelemetry export to {receiver.url} is failing (HTTP 401 Unauthorized): spans"
                     " and metrics are dropped until it answers (said once)",
                     f"llmtap: OpenTelemetry export to {receiver.url} works again"]
    assert [s.name for s in receiver.spans()] == ["chat gpt-x"]
    assert await asyncio.to_thread(exporter.shutdown)
    assert len(lines) == 2


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_stopping_serve_with_an_unreachable_collector(sim: Simulator, tmp_path: Path) -> None:
    """The collector's port is closed: `serve` stops promptly with exit code 0, in one warning line
    (not a line per retry), and every row is written."""
    proc, admin = await start_serve(sim.url, tmp_path / "serve.duckdb", "--quiet",
                                    "--otel-endpoint", f"http://127.0.0.1:{closed_port()}")
    try:
        async with aiohttp.ClientSession() as s:
            await asyncio.gather(*(stream_once(s, admin.url) for _ in range(5)))
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.to_thread(proc.communicate, timeout=10)  # a timeout only
    assert proc.returncode == 0, err
    said = [line for line in err.splitlines() if "opentelemetry" in line.lower() or "export" in line.lower()]
    assert 1 <= len(said) <= 2 and all(FAILING.match(line) or GAVE_UP.match(line) for line in said), err
    assert any("is failing (connection refused)" in line for line in said) or GAVE_UP.match(said[0]), err
    assert "Transient error" not in err and "Traceback" not in err and "llmtap: stopped" in err
    import duckdb

    con = duckdb.connect(str(tmp_path / "serve.duckdb"), read_only=True)
    assert con.execute("SELECT count(*) FROM requests").fetchone() == (5,)
    con.close()
