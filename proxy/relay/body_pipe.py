"""The response body's lean path: from the upstream connection's parser straight to the client.

aiohttp's client hands each piece of a response body to the response's `StreamReader`
(`feed_data`, called by the HTTP parser inside the upstream connection's `data_received`); the
usual way to relay it is a task that awaits `readany()` and then `StreamResponse.write()`: a
future, a task wake-up and a chain of coroutines per piece. `BodyPipe` takes the reader's place
instead (its class is switched to `_PipedReader`, same slots, so the parser's calls reach the
pipe), and in that same callback:

1. writes the piece to the client's transport, HTTP/1.1 chunk framing when the response is chunked;
2. gives the meter its copy, stamped as it arrived (`perf_counter_ns`, before the write);
3. notes the time, for the upstream's idle timeout (checked once per period, not re-armed per read);
4. when the client's transport is full (the server protocol's `writing_paused`), pauses reading
   the upstream connection, and resumes it once the client has drained (backpressure as before:
   a client that stops reading stops the upstream).

The relay's task only waits for the end: `wait_eof()` returns at the body's end, or raises what
ended it (the upstream's read timeout, a broken body, or `ClientGone` when the client left).
Everything not on this path (status, headers, the request, pooling, timeouts) stays aiohttp's.

This is the `body_pipe` fast path (proxy/relay/fast_paths.py): it runs only where the start-up probe
finds aiohttp's reader, connection and writer shaped as here, for a reader of exactly that class;
else reverse.py's `_read_and_write` relays the body through the public API.
"""

from __future__ import annotations

import asyncio
from time import perf_counter_ns
from typing import TYPE_CHECKING

from aiohttp import ServerTimeoutError, StreamReader, web

if TYPE_CHECKING:
    from proxy.meter.meter import Meter
    from proxy.relay.key_mask import KeyMask

# A piece at least this big is written as its own buffer (writelines) rather than joined with its
# chunk framing: aiohttp's own threshold for the same choice.
JOIN_BELOW = 16 * 1024


class ClientGone(ConnectionResetError):
    """The client's connection closed while the body was being relayed."""


class _PipedReader(StreamReader):
    """A `StreamReader` whose body pieces go to its `BodyPipe` instead of its buffer."""

    __slots__ = ()

    def feed_data(self, data: bytes, size: int = 0) -> bool:
        if data:
            PIPES[self].piece(data)
        return False

    # The parser marks HTTP chunk boundaries for `readchunk()`, which nothing calls on a piped body.
    def begin_http_chunk_receiving(self) -> None:
        pass

    def end_http_chunk_receiving(self) -> None:
        pass


PIPES: dict[StreamReader, BodyPipe] = {}


def give_meter(meter: Meter, data: bytes, t_ns: int) -> None:
    """The meter's copy of a piece already written to the client (measuring never breaks traffic)."""
    try:
        meter.on_chunk(data, t_ns)
    except Exception as exc:
        meter.mark_broken(f"meter: {type(exc).__name__}: {exc}")


class BodyPipe:
    __slots__ = ("_content", "_transport", "_protocol", "_writer", "_upstream", "_chunked", "_meter", "_drain",
                 "_idle_s", "_last", "_timer", "gone", "_mask")

    def __init__(self, request: web.Request, content: StreamReader, meter: Meter | None,
                 mask: KeyMask | None = None) -> None:
        self._content = content
        self._transport = request.transport
        self._protocol = request.protocol
        self._writer = request.writer
        self._upstream = content._protocol
        self._chunked = self._writer.chunked  # type: ignore[attr-defined]
        self._meter = meter
        self._drain: asyncio.Task[None] | None = None
        self._idle_s: float = 0
        self._last = 0  # perf_counter_ns of the last piece
        self._timer: asyncio.TimerHandle | None = None
        self.gone = False
        self._mask = mask  # the injected key, masked in what goes back (proxy/relay/key_mask.py)

    async def relay(self) -> None:
        """The whole body, to the client: what the reader holds already, then each piece as it comes."""
        content = self._content
        if (broken := content.exception()) is not None:  # the upstream failed as its headers came
            raise broken
        if content._buffer:
            self.piece(content.read_nowait())
        if self.gone:
            raise ClientGone("the client closed the connection mid-response")
        PIPES[content] = self
        content.__class__ = _PipedReader
        self._watch_idle()
        try:
            await content.wait_eof()
        finally:
            content.__class__ = StreamReader
            del PIPES[content]
            if self._drain is not None:
                self._drain.cancel()
            if self._timer is not None:
                self._timer.cancel()
        if self._mask is not None and (tail := self._mask.flush()) and not self.gone and self._send(tail):
            if self._meter is not None:
                give_meter(self._meter, tail, perf_counter_ns())
        if self.gone:
            raise ClientGone

    def piece(self, data: bytes) -> None:
        """One piece of the body, from inside the upstream connection's `data_received`."""
        self._last = t = perf_counter_ns()
        if self.gone:
            return
        if self._mask is not None and not (data := self._mask.piece(data)):
            return
        if not self._send(data):
            return
        if self._meter is not None:
            give_meter(self._meter, data, t)

    def _send(self, data: bytes) -> bool:
        """`data` to the client's transport (False: the client is gone)."""
        transport = self._transport
        if transport is None or transport.is_closing():
            self._client_gone()
            return False
        if not self._chunked:
            transport.write(data)
        elif len(data) < JOIN_BELOW:
            transport.write(b"%x\r\n%b\r\n" % (len(data), data))
        else:
            transport.writelines((b"%x\r\n" % len(data), data, b"\r\n"))
        if self._protocol.writing_paused and self._drain is None:
            self._hold_upstream()
        return True

    def _watch_idle(self) -> None:
        """The upstream's idle timeout (`serve --idle-timeout`), checked once per period instead of
        aiohttp's timer re-armed on every read (a timer cancelled and made per chunk)."""
        idle_s = self._upstream.read_timeout  # type: ignore[attr-defined]  # a ResponseHandler
        if not idle_s:
            return
        self._upstream.read_timeout = None  # type: ignore[attr-defined]  # this response only: aiohttp sets it again for the next
        self._idle_s, self._last = idle_s, perf_counter_ns()
        self._timer = asyncio.get_running_loop().call_later(idle_s, self._check_idle)

    def _check_idle(self) -> None:
        silent_s = (perf_counter_ns() - self._last) / 1e9
        if self._drain is not None:  # paused for the client: the upstream is not the one silent
            self._last, silent_s = perf_counter_ns(), 0.0
        if silent_s >= self._idle_s * 0.999:
            self._timer = None
            self._content.set_exception(ServerTimeoutError("Timeout on reading data from socket"))
            return
        self._timer = asyncio.get_running_loop().call_later(self._idle_s - silent_s, self._check_idle)

    def _hold_upstream(self) -> None:
        """The client reads slower than the upstream sends: stop reading the upstream until it drains."""
        self._upstream.pause_reading()
        self._drain = asyncio.ensure_future(self._resume_when_drained())

    async def _resume_when_drained(self) -> None:
        try:
            await self._writer.drain()
        except ConnectionError:
            self._client_gone()
            return
        finally:
            self._drain = None
        if not self.gone:
            self._upstream.resume_reading()

    def _client_gone(self) -> None:
        """Stop relaying and wake the relay's task: the row says the client disconnected."""
        self.gone = True
        content = self._content
        if not content.is_eof() and content.exception() is None:
            content.set_exception(ClientGone("the client closed the connection mid-response"))
