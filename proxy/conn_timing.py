"""Where a request's wait for its upstream connection goes, from the connector's own hooks.

The relay puts the request's `ConnectionMarks` (the meter's, proxy/connection_marks.py) in `CURRENT` around
`session.request`; the upstream session's connector stamps them, with the monotonic clock, at the
moments they mark:

- `TimedConnector.connect` (the documented coroutine aiohttp awaits for every request's
  connection): its entry (`start`) and its return (`ready`); whether the connection's protocol was
  seen before says whether it was reused;
- the connector's resolver (`TimedResolver`, the `resolver=` argument): around a DNS lookup, which
  happens only for a name not in the connector's cache (`dns_start`, `dns_end`);
- the connector's socket factory (`socket_factory=`, aiohttp 3.12+): a TCP connect begins (`sock`);
- the connector's protocol factory, which asyncio (and uvloop) call once the TCP connection is up
  and before the TLS handshake (`tcp_end`; through a forward proxy, the last call: after the
  CONNECT tunnel, before TLS to the upstream). aiohttp has no public hook there: this wraps the
  connector's `_factory` attribute (every aiohttp 3.x connector has it), and without it the
  handshake counts in `connect_ms` (`tls_ms` NULL). It is the `conn_timing` fast path
  (proxy/fast_paths.py: `hook_tcp`), and `hooked` says whether it took (health's `fast_paths`).

A reused connection costs a context variable read and two clock reads; a new one a few more; no
chunk and no byte costs anything. aiohttp's `TraceConfig` would give most of these moments too,
but tracing cost 38 µs per non-streaming request with an empty TraceConfig and 53 µs with these
stamps as its callbacks (benchmarks/paired_cost.py against the same tree without: 6.5 % and 9.5 %
of llmtap's CPU per request), where the hooks cost a few µs. The marks become `pool_wait_ms`, `dns_ms`, `connect_ms`, `tls_ms` and
`upstream_wait_ms` (`ConnectionMarks.parts`); docs/breakdown-and-compare.md defines them.
"""

from __future__ import annotations

import inspect
import socket
import weakref
from contextvars import ContextVar
from time import perf_counter_ns
from typing import Any, Callable

import aiohttp
from aiohttp.abc import AbstractResolver

from .connection_marks import ConnectionMarks

# The marks of the request whose connection the current task is getting (set by the relay).
CURRENT: ContextVar[ConnectionMarks | None] = ContextVar("llmtap_connection", default=None)


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
    return socket.socket(family=family, type=type_, proto=proto)


class TimedConnector(aiohttp.TCPConnector):
    """aiohttp's TCPConnector, its moments stamped on `CURRENT`'s marks (see the module docstring)."""

    def __init__(self, hook_tcp: bool = True, **kwargs: Any) -> None:
        self.resolver = TimedResolver(kwargs.pop("resolver", None) or aiohttp.DefaultResolver())
        if "socket_factory" in inspect.signature(aiohttp.TCPConnector).parameters:
            kwargs["socket_factory"] = _timed_socket
        super().__init__(resolver=self.resolver, **kwargs)
        self._seen: weakref.WeakSet[Any] = weakref.WeakSet()  # the protocols of connections handed out
        self.hooked = hook_tcp and _time_tcp_connects(self)  # health says it (proxy/fast_paths.py)

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
        marks.ready = perf_counter_ns()
        protocol = conn.protocol
        marks.reused = protocol in self._seen
        if not marks.reused and protocol is not None:
            self._seen.add(protocol)
        return conn


def _time_tcp_connects(connector: aiohttp.BaseConnector) -> bool:
    """Stamp `tcp_end` when the connector makes a connection's protocol: between the TCP connect
    and the TLS handshake. Returns whether the connector could be hooked."""
    factory: Callable[[], Any] | None = getattr(connector, "_factory", None)
    if not callable(factory):
        return False

    def timed_factory() -> Any:
        marks = CURRENT.get()
        if marks is not None:
            marks.tcp_end = perf_counter_ns()
        return factory()

    connector._factory = timed_factory  # type: ignore[attr-defined]
    return True
