"""`llmtap bench --routes /a,/b` (or `--base-url` twice or more): one comparison, fair by design.

The same requests go to every channel, interleaved: each round sends one request to each channel in
turn (A, B, A, B, ...), one at a time, each with a prompt of the same length (the same words; only
the unique opening line differs, so that no channel reads another one's cached prefix) and the
same max_tokens. Drift in the upstream or the machine then falls on every channel alike. All the
requests carry one tag, `bench-<time>-channels` (calibration and warm-up: their own), and the
proxy records them by route; the run ends with `llmtap compare`'s verdict on those rows (the
proxy's timings, broken down: where the difference is) after the client-side figures.

Channels: `--routes` names routes of the running `llmtap serve` (each must point at its channel's
upstream); repeated `--base-url`s get an in-process proxy with one route per URL (`/c1`, `/c2`, ...,
or the `--routes` names, in order) recording into --db or the default database.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from analysis.filters import sql_string
from analysis.formatting import csv_text
from analysis.views import create_views
from proxy.settings.config import ServeConfig
from proxy.serve.server import RunningProxy

from analysis.bench import client
from analysis.bench.client import Api, Result, Target
from analysis.bench.prompts import Calibration, PromptMaker, calibrate
from analysis.bench.runner import BenchError, Budget, Progress, new_tag_base
from analysis.bench.summary import Stat
from analysis.bench.upstream import RECORD_WAIT_S, sdk_base_url, base_origin, via_proxy, check_base_url, find_serving

DEFAULT_ROUNDS = 30
DEFAULT_INPUT = 500
DEFAULT_MAX_TOKENS = 64
METRICS = ("ttft_ms", "tpot_ms", "e2e_ms")


class ChannelsUsageError(ValueError):
    """Channels the run cannot start with; the message says which."""


@dataclass(frozen=True, slots=True)
class Channel:
    label: str  # the route prefix its requests go through, as the `route` column holds it
    base_url: str  # where the client sends
    upstream: str | None = None  # what it stands for, when bench chose the route (--base-url)


@dataclass(slots=True)
class ChannelsRun:
    tag: str
    started_at: datetime
    channels: list[Channel]
    results: dict[str, list[Result]] = field(default_factory=dict)
    calibration: Calibration | None = None
    comparison: Any = None  # analysis.compare.Comparison over the proxy's rows, or None
    compare_error: str | None = None
    sent: int = 0
    stopped_by: str | None = None
    elapsed_s: float = 0.0
    via: str = ""
    db: str | None = None


def route_label(text: str) -> str:
    return "/" + text.strip().strip("/")


def parse_routes(text: str) -> tuple[str, ...]:
    labels = tuple(route_label(part) for part in text.split(",") if part.strip())
    if len(labels) < 2 or len(set(labels)) != len(labels):
        raise ChannelsUsageError(f"--routes takes two or more different route prefixes, e.g. /a,/b (not {text!r})")
    return labels


# -- where the requests go ------------------------------------------------------------------

@dataclass(slots=True)
class ChannelSetup:
    channels: list[Channel]
    via: str
    db: str | None
    query: Callable[[str], tuple[list[str], list[str], list[tuple]]]
    flush: Callable[[], Any]  # awaitable: the rows of the finished requests are queryable after it


@contextlib.asynccontextmanager
async def open_channels(api: Api, routes: tuple[str, ...], base_urls: tuple[str, ...], db: Path | None
                        ) -> AsyncIterator[ChannelSetup]:
    for url in base_urls:
        check_base_url(url)
    serving = await find_serving(db)
    if len(base_urls) < 2:  # routes of the running proxy
        if serving is None:
            raise ChannelsUsageError("--routes sends through the running `llmtap serve` (start it with a --route "
                                     "for each channel), or give --base-url once per channel")
        base = base_urls[0] if base_urls else sdk_base_url(api, serving.url)
        channels = [Channel(r, via_proxy(serving.url, r, base)) for r in routes]
        from analysis.source import ServeSource
        from proxy.common import instances as running

        source = ServeSource(running.AdminClient(serving.url, serving.admin_token))

        async def flush() -> None:  # the running proxy writes within about a second
            await asyncio.sleep(0)

        yield ChannelSetup(channels, f"the running proxy at {serving.url}", serving.db, source.query, flush)
        return
    if serving is not None:
        raise ChannelsUsageError(f"a running `llmtap serve` records to {serving.db}: give --db FILE for the "
                                 "channels' own proxy, or --routes of the running one")
    if routes and len(routes) != len(base_urls):
        raise ChannelsUsageError("with --base-url once per channel, --routes names them: as many of each")
    labels = routes or tuple(f"/c{i}" for i in range(1, len(base_urls) + 1))
    config = ServeConfig(port=0, upstream=base_origin(base_urls[0]), routes={r: base_origin(u) for r, u in zip(labels, base_urls)},
                         db=str(db) if db else None, quiet=True, flush_interval_s=0.5)
    async with RunningProxy(config, query_setup=create_views) as proxy:
        channels = [Channel(r, via_proxy(proxy.url, r, u), u) for r, u in zip(labels, base_urls)]

        async def flush_proxy() -> None:
            await proxy.aflush(10)

        assert proxy.store is not None
        yield ChannelSetup(channels, f"an in-process proxy ({proxy.url})", str(config.db_path),
                           proxy.store.query, flush_proxy)


# -- the run ------------------------------------------------------------------------------------

async def run_channels(session: aiohttp.ClientSession, channels: list[Channel], api: Api, model: str,
                       api_key: str | None, budget: Budget, *, rounds: int = DEFAULT_ROUNDS,
                       input_tokens: int = DEFAULT_INPUT, max_tokens: int = DEFAULT_MAX_TOKENS, warmup: int = 1,
                       timeout_s: float = 300.0, progress: Progress | None = None, tag_base: str | None = None
                       ) -> ChannelsRun:
    """Calibrate on the first channel, warm every channel up, then `rounds` interleaved rounds."""
    started = datetime.now(timezone.utc)
    base = tag_base or new_tag_base(started)
    run = ChannelsRun(f"{base}-channels", started, channels, {c.label: [] for c in channels})
    targets = [Target(api, c.base_url, model, api_key, timeout_s) for c in channels]
    maker = PromptMaker()
    planned = 2 + (warmup + rounds) * len(channels)
    done = 0
    report = progress or (lambda d, p, label: None)

    async def send(target: Target, prompt: str, tokens: int, tag: str) -> Result | None:
        nonlocal done
        if not budget.take():
            return None
        result = await client.send(session, target, prompt, tokens, True, tag)
        done += 1
        report(done, planned, tag)
        return result

    async def measure(prompt: str) -> int | None:
        if not budget.take():
            return None
        result = await client.send(session, targets[0], prompt, 1, False, f"{base}-calibration")
        if not result.ok:
            raise BenchError(f"the calibration request to {targets[0].url} failed: {result.error}")
        return result.input_tokens

    t0 = time.monotonic()
    budget.start()
    try:
        run.calibration = await _bounded(budget, calibrate(maker, measure))
        for r in range(warmup + rounds):
            if budget.stopped_by is not None:
                break
            tag = run.tag if r >= warmup else f"{base}-warmup"
            for channel, target in zip(channels, targets):
                result = await _bounded(budget, send(target, maker.prompt(input_tokens), max_tokens, tag))
                if result is None:
                    break
                if r >= warmup:
                    run.results[channel.label].append(result)
    finally:
        run.sent, run.stopped_by = budget.sent, budget.stopped_by
        run.elapsed_s = time.monotonic() - t0
    return run


async def _bounded(budget: Budget, work: Any) -> Any:
    """`work`, unless the deadline or a stop comes first (then None, and the budget says why)."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(budget.stop.wait())
    try:
        done, _ = await asyncio.wait({task, stopped}, timeout=budget.remaining(), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if task in done:
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    if budget.stopped_by is None:
        budget.stopped_by = "interrupted" if budget.stop.is_set() else "max-seconds"
    return None


async def compare_recorded(setup: ChannelSetup, run: ChannelsRun) -> None:
    """compare's verdict on the proxy's rows of this run, by route (waits for them to be written)."""
    from analysis.compare import CompareError, Side, compare

    loop = asyncio.get_running_loop()
    expected = sum(1 for results in run.results.values() for r in results)
    tag = sql_string(run.tag)
    await setup.flush()
    deadline = time.monotonic() + RECORD_WAIT_S
    while True:
        _, _, rows = await loop.run_in_executor(None, setup.query, f"SELECT count(*) FROM requests WHERE tag = {tag}")
        if rows[0][0] >= expected or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.25)
    sides = [Side(c.label, f"route = {sql_string(c.label)}") for c in run.channels]
    try:
        run.comparison = await loop.run_in_executor(None, lambda: compare(setup.query, sides, f"tag = {tag}", "route"))
    except CompareError as exc:
        run.compare_error = str(exc)


# -- output ------------------------------------------------------------------------------------

def channel_record(run: ChannelsRun, channel: Channel) -> dict[str, Any]:
    results = run.results[channel.label]
    good = [r for r in results if r.ok]
    record: dict[str, Any] = {"route": channel.label, "base_url": channel.base_url, "upstream": channel.upstream,
                              "ok": len(good), "errors": len(results) - len(good)}
    for name in METRICS:
        stat = Stat.of([v for r in good if (v := getattr(r, name)) is not None])
        base = name.removesuffix("_ms")
        record[f"{base}_p50_ms"] = None if stat.p50 is None else round(stat.p50, 3)
        record[f"{base}_p95_ms"] = None if stat.p95 is None else round(stat.p95, 3)
    errors = [r.error for r in results if not r.ok]
    record["first_error"] = errors[0] if errors else None
    return record


def to_table(run: ChannelsRun, api: str, model: str) -> str:
    from analysis.compare import to_table as compare_table
    from analysis.formatting import layout

    stopped = f"; stopped: {run.stopped_by}" if run.stopped_by else ""
    rounds = max((len(v) for v in run.results.values()), default=0)
    lines = [f"llmtap bench {run.tag}: {api} model {model}, {len(run.channels)} channels via {run.via}",
             f"{rounds} interleaved rounds (one request to each channel in turn, the same prompt length), "
             f"{run.sent} requests in {run.elapsed_s:.1f} s{stopped}"]
    lines += [f"  {c.label} = {c.upstream}" for c in run.channels if c.upstream]
    head = ["channel", "ok", "err", "ttft p50", "p95", "tpot p50", "p95", "e2e p50", "p95"]
    rows = []
    for c in run.channels:
        r = channel_record(run, c)
        rows.append([c.label, str(r["ok"]), str(r["errors"])] + [
            "-" if r[k] is None else f"{r[k]:,.1f}" for m in ("ttft", "tpot", "e2e") for k in (f"{m}_p50_ms", f"{m}_p95_ms")])
    lines += ["", "as the client saw them (ms):", layout(head, rows, [False] + [True] * 8).rstrip("\n")]
    errors = [r for c in run.channels if (r := channel_record(run, c))["first_error"]]
    if errors:
        lines.append(f"errors, the first: {errors[0]['route']}: {errors[0]['first_error']}")
    if run.comparison is not None:  # its last line per channel: the verdict, and where the difference is
        lines += ["", "as the proxy recorded them, compared (llmtap compare --tag " + run.tag + " --by route):",
                  compare_table(run.comparison).rstrip("\n")]
    elif run.compare_error:
        lines.append(f"\nno comparison: {run.compare_error}")
    return "\n".join(lines) + "\n"


def to_json(run: ChannelsRun, api: str, model: str) -> str:
    from analysis.compare import as_dict, headline

    data = {"tag": run.tag, "started_at": run.started_at.isoformat(), "api": api, "model": model, "via": run.via,
            "db": run.db, "requests_sent": run.sent, "elapsed_s": round(run.elapsed_s, 3),
            "stopped_by": run.stopped_by, "channels": [channel_record(run, c) for c in run.channels],
            "comparison": as_dict(run.comparison) if run.comparison is not None else None,
            "verdicts": [h for c in run.channels[1:] if run.comparison is not None
                         and (h := headline(run.comparison, c.label))],
            "compare_error": run.compare_error}
    return orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n"


def to_csv(run: ChannelsRun, api: str, model: str) -> str:
    rows = [{"tag": run.tag, **channel_record(run, c)} for c in run.channels]
    return csv_text(list(rows[0]), ([r.get(k) for k in rows[0]] for r in rows))


RENDERERS = {"table": to_table, "json": to_json, "csv": to_csv}


async def bench_channels(api: Api, model: str | None, api_key: str | None, routes: tuple[str, ...],
                         base_urls: tuple[str, ...], db: Path | None, budget: Budget, *,
                         rounds: int = DEFAULT_ROUNDS, input_tokens: int = DEFAULT_INPUT,
                         max_tokens: int = DEFAULT_MAX_TOKENS, warmup: int = 1, timeout_s: float = 300.0,
                         progress: Progress | None = None) -> ChannelsRun:
    """The whole run: open the channels, send, compare what the proxy recorded."""
    if model is None:
        raise ChannelsUsageError("give --model (the one every channel serves)")
    async with open_channels(api, routes, base_urls, db) as setup:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            run = await run_channels(session, setup.channels, api, model, api_key, budget, rounds=rounds,
                                     input_tokens=input_tokens, max_tokens=max_tokens, warmup=warmup,
                                     timeout_s=timeout_s, progress=progress)
        run.via, run.db = setup.via, setup.db
        if any(run.results.values()):
            await compare_recorded(setup, run)
    return run

