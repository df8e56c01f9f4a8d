"""llmtap's own time goes into llmtap's own columns (#26): a request, or an upstream's headers,
that waited in the kernel while the proxy's loop was blocked is dated when it came
(proxy/relay/kernel_timing.py), and the wait counts in `proxy_overhead_ms` or `proxy_wait_ms`, never in the
network's or the upstream's parts. The loop is blocked deliberately from the test (the client
path, or a test-only upstream's thread); each check compares moments on the monotonic clock the
test and the proxy share in this process (the block's start and end against what was recorded),
never a duration against a threshold."""

from __future__ import annotations

import asyncio
import fcntl
import json
import socket
import struct
import termios
import threading
import time
from pathlib import Path
from time import perf_counter_ns

import aiohttp
import pytest

from proxy.meter.connection_marks import ConnectionMarks
from proxy.relay import conn_timing, kernel_timing
from .serving import RunningProxy

from .conftest import proxy_config, rows
from .faultkit import RawConn, RawUpstream, http_head
from .waiting import wait_until
from .fast_path_skips import needs

pytestmark = needs("kernel_stamps")

BODY = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode()
PARTS = ("proxy_overhead_ms", "pool_wait_ms", "dns_ms", "connect_ms", "tls_ms", "upstream_wait_ms", "proxy_wait_ms")
BLOCK_S = 0.05


def request(port: int) -> bytes:
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer sk-test\r\nContent-Length: {len(BODY)}\r\n\r\n").encode() + BODY


async def answer(sock: socket.socket) -> bytes:
    """The whole chunked response (it ends with the last chunk)."""
    loop, got = asyncio.get_running_loop(), b""
    while not got.endswith(b"0\r\n\r\n"):
        data = await asyncio.wait_for(loop.sock_recv(sock, 65536), 10)
        assert data, got
        got += data
    return got


def adds_up(row: dict) -> None:
    assert sum(row[name] for name in PARTS) == pytest.approx(row["upstream_headers_ms"], abs=1e-6)
    assert row["upstream_headers_ms"] + row["headers_to_first_token_ms"] == pytest.approx(row["ttft_ms"], abs=1e-6)


@needs("arrival")  # the public path dates a request at its handler's start
async def test_a_request_waiting_for_the_blocked_loop_counts_in_llmtaps_own_part(proxy: RunningProxy) -> None:
    """Sent while the loop is blocked: on a connection not accepted yet (the bytes wait unread when
    it comes), then again on the same connection, kept alive (read by llmtap itself)."""
    port = int(proxy.url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port))
    blocked = []
    try:
        for _ in range(2):
            sock.setblocking(True)
            sock.sendall(request(port))  # the kernel has the request when this returns
            sent = perf_counter_ns()
            time.sleep(BLOCK_S)  # the proxy's loop (this one) cannot read it meanwhile
            blocked.append(perf_counter_ns() - sent)
            sock.setblocking(False)
            assert b"data: [DONE]" in await answer(sock)
    finally:
        sock.close()
    recorded = rows(proxy)
    assert len(recorded) == 2
    for row, block_ns in zip(recorded, blocked):
        adds_up(row)
        # dated at its arrival (before `sent`); llmtap could send it upstream only after the block
        assert row["proxy_overhead_ms"] * 1e6 >= block_ns, [r["proxy_overhead_ms"] for r in recorded]
        assert row["ttft_ms"] * 1e6 >= block_ns


class HeldUpstream:
    """A one-connection upstream in a thread that sends its headers while the proxy's loop is
    blocked (a callback it puts on that loop sleeps until the headers are in the kernel)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sent = self.unblocked = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data or not data.endswith(BODY):
                data += conn.recv(65536)
            started, sent = threading.Event(), threading.Event()

            def block() -> None:
                started.set()
                sent.wait(5)
                time.sleep(BLOCK_S)
                self.unblocked = perf_counter_ns()

            self.loop.call_soon_threadsafe(block)
            started.wait(5)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            self.sent = perf_counter_ns()
            sent.set()
            event = b'data: {"choices":[{"index":0,"delta":{"content":"hello"}}]}\n\ndata: [DONE]\n\n'
            conn.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(event), event))
            conn.recv(1)  # until the proxy lets go

    def close(self) -> None:
        self.listener.close()


async def test_headers_that_waited_for_the_blocked_loop_count_in_proxy_wait(tmp_path: Path) -> None:
    upstream = HeldUpstream(asyncio.get_running_loop())
    try:
        async with RunningProxy(proxy_config(f"http://127.0.0.1:{upstream.port}", tmp_path)) as p:
            port = int(p.url.rsplit(":", 1)[1])
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request(port))
            head = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 10)
            writer.close()
            assert b"hello" in head
            (row,) = rows(p)
    finally:
        upstream.close()
    adds_up(row)
    # the headers were in the kernel by `sent`; llmtap had them only after `unblocked`
    assert row["proxy_wait_ms"] * 1e6 >= upstream.unblocked - upstream.sent, row


async def test_bytes_read_stamped_are_the_transports_bytes() -> None:
    """RxStamp on a plain asyncio server: a body larger than one read comes through whole and in
    order, the first read stamped no later than it was handed on."""
    got: list[bytes] = []
    stamps: list[tuple[int, int]] = []
    loop = asyncio.get_running_loop()
    done, armed = loop.create_future(), loop.create_future()

    class Server(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert kernel_timing.usable(transport)
            self.rx = kernel_timing.RxStamp(transport, self.data_received)  # type: ignore[arg-type]
            loop.call_soon(lambda: armed.set_result(self.rx.arm()))  # once the transport reads (uvloop)

        def data_received(self, data: bytes) -> None:
            if self.rx.stamp is not None:
                stamps.append((self.rx.stamp, perf_counter_ns()))
            got.append(data)
            if sum(map(len, got)) >= len(payload) and not done.done():
                done.set_result(None)

        def connection_lost(self, exc: BaseException | None) -> None:
            self.rx.close()

    payload = bytes(range(256)) * 4096  # 1 MiB: four of the reader's reads at least
    server = await loop.create_server(Server, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    assert await asyncio.wait_for(armed, 10)
    writer.write(payload)
    await asyncio.wait_for(done, 10)
    writer.close()
    server.close()
    assert b"".join(got) == payload
    assert stamps and all(stamp <= handed for stamp, handed in stamps)


async def test_the_answers_reader_leaves_a_connection_aiohttp_holds_alone() -> None:
    """The upstream connector's reader of the answer's first byte (kernel_timing.stamp_answer) hands
    aiohttp more than its buffer takes (a `read_bufsize` of 256 bytes): aiohttp's flow control holds
    the connection, and the reader must not start it reading again; the rest comes once the body is read."""
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n"
    first, rest = b"a" * 8192, b"b" * 65536
    go_on = asyncio.Event()

    async def answer(conn: RawConn) -> None:
        await conn.read_request()
        await conn.send(head % (len(first) + len(rest)) + first)  # one write: one read of the proxy's
        await go_on.wait()
        await conn.send(rest)

    marks = ConnectionMarks(tls=False)
    async with RawUpstream(answer) as up, aiohttp.ClientSession(
            connector=conn_timing.TimedConnector(kernel=True), read_bufsize=256) as session:
        timing = conn_timing.CURRENT.set(marks)
        try:
            response = await asyncio.wait_for(session.get(up.url), 10)
        finally:
            kernel_timing.settle()  # as the relay does once the headers are in
            conn_timing.CURRENT.reset(timing)
        assert marks.answered is not None  # the reader read the answer, stamped
        low, high = response.content.get_read_buffer_limits()
        assert response.content.total_bytes > high  # aiohttp holds the connection's reading now
        assert response.connection is not None and response.connection.transport is not None
        assert not response.connection.transport.is_reading()
        go_on.set()
        assert await asyncio.wait_for(response.read(), 10) == first + rest


def test_a_protocol_without_aiohttps_flow_control_flags_counts_as_held() -> None:
    from aiohttp.client_proto import ResponseHandler

    class Other(asyncio.Protocol):  # an aiohttp shaped otherwise: no flags to read
        pass

    assert kernel_timing.held(Other())
    loop = asyncio.new_event_loop()
    try:
        protocol = ResponseHandler(loop)
        assert not kernel_timing.held(protocol)
        protocol._reading_paused = True
        assert kernel_timing.held(protocol)
    finally:
        loop.close()


def unread(sock: socket.socket) -> int:
    """The bytes waiting in a socket's receive queue (FIONREAD)."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]


@needs("arrival")  # the reader of a connection's next request is arrival.py's
async def test_the_next_requests_reader_leaves_a_connection_aiohttp_holds_alone(tmp_path: Path) -> None:
    """A client pipelines more requests than aiohttp queues (32) while the upstream holds the first
    answer: aiohttp's flow control holds the connection's reading until its queue drains, and the
    reader of the next request must not read what the client sends meanwhile, nor start the
    connection reading again. Every request is answered once the upstream goes on."""
    go_on = asyncio.Event()

    async def answer(conn: RawConn) -> None:
        while True:
            await conn.read_request()
            await go_on.wait()
            await conn.send(http_head(200, {"Content-Type": "application/json"}, length=2) + b"{}")

    one = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
           b"Content-Length: 2\r\n\r\n{}")
    async with RawUpstream(answer) as up, RunningProxy(proxy_config(up.url, tmp_path)) as p:
        assert p.runner is not None
        sock = socket.create_connection(("127.0.0.1", int(p.url.rsplit(":", 1)[1])))
        try:
            sock.sendall(one * 40)
            server = p.runner.server
            assert server is not None
            handler = await wait_until(lambda: next((h for h in server.connections if kernel_timing.held(h)), None),
                                       what="aiohttp holding the connection")
            sock.sendall(one)  # one more while it holds
            waiting = handler.transport.get_extra_info("socket")  # type: ignore[union-attr]
            await wait_until(lambda: unread(waiting) == len(one), what="the request in the proxy's kernel")
            async with aiohttp.ClientSession() as s, s.get(p.url + "/_llmtap/health", headers=p.admin.headers()) as r:
                assert r.status == 200  # the loop has polled since those bytes came: a reader would have had them
            assert handler.transport is not None and not handler.transport.is_reading()
            assert unread(waiting) == len(one)  # still in the kernel
            go_on.set()
            sock.setblocking(False)
            got, loop = b"", asyncio.get_running_loop()
            while got.count(b"\r\n\r\n{}") < 41:
                data = await asyncio.wait_for(loop.sock_recv(sock, 65536), 10)
                assert data, got
                got += data
        finally:
            sock.close()
