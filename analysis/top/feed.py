"""Reading the proxy's live feed (`GET /_llmtap/live`), and once its recent rows.

`find_proxy` says where to connect: `--url`, else the running `llmtap serve`
found through its state file (which also holds its admin token). `ticks`
yields each `tick` event's JSON as a dict. `backfill` asks the proxy's SQL
endpoint for the rows of the window, so the percentiles do not start empty.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import aiohttp
import orjson

from proxy.common import paths, instances as running
from proxy.observe.live import FINISHED_FIELDS
from proxy.common.instances import AdminClient
from proxy.meter.sse import SSEParser

SILENCE_S = 5.0  # the proxy ticks every 250 ms: this much silence means it is gone
BACKFILL_LIMIT = 50_000


class FeedError(Exception):
    """The proxy cannot be found or refused the feed; the message is for the user."""


Proxy = AdminClient  # the proxy the feed comes from: its URL and admin token


def find_proxy(url: str | None, token: str | None = None) -> Proxy:
    """`url` (with the running proxy's token when it is that proxy), else the running `llmtap serve`."""
    client = running.find_client(url, token)
    if client is None:
        raise FeedError(f"no running `llmtap serve` found (no state file in {paths.state_dir()}): "
                        "start one, or pass --url")
    return client


async def ticks(session: aiohttp.ClientSession, proxy: Proxy) -> AsyncGenerator[dict[str, Any], None]:
    """The feed's ticks until the proxy closes it (FeedError if it refuses)."""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=SILENCE_S)
    async with session.get(proxy.endpoint("live"), headers=proxy.headers(), timeout=timeout) as resp:
        if resp.status != 200:
            raise FeedError(f"{proxy.url} refused the live feed: HTTP {resp.status} {await _error(resp)}")
        parser = SSEParser()
        async for chunk in resp.content.iter_any():
            for event, data in parser.feed(chunk):
                if event == "tick":
                    yield orjson.loads(data)


async def _error(resp: aiohttp.ClientResponse) -> str:
    try:
        return str((await resp.json(content_type=None))["error"])
    except (ValueError, KeyError, TypeError, aiohttp.ClientError):
        return resp.reason or ""


def backfill_sql(window_s: float) -> str:
    columns = ", ".join(FINISHED_FIELDS)
    return (f"SELECT {columns}, epoch(started_at) AS started FROM requests"
            f" WHERE started_at >= now() - to_milliseconds({int(window_s * 1000)})"
            f" ORDER BY started_at LIMIT {BACKFILL_LIMIT}")


async def backfill(session: aiohttp.ClientSession, proxy: Proxy, window_s: float) -> list[dict[str, Any]]:
    """The window's finished rows from the proxy's database; none when it records nothing."""
    try:
        async with session.post(proxy.endpoint("sql"), json={"sql": backfill_sql(window_s)},
                                headers=proxy.headers(), timeout=aiohttp.ClientTimeout(total=15)) as resp:
            if resp.status != 200:
                return []
            answer = await resp.json()
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return []
    return [dict(zip(answer["columns"], row)) for row in answer["rows"]]
