"""`llmtap report`: latency, errors and tokens per model (tool, route, ...), and the slowest requests.

The numbers come from one GROUP BY over the `requests` view with the rollup
terms of `views.py`: percentiles are DuckDB `quantile_cont` (linear
interpolation, like numpy's default) over successful requests where the
metric is known; TTFT only over streams. The CLI shows generations unless
asked for other kinds (`--kind`, `--all`, `--by kind`); the heading says how
many requests of other kinds it left out. The table fits 80 columns: the
metrics are split into two blocks that repeat the group column, durations
are `820ms` or `6.4s`, token counts `12.3k`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from analysis.filters import Filters, sql_string
from analysis.formatting import (
    MIN_SHRUNK_WIDTH,
    column_widths,
    csv_text,
    dumps,
    fmt_count,
    fmt_ms,
    fmt_number,
    fmt_pct,
    fmt_usd,
    layout,
    short_ids,
    truncate,
)
from proxy.common import prices

from analysis.source import Source
from analysis.views import ROLLUP_METRICS, ROLLUP_SQL

WIDTH = 80
SLOWEST = 5

# --by NAME -> the SQL expression of the group label
GROUPINGS: dict[str, str] = {
    "model": "request_model",
    "tool": "tool",
    "route": "route",
    "upstream_host": "upstream_host",
    "tag": "tag",
    "hour": "strftime(hour, '%Y-%m-%d %H:00')",
    "day": "strftime(day, '%Y-%m-%d')",
    "session": "session_id",
    "kind": "kind",
    "project": "project",
}
CHRONOLOGICAL = ("hour", "day")
NULL_LABEL = "(none)"
TOTAL_LABEL = "total"  # the table's last row: every group together (json: "total"; csv leaves it out)

# --sort NAME -> the ORDER BY of the groups: metrics largest first, `name` in order (hour, day: in time)
SORTS: dict[str, str] = {
    "count": "requests DESC",
    "errors": "error_pct DESC",
    "ttft_p50": "ttft_p50_ms DESC NULLS LAST",
    "ttft_p95": "ttft_p95_ms DESC NULLS LAST",
    "e2e_p50": "e2e_p50_ms DESC NULLS LAST",
    "e2e_p95": "e2e_p95_ms DESC NULLS LAST",
    "tpot_p50": "tpot_p50_ms DESC NULLS LAST",
    "cost": "cost_usd DESC NULLS LAST",
    "name": "1 NULLS LAST",
}

# The two table blocks: (metric, group label, header, formatter)
Block = tuple[tuple[str, str, str, Any], ...]
BLOCKS: tuple[Block, ...] = (
    (
        ("requests", "", "reqs", str),
        ("error_pct", "", "err%", fmt_pct),
        ("ttft_p50_ms", "TTFT", "p50", fmt_ms),
        ("ttft_p95_ms", "TTFT", "p95", fmt_ms),
        ("ttft_p99_ms", "TTFT", "p99", fmt_ms),
        ("e2e_p50_ms", "E2E", "p50", fmt_ms),
        ("e2e_p95_ms", "E2E", "p95", fmt_ms),
        ("e2e_p99_ms", "E2E", "p99", fmt_ms),
    ),
    (
        ("tpot_p50_ms", "TPOT", "p50", fmt_ms),
        ("tpot_p95_ms", "TPOT", "p95", fmt_ms),
        ("tpot_p99_ms", "TPOT", "p99", fmt_ms),
        ("output_tokens_per_s_p50", "output", "tok/s", fmt_number),
        ("input_tokens", "tokens", "in", fmt_count),
        ("output_tokens", "tokens", "out", fmt_count),
        ("cache_read_share", "cache", "read%", lambda x: fmt_pct(x, scale=100)),
        ("cost_usd", "", "cost", fmt_usd),
    ),
)

# --by session adds what one agent session cost: time waiting for first tokens, and its wall time
# (first request's start to last request's end). TTFT total: every request where known; its p95 is the
# rollup's.
SESSION_TERMS: tuple[str, ...] = (
    "sum(ttft_ms) AS ttft_total_ms",
    "epoch(max(started_at + to_milliseconds(coalesce(e2e_ms, 0)))) - epoch(min(started_at)) AS wall_s",
)
SESSION_METRICS: tuple[str, ...] = tuple(term.rsplit(" AS ", 1)[1] for term in SESSION_TERMS)


def fmt_wall(seconds: float | None) -> str:
    """42.5 -> '42.5s', 754 -> '12m34s', 5400 -> '1h30m'."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


SESSION_BLOCK: Block = (
    ("requests", "", "reqs", str),
    ("ttft_total_ms", "TTFT", "total", fmt_ms),
    ("wall_s", "", "wall", fmt_wall),
)


def blocks_for(by: str) -> tuple[Block, ...]:
    return BLOCKS + (SESSION_BLOCK,) if by == "session" else BLOCKS


def metrics_for(by: str) -> tuple[str, ...]:
    return ROLLUP_METRICS + SESSION_METRICS if by == "session" else ROLLUP_METRICS


# Rounding for json and csv: ms to 0.1, percentages to 0.01, shares to 1e-4, dollars to 1e-6.
ROUNDING = {"error_pct": 2, "output_tokens_per_s_p50": 1, "cache_read_share": 4, "wall_s": 3, "cost_usd": 6,
            "cost_per_request_usd": 6}
FOOTNOTE = "Percentiles: successful requests only (TTFT: streams). Slowest: any outcome."


def cost_note(report: "Report") -> str:
    """What the cost columns are: list prices, where from; subscription traffic and unknown models."""
    lines = [f"Cost: list prices from {report.price_source}."]
    subscription = sum(g.get("subscription_requests") or 0 for g in report.groups)
    if subscription:
        lines.append(f"  {subscription} on a subscription: a list-price equivalent, not money spent.")
    unpriced = sum(g.get("unpriced") or 0 for g in report.groups)
    if unpriced:
        lines.append(f"  {unpriced} of unknown models have no cost (see `llmtap prices MODEL`).")
    return "\n".join(lines)


@dataclass
class Report:
    by: str
    requests: int
    first: str | None  # UTC 'YYYY-MM-DD HH:MM' of the first and last request
    last: str | None
    groups: list[dict[str, Any]]
    slowest: list[dict[str, Any]]
    kinds: tuple[str, ...] = ()  # the kinds shown; () is every kind
    not_shown: dict[str, int] = field(default_factory=dict)  # requests of other kinds in the window, by kind
    price_source: str = ""  # the package and version the cost columns come from
    total: dict[str, Any] | None = None  # the metrics over every group together
    sort: str = "count"


def order_by(by: str, sort: str | None) -> str:
    """The groups' ORDER BY: `sort` (SORTS), ties by count then name; by default the busiest first,
    hours and days in time."""
    if sort is None:
        sort = "name" if by in CHRONOLOGICAL else "count"
    if sort not in SORTS:
        raise ValueError(f"cannot sort by {sort!r}: choose one of {', '.join(SORTS)}")
    return ", ".join(dict.fromkeys((SORTS[sort], "requests DESC", "1 NULLS LAST")))


def _terms(by: str) -> str:
    return ",\n  ".join((ROLLUP_SQL, *SESSION_TERMS)) if by == "session" else ROLLUP_SQL


def group_stats(source: Source, by: str, filters: Filters, sort: str | None = None) -> list[dict[str, Any]]:
    """One dict per group: the group label under `by`, then `metrics_for(by)` (raw values)."""
    columns, _, rows = source.query(
        f"SELECT {GROUPINGS[by]} AS {by},\n  {_terms(by)}\n"
        f"FROM requests WHERE {filters.where()} GROUP BY 1 ORDER BY {order_by(by, sort)}"
    )
    return [dict(zip(columns, row)) for row in rows]


def total_stats(source: Source, by: str, filters: Filters) -> dict[str, Any] | None:
    """`metrics_for(by)` over every matching request together (its percentiles are of all of them,
    not a mean of the groups'); None when none matches."""
    columns, _, rows = source.query(f"SELECT {_terms(by)}\nFROM requests WHERE {filters.where()}")
    total = dict(zip(columns, rows[0])) if rows else {}
    return total if total.get("requests") else None


def slowest(source: Source, filters: Filters, limit: int = SLOWEST) -> list[dict[str, Any]]:
    columns, _, rows = source.query(
        "SELECT id, request_model AS model, tool, ttft_ms, e2e_ms, outcome FROM requests"
        f" WHERE {filters.where()} AND e2e_ms IS NOT NULL ORDER BY e2e_ms DESC, id LIMIT {int(limit)}"
    )
    return [dict(zip(columns, row)) for row in rows]


def span(source: Source, filters: Filters) -> tuple[int, str | None, str | None]:
    """How many requests, and the first and last started_at (UTC, to the minute)."""
    _, _, rows = source.query(
        "SELECT count(*), strftime(min(started_at) AT TIME ZONE 'UTC', '%Y-%m-%d %H:%M'),"
        " strftime(max(started_at) AT TIME ZONE 'UTC', '%Y-%m-%d %H:%M')"
        f" FROM requests WHERE {filters.where()}"
    )
    count, first, last = rows[0]
    return int(count), first, last


def not_shown(source: Source, filters: Filters) -> dict[str, int]:
    """The requests `filters.kinds` leaves out, by kind, busiest first."""
    if not filters.kinds:
        return {}
    kinds = ", ".join(sql_string(k) for k in filters.kinds)
    _, _, rows = source.query(
        f"SELECT kind, count(*) AS n FROM requests WHERE {replace(filters, kinds=()).where()}"
        f" AND kind NOT IN ({kinds}) GROUP BY kind ORDER BY n DESC, kind"
    )
    return {kind: int(n) for kind, n in rows}


def build_report(source: Source, by: str, filters: Filters, sort: str | None = None) -> Report:
    if by not in GROUPINGS:
        raise ValueError(f"cannot group by {by!r}: choose one of {', '.join(GROUPINGS)}")
    count, first, last = span(source, filters)
    return Report(by, count, first, last, group_stats(source, by, filters, sort), slowest(source, filters),
                  filters.kinds, not_shown(source, filters), prices.sources(), total_stats(source, by, filters),
                  sort or ("name" if by in CHRONOLOGICAL else "count"))


# -- rendering -------------------------------------------------------------------

def _label(value: Any) -> str:
    return NULL_LABEL if value is None else str(value)


def _shows_total(report: Report) -> bool:
    """The table's total row: under two groups or more (one group's total is that group)."""
    return report.total is not None and len(report.groups) > 1


def _table_rows(report: Report) -> list[dict[str, Any]]:
    return report.groups + ([report.total] if report.total is not None and len(report.groups) > 1 else [])


def _block_cells(report: Report, block: Block) -> list[list[str]]:
    return [[fmt(g[metric]) for metric, _, _, fmt in block] for g in _table_rows(report)]


def _label_width(report: Report, blocks: list[tuple[Block, list[list[str]]]]) -> int:
    """The group column's width: its natural width, less what the widest block needs to fit."""
    natural = max(len(report.by), len(TOTAL_LABEL) if _shows_total(report) else 0,
                  *(len(_label(g[report.by])) for g in report.groups))
    room = min(
        WIDTH - sum(column_widths([h for _, _, h, _ in block], cells)) - 2 * len(block)
        for block, cells in blocks
    )
    return max(min(natural, room), MIN_SHRUNK_WIDTH)


def _block_tables(report: Report) -> list[str]:
    """The metrics in two tables (three by session) that repeat the (same width) group column."""
    blocks = [(block, _block_cells(report, block)) for block in blocks_for(report.by)]
    width = _label_width(report, blocks)
    labels = [truncate(_label(g[report.by]), width) for g in report.groups]
    labels += [TOTAL_LABEL] if _shows_total(report) else []
    tables = [
        layout(
            [report.by] + [header for _, _, header, _ in block],
            [[label] + row for label, row in zip(labels, cells)],
            [False] + [True] * len(block),
            groups=[""] + [group for _, group, _, _ in block],
        )
        for block, cells in blocks
    ]
    return [_rule_above_total(t) for t in tables] if _shows_total(report) else tables


def _rule_above_total(table: str) -> str:
    """The header's rule again, above the last (total) row."""
    lines = table.splitlines()
    rule = next(line for line in lines if line.startswith("-"))
    return "\n".join(lines[:-1] + [rule, lines[-1]]) + "\n"


def _slowest_table(report: Report) -> str:
    headers = ["id", "model", "tool", "ttft", "e2e", "outcome"]
    ids = short_ids([r["id"] or "" for r in report.slowest])
    rows = [
        [rid, _label(r["model"]), _label(r["tool"]), fmt_ms(r["ttft_ms"]), fmt_ms(r["e2e_ms"]),
         _label(r["outcome"])]
        for rid, r in zip(ids, report.slowest)
    ]
    right = [False, False, False, True, True, False]
    return layout(headers, rows, right, limit=WIDTH, shrinkable=[1, 2])


def _what(report: Report) -> str:
    """`generations`, `requests (token_count, probe)`, or `requests` for every kind."""
    one = report.requests == 1
    if report.kinds == ("generation",):
        return "generation" if one else "generations"
    noun = "request" if one else "requests"
    return f"{noun} ({', '.join(report.kinds)})" if report.kinds else noun


def heading(report: Report) -> str:
    if not report.requests:
        line = "no requests match" if not report.kinds else f"no {_what(report)} match"
    else:
        line = f"{report.requests} {_what(report)} from {report.first} to {report.last} UTC, by {report.by}"
    if report.not_shown:
        counts = ", ".join(f"{n} {kind}" for kind, n in report.not_shown.items())
        line += f"\nnot shown: {counts} (--all, --by kind)"
    return line


def to_table(report: Report) -> str:
    """The report as text for an 80-column terminal."""
    if not report.requests:
        return heading(report) + "\n"
    parts = [heading(report) + "\n"]
    parts += _block_tables(report)
    n = len(report.slowest)
    parts.append(f"{n} slowest request{'' if n == 1 else 's'}\n" + _slowest_table(report))
    return "\n".join(parts) + "\n" + FOOTNOTE + "\n" + cost_note(report) + "\n"


def _rounded(metric: str, value: Any) -> Any:
    if isinstance(value, float):
        return round(value, ROUNDING.get(metric, 1))
    return value


def _rounded_row(row: dict[str, Any]) -> dict[str, Any]:
    return {k: _rounded(k, v) for k, v in row.items()}


def to_json(report: Report) -> str:
    return dumps({
        "by": report.by,
        "requests": report.requests,
        "first": report.first,
        "last": report.last,
        "kinds": list(report.kinds),
        "not_shown": report.not_shown,
        "sort": report.sort,
        "groups": [_rounded_row(g) for g in report.groups],
        "total": _rounded_row(report.total) if report.total is not None else None,
        "slowest": [_rounded_row(r) for r in report.slowest],
    })


def to_csv(report: Report) -> str:
    """The group rows only, no total row (a total is a formula away in a spreadsheet, and every row
    stays a group; the slowest requests and the total are in the json and table output)."""
    columns = [report.by, *metrics_for(report.by)]
    rows = (_rounded_row(g) for g in report.groups)
    return csv_text(columns, (["" if row[c] is None else row[c] for c in columns] for row in rows))


RENDERERS = {"table": to_table, "json": to_json, "csv": to_csv}
