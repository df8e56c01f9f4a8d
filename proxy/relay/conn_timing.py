"""Where a request's wait for its upstream connection goes, from the connector's own hooks.

The relay puts the request's `ConnectionMarks` (the meter's, proxy/meter/connection_marks.py) in `CURRENT` around
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
  (proxy/relay/fast_paths.py: `hook_tcp`), and `hooked` says whether it took (health's `fast_paths`).
  There too, the kernel's own measure of the
  handshake: `TCP_INFO`'s `tcpi_rtt` (µs), which on a connection that has carried nothing yet is
  the SYN -> SYN-ACK round trip (`handshake`; none after a retransmitted SYN, or through a
  forward proxy, whose tunnel carried data);
- the response's first byte, by the kernel's receive time (`answered`): the connection handed out
  for a plain-http request reads its next bytes through `rx_stamp.RxStamp` until they come
  (`settle`, called by the relay once the headers are in, lets go of it in any case).

A reused connection costs a context variable read and two clock reads; a new one a few more; no
chunk and no byte costs anything. aiohttp's `TraceConfig` would give most of these moments too,
but tracing cost 38 µs per non-streaming request with an empty TraceConfig and 53 µs with these
stamps as its callbacks (benchmarks/paired_cost.py against the same tree without: 6.5 % and 9.5 %
of llmtap's CPU per request), where the hooks cost a few µs. The marks become `pool_wait_ms`, `dns_ms`,
`connect_ms`, `tls_ms`, `upstream_wait_ms` and `proxy_wait_ms` (`ConnectionMarks.parts`);
docs/breakdown-and-compare.md defines them.
"""

from __future__ import annotations

import asyncio
import inspect
import socket
import struct
import weakref
from contextvars import ContextVar
from time import perf_counter_ns
from typing import Any, Callable

import aiohttp
from aiohttp.abc import AbstractResolver

from proxy.relay import rx_stamp
from proxy.meter.connection_marks import ConnectionMarks

# The marks of the request whose connection the current task is getting (set by the relay).
CURRENT: ContextVar[ConnectionMarks | None] = ContextVar("llmtap_connection", default=None)
# The reader waiting for the current request's response's first byte (`_stamp_answer`, `settle`).
_ANSWER: ContextVar[rx_stamp.RxStamp | None] = ContextVar("llmtap_answer", default=None)
# The socket of the connection being opened, until its protocol is made (`_timed_socket`, the factory).
_OPENING: ContextVar[socket.socket | None] = ContextVar("llmtap_opening", default=None)
_TCP_INFO = getattr(socket, "TCP_INFO", None)
_TCP_INFO_LEN = 104  # struct tcp_info up to tcpi_total_retrans
_TCP_INFO_SENT = 160  # ... up to tcpi_data_segs_out


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


def handshake_ns(sock: socket.socket | None) -> int | None:
    """The kernel's SYN -> SYN-ACK time of a TCP connection that has carried nothing yet: its first
    round-trip sample, `tcpi_rtt` (µs). None without TCP_INFO, or after a retransmission (the kernel
    takes no sample from a retransmitted SYN)."""
    info = _tcp_info(sock, _TCP_INFO_LEN)
    if info is None:
        return None
    (rtt_us,) = struct.unpack_from("I", info, 68)
    (total_retrans,) = struct.unpack_from("I", info, 100)
    return rtt_us * 1000 if rtt_us and not total_retrans and not info[2] else None


class TimedConnector(aiohttp.TCPConnector):
    """aiohttp's TCPConnector, its moments stamped on `CURRENT`'s marks (see the module docstring)."""

    def __init__(self, hook_tcp: bool = True, **kwargs: Any) -> None:
        self.resolver = TimedResolver(kwargs.pop("resolver", None) or aiohttp.DefaultResolver())
        if "socket_factory" in inspect.signature(aiohttp.TCPConnector).parameters:
            kwargs["socket_factory"] = _timed_socket
        super().__init__(resolver=self.resolver, **kwargs)
        self._seen: weakref.WeakSet[Any] = weakref.WeakSet()  # the protocols of connections handed out
        self.hooked = hook_tcp and _time_tcp_connects(self)  # health says it (proxy/relay/fast_paths.py)

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
        if getattr(req, "proxy", None) is not None:  # the tunnel's exchange is in the round trip too
            marks.handshake = None
        reader = _stamp_answer(conn, marks)
        _stamp_sending(conn, marks, reader)
        return conn


def _segments_out(transport: Any, reader: rx_stamp.RxStamp | None = None) -> int | None:
    """The data segments the connection has sent so far (TCP_INFO's tcpi_data_segs_out), read on the
    answer's reader's socket when there is one: uvloop's transport hands out a stand-in whose every
    `getsockopt` makes a Python socket object (syscalls included), the reader's is one already."""
    sock = reader.sock if reader is not None else None
    if sock is None:
        sock = transport.get_extra_info("socket") if transport is not None else None
    info = _tcp_info(sock, _TCP_INFO_SENT)
    return None if info is None else struct.unpack_from("I", info, 156)[0]


def _tcp_info(sock: socket.socket | None, length: int) -> bytes | None:
    """The first `length` bytes of the socket's TCP_INFO; None without it (not Linux, an older kernel)."""
    if sock is None or _TCP_INFO is None:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, length)
    except (OSError, ValueError):
        return None
    return info if len(info) >= length else None


def _stamp_sending(conn: Any, marks: ConnectionMarks, reader: rx_stamp.RxStamp | None = None) -> None:
    """When the request leaves (`marks.sending`). aiohttp writes a request with a body from a task it
    creates right after this returns (Python < 3.12; later ones start it at once): a callback put on
    the loop now runs just before that task's first step, whose write sends the request. If the
    connection has sent data by then, the request went at once (`ready`, nothing to add)."""
    transport = conn.transport
    before = _segments_out(transport, reader)
    if before is None:
        return

    def sending() -> None:
        if _segments_out(transport, reader) == before:  # not written yet: it is, next on the loop
            marks.sending = perf_counter_ns()

    asyncio.get_running_loop().call_soon(sending)


def _stamp_answer(conn: Any, marks: ConnectionMarks) -> rx_stamp.RxStamp | None:
    """Read the response's first byte on `conn` with the kernel's receive time (`marks.answered`);
    the reader, armed, or None."""
    transport, protocol = conn.transport, conn.protocol
    if protocol is None or not rx_stamp.usable(transport):
        return None

    def held() -> bool:  # aiohttp's own flow control holds the connection's reading
        return bool(getattr(protocol, "_reading_paused", False) or getattr(protocol, "_buffer_paused", False))

    def answered(t_ns: int) -> None:
        marks.answered = t_ns

    reader = rx_stamp.RxStamp(transport, protocol.data_received, held, answered)
    if reader.arm():
        _ANSWER.set(reader)
        return reader
    reader.close()
    return None


def settle() -> None:
    """The current request's response headers are in (or never will be): its connection reads
    its bytes as before, and the duplicate descriptor `_stamp_answer` made is let go."""
    reader = _ANSWER.get()
    if reader is not None:
        _ANSWER.set(None)
        reader.disarm()
        reader.close()


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
            marks.handshake = handshake_ns(_OPENING.get())
            _OPENING.set(None)
        return factory()

    connector._factory = timed_factory  # type: ignore[assignment]
    return True
