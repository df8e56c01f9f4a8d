"""OpenTelemetry export: one CLIENT span and the GenAI client metrics per finished request.

Optional: it needs the `otel` extra (`pip install 'llmtap[otel]'`) and is off
unless an OTLP endpoint is configured (`otel_endpoint`, the collector's base
URL such as `http://otel-collector:4318`; spans go to `/v1/traces` and
metrics to `/v1/metrics` under it, over OTLP/HTTP protobuf).

`OtelExporter.observe(row)` is one of the recorder's observers (`recorder.on_rows`). It runs on the event
loop, so it only builds a span and records histogram points in memory; the
SDK's batch span processor and periodic metric reader send them from their
own threads. Attributes follow the GenAI semantic conventions
(docs/gen-ai in open-telemetry/semantic-conventions): the span is named
`"{gen_ai.operation.name} {gen_ai.request.model}"`, starts at `started_at`
and lasts `e2e_ms`. The operation name comes from the row's `kind`
(proxy/meter/request_kind.py): a generation is `chat` (`generate_content` for
Gemini), an embedding `embeddings`; the other kinds have no GenAI operation
(token counts, probes, model lists, Codex's prewarm) and get a plain HTTP
client span named after the method, and no GenAI metrics. `gen_ai.provider.name` comes from the dialect (an
OpenAI-compatible local server is reported as `openai`). Like the Prometheus
metrics, `time_per_output_chunk` gets one sample per request (its TPOT).

The names follow open-telemetry/semantic-conventions-genai's main branch
(docs/gen-ai/client-inference.md, gen-ai-token-metrics.md, client-embeddings.md,
non-normative/migration.md): a generation's `gen_ai.client.inference.duration`,
`.time_to_first_chunk` and `.time_per_output_chunk`; the counters
`gen_ai.client.inference.usage.{input_tokens,output_tokens,cache_read.input_tokens,
cache_write.input_tokens,reasoning.output_tokens}` with `gen_ai.token.modality` =
`unknown`; the histograms `gen_ai.client.inference.operation.{input,output}_tokens`;
an embedding's `gen_ai.client.embeddings.duration` and
`.operation.input_tokens`; the span attribute `gen_ai.usage.cache_write.input_tokens`
(was `cache_creation`). llmtap adds
`llmtap.client.inference.upstream_processing.duration` (a histogram, s: the time the upstream says it
spent, `upstream_processing_ms`),
`llmtap.client.inference.cost_usd` (a counter, the tokens' list price; an llmtap
extension, `llmtap.billing` = `api` or `subscription`) and the span attribute
`llmtap.cost_usd`.

A collector that is down or slow costs the relay nothing (the export threads
wait, the event loop never does) and the stop little: each export gives up
after `export_timeout_s` (2 s), `shutdown` flushes for at most
`shutdown_timeout_s` (4 s), and the OTLP exporters' own log lines (one per retry)
are replaced by one line when export starts failing and one when it works
again (`ExportHealth`).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import unquote, urlsplit

try:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError as exc:  # the `otel` extra is not installed
    _MISSING: ImportError | None = exc
else:
    _MISSING = None

from proxy.observe.metrics import DURATION_BUCKETS, TOKEN_BUCKETS
from proxy.common.prices import SUBSCRIPTION_KINDS, row_cost
from proxy.common.schema import GENERATING_KINDS
from proxy.common.terminal_text import stderr_line

INSTRUMENTATION = "llmtap"
EXPORTER_LOGGER = "opentelemetry.exporter.otlp"  # the OTLP exporters log each retry below it
OPERATION = {"openai_chat": "chat", "openai_responses": "chat", "anthropic": "chat", "gemini": "generate_content"}
PROVIDER = {"openai_chat": "openai", "openai_responses": "openai", "anthropic": "anthropic",
            "gemini": "gcp.gemini"}
OPENAI_API_TYPE = {"openai_chat": "chat_completions", "openai_responses": "responses"}
USAGE = (
    ("gen_ai.usage.input_tokens", "input_tokens"),
    ("gen_ai.usage.output_tokens", "output_tokens"),
    ("gen_ai.usage.cache_read.input_tokens", "cache_read_tokens"),
    ("gen_ai.usage.cache_write.input_tokens", "cache_creation_tokens"),  # was cache_creation (#440)
    ("gen_ai.usage.reasoning.output_tokens", "reasoning_tokens"),
)
# The current token counters (gen-ai-token-metrics.md), all with gen_ai.token.modality = "unknown"
USAGE_COUNTERS = (
    ("gen_ai.client.inference.usage.input_tokens", "input_tokens"),
    ("gen_ai.client.inference.usage.output_tokens", "output_tokens"),
    ("gen_ai.client.inference.usage.cache_read.input_tokens", "cache_read_tokens"),
    ("gen_ai.client.inference.usage.cache_write.input_tokens", "cache_creation_tokens"),
    ("gen_ai.client.inference.usage.reasoning.output_tokens", "reasoning_tokens"),
)


class OtelUnavailable(RuntimeError):
    """OpenTelemetry export was asked for but the `otel` extra is not installed."""


@dataclass(frozen=True)
class OtelSettings:
    endpoint: str  # OTLP/HTTP base URL, e.g. http://127.0.0.1:4318
    headers: Mapping[str, str] = field(default_factory=dict)
    service_name: str = "llmtap"
    export_interval_s: float = 10.0
    export_timeout_s: float = 2.0  # one export, its retries included (a refused connection: about 1 s)
    shutdown_timeout_s: float = 4.0  # the last flush, spans and metrics at once

    @classmethod
    def from_config(cls, config: Any) -> "OtelSettings | None":
        """From ServeConfig's otel_* settings; None (export off) when no endpoint is set."""
        endpoint = getattr(config, "otel_endpoint", None)
        if not endpoint:
            return None
        return cls(endpoint=endpoint.rstrip("/"), headers=parse_headers(getattr(config, "otel_headers", None)),
                   service_name=getattr(config, "otel_service_name", None) or "llmtap")


def parse_headers(value: str | Mapping[str, str] | None) -> dict[str, str]:
    """`key=value,key2=value2` (the OTEL_EXPORTER_OTLP_HEADERS form), or a mapping as is."""
    if not value:
        return {}
    if isinstance(value, Mapping):
        return {str(k): str(v) for k, v in value.items()}
    pairs = (item.split("=", 1) for item in value.split(",") if "=" in item)
    return {unquote(k.strip()): unquote(v.strip()) for k, v in pairs}


def available() -> bool:
    return _MISSING is None


def _require() -> None:
    if _MISSING is not None:
        raise OtelUnavailable(
            f"OpenTelemetry export needs the otel extra: pip install 'llmtap[otel]' ({_MISSING})")


def operation(row: Mapping[str, Any]) -> str | None:
    """`gen_ai.operation.name` for the row's kind (a row without one: its dialect's)."""
    kind = row.get("kind")
    if kind == "embedding":
        return "embeddings"
    if kind not in (None, *GENERATING_KINDS):
        return None
    return OPERATION.get(row.get("dialect") or "")


def error_type(row: Mapping[str, Any]) -> str | None:
    outcome = row.get("outcome")
    if outcome in (None, "ok"):
        return None
    return row.get("error_type") or outcome


def metric_attributes(row: Mapping[str, Any]) -> dict[str, Any]:
    """The attributes the GenAI client metrics are recorded with (low cardinality)."""
    dialect = row.get("dialect") or ""
    return _present({
        "gen_ai.operation.name": operation(row),
        "gen_ai.provider.name": PROVIDER.get(dialect),
        "gen_ai.request.model": row.get("request_model"),
        "gen_ai.response.model": row.get("response_model"),
        "server.address": row.get("upstream_host"),
        "error.type": error_type(row),
    })


def span_attributes(row: Mapping[str, Any]) -> dict[str, Any]:
    attributes = metric_attributes(row)
    ttft = row.get("ttft_ms")
    finish = row.get("finish_reason")
    attributes.update(_present({
        "gen_ai.request.stream": row.get("stream"),
        **{name: row.get(column) for name, column in USAGE},
        "llmtap.cost_usd": row_cost(row) if operation(row) is not None else None,  # an llmtap extension
        "gen_ai.response.time_to_first_chunk": ttft / 1000.0 if ttft is not None else None,
        "gen_ai.response.finish_reasons": [finish] if finish else None,
        "openai.api.type": OPENAI_API_TYPE.get(row.get("dialect") or ""),
        "http.request.method": row.get("method"),
        "http.response.status_code": row.get("status"),
        "url.path": row.get("path"),
        "llmtap.request.id": row.get("id"),
        "llmtap.route": row.get("route"),
        "llmtap.tool": row.get("tool"),
        "llmtap.tag": row.get("tag"),
        "llmtap.outcome": row.get("outcome"),
    }))
    return attributes


def span_name(row: Mapping[str, Any]) -> str:
    name = operation(row)
    if name is None:
        return str(row.get("method") or "HTTP")
    model = row.get("request_model")
    return f"{name} {model}" if model else name


def span_times(row: Mapping[str, Any]) -> tuple[int, int]:
    """Start and end in ns since the epoch: `started_at`, plus `e2e_ms`."""
    started: datetime | None = row.get("started_at")
    duration_ns = int((row.get("e2e_ms") or 0.0) * 1_000_000)
    if started is None:
        end = time.time_ns()
        return end - duration_ns, end
    start = int(started.timestamp()) * 1_000_000_000 + started.microsecond * 1000
    return start, start + duration_ns


def _present(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None and v != ""}


class ExportHealth:
    """Whether export to the collector works, said once per change: a line when it starts failing (with
    the first reason), one when it works again. The OTLP exporters' own lines are dropped (`_ExportLog`)."""

    def __init__(self, endpoint: str, report: Callable[[str], None] = stderr_line) -> None:
        parts = urlsplit(endpoint)
        self.where = f"{parts.scheme}://{parts.hostname or ''}{f':{parts.port}' if parts.port else ''}"
        self.report = report
        self.failing = False
        self.stopping = False
        self._lock = threading.Lock()

    def ok(self) -> None:
        with self._lock:
            was, self.failing = self.failing, False
        if was and not self.stopping:
            self.report(f"llmtap: OpenTelemetry export to {self.where} works again")

    def failed(self, reason: str) -> None:
        with self._lock:
            was, self.failing = self.failing, True
        if not was and not self.stopping:
            self.report(f"llmtap: OpenTelemetry export to {self.where} is failing ({reason}): spans and metrics"
                        " are dropped until it answers (said once)")

    def gave_up(self, seconds: float) -> None:
        self.stopping = True
        self.report(f"llmtap: OpenTelemetry: stopped flushing to {self.where} after {seconds:g} s; the rest is dropped")


_exporting = threading.local()  # the ExportHealth of the export running on this thread


def export_reason(message: str) -> str:
    """A short reason from an OTLP exporter's log line."""
    if found := re.search(r"Transient error (.+) encountered while exporting", message):
        message = found.group(1)
    if found := re.search(r"\[Errno -?\d+\] ([^\"')\]]+)", message):
        return found.group(1).strip().lower()
    if found := re.search(r"code: (\d+), reason: ([^,]*)", message):
        return f"HTTP {found.group(1)} {found.group(2).strip()}".strip()
    if "timed out" in message.lower() or "timeout" in message.lower():
        return "timed out"
    if "connection" in message.lower():
        return "connection failed"
    return message[:120]


class _ExportLog(logging.Handler):
    """Takes the OTLP exporters' records: a failure counts for the health of the export that logged it."""

    def emit(self, record: logging.LogRecord) -> None:
        health = getattr(_exporting, "health", None)
        if health is not None and record.levelno >= logging.WARNING:
            health.failed(export_reason(record.getMessage()))


def quiet_exporter_logs() -> None:
    """Route the OTLP exporters' log records to `_ExportLog` only (idempotent)."""
    logger = logging.getLogger(EXPORTER_LOGGER)
    if not any(isinstance(h, _ExportLog) for h in logger.handlers):
        logger.addHandler(_ExportLog())
    logger.propagate = False


def _otlp_exporters(settings: OtelSettings, health: ExportHealth) -> tuple[Any, Any]:
    """The OTLP/HTTP span and metric exporters, telling `health` how each export went."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics.export import MetricExportResult
    from opentelemetry.sdk.trace.export import SpanExportResult

    class Spans(OTLPSpanExporter):  # type: ignore[misc,valid-type]
        def export(self, spans: Sequence[Any]) -> Any:
            _exporting.health = health
            try:
                result = super().export(spans)
            finally:
                _exporting.health = None
            if result == SpanExportResult.SUCCESS:
                health.ok()
            return result

    class Metrics(OTLPMetricExporter):  # type: ignore[misc,valid-type]
        def export(self, metrics_data: Any, timeout_millis: float | None = 10_000, **kwargs: Any) -> Any:
            _exporting.health = health
            try:
                result = super().export(metrics_data, timeout_millis=timeout_millis, **kwargs)
            finally:
                _exporting.health = None
            if result == MetricExportResult.SUCCESS:
                health.ok()
            return result

    headers, timeout = dict(settings.headers), settings.export_timeout_s
    return (Spans(endpoint=f"{settings.endpoint}/v1/traces", headers=headers, timeout=timeout),
            Metrics(endpoint=f"{settings.endpoint}/v1/metrics", headers=headers, timeout=timeout))


class OtelExporter:
    """Spans and GenAI metrics from finished rows, through the given SDK providers."""

    def __init__(self, tracer_provider: Any, meter_provider: Any, *, exporters: Sequence[Any] = (),
                 health: ExportHealth | None = None, shutdown_timeout_s: float = 4.0) -> None:
        _require()
        self.tracer_provider, self.meter_provider = tracer_provider, meter_provider
        self.exporters, self.health, self.shutdown_timeout_s = tuple(exporters), health, shutdown_timeout_s
        self.tracer = tracer_provider.get_tracer(INSTRUMENTATION)
        meter = meter_provider.get_meter(INSTRUMENTATION)
        seconds = {"unit": "s", "explicit_bucket_boundaries_advisory": DURATION_BUCKETS}
        tokens = {"unit": "{token}", "explicit_bucket_boundaries_advisory": TOKEN_BUCKETS}
        self.duration = meter.create_histogram(
            "gen_ai.client.inference.duration", description="GenAI operation duration (e2e).", **seconds)
        self.ttft = meter.create_histogram(
            "gen_ai.client.inference.time_to_first_chunk", description="Time to the first chunk (streams).",
            **seconds)
        self.tpot = meter.create_histogram(
            "gen_ai.client.inference.time_per_output_chunk",
            description="Per-request time per output token (one sample per request).", **seconds)
        self.usage = [(meter.create_counter(name, unit="{token}", description=f"Tokens used ({column})."), column)
                      for name, column in USAGE_COUNTERS]
        self.input_hist = meter.create_histogram(
            "gen_ai.client.inference.operation.input_tokens", description="Input tokens per operation.", **tokens)
        self.output_hist = meter.create_histogram(
            "gen_ai.client.inference.operation.output_tokens", description="Output tokens per operation.", **tokens)
        self.embed_duration = meter.create_histogram(
            "gen_ai.client.embeddings.duration", description="GenAI embeddings duration (e2e).", **seconds)
        self.embed_input = meter.create_histogram(
            "gen_ai.client.embeddings.operation.input_tokens", description="Input tokens per embedding.", **tokens)
        self.processing = meter.create_histogram(
            "llmtap.client.inference.upstream_processing.duration",
            description="The time the upstream says it spent (upstream_processing_ms; an llmtap extension).", **seconds)
        self.cost = meter.create_counter(
            "llmtap.client.inference.cost_usd", unit="{USD}",
            description="List price of the generations' tokens (genai-prices; an llmtap extension).")
        self.errors = 0

    @classmethod
    def from_settings(cls, settings: OtelSettings, report: Callable[[str], None] = stderr_line) -> "OtelExporter":
        """OTLP/HTTP exporters for spans (batched) and metrics (every export_interval_s); `report` gets the
        lines of ExportHealth."""
        _require()
        quiet_exporter_logs()
        health = ExportHealth(settings.endpoint, report)
        spans, metrics = _otlp_exporters(settings, health)
        resource = Resource.create({"service.name": settings.service_name})
        tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)  # shutdown() stops them
        tracer_provider.add_span_processor(BatchSpanProcessor(spans))
        reader = PeriodicExportingMetricReader(metrics, export_interval_millis=settings.export_interval_s * 1000,
                                               export_timeout_millis=settings.export_timeout_s * 1000)
        meter_provider = MeterProvider(resource=resource, metric_readers=[reader], shutdown_on_exit=False)
        return cls(tracer_provider, meter_provider, exporters=(spans, metrics), health=health,
                   shutdown_timeout_s=settings.shutdown_timeout_s)

    def observe(self, row: Mapping[str, Any]) -> None:
        """One span, and the metric points of a generation. Never raises."""
        try:
            self._span(row)
            if operation(row) is not None:
                self._metrics(row)
        except Exception:
            self.errors += 1

    def _span(self, row: Mapping[str, Any]) -> None:
        start, end = span_times(row)
        span = self.tracer.start_span(span_name(row), kind=SpanKind.CLIENT, start_time=start,
                                      attributes=span_attributes(row))
        if error_type(row) is not None:
            span.set_status(Status(StatusCode.ERROR, (row.get("error_message") or row.get("outcome") or "")[:500]))
        span.end(end_time=end)

    def _metrics(self, row: Mapping[str, Any]) -> None:
        attributes = metric_attributes(row)
        if row.get("kind") == "embedding":
            if row.get("e2e_ms") is not None:
                self.embed_duration.record(row["e2e_ms"] / 1000.0, attributes)
            if row.get("input_tokens") is not None:
                self.embed_input.record(row["input_tokens"], attributes)
            return
        if row.get("e2e_ms") is not None:
            self.duration.record(row["e2e_ms"] / 1000.0, attributes)
        if row.get("stream") and row.get("ttft_ms") is not None:
            self.ttft.record(row["ttft_ms"] / 1000.0, attributes)
        if row.get("tpot_ms") is not None:
            self.tpot.record(row["tpot_ms"] / 1000.0, attributes)
        if row.get("upstream_processing_ms") is not None:
            self.processing.record(row["upstream_processing_ms"] / 1000.0, attributes)
        counted = {**attributes, "gen_ai.token.modality": "unknown"}
        for counter, column in self.usage:
            counter.add(row.get(column) or 0, counted)
        if row.get("input_tokens") is not None:
            self.input_hist.record(row["input_tokens"], attributes)
        if row.get("output_tokens") is not None:
            self.output_hist.record(row["output_tokens"], attributes)
        if cost := row_cost(row):
            billing = "subscription" if row.get("credential_kind") in SUBSCRIPTION_KINDS else "api"
            self.cost.add(cost, {**attributes, "llmtap.billing": billing})

    def shutdown(self) -> bool:
        """Flush spans and metrics (at once) and stop, for at most `shutdown_timeout_s`: False when it gave up
        on a collector that is down or slow (said in one line). Blocks, so call it off the event loop."""
        stoppers = [threading.Thread(target=stop, name=f"llmtap-otel-stop-{n}", daemon=True)
                    for n, stop in enumerate((self.tracer_provider.shutdown, self.meter_provider.shutdown))]
        deadline = time.monotonic() + self.shutdown_timeout_s
        for thread in stoppers:
            thread.start()
        for thread in stoppers:
            thread.join(max(0.0, deadline - time.monotonic()))
        if not any(thread.is_alive() for thread in stoppers):
            return True
        if self.health is not None:
            self.health.gave_up(self.shutdown_timeout_s)
        for exporter in self.exporters:  # ends their retry waits: what is left is dropped at once
            try:
                exporter.shutdown()
            except Exception:
                pass
        for thread in stoppers:  # daemons: a request still in flight does not hold up the exit
            thread.join(1.0)
        return False
