"""An OTLP logs export, as the agents send it, turned into `agent_events` rows: by an allow-list, never content.

The coding agents report their own account over OpenTelemetry logs (docs/tools.md, "The agents' own
telemetry"): Claude Code's `claude_code.tool_decision`/`tool_result`/`api_request`, Codex's
`codex.tool_decision`/`tool_result`/`api_request`/`turn_ttft`, Gemini CLI's `gemini_cli.tool_call`/
`api_response`. The body is decoded by the ecosystem's own code: `opentelemetry-proto`'s messages,
and protobuf's `json_format` for OTLP/JSON. Of each record only the events in `KINDS` are kept, and of
those only the attributes in `COLUMNS`: ids, names, decisions, durations, counts. Prompts, commands,
file paths, tool inputs and outputs are never read out, even when a CLI sends them
(`OTEL_LOG_USER_PROMPTS`, `OTEL_LOG_TOOL_DETAILS`, Codex's `arguments`/`output`, Gemini's
`function_args`); neither are user ids or e-mail addresses.

It runs in the decoding process (proxy/relay/otlp.py), never on the relay's event loop.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from proxy.common.schema import AGENT_EVENT_COLUMNS
from proxy.meter.decode import DecodeError as BodyDecodeError
from proxy.meter.decode import decode_all

JSON = "application/json"
PROTOBUF = "application/x-protobuf"
# The events the timeline uses, by the event name's last part (`claude_code.tool_result` -> tool_result).
KINDS = frozenset({"user_prompt", "tool_decision", "tool_result", "tool_call", "api_request", "api_response",
                   "api_error", "turn_ttft"})
# The spans kept (Claude Code's beta traces), by the end of their name
SPANS = (".tool", ".tool.blocked_on_user", ".tool.execution", ".llm_request")
# Each column's attributes, first found wins (Claude Code's, Codex's, Gemini CLI's names). Nothing else is read.
COLUMNS: dict[str, tuple[str, ...]] = {
    "session_id": ("session.id", "conversation.id"),
    "ttft_ms": ("ttft_ms",),
    "sequence": ("event.sequence",),
    "prompt_id": ("prompt.id", "prompt_id"),
    "tool_name": ("tool_name", "function_name"),
    "call_id": ("tool_use_id", "call_id", "gen_ai.tool.call.id"),
    "decision": ("decision",),
    "decision_source": ("source",),
    "duration_ms": ("duration_ms",),
    "success": ("success",),
    "model": ("model", "gen_ai.request.model"),
    "request_id": ("request_id", "gen_ai.response.id"),
    "attempt": ("attempt",),
    "status_code": ("status_code", "http.response.status_code"),
    "input_tokens": ("input_tokens", "input_token_count"),
    "output_tokens": ("output_tokens", "output_token_count"),
}
RESOURCE = {"source": "service.name", "source_version": "service.version"}
TEXT_MAX = 200  # characters of any text kept: ids and names are shorter
_EVENT_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,100}")
_NAMES = tuple(name for name, _ in AGENT_EVENT_COLUMNS)
_TYPES = dict(AGENT_EVENT_COLUMNS)
_WANTED = frozenset(a for names in COLUMNS.values() for a in names) | {"event.name", "event.timestamp"}


class ExportError(ValueError):
    """An export that cannot be taken: `status` is the HTTP status to answer (400, 413, 415)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

    def __reduce__(self) -> tuple[type[ExportError], tuple[int, str]]:  # back from the decoding process whole
        return ExportError, (self.status, str(self))


def media_type(content_type: str | None) -> str:
    """The body's media type, JSON or protobuf; ExportError(415) for anything else."""
    kind = (content_type or "").partition(";")[0].strip().lower()
    if kind in (JSON, PROTOBUF):
        return kind
    raise ExportError(415, f"Content-Type is {JSON} or {PROTOBUF}, not {kind or 'missing'!r}")


def body_of(raw: bytes, content_encoding: str | None, limit: int) -> bytes:
    """The export's bytes, decompressed (gzip, deflate, br, zstd) up to `limit`."""
    if not content_encoding or content_encoding.strip().lower() == "identity":
        return raw
    try:
        body = decode_all(raw, content_encoding, limit + 1)
    except BodyDecodeError as exc:
        raise ExportError(400, str(exc)) from None
    if len(body) > limit:
        raise ExportError(413, f"the export is over {limit:,} bytes once decompressed")
    return body


def decode(signal: str, raw: bytes, content_type: str | None, content_encoding: str | None, limit: int,
           received_at: datetime) -> list[tuple[Any, ...]]:
    """The `agent_events` rows of one OTLP export of `signal` ("v1/logs" or "v1/traces"; schema.AGENT_EVENT_COLUMNS,
    in order)."""
    kind = media_type(content_type)
    body = body_of(raw, content_encoding, limit)
    message = ExportLogsServiceRequest() if signal == "v1/logs" else ExportTraceServiceRequest()
    try:
        if kind == JSON:
            json_format.Parse(body, message, ignore_unknown_fields=True)
        else:
            message.ParseFromString(body)
    except (json_format.ParseError, DecodeError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ExportError(400, f"not an OTLP {signal[3:]} export ({kind}): {str(exc)[:200]}") from None
    if isinstance(message, ExportLogsServiceRequest):
        return [_row(found, received_at) for found in _events(message)]
    return [_row(found, received_at) for found in _spans(message, kind == JSON)]


Found = tuple[dict[str, Any], dict[str, Any], dict[str, Any]]  # (resource attributes, attributes, own columns)


def _events(message: ExportLogsServiceRequest) -> Iterator[Found]:
    for resource_logs in message.resource_logs:
        resource = _attributes(resource_logs.resource.attributes, frozenset(RESOURCE.values()))
        for scope_logs in resource_logs.scope_logs:
            for record in scope_logs.log_records:
                attrs = _attributes(record.attributes, _WANTED)
                name = _event_name(attrs.get("event.name"), record)
                if name is not None and name.rpartition(".")[2] in KINDS:
                    yield resource, attrs, {"event_name": name,
                                            "event_at": _event_time(record, attrs.get("event.timestamp"))}


def _spans(message: ExportTraceServiceRequest, json: bool) -> Iterator[Found]:
    """Claude Code's beta spans (CLAUDE_CODE_ENHANCED_TELEMETRY_BETA): the tool, its wait for the person, its
    execution, each API request; at their end, with their own duration and their ids (as hex)."""
    for resource_spans in message.resource_spans:
        resource = _attributes(resource_spans.resource.attributes, frozenset(RESOURCE.values()))
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                if not span.name.endswith(SPANS) or not span.end_time_unix_nano:
                    continue
                yield resource, _attributes(span.attributes, _WANTED), {
                    "event_name": span.name[:TEXT_MAX], "event_at": _utc(span.end_time_unix_nano),
                    "duration_ms": (span.end_time_unix_nano - span.start_time_unix_nano) / 1e6,
                    "span_id": _hex(span.span_id, json), "parent_span_id": _hex(span.parent_span_id, json)}


def _hex(raw: bytes, json: bool) -> str | None:
    """An id as OTLP writes it in hex. OTLP/JSON sends hex where protobuf's JSON mapping reads base64, so
    `json_format` gave its base64 decoding: encoded back, that is the hex text as sent."""
    if not raw:
        return None
    return base64.b64encode(raw).decode("ascii") if json else raw.hex()


def _row(found: Found, received_at: datetime) -> tuple[Any, ...]:
    resource, attrs, own = found
    row: dict[str, Any] = {"received_at": received_at}
    row.update({column: resource.get(attr) for column, attr in RESOURCE.items()})
    for column, names in COLUMNS.items():
        row[column] = next((attrs[a] for a in names if attrs.get(a) not in (None, "")), None)
    row.update({k: v for k, v in own.items() if v is not None})
    return tuple(_typed(n, row.get(n)) for n in _NAMES)


def _attributes(pairs: Any, wanted: frozenset[str]) -> dict[str, Any]:
    """The allowed keys' plain values (text, number, bool); any other key is never read."""
    return {kv.key: _plain(kv.value) for kv in pairs if kv.key in wanted}


def _plain(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which in ("string_value", "int_value", "double_value", "bool_value"):
        return getattr(value, which)
    return None  # arrays, maps, bytes: never an id, a name or a number


def _event_name(attribute: Any, record: Any) -> str | None:
    """The event's name from `event.name`, the record's own `event_name` or a body that is one (Claude Code
    puts `tool_result` in the first, `claude_code.tool_result` in the body), the qualified one first;
    anything else in the body is content, never read."""
    body = record.body.string_value if record.body.WhichOneof("value") == "string_value" else None
    names = [c for c in (attribute, getattr(record, "event_name", None), body)
             if isinstance(c, str) and _EVENT_NAME.fullmatch(c)]
    return next((n for n in names if "." in n), names[0] if names else None)  # `claude_code.x` over `x`


def _event_time(record: Any, stamp: Any) -> datetime | None:
    """The record's own time, else its `event.timestamp` (ISO 8601), else when it was observed."""
    nanos = record.time_unix_nano
    if not nanos and isinstance(stamp, str):
        try:
            parsed = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
            return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)
        except ValueError:
            pass
    nanos = nanos or record.observed_time_unix_nano
    return _utc(nanos) if nanos else None


def _utc(nanos: int) -> datetime:
    return datetime.fromtimestamp(nanos / 1e9, timezone.utc)


def _typed(column: str, value: Any) -> Any:
    """A value as its column's type; one that does not fit is NULL (a CLI's odd value costs its cell only)."""
    if value is None or column in ("received_at", "event_at"):
        return value
    kind = _TYPES[column]
    try:
        if kind == "VARCHAR":
            return str(value)[:TEXT_MAX]
        if kind == "BOOLEAN":
            return value if isinstance(value, bool) else {"true": True, "false": False}.get(str(value).lower())
        if kind == "DOUBLE":
            number = float(value)
            return number if abs(number) < 1e15 else None
        number = int(float(value))
        return number if abs(number) < (2**31 if kind == "INTEGER" else 2**63) else None
    except (TypeError, ValueError, OverflowError):
        return None
