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
- for a TLS connection, the handshake's start (`hello`: the ClientHello made, as the first
  `do_handshake` returns: `TimedSSLObject`, the client context's public `sslobject_class`; else the
  loop turn on which the transport writes it, a callback queued just before its own), and the
  upstream's first flight by the kernel's receive time (`flight`, `_FlightWatch`): from the
  protocol factory, a duplicate of the socket is watched and its first waiting byte peeked with
  `recvmsg` (`rx_stamp.first_stamp`), kept only if nothing had been read from the connection yet
  (TCP_INFO's bytes received = the bytes waiting: so it is the ServerHello's) and the handshake
  was TLS 1.3 (whose first flight from the upstream ends it: ServerHello ... Finished). The loop's
  watch (`loop.add_reader`) is added two loop turns on, after the transport's own, so that the
  kernel, which wakes a socket's watchers newest first, wakes it first; until then the connection
  is held unreadable (its receive low-water mark at 16 kB, `SO_RCVLOWAT`, only where the receive
  buffer is 4 times that, so that Linux neither grows it nor clamps the window) and a flight that
  came meanwhile is peeked as the watch is made; a thread in an epoll of its own peeks too (for a
  loop too busy to turn). The cost: a flight that comes within those two loop turns is read up to
  two turns later than it would have been; one duplicate descriptor per handshake under way.
  Without it (not Linux, `LLMTAP_NO_RX_STAMP=1`, the transport read first, TLS 1.2), `tls_ms`
  ends when the connection is ready, llmtap's own TLS work included;
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
import os
import select
import socket
import ssl
import struct
import threading
import weakref
from contextvars import ContextVar
from time import perf_counter_ns
from typing import Any, Callable

import aiohttp
from aiohttp.abc import AbstractResolver

from proxy.relay import rx_stamp

try:
    import fcntl
except ImportError:  # not a Unix: no flight stamps
    fcntl = None  # type: ignore[assignment]
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
_TCP_INFO_RECEIVED = 136  # ... up to tcpi_bytes_received
_FIONREAD = 0x541B  # Linux's SIOCINQ: the bytes waiting unread
# A TLS connection's watch for the upstream's first flight (`_FlightWatch`), by its marks' id, until
# the connector's `connect` returns or fails.
_FLIGHTS: dict[int, "_FlightWatch"] = {}


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
            watch = _FLIGHTS.pop(id(marks), None)
            if watch is not None:
                watch.close()
        marks.ready = perf_counter_ns()
        if marks.flight is not None and not _tls13(conn.transport):
            marks.flight = None  # TLS 1.2: the upstream's first flight is not the handshake's end
        protocol = conn.protocol
        marks.reused = protocol in self._seen
        if not marks.reused and protocol is not None:
            self._seen.add(protocol)
        if getattr(req, "proxy", None) is not None:  # the tunnel's exchange is in the round trip too
            marks.handshake = None
        reader = _stamp_answer(conn, marks)
        _stamp_sending(conn, marks, reader)
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


class _FlightWatch:
    """Stamps `marks.flight`: the kernel's receive time of the first bytes the upstream sends on a
    new TLS connection, peeked on a duplicate of its socket when they come (module docstring), by
    whichever of two watchers gets there before the transport reads them: the loop's (woken before
    the transport's own, when it is in place before they come) and `_Peeker`'s thread (which needs
    no turn of the loop: a busy loop reads them late)."""

    __slots__ = ("_loop", "_sock", "_marks", "_watching", "_lock", "_gated")

    def __init__(self, sock: socket.socket, marks: ConnectionMarks) -> None:
        self._loop = asyncio.get_running_loop()
        self._marks = marks
        self._watching = False
        self._lock = threading.Lock()  # the peek against the close (the thread's peek)
        self._sock: socket.socket | None = socket.fromfd(sock.fileno(), sock.family, sock.type)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, rx_stamp.SO_TIMESTAMPNS, 1)
        except OSError:
            self._sock.close()
            raise
        # Until this watch is in the loop's epoll, the connection is held unreadable: its low-water
        # mark raised to GATE bytes (more than a first flight), which the kernel lets down at once
        # when lowered again (`_ungate`, two loop turns on, or `close`).
        self._gated = _gate(self._sock)
        _Peeker.watch(self)
        # The transport is made once this factory returns; on the next loop turn it writes the
        # ClientHello (from a callback queued right after this one: `_hello` stamps its moment) and
        # starts reading. A turn later, with the transport's own watch in the loop's epoll, this one's
        # is added: the kernel wakes a socket's watchers newest first, so this one before it. A
        # flight that came before is held unread by the low-water mark: peeked when the watch is
        # made, and again a turn later, when the mark goes down.
        self._loop.call_soon(self._hello)

    def fileno(self) -> int:
        return self._sock.fileno() if self._sock is not None else -1

    def _hello(self) -> None:
        if self._marks.hello is None:  # else TimedSSLObject's, nearer the ClientHello
            self._marks.hello = perf_counter_ns()
        self._loop.call_soon(self._watch)

    def _watch(self) -> None:
        if self._sock is None:
            return
        self.peek()  # the flight already waiting (the process was not running): the loop has not polled since
        if self._marks.flight is not None:
            self.close()
            return
        try:
            self._loop.add_reader(self._sock.fileno(), self._ready)
            self._watching = True
        except (OSError, RuntimeError, NotImplementedError, ValueError):
            self._ungate()
            return
        self._loop.call_soon(self._open)

    def _open(self) -> None:
        """The watch is in the loop's epoll now: a flight held meanwhile is peeked, then let go."""
        self.peek()
        self._ungate()
        if self._marks.flight is not None:
            self.close()

    def _ungate(self) -> None:
        if self._gated and self._sock is not None:
            self._gated = False
            _ungate(self._sock)

    def _ready(self) -> None:
        self.peek()
        self.close()

    def peek(self) -> None:
        """The stamp of the first bytes waiting, if none has been read yet (any thread)."""
        with self._lock:
            sock = self._sock
            if sock is not None and self._marks.flight is None and _unread_is_all(sock):
                self._marks.flight = rx_stamp.first_stamp(sock)

    def close(self) -> None:
        """Stop watching (the loop's thread): `connect` returned or failed, or the loop's watch fired."""
        self._ungate()
        with self._lock:
            sock, self._sock = self._sock, None
        if sock is None:
            return
        if self._watching:
            self._watching = False
            try:
                self._loop.remove_reader(sock.fileno())
            except (OSError, RuntimeError, ValueError):
                pass
        _Peeker.unwatch(sock.fileno())
        sock.close()


class _Peeker:
    """One daemon thread, started with the first TLS connection, waiting in an epoll of its own on
    the sockets of the TLS handshakes under way; it peeks at each one's first bytes as they come."""

    _lock = threading.Lock()
    _epoll: Any = None
    _watches: dict[int, _FlightWatch] = {}

    @classmethod
    def watch(cls, watch: _FlightWatch) -> None:
        with cls._lock:
            try:
                if cls._epoll is None:
                    cls._epoll = select.epoll()
                    threading.Thread(target=cls._run, args=(cls._epoll,), name="llmtap-tls-flight", daemon=True).start()
                cls._epoll.register(watch.fileno(), select.EPOLLIN | select.EPOLLONESHOT)
                cls._watches[watch.fileno()] = watch
            except (OSError, RuntimeError, ValueError, AttributeError):
                pass  # no thread, or no epoll here: the loop's watch alone

    @classmethod
    def unwatch(cls, fd: int) -> None:
        with cls._lock:
            if cls._watches.pop(fd, None) is not None:
                try:
                    cls._epoll.unregister(fd)
                except (OSError, ValueError):
                    pass

    @classmethod
    def forget(cls) -> None:
        """In a forked child: the parent's thread is not there (a new one starts with the next watch)."""
        cls._lock = threading.Lock()
        cls._epoll, cls._watches = None, {}

    @classmethod
    def _run(cls, epoll: Any) -> None:
        while True:
            try:
                events = epoll.poll()
            except InterruptedError:
                continue
            except (OSError, ValueError):
                return
            for fd, _ in events:
                with cls._lock:
                    watch = cls._watches.get(fd)
                if watch is not None:
                    watch.peek()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_Peeker.forget)


GATE = 16 * 1024  # bytes: more than a TLS 1.3 first flight (a few kB with its certificates)


def _gate(sock: socket.socket) -> bool:
    """Raise the connection's receive low-water mark to GATE: no watcher hears of fewer bytes
    waiting. Only where the receive buffer is at least 4 x GATE: a mark over a quarter of it would
    make Linux grow the buffer and clamp the connection's window to the mark for good."""
    try:
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) < 4 * GATE:
            return False
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, GATE)
        return True
    except (OSError, AttributeError):
        return False


def _ungate(sock: socket.socket) -> None:
    """The low-water mark back to 1 byte; the kernel wakes the connection's readers if bytes wait."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
    except OSError:
        pass


def _unread_is_all(sock: socket.socket) -> bool:
    """Whether every byte the connection has received is still waiting unread (and there are some)."""
    info = _tcp_info(sock, _TCP_INFO_RECEIVED)
    if info is None or fcntl is None:
        return False
    (received,) = struct.unpack_from("Q", info, 128)
    try:
        waiting = struct.unpack("i", fcntl.ioctl(sock.fileno(), _FIONREAD, b"\0\0\0\0"))[0]
    except OSError:
        return False
    return received > 0 and waiting == received


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
            sock = _OPENING.get()
            marks.handshake = handshake_ns(sock)
            _OPENING.set(None)
            if marks.tls and sock is not None and rx_stamp.AVAILABLE and id(marks) not in _FLIGHTS:
                try:
                    _FLIGHTS[id(marks)] = _FlightWatch(sock, marks)
                except (OSError, RuntimeError, ValueError):
                    pass
        return factory()

    connector._factory = timed_factory  # type: ignore[assignment]
    return True
