"""When a request arrived: its first byte on the connection.

aiohttp starts a handler once it has parsed the request's headers, which at low load is a few
tenths of a millisecond after their first byte came in (more for a client that sends its headers
slowly). A measuring proxy's clock starts at the first byte, as the client's does (#21):
`Runner` is aiohttp's AppRunner whose connections stamp the first byte of each request they parse.
Checked against aiperf (benchmarks/ttft_accuracy.py --aiperf): on loopback the stamp comes 0.1 to
0.2 ms after the client's write(2) of the request; the rest of the difference is the client's own
time before that write, and the first token's way from llmtap back to it.

With the `kernel_stamps` fast path, the stamp is the kernel's receive time of the request's first
byte (proxy/relay/kernel_timing.py: while the connection waits for its next request, llmtap reads it
itself), so a request that waited for a busy loop is dated when it came and the wait counts in
`proxy_overhead_ms`; else the moment of the read (`data_received`) that brought it. Either is taken
for the first read while no request is half parsed and no body is still coming in, and kept with
the request's parsed message, so each request, pipelined ones included, finds its own (`take`); a
request pipelined behind another in the same read gets that read's moment.
"""

from __future__ import annotations

import asyncio
from collections import deque
from time import perf_counter_ns
from typing import Any

from aiohttp import StreamReader, web
from aiohttp.web import RequestHandler

from proxy.relay import kernel_timing
from proxy.relay.conn_limit import Gate


class _StampingHandler(RequestHandler):
    __slots__ = ("_kernel", "_first_ns", "_body", "_stamps", "_rx", "_next_ns")

    def __init__(self, manager: web.Server, kernel: bool, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._kernel = kernel  # the kernel_stamps fast path
        self._first_ns: int | None = None  # the first byte of a request not parsed yet
        self._body: StreamReader | None = None  # the body of the last request parsed, while it comes in
        self._stamps: deque[tuple[object, int]] = deque()  # (parsed message, its first byte), until taken
        self._rx: kernel_timing.RxStamp | None = None  # reads the next request's first bytes with the kernel's time
        self._next_ns: int | None = None  # the kernel's time of bytes waiting for the transport's next read

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        if self._kernel and kernel_timing.usable(transport):
            self._rx = rx = kernel_timing.RxStamp(transport, self.data_received, lambda: kernel_timing.held(self))
            self._next_ns = rx.peek()  # a request already waiting: the transport's first read takes it
            if self._next_ns is None:  # the transport starts reading after this returns (RxStamp.peek)
                asyncio.get_running_loop().call_soon(self._await_first)

    def _await_first(self) -> None:
        if self._rx is None or self._request_count or self._first_ns is not None:
            return  # the transport read first: that request has the read's moment
        self._next_ns = self._rx.peek()
        if self._next_ns is None:
            self._await_request()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._rx is not None:
            self._rx.close()
            self._rx = None
        super().connection_lost(exc)

    def _resume_transport_reading(self) -> None:
        # aiohttp resumes the transport as a handler reads the body (BaseProtocol.resume_reading);
        # while llmtap reads the next request itself, it resumes the transport once it has read.
        if self._rx is None or not self._rx.armed:
            super()._resume_transport_reading()

    def _await_request(self) -> None:
        """Nothing half parsed, no body coming: the next bytes begin a request, read them stamped."""
        rx = self._rx
        if rx is None or rx.armed or self._payload_parser is not None or self._upgraded:
            return
        if self._body is not None and self._body.is_eof():
            self._body = None
        if self._first_ns is None and self._body is None:
            rx.arm()

    def data_received(self, data: bytes) -> None:
        if self._payload_parser is not None or self._upgraded:  # a WebSocket's frames, no requests
            super().data_received(data)
            return
        rx, now = self._rx, None
        if rx is not None and rx.stamp is not None:  # bytes llmtap read itself, with the kernel's time
            now = rx.stamp
        elif data and self._next_ns is not None:  # bytes that were waiting when the connection came
            now, self._next_ns = self._next_ns, None
        if now is None:
            now = perf_counter_ns()
        if self._body is not None and self._body.is_eof():
            self._body = None
        if data and self._first_ns is None and self._body is None:
            self._first_ns = now  # nothing half parsed, no body coming: these bytes begin a request
        # (aiohttp itself calls this with b"" to parse what it held back: no byte came then)
        messages = self._messages
        before = self._request_count
        super().data_received(data)
        parsed = self._request_count - before
        if parsed:
            first, self._first_ns = self._first_ns, None
            new = [messages[i] for i in range(len(messages) - parsed, len(messages))]
            for i, (message, _) in enumerate(new):
                self._stamps.append((message, first if i == 0 and first is not None else now))
            payload = new[-1][1]
            self._body = None if payload.is_eof() else payload
        if rx is not None:
            self._await_request()


class _StampingServer(Gate):
    kernel = False

    def handler(self) -> RequestHandler:
        return _StampingHandler(self, self.kernel, loop=self._loop, **self._kwargs)


class _KernelStampingServer(_StampingServer):
    kernel = True


class Runner(web.AppRunner):
    """`web.AppRunner` whose connections stamp each request's first byte: the `arrival` fast path,
    with `stamps` (proxy/relay/fast_paths.py); by the kernel's receive time with `kernel` too
    (`kernel_stamps`). Without it, aiohttp's own connections, and `take` gives the handler's start:
    later than the first byte by the time the headers took to come and be parsed (a few tenths of a
    millisecond on loopback at low load; a slow client's headers, or a busy loop, add theirs). Past `max_connections` open, a new one is refused (proxy/relay/conn_limit.py)."""

    def __init__(self, app: web.Application, *, stamps: bool = True, kernel: bool = False, max_connections: int = 0,
                 **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._stamps, self._kernel, self._max_connections = stamps, kernel, max_connections

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        stamping = _KernelStampingServer if self._kernel else _StampingServer
        server.__class__ = stamping if self._stamps else Gate  # the same object, its connections counted
        server.max_connections = self._max_connections  # type: ignore[attr-defined]
        return server


def take(request: web.BaseRequest, now_ns: int) -> int:
    """The first byte of `request` (by the monotonic clock), else `now_ns` (the handler's start)."""
    stamps: deque[tuple[object, int]] | None = getattr(request.protocol, "_stamps", None)  # a _StampingHandler's
    if not stamps:  # the arrival fast path is off: aiohttp's own handler, no private name read
        return now_ns
    message = getattr(request, "_message", None)
    if message is None:
        return now_ns
    for i, (parsed, stamp) in enumerate(stamps):
        if parsed is message:
            for _ in range(i + 1):  # this request's stamp and those of requests that reached no handler
                stamps.popleft()
            return stamp if stamp <= now_ns else now_ns
    return now_ns
