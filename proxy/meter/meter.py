"""One request's marks and metrics, from a copy of what the relay moved.

The relay tells the meter what happened, as it happens, with named events (each method's
docstring says exactly when it fires; mitmproxy's hook style):

- `on_request_read(body)`: the request's body has been read whole;
- `on_upstream_sent(t)`: the request was handed to the upstream connection pool;
- `response_started(status, headers, t)`: the upstream's status and headers arrived;
- `on_chunk(data, t)`: one read of the response body, already written to the client
  (`on_message(payload, t)` for one upstream frame of a WebSocket response);
- `on_response_end(t)`: the response's last bytes were handed to the client's connection;
- `on_answered_locally(status)`: llmtap answered itself with `status` (a refusal, an upstream it
  could not reach), nothing came from upstream;
- `on_websocket_turn(frame, t, done)`: a client's `response.create` opened a response on a
  WebSocket; the meter calls `done()` when its frames end the turn (`turn_done`, the one event the
  meter raises back).

The request ends with `proxy.record.recorder.Recorder.end(meter, outcome, error)`, which calls `finish`
once to build the row. Every timestamp is `time.perf_counter_ns()` taken by the relay right
after the I/O; every duration in the row is milliseconds since `received` (the request's arrival
at the proxy). The meter does no I/O: it is testable without a socket.

The meter never raises into the relay: the relay wraps each call, and a
failure here marks the row (`parse_error`) instead of touching traffic.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NamedTuple, Protocol

from multidict import CIMultiDictProxy

from proxy.meter.clients import tool_from_headers
from proxy.meter.connection_marks import ConnectionMarks
from proxy.meter.conversations import inferred_session
from proxy.meter.decode import DecodeError, StreamDecoder
from proxy.meter.dialects.base import Dialect, QuickReader
from proxy.meter.dialects.detect import detect_dialect
from proxy.common import bounds, clocks
from proxy.common.chunk_rows import ChunkRows
from proxy.meter import ratelimits, upstream_timing
from proxy.meter.fingerprint import credential_kind, key_fingerprint, secret_fingerprint
from proxy.common.stats import GapHistogram, gaps_ms
from proxy.meter.redact import redact, request_secrets
from proxy.meter.request_info import RequestInfo, parse_request
from proxy.common.schema import ERROR_MESSAGE_MAX, Outcome
from proxy.meter.sse import SSEParser

MAX_JSON_BODY = 16 * 1024 * 1024  # non-streaming bodies parsed for usage up to this size
# One SSE event held for parsing at most: a larger one is relayed but not measured (the row says so).
MAX_SSE_EVENT = 8 * 1024 * 1024
PENDING_READS = 32  # reads kept before they are parsed together (Meter.drain; no timer: proxy/common/latency.py)
PENDING_BYTES = 256 * 1024
# Nor kept longer than this (parsed with the first read after it): what a live view (`snapshot`,
# ticking every 250 ms) shows of a slow stream is that fresh, whoever watches.
PENDING_NS = 250_000_000
# Output events kept one by one per request (their times, sizes and kinds: some 90 bytes each, and a
# chunk row of about 130 bytes at the end). A stream with more keeps running figures past the cap
# (`Meter._fold`): per-request memory has a ceiling however long the stream runs.
MAX_EVENTS_KEPT = 20_000


IDENTITY = StreamDecoder(None)  # shared: an identity body is fed as is, never through the decoder
_IDS = random.Random(os.urandom(32))  # seeded once per process (and again in a forked child)
os.register_at_fork(after_in_child=lambda: _IDS.seed(os.urandom(32)))


class ResponseTap(Protocol):
    """A copy of the response as the meter reads it (`--capture-bodies`: proxy/meter/capture.py), given
    to the meter at construction. The meter calls it; it never changes what the meter measures."""

    def on_body(self, data: bytes) -> None:
        """Decoded bytes of the response body, in order, as the meter parses them: a stream's, or a
        whole body's (the part the meter keeps to parse, up to MAX_JSON_BODY)."""

    def on_frame(self, payload: bytes) -> None:
        """One WebSocket text frame from the upstream, after the meter read it."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A request in flight as its meter has read it so far (`Meter.snapshot`: the live feed's view).
    Its figures are those of the meter's last parse: taking one parses nothing, so a viewer never
    changes when the meter parses (a read waits at most PENDING_NS for it, viewer or not)."""

    id: str
    method: str
    path: str
    status: int | None
    received: int  # the arrival, perf_counter_ns
    request_read: bool  # the request's body is read whole: `Meter.request_labels` has its model and session
    first_output: int | None  # the first output event (perf_counter_ns), None before one
    output_events: int
    tokens: int  # output tokens so far: the upstream's count where it says more than the text shows, else chars / 4


class RequestLabels(NamedTuple):
    """What a request is, for a live view: the model asked for, the tool and the session."""

    model: str | None
    tool: str | None
    session_id: str | None


def _notes(*notes: str | None) -> str | None:
    """The parse_error column: the notes given, in order, `; `-separated (None: none)."""
    text = None
    for note in notes:
        if note is not None:
            text = f"{text}; {note}" if text else note
    return text


def next_id() -> str:
    """A random 32-hex-digit request id (128 bits, as unique across processes as a UUID4) without a
    syscall per request. Its first 8 digits tell rows apart: `llmtap show` takes any unique prefix."""
    return f"{_IDS.getrandbits(128):032x}"


class Meter:
    """Marks named after the moments they record; docs/columns.md defines the row's columns."""

    __slots__ = (  # one per request: fixed attributes are cheaper to set than a dict's
        "_body", "_body_len", "_decoder", "_gaps", "_last_event", "_over", "_pending", "_pending_bytes",
        "_quick", "_sse", "broken", "captured", "chars", "connection",
        "credential", "dialect", "first_byte", "first_text", "headers", "id", "is_stream", "kinds", "limits",
        "method", "partial", "path", "query", "received", "request_body", "request_bytes",
        "response_bytes", "response_end", "retry_after", "route", "sizes", "started_at", "status", "tag", "times",
        "upstream_headers", "upstream_host", "upstream_sent",
        "_tap", "_turn_done",  # the constructor's `tap`, on_websocket_turn's `done`
        "stated", "timing_frame",  # what the upstream says it spent (proxy/meter/upstream_timing.py)
    )

    def __init__(
        self,
        *,
        received_ns: int,
        method: str,
        path: str,
        query: dict[str, str],
        headers: CIMultiDictProxy[str],
        route: str,
        upstream_host: str,
        tag: str | None,
        credential: str | None = None,
        tap: ResponseTap | None = None,
    ) -> None:
        """`credential`: the upstream key llmtap injects for this request's route, if any (its
        fingerprint goes in the row instead of the client's). `tap`: what copies the response
        (`ResponseTap`), if anything does."""
        self.id = next_id()
        # the arrival's wall-clock time: the meter is made later, once the handler runs (a busy loop's while)
        self.started_at = clocks.wall_of(received_ns)
        self.received = received_ns
        self.method, self.path, self.query, self.headers = method, path, query, headers
        self.route, self.upstream_host, self.tag = route, upstream_host, tag
        self.dialect: Dialect = detect_dialect(path)()
        self._quick: QuickReader | None = None  # an event stream's (response_started), until it gives up (_events)
        self.request_body = b""
        self.request_bytes: int | None = None
        self.credential = credential  # an injected upstream key: fingerprinted instead of the client's
        self.upstream_sent: int | None = None
        self.connection: ConnectionMarks | None = None  # stamped by the upstream connector's hooks (conn_timing.py)
        self.upstream_headers: int | None = None
        self.first_byte: int | None = None
        self.status: int | None = None
        self.retry_after: str | None = None
        self.limits: dict[str, str] | None = None  # the response's rate-limit headers (proxy/meter/ratelimits.py)
        self.stated: upstream_timing.Stated | None = None  # its stated processing time, as sent
        self.timing_frame: tuple[bytes, int] | None = None  # a WebSocket turn's timing frame, and its arrival
        self.response_bytes = 0
        self.response_end: int | None = None  # the last bytes handed to the client (before any wait to drain)
        self.is_stream = False
        self._decoder: StreamDecoder | None = None
        self._sse: SSEParser | None = None
        self._body: list[bytes] | None = None
        self._body_len = 0
        self._pending: list[tuple[bytes, int]] = []  # reads not parsed yet, with their arrival times
        self._pending_bytes = 0
        self.times: list[int] = []  # arrival of each output event
        self.sizes: list[int] = []
        self.kinds: list[str] = []
        self._over = 0  # output events past MAX_EVENTS_KEPT, folded into the next two
        self._gaps: GapHistogram | None = None  # every gap between output events, once over the cap
        self._last_event: tuple[int, int, str] | None = None  # the last event past the cap: time, size, kind
        self.first_text: int | None = None
        self.chars = 0
        self.broken: str | None = None
        self.partial = False  # the meter skipped part of the response: a missing terminal event proves nothing
        self.captured: tuple[Any, ...] | None = None  # the bodies row, with --capture-bodies (proxy/meter/capture.py)
        self._tap = tap
        self._turn_done: Callable[[], None] | None = None  # on_websocket_turn's `done`

    # -- the relay's observation points --------------------------------------

    def on_request_read(self, body: bytes) -> None:
        """The request's body has been read whole, before anything goes upstream."""
        self.request_body = body
        self.request_bytes = len(body)

    def on_upstream_sent(self, t_ns: int, tls: bool = False) -> ConnectionMarks:
        """The request was handed to the upstream connection pool: llmtap's own part ends here.
        Returns the marks its connection's moments go in (proxy/relay/conn_timing.py stamps them;
        `tls`: an https upstream)."""
        self.upstream_sent = t_ns
        self.connection = ConnectionMarks(tls)
        return self.connection

    def on_response_end(self, t_ns: int) -> None:
        """The response's last bytes (a chunked body's last chunk) were handed to the client's
        connection: E2E ends here, not after a wait for the client to drain them (that wait, and the
        loop turn after it, are the client's reading and llmtap's, not the response's)."""
        self.response_end = t_ns

    def on_answered_locally(self, status: int) -> None:
        """llmtap answered the request itself with `status`: a refusal (no route, a path that climbs,
        the client key missing, a body too large, ...), or an upstream (or the forward proxy to it)
        that could not be reached or did not answer in time. No response came from upstream."""
        self.status = status

    def on_websocket_turn(self, frame: bytes, t_ns: int, done: Callable[[], None] | None = None) -> None:
        """A client's `response.create` frame opened a response on a WebSocket (already upgraded:
        status 101, and every response on it streams). `done` is the turn's end as the meter reads
        it, called once from `on_message`: at the upstream's terminal frame (the dialect's
        `terminal`: completed, failed, incomplete, error), or at the frame the meter broke on, since
        a broken meter can no longer tell the end (its row ends there and says why, `parse_error`).
        The relay ends the turn there; the connection's close ends one that is never done."""
        self._turn_done = done
        self.on_request_read(frame)
        self.status, self.is_stream = 101, True
        self.upstream_sent = self.upstream_headers = t_ns
        self.connection = ConnectionMarks.open_already(t_ns)  # the WebSocket's, open before this turn

    def response_started(self, status: int, headers: CIMultiDictProxy[str], t_ns: int) -> None:
        """The upstream's status and headers arrived (before any of the body is written to the client)."""
        self.upstream_headers = t_ns
        self.status = status
        self.retry_after = headers.get("retry-after")
        self.limits = ratelimits.raw(headers)  # None unless a family of rate-limit headers is there
        self.stated = upstream_timing.from_headers(headers)
        if status >= 400 and self.retry_after is None and (ms := headers.get("retry-after-ms")) is not None:
            self.limits = {**(self.limits or {}), "retry-after-ms": ms}
        encoding = headers.get("content-encoding")
        try:
            self._decoder = StreamDecoder(encoding) if encoding else IDENTITY
        except DecodeError as exc:
            self.mark_broken(str(exc))
        ctype = headers.get("content-type", "")
        if ctype.startswith("text/event-stream"):
            self.is_stream = True
            self._sse = SSEParser(MAX_SSE_EVENT)
            self._quick = None if self.dialect.quick is None else QuickReader(self.dialect.quick)
        else:
            self._body = []

    def on_chunk(self, data: bytes, t_ns: int) -> None:
        """One read from the upstream, already written to the client: kept with its arrival
        time, and parsed with the next reads (see `drain`)."""
        if self.first_byte is None:
            self.first_byte = t_ns
        size = len(data)
        self.response_bytes += size
        if self._decoder is None:
            return
        pending = self._pending
        pending.append((data, t_ns))
        self._pending_bytes += size
        if len(pending) >= PENDING_READS or self._pending_bytes >= PENDING_BYTES or t_ns - pending[0][1] >= PENDING_NS:
            self.drain()

    def drain(self) -> None:
        """Parse the reads kept so far, each event timed by the read that completed it.

        Parsing reads in batches costs about a quarter less than parsing each as it comes (timed
        inside serve): between two reads of one stream the loop serves every other stream, and
        the parser's code and data go cold.
        Never raises: a failure marks the row and stops measuring the body."""
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        try:
            decoder, sse = self._decoder, self._sse
            if decoder is not None and decoder.identity and sse is not None and self._tap is None:
                self._events(sse, pending)  # a plain stream: the common case, in one loop
                return
            for data, t_ns in pending:
                decoder = self._decoder
                if decoder is None:
                    return
                if decoder.identity:
                    self._feed(data, t_ns)
                else:
                    self._feed_decoded(decoder, data, t_ns)
        except Exception as exc:
            self._decoder = None
            self.partial = True
            self.mark_broken(f"meter: {type(exc).__name__}: {exc}")

    def _events(self, sse: SSEParser, reads: Iterable[tuple[bytes, int]]) -> None:
        """The output events of some reads of a stream, each timed by its read; every lookup hoisted
        out of the loop (a plain stream's reads all come here at once, see `drain`).

        A read of whole events (it ends with a blank line and the parser is between events, `idle`) is
        split at its blank lines, each block one event's lines, and the stream's `QuickReader` (if its
        dialect has a quick pattern) asked for each block's output event, no dialect code run; a block
        it does not read is fed to the parser (idle: the block is read as in the whole read), and so is
        any other read whole. Either way each event comes out as feeding every read would make it."""
        dialect, times, sizes, kinds = self.dialect, self.times, self.sizes, self.kinds
        feed, limit = sse.feed, sse.max_event_bytes
        chars, first_text = 0, self.first_text
        before, missed, fed = len(times), 0, 0  # output events so far; new ones the pattern missed, not tried
        idle = sse.idle  # a property: read again only when the parser is fed
        try:
            for data, t_ns in reads:
                if (quick := self._quick) is not None and idle and data[-2:] == b"\n\n" and len(data) <= limit:
                    for block in data[:-2].split(b"\n\n"):
                        if (event := quick.event(block)) is not None:
                            kind, visible, size, n, model = event
                            if model:
                                dialect.response_model = model
                            times.append(t_ns)
                            sizes.append(size)
                            kinds.append(kind)
                            chars += n
                            if visible and first_text is None:
                                first_text = t_ns
                            continue
                        found, n, shown = self._parsed(feed(block + b"\n\n"), t_ns)
                        idle, missed, chars = sse.idle, missed + found, chars + n
                        if first_text is None:
                            first_text = shown
                        if missed and quick.gives_up(missed, len(times) - before - missed - fed):
                            self._quick = None  # the next reads are fed whole
                    continue
                found, n, shown = self._parsed(feed(data), t_ns)
                idle, fed, chars = quick is not None and sse.idle, fed + found, chars + n
                if first_text is None:
                    first_text = shown
        finally:
            self.chars += chars
            self.first_text = first_text
            if self._quick is not None:
                self._quick.settle(missed, len(times) - before - missed - fed)
            if len(times) > MAX_EVENTS_KEPT:  # once per batch of reads, never per event
                self._fold()

    def _parsed(self, events: list[tuple[str | None, bytes]], t_ns: int) -> tuple[int, int, int | None]:
        """The output events among some parsed SSE events (the dialect reads each), all timed `t_ns`:
        how many, their characters, and `t_ns` if one of them was visible text (else None)."""
        dialect = self.dialect
        on_event, times, sizes, kinds = dialect.on_event, self.times, self.sizes, self.kinds
        found = chars = 0
        shown = None
        for event, payload in events:
            delta = on_event(payload, event)
            if delta is not None:
                kind, visible, n = delta
                times.append(t_ns)
                sizes.append(len(payload))
                kinds.append(kind)
                found += 1
                chars += n
                if visible:
                    shown = t_ns
        if dialect.unstamped:  # a tool call's block ended in these events
            dialect.stamp(t_ns)
        return found, chars, shown

    def _feed(self, data: bytes, t_ns: int) -> None:
        if self._sse is not None:
            if self._tap is not None:
                self._tap.on_body(data)
            self._events(self._sse, ((data, t_ns),))
        elif self._body is not None and self._body_len < MAX_JSON_BODY:
            if self._tap is not None:
                self._tap.on_body(data)
            self._body.append(data)
            self._body_len += len(data)

    def _feed_decoded(self, decoder: StreamDecoder, data: bytes, t_ns: int) -> None:
        """A compressed read: its decoded copy, in bounded pieces, up to the decoder's limit."""
        try:
            for piece in decoder.pieces(data):
                self._feed(piece, t_ns)
        except Exception as exc:  # a corrupt body: stop decoding it, keep relaying it
            self._decoder = None
            self.partial = True
            self.mark_broken(f"cannot decode the {decoder.encoding} body: {type(exc).__name__}: {exc}")
            return
        if decoder.exhausted:
            self._decoder = None
            self.partial = True
            self.mark_broken("decoded body over the measuring limit; metrics partial")

    def on_message(self, payload: bytes, t_ns: int) -> None:
        """One WebSocket text frame from the upstream (Responses over WebSocket). Never raises: a
        failure marks the row and ends the turn (`on_websocket_turn`'s `done`)."""
        try:
            if self.first_byte is None:
                self.first_byte = t_ns
            self.response_bytes += len(payload)
            delta = self.dialect.on_event(payload, None)
            if self.dialect.unstamped:
                self.dialect.stamp(t_ns)
            if delta is not None:
                kind, visible, chars = delta
                self._output(kind, visible, chars, len(payload), t_ns)
            elif upstream_timing.is_timing_frame(payload):
                self.timing_frame = (payload, t_ns)
            if self._tap is not None:
                self._tap.on_frame(payload)
        except Exception as exc:
            self.partial = True  # the rest of the turn goes unread: a missing terminal event proves nothing
            self.mark_broken(f"meter: {type(exc).__name__}: {exc}")
            self._end_turn()
            return
        if self.dialect.terminal:
            self._end_turn()

    def _end_turn(self) -> None:
        done, self._turn_done = self._turn_done, None
        if done is not None:
            done()

    def _output(self, kind: str, visible: bool, chars: int, size: int, t_ns: int) -> None:
        self.times.append(t_ns)
        self.sizes.append(size)
        self.kinds.append(kind)
        self.chars += chars
        if visible and self.first_text is None:
            self.first_text = t_ns
        if len(self.times) > MAX_EVENTS_KEPT:
            self._fold()

    @property
    def output_events(self) -> int:
        """Output events so far, those past the cap included (`times` keeps at most MAX_EVENTS_KEPT)."""
        return len(self.times) + self._over

    def _fold(self) -> None:
        """Over MAX_EVENTS_KEPT output events: the first MAX_EVENTS_KEPT stay one by one (their chunk
        rows), the ones after become running figures: how many, the last one (its time, size and kind,
        for its chunk row) and every gap in a histogram (`GapHistogram`: exact maximum, p50 and p99
        within 3%). Called after a batch of reads, so the lists overshoot the cap by one batch at most."""
        times, cap = self.times, MAX_EVENTS_KEPT
        gaps = self._gaps
        if gaps is None:  # the first time: the kept events' gaps go in too, the figures cover them all
            gaps = self._gaps = GapHistogram()
            gaps.add(times[0], times[1:cap])
            prev = times[cap - 1]
        else:
            prev = self._last_event[0]  # type: ignore[index]
        gaps.add(prev, times[cap:])
        self._over += len(times) - cap
        self._last_event = (times[-1], self.sizes[-1], self.kinds[-1])
        del times[cap:], self.sizes[cap:], self.kinds[cap:]

    def mark_broken(self, message: str) -> None:
        if self.broken is None:
            self.broken = message[:200]

    # -- in flight --------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """How far the request got, as read so far (`Snapshot`); parses nothing."""
        times = self.times
        tokens = 0  # before the first output event (Anthropic reports 1 output token at message_start)
        if times:
            tokens = max(self.dialect.usage.output_tokens or 0, math.ceil(self.chars / 4))
        return Snapshot(self.id, self.method, self.path, self.status, self.received, self.request_bytes is not None,
                        times[0] if times else None, len(times) + self._over, tokens)

    def request_labels(self) -> RequestLabels:
        """The request's model, tool and session: the tool from its headers (aider's from its body), the rest
        from its body once read whole (`Snapshot.request_read`), which this parses each call (callers keep it)."""
        tool = tool_from_headers(self.headers)
        if self.request_bytes is None:
            return RequestLabels(None, tool, None)
        info = parse_request(self.path, self.headers, self.request_body, method=self.method)
        return RequestLabels(info.request_model, info.client.tool, info.session_id)  # aider: from its prompt

    # -- the row ----------------------------------------------------------------

    def finish(
        self, outcome: Outcome | None, end_ns: int, error: tuple[str, str] | None = None
    ) -> tuple[dict[str, Any], ChunkRows]:
        """The request's row and its chunk rows. `outcome` None: decide from what was seen."""
        self._read_last()
        info = parse_request(self.path, self.headers, self.request_body, method=self.method)
        self.request_body = b""
        row = self._row(info, outcome, end_ns, error)
        if row["session_id"] is None:
            row["session_id"] = inferred_session(row, info.head)
        bounds.text_checked(row)
        return row, self._chunk_rows()

    def _read_last(self) -> None:
        """Parse what is still kept (the last reads, a whole body), and say what was too large to read."""
        self.drain()
        if self._body:
            self._parse_body()
        if self._sse is not None and self._sse.oversized:
            self.partial = True
            self.mark_broken(f"{self._sse.oversized} SSE event(s) over {MAX_SSE_EVENT >> 20} MiB relayed but not measured")

    def _row(self, info: RequestInfo, outcome: Outcome | None, end_ns: int,
             error: tuple[str, str] | None) -> dict[str, Any]:
        """The request's row, one presized dict in schema order (schema.REQUEST_COLUMNS; docs/columns.md
        defines each): `proxy.record.batch` writes its values in that order."""
        d, h, r, times = self.dialect, self.headers, self.received, self.times
        if error is None and d.error_type is not None:
            error = (d.error_type, d.error_message or "")
        sent, headers, first_byte, first_text = self.upstream_sent, self.upstream_headers, self.first_byte, self.first_text
        done = self.response_end if self.response_end is not None and self.response_end <= end_ns else end_ns
        ttft, e2e = (times[0] - r) / 1e6 if times else None, (done - r) / 1e6
        last, (gap_p50, gap_p99, gap_max), capped = self._last_and_gaps()
        conn = self.connection
        pool_wait, dns, connect, tls, upstream_wait, proxy_wait = (None,) * 6 if conn is None else conn.parts(sent, headers)
        told_timing, timing_note = self._stated_timing(upstream_wait)
        limits = dict(self._limits())
        told, dropped = self._told(info, limits)
        out, source = self._output_tokens(told["output_tokens"])
        events = len(times) + self._over
        return {
            "id": self.id,
            "started_at": self.started_at,
            "route": self.route,
            "upstream_host": self.upstream_host,
            "method": self.method,
            "path": self.path,
            "dialect": d.name,
            "tool": info.client.tool,
            "user_agent": h.get("user-agent"),
            "tag": self.tag,
            "key_fingerprint": secret_fingerprint(self.credential) if self.credential else key_fingerprint(h, self.query),
            "session_id": info.session_id,
            "request_model": info.request_model,
            "stream": True if self.is_stream else info.stream,  # what the wire did (SSE, WebSocket), else what was asked
            "max_tokens": told["max_tokens"],
            "message_count": info.message_count,
            "request_bytes": self.request_bytes,
            "request_parse_error": self._clean(info.request_parse_error),
            "status": self.status,
            "response_model": d.response_model,
            "finish_reason": d.finish_reason,
            "response_bytes": self.response_bytes,
            "error_type": error[0] if error else None,
            "error_message": self._clean(error[1])[:ERROR_MESSAGE_MAX] if error else None,  # type: ignore[index]
            "outcome": str(outcome or self._outcome()),
            "parse_error": self._clean(_notes(self.broken or d.parse_error, capped, timing_note, dropped)),
            "empty_choices_chunks": d.empty_choices_chunks,
            "retry_after": self.retry_after,
            "proxy_overhead_ms": None if sent is None else (sent - r) / 1e6,
            "upstream_headers_ms": None if headers is None else (headers - r) / 1e6,
            "first_byte_ms": None if first_byte is None else (first_byte - r) / 1e6,
            "ttft_ms": ttft,
            "first_text_ms": None if first_text is None else (first_text - r) / 1e6,
            "last_token_ms": last,
            "e2e_ms": e2e,
            "tpot_ms": (last - ttft) / (out - 1) if out is not None and out > 1 and events > 1 else None,  # type: ignore[operator]
            "gap_p50_ms": gap_p50,
            "gap_p99_ms": gap_p99,
            "gap_max_ms": gap_max,
            "output_events": events,
            "output_tokens_per_s": out * 1000 / e2e if out and e2e else None,
            "input_tokens": told["input_tokens"],
            "output_tokens": out,
            "cache_read_tokens": told["cache_read_tokens"],
            "cache_creation_tokens": told["cache_creation_tokens"],
            "reasoning_tokens": told["reasoning_tokens"],
            "tokens_source": source,
            "kind": info.kind,
            "connection_reused": None if conn is None else conn.reused,
            "pool_wait_ms": pool_wait,
            "dns_ms": dns,
            "connect_ms": connect,
            "tls_ms": tls,
            "upstream_wait_ms": upstream_wait,
            "headers_to_first_token_ms": (times[0] - headers) / 1e6 if times and headers is not None else None,
            "decode_ms": last - ttft if last is not None and ttft is not None else None,
            "credential_kind": "api_key" if self.credential else credential_kind(h, self.query),
            **limits,
            "tool_calls": self._tool_calls(done) if d.tool_calls else None,
            "tool_results": info.tool_results,
            "proxy_wait_ms": proxy_wait,
            "project": info.project,
            "tool_version": info.client.version,
            "tool_mode": info.client.mode,
            **told_timing,
        }

    def _last_and_gaps(self) -> tuple[float | None, tuple[float | None, float | None, float | None], str | None]:
        """The last output event (ms from arrival), the gaps between output events (p50, p99, max) and,
        past MAX_EVENTS_KEPT, the note saying they come from the running figures (`_fold`)."""
        r, times = self.received, self.times
        if self._over and self._last_event is not None and self._gaps is not None:
            capped = (f"over {len(times)} output events: chunk rows kept for the first {len(times)} and the last;"
                      " gap p50/p99 from a histogram (within 3%)")
            return (self._last_event[0] - r) / 1e6, self._gaps.quantiles_ms(), capped
        return (times[-1] - r) / 1e6 if times else None, gaps_ms(times), None

    def _told(self, info: RequestInfo, limits: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        """The token counts the request and the upstream told, checked with the rate-limit columns: numbers
        from outside enter the row here. What does not fit is dropped, and said (for parse_error)."""
        u = self.dialect.usage
        told = {"max_tokens": info.max_tokens, "input_tokens": u.input_tokens, "output_tokens": u.output_tokens,
                "cache_read_tokens": u.cache_read_tokens, "cache_creation_tokens": u.cache_creation_tokens,
                "reasoning_tokens": u.reasoning_tokens}
        return told, bounds.checked(told, limits)

    def _output_tokens(self, told: int | None) -> tuple[int | None, str | None]:
        """The output tokens and their source: as the upstream told, else estimated from the characters."""
        if told is None and self.chars:
            return math.ceil(self.chars / 4), "estimated"
        return told, "usage" if self.dialect.usage.seen() else None

    def _tool_calls(self, end_ns: int) -> list[dict[str, Any]]:
        """The `tool_calls` column: each call's id, name and when its block ended (ms from arrival); a
        whole body's calls end with it (`end_ns`, the response's end as e2e_ms has it), a stream's call
        whose block never ended has none."""
        r, whole = self.received, not self.is_stream
        return [{"id": call_id, "name": name,
                 "ended_ms": (ended - r) / 1e6 if ended > 0 else (end_ns - r) / 1e6 if whole else None}
                for call_id, name, ended in self.dialect.tool_calls or ()]

    def _stated_timing(self, wait_ms: float | None) -> tuple[dict[str, Any], str | None]:
        """The upstream's stated times, checked against the spans measured (proxy/meter/upstream_timing.py)."""
        frame, sent, times = self.timing_frame, self.upstream_sent, self.times
        if self.stated is None and frame is None:
            return upstream_timing.EMPTY, None
        frame_ms = None if frame is None or sent is None else (frame[1] - sent) / 1e6
        first_ms = (times[0] - sent) / 1e6 if times and sent is not None else None
        return upstream_timing.read(self.stated, frame and frame[0], wait_ms, frame_ms, first_ms)

    def _limits(self) -> dict[str, Any]:
        """The rate-limit columns (proxy/meter/ratelimits.py), resets given as durations counted from the
        wall-clock time the headers arrived."""
        found, retry = self.limits, self.retry_after
        if found is None and retry is None:
            return ratelimits.EMPTY
        at = self.started_at
        if self.upstream_headers is not None:
            at += timedelta(microseconds=(self.upstream_headers - self.received) / 1000)
        return ratelimits.parse(found, retry, (found or {}).get("retry-after-ms"), at)

    def _chunk_rows(self) -> ChunkRows:
        r, times = self.received, self.times
        offsets, sizes, kinds = [(t - r) / 1e6 for t in times], self.sizes, self.kinds  # the meter's own lists
        seqs: Sequence[int] = range(len(times))
        if self._last_event is not None:  # past the cap: the last event's row too, with its own seq
            t, size, kind = self._last_event
            seqs = [*seqs, len(times) + self._over - 1]
            offsets.append((t - r) / 1e6)
            sizes, kinds = [*sizes, size], [*kinds, kind]
        return ChunkRows(self.id, seqs, offsets, sizes, kinds)

    def secrets(self) -> list[str]:
        """The credentials this request carried (and an injected one): never to be written anywhere."""
        return request_secrets(self.headers, self.query, (self.credential,))

    def _clean(self, text: str | None) -> str | None:
        """Upstream error messages can echo a key back; messages of ours can hold a URL with one."""
        return redact(text, self.secrets()) if text else text

    def _outcome(self) -> Outcome:
        if self.status is not None and self.status >= 400:
            return Outcome.HTTP_ERROR
        if self.dialect.error_type is not None:
            return Outcome.STREAM_ERROR
        if self.is_stream and self.dialect.has_terminal_event and not self.dialect.terminal and not self.partial:
            return Outcome.STREAM_TRUNCATED
        return Outcome.OK

    def _parse_body(self) -> None:
        body = b"".join(self._body or ())
        self._body = None
        if self._body_len >= MAX_JSON_BODY:
            self.mark_broken("response body too large to parse for usage")
            return
        if body:
            self.dialect.on_body(body)
