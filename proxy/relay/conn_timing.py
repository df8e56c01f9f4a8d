"""Where a request's wait for its upstream connection goes, from the connector's own hooks.

The relay puts the request's `ConnectionMarks` (proxy/meter/connection_marks.py) in `CURRENT` around
`session.request`; `TimedConnector` stamps them with the monotonic clock: `connect`'s entry and
return (`start`, `ready`; reused or not), the resolver around a DNS lookup, the socket factory as a
TCP connect begins, the protocol factory once TCP is up and before TLS (`tcp_end`: the `conn_timing`
fast path, the connector's private `_factory`; `hooked` says whether it took), and the client
context's public `sslobject_class` as the ClientHello is made (`hello`). With the `kernel_stamps`
fast path, proxy/relay/kernel_timing.py adds the kernel's times (the handshake's round trip, a TLS
upstream's first flight, the request's write, the response's first byte). docs/development.md
("Kernel timing") has the sequence; docs/breakdown-and-compare.md the columns they become. aiohttp's
`TraceConfig` would give most of these moments at 38-53 µs a request, the hooks at a few
(benchmarks/paired_cost.py).
"""

from __future__ import annotations

import inspect
import socket
import ssl
import weakref
from contextvars import ContextVar
from time import perf_counter_ns
from typing import Any, Callable

import aiohttp
from aiohttp.abc import AbstractResolver

from proxy.meter.connection_marks import ConnectionMarks
from proxy.relay import kernel_timing

# The marks of the request whose connection the current task is getting (set by the relay).
CURRENT: ContextVar[ConnectionMarks | None] = ContextVar("llmtap_connection", default=None)
# The socket of the connection being opened, until its protocol is made (`_timed_socket`, the factory).
_OPENING: ContextVar[socket.socket | None] = ContextVar("llmtap_opening", default=None)


class TimedResolver(AbstractResolver):
    """The connector's resolver, with the lookup's start and end stamped on the current marks. The
    connector resolves in a task it creates, which copies the requester's context: the marks are
    those of the request that missed the cache."""

    def __init__(self, inner: AbstractResolver) -> None:
        self.inner = inner

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET) -> Any:
        marks = CURRENT.get()
        if marks is not None:
            marks.dns_start = perf_counter_ns()
        try:
            return await self.inner.resolve(host, port, family)
        finally:
            if marks is not None:
                marks.dns_end = perf_counter_ns()

    async def close(self) -> None:
        await self.inner.close()


def _timed_socket(addr_info: Any) -> socket.socket:
    """aiohappyeyeballs' own socket (its default without a factory), the TCP connect's start stamped
    (the first attempt's, when several addresses are tried)."""
    marks = CURRENT.get()
    if marks is not None and marks.sock is None:
        marks.sock = perf_counter_ns()
    family, type_, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=type_, proto=proto)
    if marks is not None:
        _OPENING.set(sock)
    return sock


class TimedConnector(aiohttp.TCPConnector):
    """aiohttp's TCPConnector, its moments stamped on `CURRENT`'s marks (see the module docstring);
    `kernel`: the kernel's times too (proxy/relay/kernel_timing.py), health's `kernel_stamps`."""

    def __init__(self, hook_tcp: bool = True, kernel: bool = False, **kwargs: Any) -> None:
        self.resolver = TimedResolver(kwargs.pop("resolver", None) or aiohttp.DefaultResolver())
        if "socket_factory" in inspect.signature(aiohttp.TCPConnector).parameters:
            kwargs["socket_factory"] = _timed_socket
        super().__init__(resolver=self.resolver, **kwargs)
        self._seen: weakref.WeakSet[Any] = weakref.WeakSet()  # the protocols of connections handed out
        self.kernel = kernel
        self.hooked = hook_tcp and _time_tcp_connects(self, kernel)  # health says it (proxy/relay/fast_paths.py)
        context = kwargs.get("ssl")
        if self.hooked and isinstance(context, ssl.SSLContext) and context.sslobject_class is ssl.SSLObject:
            context.sslobject_class = TimedSSLObject  # its public hook: the ClientHello's moment

    async def connect(self, req: Any, traces: Any, timeout: Any) -> Any:
        marks = CURRENT.get()
        if marks is None:
            return await super().connect(req, traces, timeout)
        marks.begin(perf_counter_ns())
        try:
            conn = await super().connect(req, traces, timeout)
        except BaseException:  # no pooled connection, and a new one failed
            marks.reused = False
            raise
        finally:
            if self.kernel:
                kernel_timing.end_flight(marks)
        marks.ready = perf_counter_ns()
        if marks.flight is not None and not _tls13(conn.transport):
            marks.flight = None  # TLS 1.2: the upstream's first flight is not the handshake's end
        protocol = conn.protocol
        marks.reused = protocol in self._seen
        if not marks.reused and protocol is not None:
            self._seen.add(protocol)
        if getattr(req, "proxy", None) is not None:  # the tunnel's exchange is in the round trip too
            marks.handshake = None
        if self.kernel:
            kernel_timing.stamp_sending(conn, marks, kernel_timing.stamp_answer(conn, marks))
        return conn


class TimedSSLObject(ssl.SSLObject):
    """The client context's `sslobject_class` (what `wrap_bio` makes, as asyncio's and uvloop's TLS
    do): the first `do_handshake`, which makes the ClientHello, stamps `hello` as it returns; the
    transport writes the ClientHello right after (llmtap's work making it, a key share, is its own)."""

    def do_handshake(self) -> None:
        marks = CURRENT.get() if not getattr(self, "_llmtap_begun", False) else None
        try:
            super().do_handshake()
        finally:
            if marks is not None:
                self._llmtap_begun = True
                if marks.ready is None:
                    marks.hello = perf_counter_ns()


def _tls13(transport: Any) -> bool:
    ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
    try:
        return ssl_object is not None and ssl_object.version() == "TLSv1.3"
    except (AttributeError, ValueError):
        return False


def _time_tcp_connects(connector: aiohttp.BaseConnector, kernel: bool) -> bool:
    """Stamp `tcp_end` when the connector makes a connection's protocol: between the TCP connect
    and the TLS handshake (and with `kernel`, the handshake's round trip and the TLS upstream's first
    flight). Returns whether the connector could be hooked."""
    factory: Callable[[], Any] | None = getattr(connector, "_factory", None)
    if not callable(factory):
        return False

    def timed_factory() -> Any:
        marks = CURRENT.get()
        if marks is not None:
            marks.tcp_end = perf_counter_ns()
            sock = _OPENING.get()
            _OPENING.set(None)
            if kernel and sock is not None:
                marks.handshake = kernel_timing.handshake_ns(sock)
                if marks.tls:
                    kernel_timing.watch_flight(sock, marks)
        return factory()

    connector._factory = timed_factory  # type: ignore[assignment]
    return True
