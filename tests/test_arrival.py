"""proxy/relay/arrival.py: each request on a connection is stamped at its own first byte. The checks
compare moments on the one monotonic clock the client and the server share in this process
(which came first), never a duration."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from time import perf_counter_ns

import pytest
from aiohttp import web

from proxy.relay import arrival

from .fast_path_skips import on


async def _stamp(request: web.Request) -> web.Response:
    now = perf_counter_ns()  # as proxy/relay/app.py's middleware does
    stamp = arrival.take(request, now)
    if request.path == "/read":
        await request.read()
    return web.json_response({"stamp": stamp, "handler": now})


@pytest.fixture
async def server() -> AsyncIterator[int]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", _stamp)
    runner = arrival.Runner(app, stamps=on("arrival"))  # as serve makes it (proxy/serve/server.py)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    await runner.cleanup()


def _head(port: int, path: str, length: int = 0) -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {length}\r\n\r\n".encode()


async def _response(reader: asyncio.StreamReader) -> dict:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    return json.loads(await reader.readexactly(length))


async def test_each_keep_alive_request_has_its_own_first_byte(server: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server)
    seen = []
    for _ in range(3):
        before = perf_counter_ns()
        head = _head(server, "/read", 2)
        writer.write(head[:10])  # the headers in two reads: the stamp is the first one's
        await writer.drain()
        await asyncio.sleep(0.05)
        second = perf_counter_ns()
        writer.write(head[10:] + b"{}")
        got = await _response(reader)
        if on("arrival"):
            assert before <= got["stamp"] < second <= got["handler"]
        else:  # the public path: the handler's start, once the headers are whole
            assert second <= got["stamp"] == got["handler"]
        seen.append(got["stamp"])
    writer.close()
    assert seen == sorted(set(seen))


async def test_a_body_left_unread_never_dates_the_next_request(server: int) -> None:
    """The handler answers before the body is all in; aiohttp drains the rest after it: those
    bytes are the old request's, and the next request is stamped at its own first byte."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server)
    writer.write(_head(server, "/early", 10) + b"12345")
    await _response(reader)
    writer.write(b"67890")  # the rest of the body, after the answer
    await writer.drain()
    await asyncio.sleep(0.05)
    before = perf_counter_ns()
    writer.write(_head(server, "/read"))
    got = await _response(reader)
    writer.close()
    assert before <= got["stamp"] <= got["handler"]


async def test_pipelined_requests_each_get_a_stamp(server: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server)
    before = perf_counter_ns()
    writer.write(_head(server, "/read") + _head(server, "/read"))
    first, second = await _response(reader), await _response(reader)
    writer.close()
    assert before <= first["stamp"] <= first["handler"]
    assert before <= second["stamp"] <= second["handler"]
    assert first["handler"] <= second["handler"]
