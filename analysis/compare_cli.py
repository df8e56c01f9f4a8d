"""`llmtap compare`: the thin click layer over analysis.compare (numpy loads when it runs)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from proxy.common.schema import KINDS
from proxy.common.terminal_text import echo

from analysis.cli import db_option, filter_options_for, from_option, opened, output_options
from analysis.filters import BENCH_TAG_PREFIX, ConditionError, Filters, check_condition, sql_string, sql_timestamp
from analysis.timewindow import WindowError, parse_time, utc_now

# --by NAME -> the column that names a side
BY: dict[str, str] = {
    "route": "route",
    "upstream_host": "upstream_host",
    "model": "request_model",
    "tag": "tag",
    "key": "key_fingerprint",
    "tool": "tool",
    "dialect": "dialect",
    "project": "project",
}
MAX_SIDES = 6  # sides found by --by without values: the busiest ones
MIN_REQUESTS = 10  # ... with at least this many successful requests (analysis.compare.MIN_REQUESTS: a test holds them equal)
NULL_LABEL = "(none)"


def _value_side(column: str, value: str) -> tuple[str, str]:
    if value == NULL_LABEL:
        return value, f"{column} IS NULL"
    return value, f"{column} = {sql_string(value)}"


def _window_side(spec: str) -> tuple[str, str]:
    since, sep, until = spec.partition("..")
    if not sep:
        raise click.BadParameter(f"expected SINCE..UNTIL (either may be empty), not {spec!r}", param_hint="--window")
    now, terms = utc_now(), []
    try:
        if since.strip():
            terms.append(f"started_at >= {sql_timestamp(parse_time(since, now))}")
        if until.strip():
            terms.append(f"started_at < {sql_timestamp(parse_time(until, now))}")
    except WindowError as exc:
        raise click.BadParameter(str(exc), param_hint="--window") from None
    return spec, " AND ".join(terms) or "TRUE"


def _busiest(source: Any, column: str, where: str) -> tuple[list[str], list[tuple[str, int]]]:
    """The busiest values with MIN_REQUESTS+ successful requests (at most MAX_SIDES), and the
    busiest of those with fewer, with their counts (for the words when too few sides are left)."""
    _, _, rows = source.query(
        f"SELECT {column} AS v, count(*) AS n FROM requests WHERE ({where}) AND outcome = 'ok'"
        f" GROUP BY 1 ORDER BY n DESC, 1 NULLS LAST LIMIT {MAX_SIDES + 6}")
    named = [(NULL_LABEL if v is None else str(v), int(n)) for v, n in rows]
    return [v for v, n in named if n >= MIN_REQUESTS][:MAX_SIDES], [(v, n) for v, n in named if n < MIN_REQUESTS]


def _too_few_sides(by: str, found: list[str], few: list[tuple[str, int]]) -> str:
    """Why --by without VALUEs has no comparison: each side needs MIN_REQUESTS+ successful requests."""
    text = f"compare --by {by} needs two sides with {MIN_REQUESTS}+ successful requests each; "
    text += f"found {len(found)}" + (f" ({', '.join(found)})" if found else "")
    if few:
        text += "; too few: " + ", ".join(f"{v} ({n})" for v, n in few)
    return text + " (the filters, --since and --kind apply)"


@click.command()
@click.argument("values", nargs=-1, metavar="[VALUE]...")
@click.option("--by", type=click.Choice(list(BY)), help="Sides are the values of this (VALUEs: these, "
              f"the first the baseline; none: the {MAX_SIDES} busiest, with {MIN_REQUESTS}+ requests).")
@click.option("--where", "conditions", multiple=True, metavar="SQL",
              help="A side: the requests matching this SQL condition (repeatable; the first is the baseline).")
@click.option("--window", "windows", multiple=True, metavar="SINCE..UNTIL",
              help="A side: the requests of this time window, e.g. 48h..24h or 2026-11-30..2026-12-01 "
              "(repeatable; the first is the baseline).")
@click.option("--baseline", metavar="VALUE", help="With --by and no VALUEs: compare against this one.")
@click.option("--kind", "kinds", multiple=True, type=click.Choice(KINDS),
              help="Only requests of this kind (repeatable; default: generation).")
@filter_options_for(where=False)
@db_option
@from_option
@output_options("table", "json")
def compare(values: tuple[str, ...], by: str | None, conditions: tuple[str, ...], windows: tuple[str, ...],
            baseline: str | None, kinds: tuple[str, ...], filters: Filters, db_path: Path,
            sources: tuple[str, ...], fmt: str) -> None:
    """Compare TTFT, TPOT and E2E of two or more groups, with confidence.

    Sides: --by route /a /b (or model, tag, key, upstream_host, tool, dialect, project),
    --where SQL twice or more, or --window SINCE..UNTIL twice or more; the
    other filters apply to every side. Per side: n, p50, p95. Against the
    first: the difference of medians at an input length both sides share
    (each side's metric fitted on its input tokens), a 95% bootstrap
    interval, a verdict, and when it cannot tell, how many more requests
    would; when they cannot be compared, why. Successful generations only
    (--kind for others); `llmtap bench`'s requests only with --include-bench,
    --tag, or --by tag naming them.
    """
    modes = [bool(by), bool(conditions), bool(windows)]
    if sum(modes) != 1:
        raise click.UsageError("give one of --by, --where (twice or more) or --window (twice or more)")
    if values and not by:
        raise click.UsageError("VALUEs name sides of --by")
    if baseline and (values or not by):
        raise click.UsageError("--baseline goes with --by and no VALUEs (else the first VALUE is the baseline)")
    filters = replace(filters, kinds=kinds or ("generation",))
    if by == "tag" and any(v.startswith(BENCH_TAG_PREFIX) for v in (*values, baseline or "")):
        filters = replace(filters, bench=True)  # sides that name bench's tags
    from analysis.compare import CompareError, RENDERERS, Side, compare as run_compare

    with opened(db_path, sources) as source:
        where = filters.where()
        few: list[tuple[str, int]] = []
        if by:
            names = list(values)
            if not names:
                names, few = _busiest(source, BY[by], where)
            if baseline:
                if baseline not in names:
                    names.insert(0, baseline)
                names.sort(key=lambda name: name != baseline)
            sides = [Side(*_value_side(BY[by], name)) for name in names]
        elif conditions:
            try:
                sides = [Side(condition, check_condition(condition)) for condition in conditions]
            except ConditionError as exc:
                raise click.BadParameter(str(exc), param_hint="--where") from None
        else:
            sides = [Side(*_window_side(spec)) for spec in windows]
        if len(sides) < 2 and by and not values:
            raise click.ClickException(_too_few_sides(by, [s.label for s in sides], few))
        if len(sides) < 2:
            found = f" ({', '.join(s.label for s in sides)})" if sides else ""
            raise click.ClickException(f"compare needs two sides or more; found {len(sides)}{found}")
        try:
            result = run_compare(source.query, sides, where, by or ("where" if conditions else "window"))
        except CompareError as exc:
            raise click.ClickException(str(exc)) from None
    echo(RENDERERS[fmt](result), nl=False)
