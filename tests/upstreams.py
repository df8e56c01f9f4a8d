"""A scripted upstream for byte-exact relay tests: it answers fixed bytes, fixed headers,
in fixed chunks at fixed times, and records what it received. (The simulator makes
realistic traffic; this one makes traffic whose every byte the test knows.)"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Script:
    status: int = 200
    headers: list[tuple[str, str]] = field(default_factory=list)
    chunks: list[bytes] = field(default_factory=list)
    delay_s: float = 0.0  # before each chunk
    reason: str | None = None


@dataclass
class Received:
    method: str
    path_qs: str
    headers: list[tuple[str, str]]
    body: bytes


def raw_headers(request: web.Request) -> list[tuple[str, str]]:
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.raw_headers]


class ScriptedUpstream:
    def __init__(self, script: Script | None = None) -> None:
        self.script = script or Script()
        self.received: list[Received] = []
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.received.append(Received(request.method, request.raw_path, raw_headers(request), body))
        s = self.script
        resp = web.StreamResponse(status=s.status, reason=s.reason)
        for name, value in s.headers:
            resp.headers.add(name, value)
        await resp.prepare(request)
        for chunk in s.chunks:
            if s.delay_s:
                await asyncio.sleep(s.delay_s)
            await resp.write(chunk)
        await resp.write_eof()
        return resp

    async def __aenter__(self) -> "ScriptedUpstream":
        app = web.Application(client_max_size=0)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, auto_decompress=False, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


