"""Reading the proxy's live feed (`GET /_llmtap/live`), and once its recent rows.

`find_proxy` says where to connect: `--url`, else the running `llmtap serve`
found through its state file (which also holds its admin token). `ticks`
yields each `tick` event's JSON as a dict. `backfill` asks the proxy's SQL
endpoint for the rows of the window, so the percentiles do not start empty.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from proxy import paths
from proxy.live import FINISHED_FIELDS
from proxy.sse import SSEParser

from ..source import _connect_host

TOKEN_HEADER = "X-Llmtap-Admin-Token"
LIVE_PATH = "/_llmtap/live"
SQL_PATH = "/_llmtap/sql"
SILENCE_S = 5.0  # the proxy ticks every 250 ms: this much silence means it is gone
BACKFILL_LIMIT = 50_000


class FeedError(Exception):
    """The proxy cannot be found or refused the feed; the message is for the user."""


@dataclass(frozen=True)
class Proxy:
    url: str  # base URL, no trailing slash
    token: str | None = None

    def headers(self) -> dict[str, str]:
        return {TOKEN_HEADER: self.token} if self.token else {}


def _serve_state() -> dict[str, Any] | None:
    try:
        state = json.loads(paths.state_path().read_text())
        return state if isinstance(state, dict) else None
    except (OSError, ValueError):
        return None


def find_proxy(url: str | None, token: str | None = None) -> Proxy:
    """`url` (with the running proxy's token when it is that proxy), else the running `llmtap serve`."""
    state = _serve_state()
    if url:
        same = state is not None and urlsplit(url).port == state.get("port")
        return Proxy(url.rstrip("/"), token or (state.get("admin_token") if same and state else None))
    if state is None or "port" not in state:
        raise FeedError(f"no running `llmtap serve` found ({paths.state_path()} is missing): "
                        "start one, or pass --url")
    return Proxy(f"http://{_connect_host(state.get('host'))}:{state['port']}", token or state.get("admin_token"))


async def ticks(session: aiohttp.ClientSession, proxy: Proxy) -> AsyncIterator[dict[str, Any]]:
    """The feed's ticks until the proxy closes it (FeedError if it refuses)."""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=SILENCE_S)
    async with session.get(proxy.url + LIVE_PATH, headers=proxy.headers(), timeout=timeout) as resp:
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
        async with session.post(proxy.url + SQL_PATH, json={"sql": backfill_sql(window_s)},
                                headers=proxy.headers(), timeout=aiohttp.ClientTimeout(total=15)) as resp:
            if resp.status != 200:
                return []
            answer = await resp.json()
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return []
    return [dict(zip(answer["columns"], row)) for row in answer["rows"]]
