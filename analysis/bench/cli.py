"""`llmtap bench`: the thin click layer over analysis.bench."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path
from typing import Any

import click

from proxy.common.event_loop import run as run_loop
from proxy.record.store_reader import StoreError
from proxy.common.terminal_text import echo

from analysis.bench.output import RENDERERS, recording_notes
from analysis.bench.plan import EXPERIMENTS, PlanOptions, parse_counts
from analysis.bench.progress import ProgressLine
from analysis.bench.run import BenchOutcome, BenchRequest, BenchUsageError, bench as run_bench
from analysis.bench.runner import BenchError, Budget

POSITIVE = click.IntRange(min=1)


def _counts(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        return parse_counts(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command()
@click.option("--base-url", "base_urls", multiple=True, metavar="URL", help="OpenAI-compatible base (ends in /v1) "
              "or Anthropic base (no /v1). Default: the running proxy's default route, else the built-in "
              "simulator. Twice or more: compare these channels (as --routes, through an in-process proxy).")
@click.option("--routes", "routes_text", metavar="/A,/B,...", help="Compare these routes of the running proxy "
              "(two or more channels to the same model): the same requests to each, interleaved, then "
              "compare's verdict.")
@click.option("--api", type=click.Choice(["openai", "anthropic"]), default="openai", show_default=True,
              help="Chat Completions or Messages.")
@click.option("--model", help="Model name (default: the simulator's; through a running proxy, the one its route's traffic used most, else the first its upstream lists).")
@click.option("--api-key-env", metavar="VAR", help="Read the API key from this environment variable "
              "(default OPENAI_API_KEY or ANTHROPIC_API_KEY).")
@click.option("--api-key", metavar="KEY", help="The API key itself.")
@click.option("--direct", is_flag=True, help="Send to the upstream directly: no proxy, nothing recorded.")
@click.option("--proxy-route", default="", metavar="PREFIX", help="Send through this route of the running proxy "
              "(e.g. /openai) instead of its default route.")
@click.option("--db", type=click.Path(dir_okay=False, path_type=Path),
              help="Record into this DuckDB file (via an in-process proxy) instead of the default database.")
@click.option("--experiment", "experiments", multiple=True, type=click.Choice([*EXPERIMENTS, "all"]),
              help="Which experiment (repeatable). Default: all.")
@click.option("--runs", type=POSITIVE, help="Measured requests per point (per client in the concurrency sweep) "
              "[default: 5]; with --routes, per channel [default: 30].")
@click.option("--warmup", type=click.IntRange(min=0), default=1, show_default=True,
              help="Warm-up rounds per experiment (a round: as many requests as its first point has in flight), "
              "left out of the statistics.")
@click.option("--inputs", callback=_counts, metavar="N,N,...", help="Input lengths in tokens, input sweep "
              "[default: 200,500,1000,2000,4000].")
@click.option("--outputs", callback=_counts, metavar="N,N,...", help="max_tokens values, output sweep "
              "[default: 50,200,500].")
@click.option("--concurrency", callback=_counts, metavar="N,N,...", help="Concurrency levels "
              "[default: 1,2,4,8,16,32].")
@click.option("--parallel", type=POSITIVE, help="Requests in flight within a point of the input, output and "
              "stream sweeps [default: 1; the simulator's capacity against the built-in simulator].")
@click.option("--max-requests", type=POSITIVE, help="Send at most this many requests, calibration and warm-up "
              "included.")
@click.option("--max-seconds", type=click.FloatRange(min=0, min_open=True), help="Stop after this many seconds.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True), default=300.0,
              show_default=True, help="Seconds one request may take.")
@click.option("--format", "fmt", type=click.Choice(list(RENDERERS)), default="table", show_default=True,
              help="Output format.")
def bench(experiments: tuple[str, ...], inputs: tuple[int, ...] | None, outputs: tuple[int, ...] | None,
          concurrency: tuple[int, ...] | None, runs: int | None, fmt: str, max_requests: int | None,
          max_seconds: float | None, api_key: str | None, api_key_env: str | None, base_urls: tuple[str, ...],
          routes_text: str | None, **options: Any) -> None:
    """Measure TTFT, TPOT and throughput with controlled requests.

    Input-length, output-length, concurrency and streaming sweeps, recorded by
    the proxy under the tag bench-<time>-<experiment>. Through the running
    `llmtap serve` when there is one (its route must point at --base-url's
    upstream), else through a proxy started for the run; with no --base-url,
    against the built-in simulated upstream. With --routes (or --base-url
    twice or more): one request to each channel in turn, the same prompt
    length, under one tag, then `llmtap compare`'s verdict. Ctrl-C stops and
    keeps what was measured.
    """
    if api_key and api_key_env:
        raise click.UsageError("give --api-key or --api-key-env, not both")
    if routes_text or len(base_urls) > 1:
        if experiments:
            raise click.UsageError("--routes runs its own interleaved comparison: --experiment does not apply")
        _channels(base_urls, routes_text, runs, inputs, outputs, fmt, max_requests, max_seconds, api_key,
                  api_key_env, options)
        return
    runs = runs or 5
    options["base_url"] = base_urls[0] if base_urls else None
    chosen = EXPERIMENTS if not experiments or "all" in experiments else tuple(experiments)
    points: dict[str, Any] = {name: value for name, value in (("inputs", inputs), ("outputs", outputs),
                                              ("concurrency", concurrency)) if value}
    plan = PlanOptions(runs=runs, experiments=chosen, **points)
    request = BenchRequest(plan=plan, api_key=api_key, api_key_env=api_key_env, **options)
    progress = ProgressLine()
    try:
        budget = Budget(max_requests, max_seconds)
        outcome = run_loop(lambda: _until_interrupted(budget, run_bench(request, budget, progress)))
    except (BenchUsageError, BenchError, StoreError) as exc:
        progress.clear()
        raise click.ClickException(str(exc)) from None
    progress.finish(_final_line(outcome))
    echo(RENDERERS[fmt](outcome.run, outcome.info), nl=False)
    for line in recording_notes(outcome.run, outcome.recorded, db=outcome.info.db, base_url=request.base_url,
                                db_flag=request.db, direct=request.direct):
        echo(line, err=True)


def _channels(base_urls: tuple[str, ...], routes_text: str | None, runs: int | None,
              inputs: tuple[int, ...] | None, outputs: tuple[int, ...] | None, fmt: str,
              max_requests: int | None, max_seconds: float | None, api_key: str | None,
              api_key_env: str | None, options: dict[str, Any]) -> None:
    """`bench --routes` / `--base-url` twice or more (analysis/bench/channels.py)."""
    from analysis.bench.channels import DEFAULT_INPUT, DEFAULT_MAX_TOKENS, DEFAULT_ROUNDS, RENDERERS as CHANNEL_RENDERERS
    from analysis.bench.channels import ChannelsUsageError, bench_channels, parse_routes
    from analysis.bench.run import DEFAULT_KEY_ENV

    api = options["api"]
    try:
        routes = parse_routes(routes_text) if routes_text else ()
    except ChannelsUsageError as exc:
        raise click.BadParameter(str(exc), param_hint="--routes") from None
    key = api_key or (os.environ.get(api_key_env) if api_key_env else os.environ.get(DEFAULT_KEY_ENV[api]))
    if api_key_env and not key:
        raise click.ClickException(f"the environment variable {api_key_env} is not set")
    progress = ProgressLine()
    budget = Budget(max_requests, max_seconds)
    try:
        channel_run = run_loop(lambda: _until_interrupted(budget, bench_channels(
            api, options.get("model"), key, routes, base_urls, options.get("db"), budget,
            rounds=runs or DEFAULT_ROUNDS, input_tokens=inputs[0] if inputs else DEFAULT_INPUT,
            max_tokens=outputs[0] if outputs else DEFAULT_MAX_TOKENS, warmup=options["warmup"],
            timeout_s=options["timeout_s"], progress=progress)))
    except (ChannelsUsageError, BenchError, StoreError) as exc:
        progress.clear()
        raise click.ClickException(str(exc)) from None
    stopped = f"; stopped: {channel_run.stopped_by}" if channel_run.stopped_by else ""
    progress.finish(f"bench: {channel_run.sent} requests in {channel_run.elapsed_s:.1f} s{stopped}")
    echo(CHANNEL_RENDERERS[fmt](channel_run, api, options.get("model") or ""), nl=False)
    if channel_run.db:
        echo(f"recorded in {channel_run.db} under {channel_run.tag}: llmtap report --tag {channel_run.tag} "
                   "--by route --breakdown", err=True)


async def _until_interrupted(budget: Budget, work: Any) -> Any:
    """The first Ctrl-C stops the run (and keeps what was measured); a second one aborts."""
    loop = asyncio.get_running_loop()

    def interrupted() -> None:
        budget.stop.set()
        loop.remove_signal_handler(signal.SIGINT)

    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, interrupted)
    try:
        return await work
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)


def _final_line(outcome: BenchOutcome) -> str:
    run = outcome.run
    errors = sum(p.errors for e in run.experiments for p in e.points)
    stopped = f"; stopped: {run.stopped_by}" if run.stopped_by else ""
    return f"bench: {run.sent} requests in {run.elapsed_s:.1f} s, {errors} measured failed{stopped}"
