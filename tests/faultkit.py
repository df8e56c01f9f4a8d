"""Tools for the fault tests: a raw upstream that misbehaves on purpose, raw clients,
resource snapshots, and a real `llmtap serve` process. Everything listens on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tests import procfs
from proxy.common import instances as running
from .state_files import state_of
from .waiting import START_S

Handler = Callable[["RawConn"], Awaitable[None]]


# -- resources -------------------------------------------------------------------


def rss_mb(pid: int | str = "self") -> float:
    return procfs.rss_kib(pid) / 1024


def peak_rss_mb(pid: int | str = "self") -> float:
    return procfs.peak_rss_kib(pid) / 1024


def reset_peak(pid: int | str = "self") -> float:
    return procfs.reset_peak(pid) / 1024


open_fds = procfs.open_fds


@dataclass
class Baseline:
    """Memory and file descriptors of a process, to compare after a fault."""

    pid: int | str = "self"
    rss: float = 0.0
    fds: int = 0

    def __post_init__(self) -> None:
        self.rss, self.fds = rss_mb(self.pid), open_fds(self.pid)

    async def settled(self, *, rss_slack_mb: float = 30, fd_slack: int = 4, within_s: float = 3.0) -> None:
        """Wait (bounded) until fds are back near the baseline; then check memory too."""
        deadline = time.monotonic() + within_s
        while open_fds(self.pid) > self.fds + fd_slack and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        fds, rss = open_fds(self.pid), rss_mb(self.pid)
        assert fds <= self.fds + fd_slack, f"open fds {self.fds} -> {fds}"
        assert rss <= self.rss + rss_slack_mb, f"RSS {self.rss:.1f} -> {rss:.1f} MB"


# -- a raw upstream ---------------------------------------------------------------


@dataclass
class RawConn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    upstream: "RawUpstream"
    head: bytes = b""
    body: bytes = b""

    async def read_request(self) -> bytes:
        """Read one request (headers and a Content-Length body); returns the head."""
        self.head = await self.reader.readuntil(b"\r\n\r\n")
        m = re.search(rb"(?im)^content-length:\s*(\d+)", self.head)
        self.body = await self.reader.readexactly(int(m[1])) if m else b""
        self.upstream.requests.append(self.head + self.body)
        return self.head

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        self.upstream.bytes_sent += len(data)
        await self.writer.drain()

    async def closed_by_peer(self, within_s: float) -> None:
        """Send nothing; return when the other side closes (or after `within_s`)."""
        try:
            async with asyncio.timeout(within_s):
                while await self.reader.read(65536):
                    pass
        except TimeoutError:
            pass

    def reset(self) -> None:
        """Close with an RST (SO_LINGER 0) instead of a FIN."""
        sock = self.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()


@dataclass
class RawUpstream:
    """An asyncio server whose `handler(conn)` does whatever a test needs, byte by byte."""

    handler: Handler
    accepted: int = 0
    open: int = 0
    bytes_sent: int = 0
    requests: list[bytes] = field(default_factory=list)
    server: asyncio.AbstractServer | None = None
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self.open += 1
        try:
            await self.handler(RawConn(reader, writer, self))
            if not writer.is_closing():  # what the handler wrote reaches the peer before the close
                writer.close()
                await writer.wait_closed()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            self.open -= 1
            writer.transport.abort()  # a handler that breaks off: cut, unflushed

    async def __aenter__(self) -> "RawUpstream":
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        if hasattr(self.server, "close_clients"):
            self.server.close_clients()

    async def idle(self, within_s: float = 3.0) -> None:
        """Wait (bounded) until no connection to this upstream is open."""
        deadline = time.monotonic() + within_s
        while self.open and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert self.open == 0, f"{self.open} upstream connection(s) still open"


def http_head(status: int = 200, headers: dict[str, str] | None = None, *, chunked: bool = False,
              length: int | None = None) -> bytes:
    lines = [f"HTTP/1.1 {status} {'OK' if status == 200 else 'Status'}"]
    for name, value in (headers or {}).items():
        lines.append(f"{name}: {value}")
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


SSE = {"Content-Type": "text/event-stream"}
JSON = {"Content-Type": "application/json"}


def sends_events(events: Iterable[bytes], every_s: float = 0.0) -> Handler:
    """An upstream handler: reads the request, answers a chunked event stream, one HTTP chunk per
    event (`every_s` apart), then the last chunk."""

    async def handler(conn: RawConn) -> None:
        await conn.read_request()
        await conn.send(http_head(200, SSE, chunked=True))
        for event in events:
            await conn.send(chunk(event))
            if every_s:
                await asyncio.sleep(every_s)
        await conn.send(b"0\r\n\r\n")

    return handler


# -- raw clients -----------------------------------------------------------------------


async def raw_exchange(port: int, request: bytes, *, timeout: float = 5.0) -> bytes:
    """Send exact bytes, read until the server closes (or the timeout)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    data = bytearray()
    try:
        async with asyncio.timeout(timeout):
            while piece := await reader.read(65536):
                data += piece
    except (TimeoutError, ConnectionError):
        pass
    finally:
        writer.close()
    return bytes(data)


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/") else 0


def body_of(response: bytes) -> bytes:
    return response.partition(b"\r\n\r\n")[2]


def dechunk(body: bytes) -> bytes:
    out, at = [], 0
    while at < len(body):
        end = body.index(b"\r\n", at)
        size = int(body[at:end].split(b";")[0], 16)
        if size == 0:
            break
        out.append(body[end + 2:end + 2 + size])
        at = end + 4 + size
    return b"".join(out)


# -- a real `llmtap serve` ----------------------------------------------------------------


class Serve:
    """`llmtap serve` in its own process; stderr goes to a file so nothing blocks on a pipe."""

    def __init__(self, upstream: str | None, db: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        self.db = db
        logs = db.parent if db.parent.exists() else db.parent.parent  # never create the database's directory
        self.log = logs / f"serve-{time.monotonic_ns()}.log"
        args = [sys.executable, "-m", "proxy", "serve", "--port", "0", "--db", str(db), *extra]
        if upstream:
            args += ["--upstream", upstream]
        self._log_file = open(self.log, "wb")
        self.proc = subprocess.Popen(args, stdout=self._log_file, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})
        self.base = ""
        self.state: running.State | None = None

    async def started(self, within_s: float = START_S) -> "Serve":
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited {self.proc.returncode}: {self.output()}")
            if (state := state_of(self.proc.pid)) is not None:
                self.base, self.state = state.url, state
                return self
            await asyncio.sleep(0.05)
        self.proc.kill()
        raise AssertionError(f"serve did not start in {within_s} s: {self.output()}")

    async def __aenter__(self) -> "Serve":
        return await self.started()

    async def __aexit__(self, *exc: object) -> None:
        """Never leave a serve process behind, whatever the test did."""
        if self.proc.poll() is None:
            self.stop(signal.SIGKILL if exc[0] is not None else signal.SIGTERM)

    @property
    def admin(self) -> running.AdminClient:
        """Admin requests to this serve, with the token of its state file."""
        assert self.state is not None, "serve has not started"
        return running.AdminClient(self.base, self.state.admin_token)

    @property
    def port(self) -> int:
        return int(self.base.rsplit(":", 1)[1])

    def output(self) -> str:
        if not self._log_file.closed:
            self._log_file.flush()
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(5)
        self._log_file.close()
        return code
