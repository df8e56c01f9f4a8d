"""The kernel's receive time of a connection's next bytes, for the moments llmtap must not date late.

A stamp taken in `data_received` is the moment of the read. Under a busy loop, or a busy machine,
that read comes long after the kernel had the bytes (#26: up to 20 ms at concurrency 32), and
the wait would fall into the network's or the upstream's part. The kernel stamps every segment it
receives (`SO_TIMESTAMPNS`, nanoseconds, CLOCK_REALTIME) and tells the time to whoever reads the
segment with `recvmsg`; the loop (uvloop's libuv) reads with `read(2)` and hears nothing of it.

`RxStamp.arm` makes llmtap the reader of a plain-TCP connection's next bytes: it pauses the
transport's reading (public `pause_reading`) and watches a duplicate of its socket
(`loop.add_reader`). When bytes come, in the same loop callback the transport would have read
them in: `recvmsg(MSG_PEEK)` of one byte gives the kernel's time of the first segment waiting
(a read of more would give the last one's), a `recv_into` reads what is there (as the transport
would: up to 256 KiB), the protocol gets it through its own `data_received` with `stamp` set, and
the transport reads again. The bytes and their order are the transport's. It costs once
per request, never per chunk: about 15 µs of CPU (a keep-alive request on loopback, 13–15 µs
without it, 29–30 with: most of it uvloop making and closing the watch, 6 µs), on each leg;
`LLMTAP_NO_RX_STAMP=1` saves it, at the price of the read's moment.

TCP merges segments that wait unread into one and keeps the last one's time: bytes that came in
several segments and waited together are dated at the last of them (still no later than the read).

The stamp is converted to the monotonic clock (`perf_counter_ns`) by the two clocks read side by
side; its resolution is the kernel's, 1 ns, its accuracy that of the conversion (well under a µs)
and at worst the read's own moment (a stamp later than that, or none, falls back to it).

Off (the read's moment, as before) where a start-up probe finds no `SO_TIMESTAMPNS` on a loopback
pair (not Linux), on TLS transports (their bytes are records the TLS layer must read), and where
the loop cannot watch a socket or the transport cannot pause. `LLMTAP_NO_RX_STAMP=1` turns it off.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import sys
import threading
import time
from time import perf_counter_ns, time_ns
from typing import Callable

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux's value; the probe checks it works
_TIMESPEC = struct.Struct("@qq")
_ANCILLARY = socket.CMSG_SPACE(_TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0
_READ = 256 * 1024  # what uvloop reads at once
_FLAGS = getattr(socket, "MSG_DONTWAIT", 0)
_PEEK = getattr(socket, "MSG_PEEK", 0) | _FLAGS
PROBES = 40  # at most 0.2 s at start-up, once
_BUFFERS = threading.local()  # one read buffer per thread running a loop, not per connection


def _probe() -> bool:
    """Whether a loopback TCP pair gives a receive timestamp to `recvmsg` (checked once). Keeps
    the kernel stamping every segment it receives from now on (`_HOLDER`)."""
    global _HOLDER
    if sys.platform != "linux" or os.environ.get("LLMTAP_NO_RX_STAMP") or not _ANCILLARY:
        return False
    try:
        _HOLDER = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        _HOLDER.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
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
    except OSError:
        pass
    return False


def _stamp(ancillary: list[tuple[int, int, bytes]]) -> int | None:
    """The kernel's receive time in `recvmsg`'s ancillary data, by the monotonic clock."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack_from(data)
            now, wall = perf_counter_ns(), time_ns()
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


# The kernel stamps a received segment only while some socket of the machine asks for stamps; a
# socket asking after its bytes came gets none for them. This one asks for the process's life, so
# a request already waiting when its connection is accepted has its stamp (the cost: one clock
# read per received packet, as while tcpdump runs).
_HOLDER: socket.socket | None = None
AVAILABLE = _probe()


def usable(transport: asyncio.BaseTransport | None) -> bool:
    """Whether `transport` is a plain TCP connection whose next bytes llmtap can read stamped."""
    if not AVAILABLE or transport is None or transport.is_closing():
        return False
    if transport.get_extra_info("sslcontext") is not None or transport.get_extra_info("ssl_object") is not None:
        return False
    sock = transport.get_extra_info("socket")
    return sock is not None and getattr(sock, "type", None) == socket.SOCK_STREAM and \
        getattr(sock, "family", None) in (socket.AF_INET, socket.AF_INET6)


class RxStamp:
    """Reads one connection's next bytes itself, with the kernel's time of their arrival (see the
    module docstring). `feed` is the protocol's `data_received`; `held()` says whether the protocol
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
            first, ancillary, _, _ = self._socket().recvmsg(1, _ANCILLARY, _PEEK)
        except (OSError, AttributeError, ValueError):
            return None
        return _stamp(ancillary) if first else None

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

