"""Faults from the client, on purpose: it goes away at every stage, stops reading, sends too
much or sends garbage, or comes a thousand at once. The proxy keeps serving, a row records
each request, and memory, file descriptors and upstream connections return to baseline."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import resource
import socket
from pathlib import Path

import aiohttp
import pytest

from .serving import RunningProxy
from proxy.simulator.app import Simulator
from proxy.simulator.config import SimConfig

from .conftest import proxy_config, rows
from .waiting import wait_until, wait_until_still
from .faultkit import (SSE, Baseline, RawConn, RawUpstream, chunk, http_head, open_fds, peak_rss_mb, raw_exchange, reset_peak,
                       status_of)

CHAT = "/v1/chat/completions"
EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"tok"}}]}\n\n'


def post_head(path: str, length: int, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n{extra}\r\n").encode()


async def streaming_upstream(conn: RawConn) -> None:
    """Headers, then an event every 20 ms for up to 10 s."""
    await conn.read_request()
    await conn.send(http_head(200, SSE, chunked=True))
    for _ in range(500):
        await conn.send(chunk(EVENT))
        await asyncio.sleep(0.02)


# -- going away ------------------------------------------------------------------------------


async def test_client_leaves_while_sending_the_body(tmp_path: Path) -> None:
    async with RawUpstream(streaming_upstream) as up, RunningProxy(proxy_config(up.url, tmp_path)) as p:
        base = Baseline()
        for _ in range(3):
            reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
            writer.write(post_head(CHAT, 1_000_000) + b'{"model": "m", "messages": [' + b" " * 10_000)
            await writer.drain()
            await wait_until(lambda: p.state.recorder.inflight, what="the request in flight")
            writer.transport.abort()
        await wait_until(lambda: p.state.requests_seen == 3)
        await base.settled()
        found = rows(p)
    assert up.accepted == 0, "a partial body must not be forwarded"
    assert [r["outcome"] for r in found] == ["client_disconnected"] * 3
    assert all(r["status"] is None for r in found)


async def test_client_leaves_before_the_response_headers(tmp_path: Path) -> None:
    async def slow_to_answer(conn: RawConn) -> None:
        await conn.read_request()
        await conn.closed_by_peer(10)

    async with RawUpstream(slow_to_answer) as up, RunningProxy(proxy_config(up.url, tmp_path)) as p:
        base = Baseline()
        body = b'{"model": "m", "stream": true}'
        reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
        writer.write(post_head(CHAT, len(body)) + body)
        await wait_until(lambda: len(up.requests) == 1)
        writer.transport.abort()
        await up.idle(within_s=1.0)  # the upstream request is cancelled at once
        await wait_until(lambda: p.state.requests_seen == 1)
        await base.settled()
        row = rows(p)[0]
    assert row["outcome"] == "client_disconnected" and row["status"] is None


async def test_client_leaves_mid_stream(tmp_path: Path) -> None:
    async with RawUpstream(streaming_upstream) as up, RunningProxy(proxy_config(up.url, tmp_path)) as p:
        base = Baseline()
        for _ in range(3):
            async with aiohttp.ClientSession() as s:
                r = await s.post(p.url + CHAT, json={"model": "m", "stream": True})
                assert await r.content.readuntil(b"\n\n") == EVENT.rstrip(b"\n") + b"\n\n"
                r.close()
        await up.idle(within_s=1.0)
        await wait_until(lambda: p.state.requests_seen == 3)
        await base.settled()
        found = rows(p)
    assert up.accepted == 3
    assert [(r["outcome"], r["status"]) for r in found] == [("client_disconnected", 200)] * 3


# -- reading slowly --------------------------------------------------------------------------------


async def test_a_client_that_stops_reading_pauses_the_upstream(tmp_path: Path) -> None:
    """Backpressure end to end: the proxy buffers a bounded amount and the upstream stops writing."""
    total = 256 << 20
    block = bytes(range(256)) * 1024

    async def firehose(conn: RawConn) -> None:
        await conn.read_request()
        await conn.send(http_head(200, {"Content-Type": "application/octet-stream"}, length=total))
        for _ in range(total // len(block)):
            await conn.send(block)

    async with RawUpstream(firehose) as up, RunningProxy(proxy_config(up.url, tmp_path)) as p:
        before = reset_peak()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_connect(sock, ("127.0.0.1", p.port))
        await loop.sock_sendall(sock, b"GET /v1/files/f/content HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        head = await loop.sock_recv(sock, 4096)
        assert status_of(head) == 200
        # the client reads nothing more: the upstream stops writing (else it never holds still)
        stalled = await wait_until_still(lambda: up.bytes_sent, still_s=1.0, what="the upstream's bytes sent")
        assert stalled < 32 << 20, f"{stalled >> 20} MiB left the upstream for a client that reads nothing"
        grew = peak_rss_mb() - before
        assert grew < 30, f"peak RSS grew {grew:.0f} MB while the client did not read"
        received, digest = len(head.partition(b"\r\n\r\n")[2]), hashlib.sha256(head.partition(b"\r\n\r\n")[2])
        while received < total:  # now read it all: nothing lost, nothing reordered
            data = await loop.sock_recv(sock, 1 << 20)
            assert data, f"connection closed after {received} bytes"
            received += len(data)
            digest.update(data)
        sock.close()
        row = rows(p)[0]
    expected = hashlib.sha256()
    for _ in range(total // len(block)):
        expected.update(block)
    assert received == total and digest.digest() == expected.digest()
    assert row["outcome"] == "ok" and row["response_bytes"] == total


# -- too much, or garbage ------------------------------------------------------------------------------


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_a_body_over_the_limit_is_413_in_the_apis_shape(tmp_path: Path, framing: str) -> None:
    async with RawUpstream(streaming_upstream) as up, \
            RunningProxy(proxy_config(up.url, tmp_path, max_body_mb=0.01)) as p:
        body = b'{"model": "m", "messages": ["' + b"x" * 20_000 + b'"]}'
        if framing == "content-length":
            request = post_head("/v1/messages", len(body), "Connection: close\r\n") + body
        else:
            request = (b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
                       b"Connection: close\r\n\r\n"
                       + chunk(body[:8000]) + chunk(body[8000:]) + b"0\r\n\r\n")
        response = await raw_exchange(p.port, request, timeout=2)
        row = rows(p)[0]
    assert status_of(response) == 413
    assert b'"type":"error"' in response and b'"request_too_large"' in response
    assert up.accepted == 0
    assert row["outcome"] == "http_error" and row["status"] == 413


async def test_malformed_json_is_forwarded_unchanged_and_noted(tmp_path: Path) -> None:
    async def echo(conn: RawConn) -> None:
        await conn.read_request()
        await conn.send(http_head(400, {"Content-Type": "application/json"}, length=2) + b"{}")

    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}'  # cut short
    async with RawUpstream(echo) as up, RunningProxy(proxy_config(up.url, tmp_path)) as p:
        response = await raw_exchange(p.port, post_head(CHAT, len(body), "Connection: close\r\n") + body)
        row = rows(p)[0]
    assert status_of(response) == 400
    assert up.requests[0].endswith(b"\r\n\r\n" + body)
    assert row["request_parse_error"].startswith("body is not JSON")
    assert row["request_bytes"] == len(body) and row["outcome"] == "http_error"


# -- many at once ----------------------------------------------------------------------------------------


async def test_a_thousand_concurrent_streams(tmp_path: Path) -> None:
    n = 1000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 8 * n:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(8 * n, hard), hard))
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    sim = Simulator(SimConfig(ttft_ms=200, itl_ms=20, tokens=10, prefill_us_per_token=0))
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(sim)
        p = await stack.enter_async_context(RunningProxy(proxy_config(sim.url, tmp_path, flush_interval_s=0.5)))
        base = Baseline()

        async def one(s: aiohttp.ClientSession) -> bytes:
            async with s.post(p.url + CHAT, json=body) as r:
                return await r.read()

        async def thousand() -> list[bytes]:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
                return await asyncio.wait_for(asyncio.gather(*(one(s) for _ in range(n))), 60)

        first = await thousand()
        warm = Baseline()  # this process's heap, the client's included, after a first thousand
        bodies = await thousand()
        peak_fds = open_fds()
        await warm.settled(rss_slack_mb=80, fd_slack=n + 8, within_s=5)  # a second thousand keeps < 80 KiB each
        await sim.__aexit__(None, None, None)  # it closes its keep-alive connections: the proxy must let go of its own
        await base.settled(rss_slack_mb=120, fd_slack=8, within_s=5)
        found = rows(p, "SELECT outcome, count(*) AS n, max(output_events) AS events FROM requests GROUP BY 1")
    assert peak_fds > base.fds + n  # the pooled upstream connections were there a moment ago
    assert all(b.endswith(b"data: [DONE]\n\n") for b in first + bodies)
    assert found == [{"outcome": "ok", "n": 2 * n, "events": 10}]
