"""The kernel's own times of a connection (Linux): receive stamps, TCP_INFO, a TLS upstream's first flight.

The `kernel_stamps` fast path (proxy/relay/fast_paths.py): a request's first byte (arrival.py) and an
upstream's answer, first flight and handshake (conn_timing.py's connector) dated by the kernel
rather than by a busy loop's read. docs/development.md ("Kernel timing") has the design and its
diagram. Every reader here stands aside while aiohttp's own flow control holds the connection
(`held`); one that cannot tell counts it as held.
"""

from __future__ import annotations

import asyncio
import os
import select
import socket
import struct
import sys
import threading
import time
from contextvars import ContextVar
from functools import cache
from time import perf_counter_ns
from typing import Any, Callable

from proxy.common import clocks
from proxy.meter.connection_marks import ConnectionMarks

try:
    import fcntl
except ImportError:  # not a Unix: no flight stamps
    fcntl = None  # type: ignore[assignment]

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux's value; the probe checks it works
FLOW_FIELDS = ("_reading_paused", "_buffer_paused")  # aiohttp's BaseProtocol: its flow control holds reading
_TIMESPEC = struct.Struct("@qq")
_ANCILLARY = socket.CMSG_SPACE(_TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0
_READ = 256 * 1024  # what uvloop reads at once
_FLAGS = getattr(socket, "MSG_DONTWAIT", 0)
_PEEK = getattr(socket, "MSG_PEEK", 0) | _FLAGS
PROBES = 40  # at most 0.2 s at serve's start, once
_BUFFERS = threading.local()  # one read buffer per thread running a loop, not per connection
_TCP_INFO = getattr(socket, "TCP_INFO", None)
_TCP_INFO_LEN = 104  # struct tcp_info up to tcpi_total_retrans
_TCP_INFO_SENT = 160  # ... up to tcpi_data_segs_out
_TCP_INFO_RECEIVED = 136  # ... up to tcpi_bytes_received
_FIONREAD = 0x541B  # Linux's SIOCINQ: the bytes waiting unread
GATE = 16 * 1024  # bytes: more than a TLS 1.3 first flight (a few kB with its certificates)

# The kernel stamps a received segment only while some socket of the machine asks for stamps; this
# one asks from serve's start on (`refusal`), so a request already waiting when its connection is
# accepted has its stamp (the cost: one clock read per received packet, as while tcpdump runs).
_HOLDER: socket.socket | None = None
# The reader waiting for the current request's response's first byte (`stamp_answer`, `settle`).
_ANSWER: ContextVar[RxStamp | None] = ContextVar("llmtap_answer", default=None)
# A TLS connection's watch for the upstream's first flight, by its marks' id, until `connect` ends.
_FLIGHTS: dict[int, _FlightWatch] = {}


@cache
def refusal() -> str | None:
    """Why kernel receive stamps cannot run here, or None: a loopback TCP pair gives `recvmsg` a
    receive time (checked once, by fast_paths.probe at serve's start)."""
    global _HOLDER
    if sys.platform != "linux" or not _ANCILLARY:
        return "not Linux: no SO_TIMESTAMPNS"
    holder, kept = socket.socket(socket.AF_INET, socket.SOCK_DGRAM), False
    try:
        holder.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        kept = _stamps_a_loopback_pair()
    except OSError as exc:
        return f"SO_TIMESTAMPNS failed: {exc}"
    finally:
        if kept:
            _HOLDER = holder
        else:
            holder.close()
    return None if kept else "no receive timestamp on a loopback TCP pair"


def _stamps_a_loopback_pair() -> bool:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        with socket.create_connection(listener.getsockname(), timeout=2) as client:
            server, _ = listener.accept()
            with server:
                server.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
                server.settimeout(2)
                for _ in range(PROBES):  # the kernel turns stamping on a moment after it is asked
                    client.sendall(b"x")
                    data, ancillary, _, _ = server.recvmsg(1, _ANCILLARY)
                    if data == b"x" and _stamp(ancillary) is not None:
                        return True
                    time.sleep(0.005)
    return False


def held(protocol: object) -> bool:
    """aiohttp's own flow control holds the connection's reading; a protocol without its flags
    (an aiohttp shaped otherwise) counts as holding it: then nothing here reads or resumes."""
    return bool(getattr(protocol, "_reading_paused", True) or getattr(protocol, "_buffer_paused", True))


def _stamp(ancillary: list[tuple[int, int, bytes]]) -> int | None:
    """The kernel's receive time in `recvmsg`'s ancillary data, by the monotonic clock."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack_from(data)
            now, wall = clocks.pair()
            age = wall - (sec * 1_000_000_000 + nsec)
            return now - age if 0 <= age < 60_000_000_000 else None  # a wall clock step: no stamp
    return None


def first_stamp(sock: socket.socket) -> int | None:
    """The kernel's time (monotonic clock) of the first byte waiting unread on `sock` (which asks
    for stamps: SO_TIMESTAMPNS), nothing read; None without one."""
    try:
        first, ancillary, _, _ = sock.recvmsg(1, _ANCILLARY, _PEEK)
    except (OSError, AttributeError, ValueError):
        return None
    return _stamp(ancillary) if first else None


def usable(transport: asyncio.BaseTransport | None) -> bool:
    """Whether `transport` is a plain TCP connection whose next bytes llmtap can read stamped."""
    if transport is None or transport.is_closing():
        return False
    if transport.get_extra_info("sslcontext") is not None or transport.get_extra_info("ssl_object") is not None:
        return False
    sock = transport.get_extra_info("socket")
    return sock is not None and getattr(sock, "type", None) == socket.SOCK_STREAM and \
        getattr(sock, "family", None) in (socket.AF_INET, socket.AF_INET6)


class RxStamp:
    """Reads one connection's next bytes itself, with the kernel's time of their arrival (the
    design note). `feed` is the protocol's `data_received`; `held()` says whether the protocol
    holds the transport's reading itself (flow control), in which case llmtap neither reads nor
    resumes; `on_stamp(t_ns)` hears each stamp before `feed` gets the bytes. `stamp` is the time of
    the bytes being fed, during `feed` only."""

    __slots__ = ("_loop", "_transport", "_feed", "_held", "_on_stamp", "_sock", "armed", "stamp")

    def __init__(self, transport: asyncio.Transport, feed: Callable[[bytes], None],
                 held: Callable[[], bool] = lambda: False, on_stamp: Callable[[int], None] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._transport = transport
        self._feed, self._held, self._on_stamp = feed, held, on_stamp
        self._sock: socket.socket | None = None
        self.armed = False
        self.stamp: int | None = None

    def _socket(self) -> socket.socket:
        if self._sock is None:
            raw = self._transport.get_extra_info("socket")
            self._sock = socket.fromfd(raw.fileno(), raw.family, raw.type)  # a duplicate descriptor
            self._sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        return self._sock

    @property
    def sock(self) -> socket.socket | None:
        """The duplicate of the connection's socket while it is open (armed once), else None."""
        return self._sock

    def peek(self) -> int | None:
        """The kernel's time of the first bytes waiting unread, if any (nothing is read). For a
        connection just accepted, whose transport starts reading once `connection_made` returns
        (uvloop does so even when the protocol paused it there): a request already waiting is
        stamped here, one coming later by `arm` on the next loop turn."""
        try:
            sock = self._socket()
        except (OSError, AttributeError, ValueError):
            return None
        return first_stamp(sock)

    def arm(self) -> bool:
        """Read the connection's next bytes stamped. False (nothing changed) where it cannot."""
        if self.armed:
            return True
        transport = self._transport
        if transport.is_closing() or self._held():
            return False
        try:
            fd = self._socket().fileno()
            transport.pause_reading()
            self._loop.add_reader(fd, self._ready)
        except (OSError, RuntimeError, AttributeError, NotImplementedError, ValueError):
            self._resume()
            self.close()
            return False
        self.armed = True
        return True

    def disarm(self) -> None:
        """Back to the transport's own reading."""
        if self.armed:
            self._unwatch()
            self._resume()

    def close(self) -> None:
        """Let go of the duplicate descriptor (when the connection is lost: the socket closes with it)."""
        if self.armed:
            self._unwatch()
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _unwatch(self) -> None:
        self.armed = False
        if self._sock is not None:
            try:
                self._loop.remove_reader(self._sock.fileno())
            except (OSError, RuntimeError, ValueError):
                pass

    def _resume(self) -> None:
        if self._held() or self._transport.is_closing():
            return
        try:
            self._transport.resume_reading()
        except (RuntimeError, NotImplementedError):
            pass

    def _ready(self) -> None:
        """The socket has bytes (or its end): read them stamped, hand them on, read as before."""
        self._unwatch()
        sock = self._sock
        if sock is None or self._held() or self._transport.is_closing():
            return
        try:
            first, ancillary, _, _ = sock.recvmsg(1, _ANCILLARY, _PEEK)  # the first segment's time
            if not first:  # the peer's end (or reset): the transport reads it and says so
                self._resume()
                return
            buffer = getattr(_BUFFERS, "buffer", None)
            if buffer is None:
                buffer = _BUFFERS.buffer = bytearray(_READ)
            n = sock.recv_into(buffer, _READ, _FLAGS)
        except OSError:  # nothing there after all, or an error the transport meets on its next read
            self._resume()
            return
        stamp = _stamp(ancillary)
        now = perf_counter_ns()
        self.stamp = stamp if stamp is not None and stamp <= now else now
        if self._on_stamp is not None:
            self._on_stamp(self.stamp)
        try:
            self._feed(bytes(memoryview(buffer)[:n]))
        finally:
            self.stamp = None
            if not self.armed:  # `feed` may have armed again: then the next bytes are read here too
                self._resume()


# -- the upstream connection (conn_timing.TimedConnector's, with kernel stamps on) --------------


def stamp_answer(conn: Any, marks: ConnectionMarks) -> RxStamp | None:
    """Read the response's first byte on `conn` with the kernel's receive time (`marks.answered`)
    until `settle`; the reader, armed, or None."""
    transport, protocol = conn.transport, conn.protocol
    if protocol is None or not usable(transport):
        return None

    def answered(t_ns: int) -> None:
        marks.answered = t_ns

    reader = RxStamp(transport, protocol.data_received, lambda: held(protocol), answered)
    if reader.arm():
        _ANSWER.set(reader)
        return reader
    reader.close()
    return None


def settle() -> None:
    """The current request's response headers are in (or never will be): its connection reads its
    bytes as before, and the duplicate descriptor `stamp_answer` made is let go."""
    reader = _ANSWER.get()
    if reader is not None:
        _ANSWER.set(None)
        reader.disarm()
        reader.close()


def stamp_sending(conn: Any, marks: ConnectionMarks, reader: RxStamp | None = None) -> None:
    """When the request leaves (`marks.sending`). aiohttp writes a request with a body from a task it
    creates right after `connect` returns (Python < 3.12; later ones start it at once): a callback
    put on the loop now runs just before that task's first step. If the connection has sent data
    by then, the request went at once (`ready`, nothing to add)."""
    transport = conn.transport
    before = _segments_out(transport, reader)
    if before is None:
        return

    def sending() -> None:
        if _segments_out(transport, reader) == before:  # not written yet: it is, next on the loop
            marks.sending = perf_counter_ns()

    asyncio.get_running_loop().call_soon(sending)


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


def _segments_out(transport: Any, reader: RxStamp | None = None) -> int | None:
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


def watch_flight(sock: socket.socket, marks: ConnectionMarks) -> None:
    """A new TLS connection's protocol is being made: stamp the upstream's first flight
    (`marks.flight`) until `end_flight`."""
    if id(marks) not in _FLIGHTS:
        try:
            _FLIGHTS[id(marks)] = _FlightWatch(sock, marks)
        except (OSError, RuntimeError, ValueError):
            pass


def end_flight(marks: ConnectionMarks) -> None:
    """The connector's `connect` returned or failed: the flight watch, if any, is let go."""
    watch = _FLIGHTS.pop(id(marks), None)
    if watch is not None:
        watch.close()


class _FlightWatch:
    """Stamps `marks.flight` by the kernel's receive time of the first bytes the upstream sends on a
    new TLS connection, peeked on a duplicate of its socket by whichever of two watchers gets there
    before the transport reads them: the loop's (added two turns on, so that the kernel, which wakes
    a socket's watchers newest first, wakes it before the transport's; meanwhile `_gate` holds the
    bytes unread) and `_Peeker`'s thread (a busy loop reads them late). The design note has the
    sequence."""

    __slots__ = ("_loop", "_sock", "_marks", "_watching", "_lock", "_gated")

    def __init__(self, sock: socket.socket, marks: ConnectionMarks) -> None:
        self._loop = asyncio.get_running_loop()
        self._marks = marks
        self._watching = False
        self._lock = threading.Lock()  # the peek against the close (the thread's peek)
        self._sock: socket.socket | None = socket.fromfd(sock.fileno(), sock.family, sock.type)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        except OSError:
            self._sock.close()
            raise
        self._gated = _gate(self._sock)
        _Peeker.watch(self)
        self._loop.call_soon(self._hello)  # the transport, made next, writes the ClientHello a turn on

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
                self._marks.flight = first_stamp(sock)

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
