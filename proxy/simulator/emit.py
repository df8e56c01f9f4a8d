"""Writing a stream: framing, gzip, token pacing and injected faults.

The API modules build event objects; an Emitter frames each one, writes it as
its own chunk (or WebSocket frame), paces the output-carrying ones on a
TokenClock, and injects the configured mid-stream error or disconnect.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from proxy.simulator.pacing import TokenClock

Event = dict[str, Any]
Send = Callable[[bytes], Awaitable[None]]


class Stopped(Exception):
    """The stream ended early on purpose: an injected error or disconnect."""


def sse_named(event: Event) -> bytes:
    """`event: <type>` + `data:` (Responses, Anthropic)."""
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def sse_data(event: Event) -> bytes:
    """A data-only SSE event (Chat Completions, Gemini)."""
    return b"data: " + orjson.dumps(event) + b"\n\n"


class JsonArrayFramer:
    """Gemini without alt=sse: one JSON array, written element by element."""

    def __init__(self) -> None:
        self._first = True

    def __call__(self, event: Event) -> bytes:
        prefix = b"[" if self._first else b",\r\n"
        self._first = False
        return prefix + orjson.dumps(event)

    def close(self) -> bytes:
        return b"[]" if self._first else b"]"


class HttpSink:
    """Writes to a prepared StreamResponse, gzip-compressing each write on its own."""

    def __init__(self, resp: web.StreamResponse, gzip: bool) -> None:
        self._resp = resp
        self._gzip = zlib.compressobj(wbits=31) if gzip else None

    async def send(self, data: bytes) -> None:
        if self._gzip is not None:
            data = self._gzip.compress(data) + self._gzip.flush(zlib.Z_SYNC_FLUSH)
        await self._resp.write(data)

    async def close(self) -> None:
        if self._gzip is not None:
            await self._resp.write(self._gzip.flush())
        await self._resp.write_eof()


class Emitter:
    """One stream's writer.

    delta() is for output-carrying events, one per token; event() writes at
    once. With stream_error the API's error events replace delta number
    total//2; with disconnect_after N the connection is aborted right after
    the N-th delta (or before the first when N is 0).
    """

    def __init__(
        self,
        send: Send,
        frame: Callable[[Event], bytes],
        clock: TokenClock,
        abort: Callable[[], None],
        *,
        total_deltas: int,
        stream_error: bool,
        disconnect_after: int | None,
    ) -> None:
        self._send = send
        self._frame = frame
        self._clock = clock
        self._abort = abort
        self._error_at = total_deltas // 2 if stream_error else None
        self._disconnect_after = disconnect_after
        self.error_events: Callable[[], list[Event]] = list
        self.sent = 0
        self.first_at: float | None = None  # when the first output event was written (perf_counter)
        self.aborted = False

    async def event(self, event: Event) -> None:
        await self._send(self._frame(event))

    async def raw(self, data: bytes) -> None:
        await self._send(data)

    async def delta(self, event: Event, lead: Event | None = None, tokens: int = 1) -> None:
        """Write an output event when its last token is due (most events carry
        one token); `lead`, e.g. a tool call's name fragment, goes out just
        before it and is not counted."""
        await self.checkpoint()
        await self._clock.all_tokens(max(1, tokens))
        if lead is not None:
            await self.event(lead)
        await self.event(event)
        if self.first_at is None:
            self.first_at = time.perf_counter()
        self.sent += 1
        if self.sent == self._disconnect_after:
            self._disconnect()

    async def checkpoint(self) -> None:
        """Inject a fault due before the next delta; call it once more before the terminal events."""
        if self.sent == self._disconnect_after:
            self._disconnect()
        if self.sent == self._error_at:
            await self._clock.next_token()
            for event in self.error_events():
                await self.event(event)
            raise Stopped

    def _disconnect(self) -> None:
        self.aborted = True
        self._abort()
        raise Stopped
