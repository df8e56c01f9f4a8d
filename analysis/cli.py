"""The analysis commands (`sql`, `report`, `errors`, `export`, `show`, `demo`): a thin click layer.

`proxy.cli` imports each command when it runs (its `COMMANDS`); `register(group)` adds them all
at once. Every command takes `--db` and reads
through `source.open_source`, so it works whether or not `llmtap serve` is
running. `sql`, `report`, `errors` and `export` also take `--from`
(repeatable), which reads several databases and Parquet exports together
instead (`multi_source.py`).
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

import click

from proxy.common import paths
from proxy.settings.cli_options import db_option as shared_db_option
from proxy.common.schema import KINDS
from proxy.common.terminal_text import echo

from analysis import error_report, report as report_mod
from analysis.export import FORMATS as EXPORT_FORMATS, ExportError, export as export_tables, summary
from analysis.filters import EXCLUDABLE, ConditionError, Filters, check_condition
from analysis.formatting import FORMATS as SQL_FORMATS, render, short_ids
from analysis.multi_source import open_sources
from analysis.remote import is_remote
from analysis.source import Source, SourceError, open_source
from analysis.timewindow import WindowError, parse_time, utc_now

F = TypeVar("F", bound=Callable[..., Any])
DEMO_DB = "demo.duckdb"  # `llmtap demo`'s database, in llmtap's data directory
_SHOW_TABLES = re.compile(r"\s*show\s+tables\s*;?\s*", re.IGNORECASE)


db_option = shared_db_option()  # resolved by `opened` (config.resolve_db), as every command does


def from_option(f: F) -> F:
    return click.option(
        "--from", "sources", multiple=True, metavar="DB|EXPORT",
        help=("Read these instead of --db, together (repeatable): DuckDB files, `llmtap export`"
              " directories or globs of them, local or s3://...; a `source` column tells them apart."),
    )(f)


def output_options(*formats: str) -> Callable[[F], F]:
    """The `--format` option of a command that prints rows (the first format is the default)."""
    def decorate(f: F) -> F:
        return click.option(
            "--format", "fmt", type=click.Choice(formats), default=formats[0], show_default=True,
            help="Output format.",
        )(f)
    return decorate


def _exclusion(value: str) -> tuple[str, str]:
    field, sep, excluded = value.partition("=")
    if not sep or field.strip() not in EXCLUDABLE or not excluded:
        raise click.BadParameter(f"expected FIELD=VALUE with FIELD one of {', '.join(EXCLUDABLE)}, not {value!r}",
                                 param_hint="--exclude")
    return field.strip(), excluded


def filter_options_for(*, where: bool = True, daily: bool = True, since: str | None = None) -> Callable[[F], F]:
    """--since/--until, the tag, model and tool filters, --exclude, --where (unless `where` is False:
    compare's --where names sides) and, on a daily command, --include-bench; given to the command as
    `filters`. `daily`: `llmtap bench`'s rows are left out unless --include-bench (or --tag). `since`:
    the window when --since is not given (`--since all`: every request)."""
    default_since = since

    def decorate(f: F) -> F:
        @functools.wraps(f)
        def command(*args: Any, since: str | None, until: str | None, tags: tuple[str, ...],
                    models: tuple[str, ...], tools: tuple[str, ...], excluded: tuple[str, ...],
                    **kwargs: Any) -> Any:
            conditions = kwargs.pop("where_sql") if where else ()
            bench = kwargs.pop("include_bench") if daily else True
            filters = make_filters(since or default_since, until, tags, models, tools, excluded=excluded,
                                   conditions=conditions, bench=bench)
            return f(*args, filters=filters, **kwargs)

        options = [
            click.option("--since", metavar="WHEN", help=(
                "Only requests from WHEN: a span before now (30m, 24h, 7d), today or yesterday"
                " (from 00:00 UTC), or an ISO date-time (UTC unless given); all: every request."
                + (f" Default: {default_since}." if default_since else ""))),
            click.option("--until", metavar="WHEN", help="Only requests before WHEN (same forms as --since)."),
            click.option("--tag", "tags", multiple=True, help="Only this tag (repeatable)."),
            click.option("--model", "models", multiple=True, help="Only this requested model (repeatable)."),
            click.option("--tool", "tools", multiple=True, help="Only this tool, e.g. claude-code (repeatable)."),
            click.option("--exclude", "excluded", multiple=True, metavar="FIELD=VALUE", help=(
                "Leave out the requests whose FIELD (tag, model, tool or project) is VALUE (repeatable),"
                " e.g. --exclude tool=codex.")),
        ]
        if where:
            options.append(click.option("--where", "where_sql", multiple=True, metavar="SQL", help=(
                "Only requests matching this SQL condition on the `requests` view (repeatable, all must"
                " hold), e.g. \"input_tokens > 10000\"; read-only and no file access, as `llmtap sql`.")))
        if daily:
            options.append(click.option("--include-bench", is_flag=True, help=(
                "Count `llmtap bench`'s requests (tags bench-...) too: left out by default, unless --tag"
                " names the tags.")))
        for option in reversed(options):
            command = option(command)
        return command  # type: ignore[return-value]
    return decorate


filter_options = filter_options_for()


def update_prices_option(f: F) -> F:
    return click.option(
        "--update-prices", is_flag=True,
        help="Fetch genai-prices' latest price data first (network; off by default: the data in the package is used).",
    )(f)


def _update_prices(update: bool) -> None:
    """With --update-prices: genai-prices' own update, waited for (a failure is one line)."""
    if not update:
        return
    from proxy.common import prices

    prices.enable_updates()
    try:
        if not prices.wait_updated(30):
            echo("llmtap: genai-prices did not update in 30 s; using the data in the package", err=True)
    except Exception as exc:  # the package raises its fetch's error
        raise click.ClickException(f"cannot update prices: {type(exc).__name__}: {exc}") from None


ALL_TIME = datetime(1970, 1, 1, tzinfo=timezone.utc)  # `--since all`: said, unlike no --since (a default window)


def make_filters(since: str | None, until: str | None, tags: tuple[str, ...], models: tuple[str, ...],
                 tools: tuple[str, ...], *, excluded: tuple[str, ...] = (), conditions: tuple[str, ...] = (),
                 bench: bool = True) -> Filters:
    now = utc_now()
    try:
        checked = tuple(check_condition(c) for c in conditions)
    except ConditionError as exc:
        raise click.BadParameter(str(exc), param_hint="--where") from None
    try:
        return Filters(
            since=ALL_TIME if since == "all" else parse_time(since, now) if since else None,
            until=parse_time(until, now) if until else None,
            tags=tags, models=models, tools=tools, exclude=tuple(_exclusion(e) for e in excluded),
            conditions=checked, bench=bench,
        )
    except WindowError as exc:
        raise click.BadParameter(str(exc), param_hint="--since/--until") from None


@contextmanager
def opened(db_path: Path, sources: tuple[str, ...] = (), writes_to: str | None = None) -> Iterator[Source]:
    """The source for `db_path` (or for the `--from` inputs), with its errors turned into click errors.
    Its SQL touches no file but its inputs and `writes_to`; an s3:// `writes_to` needs httpfs or s3fs
    and the network, unlocked."""
    remote = writes_to is not None and is_remote(writes_to)
    local_out = None if remote or writes_to is None else Path(writes_to).expanduser()
    db_path = default_or_demo(db_path) if not sources else db_path
    source: Source
    try:
        if sources:
            source = open_sources(sources, writes_to=local_out, lock=not remote)
        else:
            source = open_source(db_path, writes_to=local_out, lock=not remote)
    except SourceError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        yield source
    except SourceError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        source.close()


def default_or_demo(db_path: Path) -> Path:
    """After `llmtap demo` and before the first `llmtap serve`, the default database does not exist
    yet: read the demo's instead, and say so on stderr."""
    if db_path != paths.default_db_path() or db_path.exists():
        return db_path
    demo = paths.data_dir() / DEMO_DB
    if not demo.exists():
        return db_path
    echo(f"llmtap: no {db_path} yet (`llmtap serve` records there): reading the demo's {demo}", err=True)
    return demo


def _read_query(query: str | None, file: Path | None) -> str:
    if file is not None:
        if query is not None:
            raise click.UsageError("give QUERY or --file, not both")
        return file.read_text()
    if query is None or query == "-":
        stdin = sys.stdin  # click.get_text_stream is deprecated (Click 9 removes it); CliRunner swaps sys.stdin
        if stdin.isatty():
            raise click.UsageError("give a QUERY, --file F, or a query on stdin")
        return stdin.read()
    return query


@click.command()
@click.argument("query", required=False)
@click.option("--file", "file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Read the query from this file.")
@db_option
@from_option
@output_options(*SQL_FORMATS)
def sql(query: str | None, file: Path | None, db_path: Path, sources: tuple[str, ...], fmt: str) -> None:
    """Run SQL on the recorded requests.

    QUERY, or `-` or nothing to read it from stdin. Views: `requests` (the
    table plus error, day, hour, decode_tokens_per_s, cache_read_share),
    `errors`, `hourly`, `daily`; table: `chunks`. Timestamps are UTC.
    """
    text = _read_query(query, file)
    if not text.strip():
        raise click.UsageError("the query is empty")
    if _SHOW_TABLES.fullmatch(text):  # the `requests` view shadows the table: name it once
        text = "SELECT DISTINCT name FROM (SHOW TABLES) ORDER BY name"
    with opened(db_path, sources) as source:
        try:
            columns, _, rows = source.query(text)
        except SourceError as exc:
            raise click.ClickException(_with_file_hint(str(exc))) from None
    echo(render(columns, rows, fmt), nl=False)


_LOCKED_OUT = "file system operations are disabled"
FILE_HINT = ("hint: llmtap's SQL reads its inputs and no other file (docs/security.md). Name them with --from:"
             " `llmtap sql --from 'exports/*' \"SELECT ...\"` reads `llmtap export` directories (their Parquet)"
             " and other llmtap databases as the `requests` view; for any other file, use duckdb itself.")


def _with_file_hint(message: str) -> str:
    """A query's error; when it tried to read a file (read_parquet, read_csv, 'x.json'), where to go instead."""
    return f"{message}\n{FILE_HINT}" if _LOCKED_OUT in message else message


@click.command()
@click.option("--by", type=click.Choice([*report_mod.GROUPINGS, "tool_name"]), default="model", show_default=True,
              help="Group requests by this; tool_name: the run time of each tool the model called, across sessions.")
@click.option("--sort", type=click.Choice(list(report_mod.SORTS)), help=(
    "Order the groups by this, largest first (name: in order): count, errors (err%), p50/p95 TTFT, E2E,"
    " TPOT, cost. Default: count; by hour and day, name (in time)."))
@click.option("--breakdown", "show_breakdown", is_flag=True,
              help="Show where TTFT goes instead: the median of each part (connection, wait for headers, "
              "first token) per group, as a table and stacked bars.")
@click.option("--limits", "show_limits", is_flag=True,
              help="Show the quota headroom instead: per key and upstream, the latest remaining requests and tokens, a subscription's 5-hour and weekly windows, the 429s, and the lowest headroom per hour.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write a self-contained HTML report with charts to this file.")
@click.option("--kind", "kinds", multiple=True, type=click.Choice(KINDS),
              help="Only requests of this kind (repeatable; default: generation, or every kind with --by kind).")
@click.option("--all", "all_kinds", is_flag=True,
              help="Every kind of request: token counts, probes, model lists, prewarms, ... too.")
@filter_options
@db_option
@from_option
@output_options("table", "json", "csv")
@update_prices_option
def report(by: str, sort: str | None, show_limits: bool, show_breakdown: bool, html_path: Path | None, kinds: tuple[str, ...], all_kinds: bool,
           filters: Filters, db_path: Path, sources: tuple[str, ...], fmt: str, update_prices: bool) -> None:
    """Latency, errors, tokens and cost by model, tool, route, ...

    Then the 5 slowest requests. Generations only (chat, messages,
    responses, generateContent) unless --kind, --all or --by kind: token
    counts, probes and model lists take milliseconds. Percentiles (DuckDB
    quantile_cont: linear interpolation, like numpy) are over successful
    requests, TTFT over streams only. Cost: the list price of the tokens
    on the request's date (genai-prices); a subscription's is a list-price
    equivalent. Days and hours are UTC. A total row under the groups
    (json: "total"; csv: the groups only). `llmtap bench`'s requests are
    left out unless --include-bench or --tag.
    """
    _update_prices(update_prices)
    if kinds and all_kinds:
        raise click.UsageError("give --kind or --all, not both")
    every = all_kinds or (not kinds and (by == "kind" or show_limits))
    filters = replace(filters, kinds=() if every else kinds or ("generation",))
    if sort and (show_limits or show_breakdown or by == "tool_name"):
        raise click.UsageError("--sort orders the report's groups: it does not go with --limits, --breakdown"
                               " or --by tool_name")
    if by == "tool_name" and (show_breakdown or html_path is not None):
        raise click.UsageError("--by tool_name shows each tool's run time: it does not go with --breakdown or --html")
    with opened(db_path, sources) as source:
        if show_limits:
            from analysis import limits

            try:
                text = limits.RENDERERS[fmt](limits.build_limits(source, filters))
            except limits.LimitsUnknown as exc:
                raise click.ClickException(str(exc)) from None
        elif by == "tool_name":
            from analysis.session_report import render_tool_runs
            from analysis.timeline import a_week, tool_names

            text = render_tool_runs(tool_names(source.query, replace(a_week(filters), kinds=()).where()), fmt,
                                    filters.since is None and filters.until is None)
        elif show_breakdown:
            from analysis import breakdown

            built = breakdown.build_breakdown(source.query, by, report_mod.GROUPINGS[by], filters)
            text = breakdown.RENDERERS[fmt](built)
        else:
            text = report_mod.RENDERERS[fmt](report_mod.build_report(source, by, filters, sort))
        if html_path is not None:
            from proxy.common.private_file import write_private

            from analysis.html.report import render_html

            counted = "generations" if filters.kinds == ("generation",) else "requests"
            write_private(html_path, render_html(source.query, where=filters.where(), title=f"llmtap report: {counted}"
                                                 if counted == "generations" else "llmtap report",
                                                 by=(by, report_mod.GROUPINGS[by]), counted=counted))
    echo(text, nl=False)
    if html_path is not None:
        echo(f"wrote {html_path} (open it in a browser; it needs no network)", err=True)


@click.command()
@click.argument("model", required=False)
@click.option("--upstream", metavar="HOST|URL",
              help="The upstream it went to (an aggregator's URL matches its own prices), e.g. openrouter.ai.")
@click.option("--route", metavar="PREFIX", help="The route prefix it went through (its [price_markup] applies).")
@click.option("--at", "at", metavar="WHEN", help="The price on this date (ISO, UTC; default: now).")
@update_prices_option
@output_options("table", "json")
def prices(model: str | None, upstream: str | None, route: str | None, at: str | None, update_prices: bool,
           fmt: str) -> None:
    """What genai-prices (or your config's [prices]) matched for MODEL, and the price the cost columns use.

    MODEL as the upstream reported it (the row's response_model, else
    request_model). Exits 1 when no price is known: its cost is NULL.
    Without MODEL: the config file's own prices and markups.
    """
    from urllib.parse import urlsplit

    from analysis import price_report

    _update_prices(update_prices)
    if model is None:
        echo(price_report.CONFIGURED_RENDERERS[fmt](price_report.configured()), nl=False)
        return
    if route is not None:
        route = "/" + route.strip("/") if route.strip("/") else "/"
    host = (urlsplit(upstream).hostname if "//" in upstream else upstream.split("/")[0]) if upstream else None
    when = None
    if at:
        try:
            when = parse_time(at, utc_now())
        except WindowError as exc:
            raise click.BadParameter(str(exc), param_hint="--at") from None
    info = price_report.describe(model, host, when, route)
    echo(price_report.RENDERERS[fmt](info), nl=False)
    if not info["matched"]:
        sys.exit(1)


@click.command()
@filter_options
@db_option
@from_option
@output_options("table", "json", "csv")
@click.option("--fail", "fail", is_flag=True, help="Exit 1 when any request failed (for scripts and cron).")
def errors(filters: Filters, db_path: Path, sources: tuple[str, ...], fmt: str, fail: bool) -> None:
    """Failures grouped, with likely causes and fixes.

    Groups by outcome, HTTP status, error type and tool; also lists successful
    streams whose chunks had empty `choices`.
    """
    with opened(db_path, sources) as source:
        report_ = error_report.build_error_report(source, filters)
    echo(error_report.RENDERERS[fmt](report_), nl=False)
    if fail and report_.failed:
        sys.exit(1)


@click.command()
@click.argument("request_id", metavar="ID")
@db_option
@from_option
@output_options("table", "json")
def show(request_id: str, db_path: Path, sources: tuple[str, ...], fmt: str) -> None:
    """One request whole: its timing as a chart, its events, its error, every column.

    ID is any unique prefix of a request id, as `llmtap report` prints them.
    """
    from analysis import show as show_mod

    with opened(db_path, sources) as source:
        try:
            shown = show_mod.find(source, request_id)
        except show_mod.NoMatch as exc:
            raise click.ClickException(str(exc) + _in_the_demo(request_id, db_path, sources)) from None
        except show_mod.ShowError as exc:
            raise click.ClickException(str(exc)) from None
    echo(show_mod.RENDERERS[fmt](shown), nl=False)


def _in_the_demo(request_id: str, db_path: Path, sources: tuple[str, ...]) -> str:
    """When the default database lacks the id and the demo's has it (a "Try next" line typed after
    `serve` made the default database): where it is, or nothing."""
    from analysis import show as show_mod

    demo = paths.data_dir() / DEMO_DB
    if sources or db_path != paths.default_db_path() or not db_path.exists() or not demo.exists():
        return ""
    try:
        source = open_source(demo)
    except SourceError:
        return ""
    try:
        show_mod.find(source, request_id)
    except (show_mod.ShowError, SourceError):
        return ""
    finally:
        source.close()
    return (f" in {db_path}; the demo's database has it:"
            f" `llmtap show --db {demo} {request_id.strip()}`")


def gap_option(f: F) -> F:
    return click.option(
        "--gap", "gap_min", type=click.FloatRange(min=0, min_open=True), default=30, show_default=True,
        metavar="MINUTES", help="A session quiet for longer than this is two sessions.",
    )(f)


@click.command()
@gap_option
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True,
              help="List the newest this many sessions.")
@filter_options_for(since="7d")
@db_option
@from_option
@output_options("table", "json")
def sessions(gap_min: float, limit: int, filters: Filters, db_path: Path, sources: tuple[str, ...], fmt: str) -> None:
    """Agent sessions: where each one's time went.

    Per session (its session id; where a tool sends none, its tool and
    key, marked ~ inferred): start, wall time, turns, requests, and the
    shares of the wall time that went to the model (waiting for the first
    token / generating), the tools (the three that took longest) and you,
    each instant counted once; output tokens and cost. ! marks a slow
    session: TPOT or TTFT per input token 3x its peers' on the same model
    within the hour. `llmtap session ID` shows one as a timeline. The
    newest --limit sessions of the last 7 days unless --since says.
    """
    from analysis import timeline
    from analysis.session_report import render_sessions

    with opened(db_path, sources) as source:
        total, found = timeline.newest(source.query, filters.where(), gap_min * 60, limit)
    echo(render_sessions(found, fmt, total), nl=False)
    if fmt == "json" and total > len(found):  # the list stays a list; the note goes beside it
        echo(f"llmtap: the newest {len(found)} of {total:,} sessions in this window (--limit, --since)", err=True)


@click.command()
@click.argument("session_id", metavar="ID")
@gap_option
@click.option("--since", default="7d", show_default=True, metavar="WHEN",
              help="Look among the sessions from WHEN (forms as in `llmtap report`; all: every one).")
@db_option
@from_option
@output_options("table", "json")
def session(session_id: str, gap_min: float, since: str, db_path: Path, sources: tuple[str, ...], fmt: str) -> None:
    """One agent session as a timeline: model, tool and you spans.

    ID is a session as `llmtap sessions` lists it (any unique prefix,
    pasted with its … too; an inferred session's ~ may be left off). A
    line per span, on one time scale: the model's wait for its first token
    and its generating, each tool run (from the end of the call's block to
    the request that brought the result; calls made together share a
    span, Bash+Read; ░ a result that never came), and you (a finished
    answer to your next prompt). Then the totals, each instant once.
    """
    from analysis import timeline
    from analysis.session_report import render_session

    where = make_filters(since, None, (), (), ()).where()
    with opened(db_path, sources) as source:
        found = timeline.matching(source.query, session_id, where, gap_s=gap_min * 60)
    if not found:
        raise click.ClickException(f"no session starts with {session_id} since {since} (see `llmtap sessions`;"
                                   " --since all looks at every one)")
    if len(found) > 1:
        keys = ", ".join(s.key for s in found[:5])
        raise click.ClickException(f"{session_id} starts {len(found)} sessions ({keys}): give more of it")
    echo(render_session(found[0], fmt), nl=False)


@click.command()
@click.option("--out", "out_dir", required=True, metavar="DIR",
              help="Write DIR/requests/day=.../ and DIR/chunks/day=.../ here; DIR may be s3://bucket/prefix.")
@click.option("--format", "fmt", type=click.Choice(EXPORT_FORMATS), default="parquet", show_default=True,
              help="File format.")
@click.option("--overwrite", is_flag=True, help="Replace what an earlier export wrote there.")
@filter_options_for(daily=False)
@db_option
@from_option
def export(out_dir: str, fmt: str, overwrite: bool, filters: Filters, db_path: Path,
           sources: tuple[str, ...]) -> None:
    """Write requests and chunks as Parquet or CSV files.

    One directory per UTC day: DIR/requests/day=2026-11-30/, DIR/chunks/...
    An s3:// DIR is written through DuckDB's httpfs when installed, else
    s3fs (pip install 'llmtap[s3]'), with credentials from
    AWS_ACCESS_KEY_ID etc. (AWS_ENDPOINT_URL for MinIO, R2, ...).
    """
    with opened(db_path, sources, writes_to=out_dir) as source:
        try:
            written = export_tables(source, out_dir, fmt, filters, overwrite)
        except ExportError as exc:
            raise click.ClickException(str(exc)) from None
    echo(summary(written, fmt), nl=False)


@click.command()
@click.option("--db", "db_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Database for the demo (default: demo.duckdb in llmtap's data directory, made anew).")
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="The demo proxy's port on localhost (0: a free one).")
def demo(db_path: Path | None, port: int) -> None:
    """See llmtap work on a simulated upstream: no key, no network.

    Starts the built-in simulated upstream and the proxy on free loopback
    ports, drives a short realistic mix through the official OpenAI and
    Anthropic SDKs (chat, Responses, Messages; streaming and not; a few
    errors) and what the real CLIs send around them (token counts, a HEAD
    probe, a models list, Codex's WebSocket prewarm and turn), then prints
    the report.
    """
    from proxy.common.event_loop import run

    try:
        from analysis.demo import run_demo
    except ImportError as exc:
        raise click.ClickException(f"the demo needs the official SDKs ({exc.name}): pip install 'llmtap[demo]'") from None

    if db_path is None:
        db_path = paths.data_dir() / DEMO_DB
        for stale in (db_path, db_path.with_name(db_path.name + ".wal")):
            stale.unlink(missing_ok=True)
    from proxy.record.store_reader import StoreError

    try:
        sent = run(lambda: run_demo(db_path, port=port))
    except StoreError as exc:  # a database it may not write (a directory others can write): said, not a traceback
        raise click.ClickException(str(exc)) from None
    with opened(db_path) as source:
        built = report_mod.build_report(source, "model", Filters(kinds=("generation",)))
        echo(report_mod.to_table(built))
        echo(error_report.to_table(error_report.build_error_report(source, Filters())), nl=False)
    echo(try_next(sent, db_path, built), nl=False)


def try_next(sent: int, db_path: Path, built: report_mod.Report) -> str:
    """The demo's last lines: commands that work as typed, from where the demo was run."""
    llmtap = invoked_as()
    db = f" --db {shlex.quote(str(db_path))}"  # always: once `serve` records, the default database is another
    lines = [f"\n{sent} requests recorded in {db_path}. Try next:"]
    lines.append(f"  {llmtap} report{db} --by kind      # generations beside token counts, probes, prewarms")
    if built.slowest:
        lines.append(f"  {llmtap} show{db} {short_ids([r['id'] for r in built.slowest])[0]}"
                     "     # the slowest request whole")
    lines.append(f"  {llmtap} sql{db} \"SELECT kind, dialect, outcome, count(*) AS n,"
                 " round(median(ttft_ms)) AS ttft_ms FROM requests GROUP BY ALL ORDER BY n DESC\"")
    lines.append(f"  {llmtap} serve --upstream https://api.anthropic.com   # then point a real tool at it")
    if llmtap != "llmtap" and sys.prefix != sys.base_prefix:
        lines.append(f"(or `source {_from_here(str(Path(sys.prefix, 'bin', 'activate')))}` first, and type just `llmtap`)")
    return "\n".join(lines) + "\n"


def invoked_as() -> str:
    """How to run this llmtap again from the current directory: `llmtap` when that is on PATH and is
    this program, else the path it was started by (`.venv/bin/llmtap`), else `python -m proxy`."""
    argv0 = sys.argv[0] if sys.argv else ""
    if Path(argv0).name != "llmtap":
        return f"{_from_here(sys.executable)} -m proxy"
    on_path = shutil.which("llmtap")
    if on_path and (not os.path.exists(argv0) or os.path.samefile(on_path, argv0)):
        return "llmtap"
    return _from_here(argv0)


def _from_here(path: str) -> str:
    """`path` relative to the current directory when it is below it, else absolute."""
    full = os.path.abspath(path)
    relative = os.path.relpath(full)
    return full if relative.startswith("..") else relative


def __getattr__(name: str) -> Any:
    """`COMMANDS`, built when asked for: `bench` and `top` import the proxy's server, which the
    query commands never need (`proxy.cli` imports each command when it runs)."""
    if name == "COMMANDS":
        from analysis.bench.cli import bench
        from analysis.top.cli import top

        return (sql, report, errors, export, show, sessions, session, demo, bench, top, prices)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register(group: click.Group) -> None:
    """Add the analysis commands to the `llmtap` group."""
    for command in __getattr__("COMMANDS"):
        group.add_command(command)


@click.command()
@click.option("--since", default="1h", show_default=True, metavar="WHEN",
              help="The window checked: a span before now (30m, 24h, 7d), today, yesterday or an ISO date-time.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              help="TOML config file with the [alerts] table (default: $LLMTAP_CONFIG, else ~/.config/llmtap/config.toml).")
@click.option("--ttft-p95-ms", type=click.FloatRange(min=0, min_open=True), metavar="MS",
              help="Fail when the p95 TTFT of streamed generations is over MS (or [alerts] ttft_p95_ms).")
@click.option("--error-rate", type=click.FloatRange(min=0, max=1, min_open=True), metavar="SHARE",
              help="Fail when over this share of requests failed, e.g. 0.05 (or [alerts] error_rate).")
@click.option("--window-5h", "window_5h_utilization", type=click.FloatRange(min=0, max=1, min_open=True),
              metavar="SHARE", help="Fail when a key's 5-hour window is used over SHARE, e.g. 0.8 (or [alerts] window_5h_utilization).")
@click.option("--daily-budget-usd", type=click.FloatRange(min=0, min_open=True), metavar="USD",
              help="Fail when a UTC day's spend (API keys, list price) is over USD (or [alerts] daily_budget_usd).")
@db_option
@from_option
@output_options("text", "json")
def check(since: str, config_path: Path | None, db_path: Path, sources: tuple[str, ...], fmt: str,
          **flags: float | None) -> None:
    """Exit 1 with a one-line reason when a threshold is crossed, else print "ok …" (for cron and CI).

    The thresholds: the config file's [alerts] table, a flag winning over
    its key. Over the requests since --since (the daily budget: each UTC day
    from there, today at least).
    """
    from dataclasses import asdict

    from proxy.settings import config as cfg
    from proxy.settings.alerts import AlertsError, check_alerts

    from analysis import check as check_mod

    try:
        table = cfg.load_file(config_path or paths.default_config_path()).get("alerts") or {}
        limits = check_alerts(table)
    except (cfg.ConfigError, AlertsError) as exc:
        raise click.ClickException(str(exc)) from None
    limits = check_alerts({**{k: v for k, v in asdict(limits).items() if v is not None},
                           **{k: v for k, v in flags.items() if v is not None}})
    if not limits.any:
        raise click.UsageError("nothing to check: set [alerts] in the config file (ttft_p95_ms, error_rate,"
                               " window_5h_utilization, daily_budget_usd) or give a threshold flag")
    filters = make_filters(since, None, (), (), ())
    now = utc_now()
    with opened(db_path, sources) as source:
        findings = check_mod.evaluate(source, filters, limits, now)
    window = since
    if fmt == "json":
        echo(check_mod.to_json(findings, window), nl=False)
    else:
        echo(check_mod.line(findings, window))
    if any(f.crossed for f in findings):
        sys.exit(1)
