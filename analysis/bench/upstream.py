"""Where the bench sends its requests, so that they are recorded like daily use.

- A `llmtap serve` is running (its state file answers a health check): send
  through it. Its default route (or the route named by `proxy_route`) must
  point at the upstream of --base-url; the path of --base-url is kept, so
  `--base-url https://api.openai.com/v1` becomes `http://127.0.0.1:8787/v1`.
- No proxy runs: start one in-process for the run, forwarding to the origin of
  --base-url and recording into the default database (or --db).
- No --base-url and no running proxy: also start the built-in simulated
  upstream (capacity 8, TTFT 80 ms + 20 us per input token, 15 ms per token).
- `direct`: no proxy at all; nothing is recorded.

With no --model through a running proxy, `default_model` picks one: the model
its route's successful generations in the API's dialect asked for most (what
the tools sent there; bench's own requests not counted), else the first model the upstream lists (`GET
/v1/models` through the route).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from yarl import URL

from analysis.filters import BENCH_TAG_PREFIX, sql_string
from analysis.views import create_views
from proxy.common import instances as running
from proxy.settings.config import ServeConfig
from proxy.serve.server import RunningProxy
from proxy.simulator.app import Simulator
from proxy.simulator.config import SimConfig

from analysis.bench.client import Api

BENCH_SIM = SimConfig(ttft_ms=80, itl_ms=15, tokens=100_000, prefill_us_per_token=20, capacity=8)
SIM_MODELS = {"openai": "sim-gpt", "anthropic": "sim-claude"}
RECORD_WAIT_S = 5.0  # how long to wait for a running proxy's writer to catch up
DIALECTS = {"openai": "openai_chat", "anthropic": "anthropic"}  # the `dialect` of the requests bench sends


@dataclass(frozen=True, slots=True)
class ServingProxy:
    """A `llmtap serve` found through its state file."""

    url: str
    db: str | None
    admin_token: str | None


@dataclass(slots=True)
class Setup:
    base_url: str  # where the client sends: a proxy, or the upstream itself
    via: str  # one line for the user: where the requests go
    db: Path | None = None  # where the rows land; None when nothing records
    simulated: bool = False  # the built-in simulator answers
    capacity: int | None = None  # the simulator's capacity
    proxy: RunningProxy | None = None  # in-process
    serving: ServingProxy | None = None  # another process
    route: str = "/"  # the running proxy's route the requests go through

    async def recorded(self, tag_base: str, expected: int = 0) -> list[tuple[str, str, int]] | None:
        """(tag, upstream_host, rows) for this run's tags; None when nothing records."""
        sql = (f"SELECT tag, coalesce(upstream_host, ''), count(*) FROM requests "
               f"WHERE starts_with(tag, {sql_string(tag_base + '-')}) GROUP BY ALL ORDER BY 1, 2")
        if self.proxy is not None and self.proxy.store is not None:
            await self.proxy.aflush(10)
            _, _, rows = await asyncio.get_running_loop().run_in_executor(None, self.proxy.store.query, sql)
            return [tuple(r) for r in rows]  # type: ignore[misc]
        if self.serving is not None:
            return await _poll_serving(self.serving, sql, expected)
        return None


async def default_model(setup: Setup, api: Api, headers: dict[str, str]) -> tuple[str, str] | None:
    """A model for a run through a running proxy without --model: (model, where it came from), or None."""
    if setup.serving is None:
        return None
    sql = (f"SELECT request_model, count(*) AS n FROM requests WHERE kind = 'generation' AND outcome = 'ok'"
           f" AND dialect = {sql_string(DIALECTS[api])} AND route = {sql_string(setup.route)}"
           f" AND request_model IS NOT NULL AND NOT coalesce(starts_with(tag, {sql_string(BENCH_TAG_PREFIX)}), false)"
           " GROUP BY 1 ORDER BY n DESC, max(started_at) DESC LIMIT 1")
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError, IndexError):
            async with session.post(setup.serving.url + "/_llmtap/sql", json={"sql": sql},
                                    headers=_admin_headers(setup.serving)) as resp:
                rows = (await resp.json())["rows"] if resp.status == 200 else []
            if rows:
                model, n = rows[0]
                return str(model), f"the most used on route {setup.route} ({n} requests)"
        models_url = setup.base_url.rstrip("/") + ("/models" if api == "openai" else "/v1/models")
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError, IndexError, TypeError):
            async with session.get(models_url, headers=headers) as resp:
                listed = (await resp.json(content_type=None))["data"] if resp.status == 200 else []
            if listed and listed[0].get("id"):
                return str(listed[0]["id"]), f"the first the upstream lists (GET {URL(models_url).path})"
    return None


async def find_serving(db: Path | None = None, timeout_s: float = 2.0) -> ServingProxy | None:
    """The running `llmtap serve` (the one recording to `db`, if given) that answers its health check."""
    loop = asyncio.get_running_loop()
    live = await loop.run_in_executor(None, lambda: running.find_running(db, timeout_s))
    return ServingProxy(live.url, live.db, live.admin_token) if live is not None else None


def _admin_headers(serving: ServingProxy) -> dict[str, str]:
    return running.AdminClient(serving.url, serving.admin_token).headers()


async def _poll_serving(serving: ServingProxy, sql: str, expected: int) -> list[tuple[str, str, int]] | None:
    """Ask the running proxy until it has written `expected` rows, for RECORD_WAIT_S at most."""
    rows: list[tuple[str, str, int]] | None = None
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        for _ in range(int(RECORD_WAIT_S / 0.5)):
            try:
                async with session.post(serving.url + "/_llmtap/sql", json={"sql": sql},
                                        headers=_admin_headers(serving)) as resp:
                    if resp.status != 200:
                        return None
                    rows = [tuple(r) for r in (await resp.json())["rows"]]  # type: ignore[misc]
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError):
                return None
            if sum(r[2] for r in rows) >= expected:
                break
            await asyncio.sleep(0.5)
    return rows


def sdk_base_url(api: Api, root: str) -> str:
    """The base URL an SDK would use for a server at `root`: OpenAI's includes /v1."""
    return root.rstrip("/") + ("/v1" if api == "openai" else "")


def check_base_url(base_url: str) -> None:
    url = URL(base_url)
    if url.scheme not in ("http", "https") or not url.host or url.query_string:
        raise ValueError(f"--base-url must be an http:// or https:// URL without a query, not {base_url!r}")


def base_origin(base_url: str) -> str:
    """The origin (scheme, host, port) of a checked base URL: what a proxy forwards to."""
    check_base_url(base_url)
    return str(URL(base_url).origin())


def via_proxy(proxy_url: str, route: str, base_url: str) -> str:
    """`base_url` reached through the proxy at `proxy_url`, on its `route` prefix."""
    prefix = "/" + route.strip("/") if route.strip("/") else ""
    return proxy_url + prefix + URL(base_url).raw_path.rstrip("/")


@contextlib.asynccontextmanager
async def open_setup(api: Api, base_url: str | None = None, *, direct: bool = False, db: Path | None = None,
                     proxy_route: str = "", simulator: SimConfig = BENCH_SIM) -> AsyncIterator[Setup]:
    """Start what the run needs (see the module docstring) and stop it afterwards."""
    if base_url is not None:
        check_base_url(base_url)
    serving = None if direct else await find_serving(db)
    if serving is not None:
        base = via_proxy(serving.url, proxy_route, base_url or sdk_base_url(api, serving.url))
        route = f"route {proxy_route}" if proxy_route.strip("/") else "default route"
        yield Setup(base, f"the running proxy at {serving.url} ({route})",
                    Path(serving.db) if serving.db else None, serving=serving,
                    route="/" + proxy_route.strip("/") if proxy_route.strip("/") else "/")
        return
    async with contextlib.AsyncExitStack() as stack:
        setup = Setup(base_url or "", "")
        upstream = base_url
        if base_url is None:
            sim = await stack.enter_async_context(Simulator(simulator, record=False))
            setup.simulated, setup.capacity = True, simulator.capacity
            upstream = sdk_base_url(api, sim.url)
        assert upstream is not None
        if direct:
            setup.base_url, setup.via = upstream, "direct" + (" to the built-in simulator" if setup.simulated else "")
        else:
            config = ServeConfig(port=0, upstream=base_origin(upstream), db=str(db) if db else None, quiet=True,
                                 flush_interval_s=0.5)
            proxy = await stack.enter_async_context(RunningProxy(config, query_setup=create_views))
            setup.proxy, setup.db = proxy, config.db_path
            setup.base_url = via_proxy(proxy.url, "", upstream)
            target = "the built-in simulator" if setup.simulated else base_origin(upstream)
            setup.via = f"an in-process proxy ({proxy.url}) to {target}"
        yield setup
