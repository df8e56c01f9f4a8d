"""When a request arrived: its first byte on the connection.

aiohttp starts a handler once it has parsed the request's headers, which at low load is about a
millisecond after their first byte came in (more for a client that sends its headers slowly). A
measuring proxy's clock starts at the first byte, as the client's does (#21, checked with aiperf):
`Runner` is aiohttp's AppRunner whose connections stamp the first byte each request brings.

A connection's stamp is taken by its request's handler (`take`) and cleared when the handler ends
(`clear`), so that the bytes of a body read meanwhile never date the next request. A request
pipelined behind another one on the same connection falls back to its handler's start.
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler


class _StampingHandler(RequestHandler):
    __slots__ = ("arrival_ns",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.arrival_ns: int | None = None

    def data_received(self, data: bytes) -> None:
        if self.arrival_ns is None:
            self.arrival_ns = perf_counter_ns()
        super().data_received(data)


class _StampingServer(web.Server):
    def __call__(self) -> RequestHandler:
        return _StampingHandler(self, loop=self._loop, **self._kwargs)


class Runner(web.AppRunner):
    """`web.AppRunner` whose connections stamp each request's first byte."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _StampingServer  # the same object, making stamping connections
        return server


def take(request: web.BaseRequest, now_ns: int) -> int:
    """The first byte of `request` (by the monotonic clock), else `now_ns` (the handler's start)."""
    stamp = getattr(request.protocol, "arrival_ns", None)
    return stamp if stamp is not None and stamp <= now_ns else now_ns


def clear(request: web.BaseRequest) -> None:
    """The request's handler is ending: what arrives from now on belongs to the next request."""
    protocol = request.protocol
    if isinstance(protocol, _StampingHandler):
        protocol.arrival_ns = None
