"""What docs/guarantees.md says llmtap adds to an answer it relays: nothing of its own; aiohttp's `Date`
and `Server` where the upstream sent none; an upstream's own `Date` and `Server` unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import proxy_config
from .faultkit import RawConn, RawUpstream, raw_exchange
from .serving import RunningProxy

REQUEST = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
OWN = b"Date: Mon, 30 Nov 2026 00:00:00 GMT\r\nServer: the-upstream\r\n"


def headers_of(answer: bytes) -> dict[str, str]:
    lines = answer.split(b"\r\n\r\n", 1)[0].decode().split("\r\n")[1:]
    return {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}


@pytest.mark.parametrize("own", [b"", OWN], ids=["none", "the-upstream's"])
async def test_date_and_server_are_the_only_headers_added(own: bytes, tmp_path: Path) -> None:
    async def answer(conn: RawConn) -> None:
        await conn.read_request()
        await conn.send(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n" + own
                        + b"Connection: close\r\n\r\n{}")

    async with RawUpstream(answer) as up, RunningProxy(proxy_config(up.url, tmp_path)) as proxy:
        got = headers_of(await raw_exchange(proxy.port, REQUEST))
    assert set(got) == {"content-type", "content-length", "connection", "date", "server"}
    if own:
        assert (got["date"], got["server"]) == ("Mon, 30 Nov 2026 00:00:00 GMT", "the-upstream")
    else:
        assert got["server"].startswith("Python/") and " aiohttp/" in got["server"]
