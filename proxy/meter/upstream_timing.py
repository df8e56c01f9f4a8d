"""What the upstream says it spent on a request, read off its response and checked against what
llmtap measured (docs/columns.md `upstream_processing_ms`; docs/breakdown-and-compare.md).

The sources, in the order that decides which one `upstream_processing_ms` holds when a response has
several (the account nearest the model first: whatever it leaves out is the path to it):

1. `responsesapi.websocket_timing`, a frame on the Responses WebSocket (Codex's transport): its
   `timing_metrics` carry `responses_duration_excl_engine_and_client_tool_time_ms` (the server's
   time outside the engine and the client's tools: `upstream_overhead_ms`) and
   `engine_service_total_ms` (the engine's); their sum is the server's time on the response. Its
   `engine_service_ttft_total_ms` (else `engine_iapi_ttft_total_ms`) is `upstream_engine_ttft_ms`.
2. `openai-processing-ms`: OpenAI's API servers' time on the request, to the response's headers.
3. `Server-Timing` (W3C): the first entry whose name contains `total` or `upstream` (any case), its
   `dur` in ms (`total;dur=123.4`, `upstream-service;dur=80`); other entries are ignored.
4. `x-envoy-upstream-service-time`: an Envoy or Istio gateway's wait for the service behind it.

Never trusted blindly: a value must be a finite number from 0 and no larger than what llmtap measured
for the same span, else it is kept aside (its column NULL, the row's `parse_error` says which and
why) and the next source is tried. The spans: a header's, `upstream_wait_ms` (the request on the
wire to the response's first byte); the frame's processing and overhead, the turn's start (its
`response.create` passing llmtap) to the frame's arrival; the engine's TTFT, the turn's start to
its first output event.

Cheap on the relay's path: three header lookups per response (`from_headers`), and, on a WebSocket,
a byte search only in frames that carry no output (`is_timing_frame`); the parsing is done once,
when the row is built (`read`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import orjson

OPENAI = "openai-processing-ms"
SERVER_TIMING = "server-timing"
ENVOY = "x-envoy-upstream-service-time"
HEADERS = (OPENAI, SERVER_TIMING, ENVOY)  # in the order stated above
FRAME = "websocket_timing"  # the source name of the frame
_FRAME_MARK = b'"responsesapi.websocket_timing"'
MAX_FRAME = 64 * 1024  # a larger frame with the mark is not kept to parse
SERVER_TIMING_NAMES = ("total", "upstream")
SHOWN = 40  # characters of a value named in parse_error

COLUMNS = ("upstream_processing_ms", "upstream_processing_source", "upstream_engine_ttft_ms", "upstream_overhead_ms")
EMPTY: dict[str, Any] = dict.fromkeys(COLUMNS)

Stated = tuple[tuple[str, str], ...]  # (source, its value as sent), in the order above


def from_headers(headers: Mapping[str, str]) -> Stated | None:
    """A response's stated times as sent, None (at the cost of three lookups) when it states none."""
    found = tuple((name, value) for name in HEADERS if (value := headers.get(name)) is not None)
    if not found:
        return None
    if any(name == SERVER_TIMING for name, _ in found) and hasattr(headers, "getall"):
        every = ", ".join(headers.getall(SERVER_TIMING))  # the header may come more than once
        found = tuple((name, every if name == SERVER_TIMING else value) for name, value in found)
    return found


def is_timing_frame(payload: bytes) -> bool:
    return _FRAME_MARK in payload and len(payload) <= MAX_FRAME


def read(stated: Stated | None, frame: bytes | None, wait_ms: float | None, frame_ms: float | None,
         first_token_ms: float | None) -> tuple[dict[str, Any], str | None]:
    """The columns (`COLUMNS`) and a note for `parse_error` (None when nothing was kept aside), from
    the headers' `stated` times, a WebSocket turn's timing `frame`, and the spans llmtap measured:
    `wait_ms` (upstream_wait_ms), `frame_ms` (the turn's start to the frame) and `first_token_ms`
    (the turn's start to its first output event)."""
    if stated is None and frame is None:
        return EMPTY, None
    out, notes = dict(EMPTY), list[str]()
    if frame is not None:
        _read_frame(frame, frame_ms, first_token_ms, out, notes)
    for source, text in stated or ():
        if out["upstream_processing_ms"] is not None:
            break
        if source == SERVER_TIMING:
            entry = server_timing_entry(text)
            if entry is None:
                continue
            name, text = entry
            source = f"{SERVER_TIMING} {name[:SHOWN]}"
        if (value := _kept(_number(text), wait_ms, f"{source} {text[:SHOWN]!r}", notes)) is not None:
            out["upstream_processing_ms"], out["upstream_processing_source"] = value, source
    return out, ("upstream timing not kept: " + "; ".join(notes)) if notes else None


def server_timing_entry(header: str) -> tuple[str, str] | None:
    """The first entry whose name contains `total` or `upstream`: (its name, its `dur` as sent, ''
    when it has none); None when no entry's name says so."""
    for entry in header.split(","):
        name, *params = (p.strip() for p in entry.split(";"))
        if not any(word in name.lower() for word in SERVER_TIMING_NAMES):
            continue
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "dur":
                return name, value.strip().strip('"')
        return name, ""
    return None


def _read_frame(frame: bytes, frame_ms: float | None, first_token_ms: float | None,
                out: dict[str, Any], notes: list[str]) -> None:
    try:
        metrics = orjson.loads(frame).get("timing_metrics")
    except (orjson.JSONDecodeError, AttributeError):
        metrics = None
    if not isinstance(metrics, dict):
        notes.append(f"{FRAME} without a timing_metrics object")
        return

    def field(key: str, bound: float | None) -> float | None:
        raw = metrics.get(key)
        if raw is None:
            return None
        return _kept(raw if type(raw) in (int, float) else None, bound, f"{FRAME} {key} {str(raw)[:SHOWN]!r}", notes)

    overhead = field("responses_duration_excl_engine_and_client_tool_time_ms", frame_ms)
    engine = field("engine_service_total_ms", frame_ms)
    ttft_key = "engine_service_ttft_total_ms" if "engine_service_ttft_total_ms" in metrics else "engine_iapi_ttft_total_ms"
    out["upstream_engine_ttft_ms"] = field(ttft_key, first_token_ms)
    out["upstream_overhead_ms"] = overhead
    if overhead is not None and engine is not None and (
            total := _kept(overhead + engine, frame_ms, f"{FRAME} overhead + engine {overhead + engine:.1f} ms", notes)
    ) is not None:
        out["upstream_processing_ms"], out["upstream_processing_source"] = total, FRAME


def _number(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None


def _kept(value: float | None, bound: float | None, what: str, notes: list[str]) -> float | None:
    """`value` when `_checked` keeps it, else None, and a note saying `what` and why."""
    checked = _checked(value, bound)
    if isinstance(checked, str):
        notes.append(f"{what} {checked}")
        return None
    return checked


def _checked(value: float | None, bound: float | None) -> float | str:
    """`value` as a float, or why it is not kept."""
    if value is None:
        return "is not a number"
    if not math.isfinite(value):
        return "is not finite"
    if value < 0:
        return "is negative"
    if bound is None:
        return "has no span measured by llmtap to check it against"
    if value > bound:
        return f"is more than the {bound:.1f} ms llmtap measured"
    return float(value)
