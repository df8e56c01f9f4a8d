"""The lean response path (proxy/relay/body_pipe.py): what it must keep that the read-and-write loop gave.

Each test is a case the pipe handles differently from aiohttp's reader: many HTTP chunks in one
read, a body that is complete before the pipe takes over, a client too slow for a chunked stream,
HTTP/1.0 framing, and every way a relay ends leaving no pipe behind."""

from __future__ import annotations

import asyncio
import hashlib
import socket
from pathlib import Path

import aiohttp

from proxy.relay import body_pipe
from .serving import RunningProxy

from .conftest import proxy_config, rows
from .waiting import wait_until, wait_until_still
from .faultkit import SSE, RawConn, RawUpstream, body_of, chunk, dechunk, http_head, raw_exchange, sends_events, status_of

CHAT = "/v1/chat/completions"


DONE = b"data: [DONE]\n\n"


def event(i: int) -> bytes:
    return b'data: {"choices":[{"index":0,"delta":{"content":"t%d"}}]}\n\n' % i


async def slow_reader(port: int) -> tuple[socket.socket, bytearray]:
    """A client with a small receive buffer that posts a streaming request and reads its first
    bytes only: what it reads next is up to the test."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", port))
    await loop.sock_sendall(sock, b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                            b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
    return sock, bytearray(await loop.sock_recv(sock, 65536))


async def read_to_the_end(sock: socket.socket, received: bytearray) -> None:
    """The rest of a chunked response, up to its last chunk (bounded in time), then close."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(60):
        while not received.endswith(b"0\r\n\r\n"):
            data = await loop.sock_recv(sock, 1 << 20)
            assert data, "the proxy closed the connection before the end"
            received += data
    sock.close()


async def test_thousands_of_http_chunks_in_one_read(tmp_path: Path) -> None:
    """aiohttp's reader marks every HTTP chunk's end and pauses the connection past a few thousand
    unread marks; the pipe reads none of them, so it must keep none."""
    events = [event(i) for i in range(20_000)] + [DONE]

    async def burst(conn: RawConn) -> None:
        await conn.read_request()
        await conn.send(http_head(200, SSE, chunked=True) + b"".join(chunk(e) for e in events) + b"0\r\n\r\n")

    async with RawUpstream(burst) as up, RunningProxy(proxy_config(up.url, tmp_path)) as p:
        async with aiohttp.ClientSession() as s:
            async with asyncio.timeout(20):
                async with s.post(p.url + CHAT, json={"stream": True}) as r:
                    body = await r.read()
        row = rows(p)[0]
    assert body == b"".join(events)
    assert row["outcome"] == "ok" and row["output_events"] == len(events) - 1
    assert not body_pipe.PIPES


async def test_a_body_complete_with_its_headers(tmp_path: Path) -> None:
    """Headers and the whole body in one segment: the reader holds it all before the pipe starts."""
    body = b'{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}'

    async def at_once(conn: RawConn) -> None:
        for _ in range(3):
            await conn.read_request()
            await conn.send(http_head(200, {"Content-Type": "application/json"}, length=len(body)) + body)

    async with RawUpstream(at_once) as up, RunningProxy(proxy_config(up.url, tmp_path)) as p:
        async with aiohttp.ClientSession() as s:
            for _ in range(3):  # and again on the pooled connection
                async with s.post(p.url + CHAT, json={}) as r:
                    assert await r.read() == body
        found = rows(p)
    assert [(r["outcome"], r["output_tokens"], r["response_bytes"]) for r in found] == [("ok", 1, len(body))] * 3
    assert up.accepted == 1


async def test_a_slow_client_pauses_a_chunked_stream_and_gets_every_byte(tmp_path: Path) -> None:
    """Backpressure with chunk framing: the upstream stalls while the client reads nothing, then the
    client reads the rest, unchanged and in order, and the row counts every event."""
    piece = b"data: " + b"x" * 16_000 + b"\n\n"  # not JSON: relayed as is, noted, not counted
    count = 4_000  # 64 MB

    async with RawUpstream(sends_events([piece] * count)) as up, RunningProxy(proxy_config(up.url, tmp_path)) as p:
        sock, received = await slow_reader(p.port)
        # the upstream stops writing to a proxy whose client does not read (else it never holds still)
        stalled = await wait_until_still(lambda: up.bytes_sent, still_s=1.0, what="the upstream's bytes sent")
        assert stalled < 16 << 20, f"{stalled >> 20} MiB left the upstream for a client that reads nothing"
        await read_to_the_end(sock, received)
        row = rows(p)[0]
    assert hashlib.sha256(dechunk(body_of(bytes(received)))).digest() == hashlib.sha256(piece * count).digest()
    assert row["response_bytes"] == len(piece) * count and row["outcome"] == "stream_truncated"  # no [DONE]
    assert not body_pipe.PIPES


async def test_an_http_1_0_client_gets_the_body_unframed(tmp_path: Path) -> None:
    events = [event(i) for i in range(50)] + [DONE]

    async with RawUpstream(sends_events(events)) as up, RunningProxy(proxy_config(up.url, tmp_path)) as p:
        reply = await raw_exchange(p.port, b"POST " + CHAT.encode() + b" HTTP/1.0\r\nHost: 127.0.0.1\r\n"
                                   b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
        row = rows(p)[0]
    assert status_of(reply) == 200 and b"transfer-encoding" not in reply.partition(b"\r\n\r\n")[0].lower()
    assert body_of(reply) == b"".join(events)
    assert row["outcome"] == "ok" and row["output_events"] == len(events) - 1


async def test_no_pipe_outlives_its_relay(tmp_path: Path) -> None:
    """A client that leaves, an upstream that goes silent and one that breaks off: each relay ends
    with its row, and hands the upstream's reader back."""

    async def silent_after_one(conn: RawConn) -> None:
        await conn.read_request()
        await conn.send(http_head(200, SSE, chunked=True) + chunk(event(0)))
        await conn.closed_by_peer(within_s=10)

    async def broken_after_one(conn: RawConn) -> None:
        await conn.read_request()
        await conn.send(http_head(200, SSE, chunked=True) + chunk(event(0)))
        conn.reset()

    async def endless(conn: RawConn) -> None:
        await conn.read_request()
        await conn.send(http_head(200, SSE, chunked=True))
        for i in range(500):
            await conn.send(chunk(event(i)))
            await asyncio.sleep(0.01)

    outcomes = []
    for handler, extra in ((silent_after_one, {"idle_timeout_s": 0.5}), (broken_after_one, {}), (endless, {})):
        async with RawUpstream(handler) as up, RunningProxy(proxy_config(up.url, tmp_path / handler.__name__, **extra)) as p:
            async with aiohttp.ClientSession() as s:
                r = await s.post(p.url + CHAT, json={"stream": True})
                assert await r.content.readuntil(b"\n\n") == event(0)
                if handler is endless:
                    r.close()
                else:
                    try:
                        await r.read()
                    except aiohttp.ClientPayloadError:
                        pass
            await wait_until(lambda: p.state.requests_seen, what="the request's row")
            outcomes.append(rows(p)[0]["outcome"])
        assert not body_pipe.PIPES
    assert outcomes == ["upstream_timeout", "stream_truncated", "client_disconnected"]


async def test_the_idle_timeout_counts_silence_not_the_stream_s_length(tmp_path: Path) -> None:
    """`--idle-timeout` 0.3 s: a stream with an event every 50 ms for 1.5 s is not cut; one the
    upstream pauses 1 s in is, after its first events."""
    events = [event(i) for i in range(30)] + [DONE]

    steady = sends_events(events, every_s=0.05)

    async def stalls(conn: RawConn) -> None:
        await conn.read_request()
        await conn.send(http_head(200, SSE, chunked=True))
        for e in events[:5]:
            await conn.send(chunk(e))
            await asyncio.sleep(0.05)
        await conn.closed_by_peer(within_s=1.0)

    found = []
    for handler in (steady, stalls):
        async with RawUpstream(handler) as up, RunningProxy(proxy_config(up.url, tmp_path / handler.__name__,
                                                                         idle_timeout_s=0.3)) as p:
            async with aiohttp.ClientSession() as s:
                async with s.post(p.url + CHAT, json={"stream": True}) as r:
                    try:
                        body = await r.read()
                    except aiohttp.ClientPayloadError:
                        body = b""
            row = rows(p)[0]
            found.append((row["outcome"], row["output_events"]))
            if handler is steady:
                assert body == b"".join(events)
    assert found == [("ok", 30), ("upstream_timeout", 5)]


async def test_a_client_paused_past_the_idle_timeout_is_no_upstream_timeout(tmp_path: Path) -> None:
    """The upstream is held back for the client (backpressure) longer than `--idle-timeout`: that
    silence is the client's, and the stream completes."""
    piece = b'data: {"choices":[{"index":0,"delta":{"content":"' + b"x" * 16_000 + b'"}}]}\n\n'
    count = 1_000

    async with RawUpstream(sends_events([piece] * count + [DONE])) as up, RunningProxy(proxy_config(up.url, tmp_path, idle_timeout_s=0.3)) as p:
        sock, received = await slow_reader(p.port)
        # four idle periods in which the upstream, held back for the client, sends nothing
        await wait_until_still(lambda: up.bytes_sent, still_s=1.2, what="the upstream's bytes sent")
        await read_to_the_end(sock, received)
        row = rows(p)[0]
    assert dechunk(body_of(bytes(received))) == piece * count + DONE
    assert (row["outcome"], row["output_events"]) == ("ok", count)
