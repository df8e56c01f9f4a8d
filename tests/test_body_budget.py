"""Request bodies in memory, all requests together (#27 item 5): many large POSTs at once stay
within `serve --body-memory-mb`; those past it get a 503 in the API's shape, and a row."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import duckdb
from aiohttp import web

from tests import procfs
from .serving import RunningProxy

from .conftest import proxy_config, rows
from .faultkit import Serve, body_of, status_of

MIB = 1024 * 1024
BODY_MIB = 60
CLIENTS = 12
BUDGET_MIB = 100  # one 60 MiB body at a time


class CountingUpstream:
    """Reads each body to the end without keeping it, and answers its size."""

    def __init__(self) -> None:
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def _handle(self, request: web.Request) -> web.Response:
        n = 0
        async for data in request.content.iter_any():
            n += len(data)
        return web.json_response({"id": "x", "object": "chat.completion", "received": n})

    async def __aenter__(self) -> "CountingUpstream":
        app = web.Application(client_max_size=0)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


async def post_big(port: int, mib: int) -> bytes:
    """A POST of `mib` MiB with its Content-Length, written 1 MiB at a time from one buffer (the
    test holds 1 MiB per client); the answer is read meanwhile, as llmtap may answer first."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    prefix = b'{"model": "gpt-x", "messages": [{"role": "user", "content": "'
    suffix = b'"}]}'
    filler = b"x" * MIB
    length = len(prefix) + mib * MIB + len(suffix)
    writer.write(f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {length}\r\nConnection: close\r\n\r\n".encode() + prefix)
    answer = asyncio.create_task(reader.read())
    try:
        for _ in range(mib):
            if answer.done():
                break
            writer.write(filler)
            await writer.drain()
        writer.write(suffix)
        await writer.drain()
    except (ConnectionError, OSError):
        pass  # llmtap answered and closed before the body was all sent
    try:
        return await asyncio.wait_for(answer, 120)
    finally:
        writer.close()


async def test_many_large_bodies_at_once_stay_within_the_budget(tmp_path: Path) -> None:
    db = tmp_path / "llmtap.duckdb"
    async with CountingUpstream() as up:
        async with Serve(up.url, db, "--quiet", "--body-memory-mb", str(BUDGET_MIB)) as serve:
            pid = serve.proc.pid
            before = procfs.reset_peak(pid) / 1024
            answers = await asyncio.gather(*(post_big(serve.port, BODY_MIB) for _ in range(CLIENTS)))
            grew = procfs.peak_rss_kib(pid) / 1024 - before
            assert serve.stop() == 0
    statuses = sorted(status_of(a) for a in answers)
    assert 200 in statuses and 503 in statuses and set(statuses) == {200, 503}, statuses
    # 100 MiB of bodies at most, and each also once more as it is joined and sent: never 12 x 60 MiB
    assert grew < 3 * BUDGET_MIB, f"serve grew by {grew:.0f} MB"
    refused = next(a for a in answers if status_of(a) == 503)
    assert b"\r\nretry-after: 1\r\n" in refused.lower()
    assert json.loads(body_of(refused))["error"]["code"] == "body_memory_full"
    con = duckdb.connect(str(db), read_only=True)
    found = con.execute("SELECT status, outcome, error_type FROM requests ORDER BY status").fetchall()
    con.close()
    assert len(found) == CLIENTS
    assert {r for r in found if r[0] == 503} == {(503, "http_error", "body_memory_full")}
    assert statuses.count(200) == sum(1 for r in found if r[0] == 200)


async def test_a_body_alone_goes_through_even_when_larger_than_the_budget(tmp_path: Path) -> None:
    """A budget below --max-body-mb would otherwise refuse such a body for ever: alone, it is let in,
    with its Content-Length and chunked alike."""
    async with CountingUpstream() as up:
        config = proxy_config(up.url, tmp_path, body_memory_mb=1)
        async with RunningProxy(config) as p:
            answers = [await post_big(p.port, 3) for _ in range(2)]
            async with aiohttp.ClientSession() as s:
                async def pieces():
                    for _ in range(3):
                        yield b"x" * MIB
                async with s.post(p.url + "/v1/chat/completions", data=pieces()) as r:
                    chunked = (r.status, await r.json())
            found = rows(p, "SELECT status, error_type FROM requests")
    assert [status_of(a) for a in answers] == [200, 200]
    assert chunked[0] == 200 and chunked[1]["received"] == 3 * MIB
    assert found == [{"status": 200, "error_type": None}] * 3
