"""`llmtap report --breakdown`: where TTFT goes, per model, route, upstream host, ...

Each request's TTFT is the sum of consecutive parts (docs/breakdown-and-compare.md):

    ttft_ms = proxy_overhead_ms + pool_wait_ms            llmtap's own part, and the pool's
            + proxy_wait_ms                               llmtap's own time inside the upstream's part
            + dns_ms + connect_ms + tls_ms                a new connection (0 on a reused one)
            + upstream_wait_ms                            request sent -> response headers
            + headers_to_first_token_ms                   headers -> first output event

Where the upstream says what it spent (`upstream_processing_ms`, `upstream_engine_ttft_ms`:
proxy/meter/upstream_timing.py), its part of the wait is split off: `upstream_stated_ms`, the time the
upstream accounts for, and `path_ms`, the rest: the network and any gateways between llmtap and the
server. Of a request over HTTP the stated processing splits `upstream_wait_ms`; of a Responses
WebSocket turn (no headers of its own: its wait is `headers_to_first_token_ms`) the engine's stated TTFT
splits that, and its `path_ms` holds the server's own time outside the engine too. The part split is
then 0, so the parts still add up to TTFT; a request whose upstream says nothing keeps its parts as
they were (stated and path 0).

For each group this shows the median (p50, DuckDB `quantile_cont`) of every part, as a table and as
a stacked bar, beside the TTFT median and the share of requests that opened a new connection. The
medians of the parts need not add up to the median TTFT (a median of sums is not a sum of
medians); the JSON has the means too, which do add up. Requests: successful streamed generations
(as the report's TTFT) recorded with a breakdown (rows from before m004 have none: counted apart).
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any, Callable

from analysis.filters import Filters
from analysis.formatting import csv_text, dumps, layout, truncate

Query = Callable[[str], tuple[list[str], list[str], list[tuple]]]

# One request's stated part of its wait, NULL when its upstream stated none: the processing time over
# HTTP, the engine's TTFT on a WebSocket turn (status 101), each already checked against the part it splits.
STATED = "(CASE WHEN status = 101 THEN upstream_engine_ttft_ms ELSE upstream_processing_ms END)"
STATED_COLUMNS = ("upstream_processing_ms", "upstream_engine_ttft_ms")
_WS = f"({STATED} IS NOT NULL AND status = 101)"
_HTTP = f"({STATED} IS NOT NULL AND status <> 101)"
# (column in the JSON, SQL expression of one request's part, table header, bar glyph)
PARTS: tuple[tuple[str, str, str, str], ...] = (
    ("llmtap_ms", "proxy_overhead_ms + pool_wait_ms + coalesce(proxy_wait_ms, 0)", "llmtap", "·"),
    ("dns_ms", "dns_ms", "dns", "░"),
    ("connect_ms", "connect_ms", "connect", "▒"),
    ("tls_ms", "coalesce(tls_ms, 0)", "tls", "▓"),
    ("upstream_stated_ms", f"coalesce({STATED}, 0)", "stated", "#"),
    ("path_ms", f"CASE WHEN {_HTTP} THEN upstream_wait_ms - {STATED} WHEN {_WS} THEN headers_to_first_token_ms"
                f" - {STATED} ELSE 0 END", "path", "~"),
    ("upstream_wait_ms", f"CASE WHEN {_HTTP} THEN 0 ELSE upstream_wait_ms END", "wait", "█"),
    ("headers_to_first_token_ms", f"CASE WHEN {_WS} THEN 0 ELSE headers_to_first_token_ms END", "→token", "="),
)
PART_NAMES = tuple(name for name, _, _, _ in PARTS)
SPLIT = ("upstream_stated_ms", "path_ms")  # shown only where some upstream stated its time
LEGEND = ("· llmtap (proxy + pool + its waits)  ░ dns  ▒ connect  ▓ tls  █ wait: request sent → response headers\n"
          "= response headers → first token")
LEGEND_SPLIT = ("# stated: the part of the wait the upstream says it spent  ~ path: the rest of that wait "
                "(network, gateways)")
NEEDED = ("upstream_wait_ms", "headers_to_first_token_ms", "connection_reused", "pool_wait_ms")
WIDTH = 80
BAR = 50
SELECTED = "outcome = 'ok' AND stream AND ttft_ms IS NOT NULL"


@dataclass
class Breakdown:
    by: str
    groups: list[dict[str, Any]]
    without: int = 0  # selected requests recorded without a breakdown (before m004)
    missing_columns: bool = False  # the data has no breakdown columns at all
    notes: list[str] = field(default_factory=list)


def breakdown_sql(group: str, by: str, where: str) -> str:
    medians = ",\n  ".join(f"quantile_cont({expr}, 0.5) AS {name}" for name, expr, _, _ in PARTS)
    means = ",\n  ".join(f"avg({expr}) AS mean_{name}" for name, expr, _, _ in PARTS)
    return f"""
SELECT {group} AS {by},
  count(*) AS requests,
  100.0 * count(*) FILTER (WHERE NOT connection_reused) / count(*) AS new_connection_pct,
  count(*) FILTER (WHERE {STATED} IS NOT NULL) AS stated_requests,
  {medians},
  quantile_cont(ttft_ms, 0.5) AS ttft_p50_ms,
  quantile_cont(decode_ms, 0.5) AS decode_p50_ms,
  {means},
  avg(ttft_ms) AS mean_ttft_ms
FROM requests
WHERE ({where}) AND {SELECTED} AND upstream_wait_ms IS NOT NULL AND pool_wait_ms IS NOT NULL
GROUP BY 1 ORDER BY requests DESC, 1 NULLS LAST"""


def has_columns(query: Query) -> bool:
    columns, _, _ = query("SELECT * FROM requests LIMIT 0")
    return all(name in columns for name in NEEDED)


def without_stated(query: Query, sql: str) -> str:
    """`sql` with `STATED` as NULL where the data has no stated times (recorded before m009)."""
    columns, _, _ = query("SELECT * FROM requests LIMIT 0")
    return sql if all(name in columns for name in STATED_COLUMNS) else sql.replace(STATED, "CAST(NULL AS DOUBLE)")


def stated_split(row: dict[str, Any]) -> tuple[str, str, float, float] | None:
    """One request's stated part of its wait, as the breakdown splits it (`STATED`): the column it
    splits, the column that states, the upstream's stated part and the path's (the rest); None when
    its upstream stated none."""
    ws = row.get("status") == 101
    stated_column = "upstream_engine_ttft_ms" if ws else "upstream_processing_ms"
    column = "headers_to_first_token_ms" if ws else "upstream_wait_ms"
    stated, whole = row.get(stated_column), row.get(column)
    if stated is None or whole is None:
        return None
    return column, stated_column, float(stated), float(whole) - float(stated)


def build_breakdown(query: Query, by: str, group: str, filters: Filters | None = None,
                    where: str | None = None) -> Breakdown:
    """The breakdown of the requests matching `filters` (or the SQL predicate `where`) by `group`."""
    where = where if where is not None else (filters or Filters()).where()
    if not has_columns(query):
        return Breakdown(by, [], missing_columns=True)
    columns, _, rows = query(without_stated(query, breakdown_sql(group, by, where)))
    groups = [dict(zip(columns, row)) for row in rows]
    _, _, counted = query(f"SELECT count(*) FROM requests WHERE ({where}) AND {SELECTED}"
                          " AND (upstream_wait_ms IS NULL OR pool_wait_ms IS NULL)")
    return Breakdown(by, groups, without=int(counted[0][0]))


# -- text -------------------------------------------------------------------------

def fmt_part(ms: float | None) -> str:
    """0.43 -> '0.4', 12.6 -> '13', 1530 -> '1530'; None -> '-'."""
    if ms is None:
        return "-"
    return f"{ms:.1f}" if abs(ms) < 10 else f"{ms:.0f}"


def _label(value: Any) -> str:
    return "(none)" if value is None else str(value)


def stacked_bar(values: list[float], scale: float, width: int = BAR) -> str:
    """The parts as runs of their glyphs, `scale` ms filling `width` characters; each run's end is
    rounded from the running total, so the bar's length is the total's, whatever the rounding."""
    out, total, drawn = [], 0.0, 0
    for (_, _, _, glyph), value in zip(PARTS, values):
        total += max(value, 0.0)
        end = round(total / scale * width) if scale > 0 else 0
        out.append(glyph * (end - drawn))
        drawn = end
    return "".join(out)


def _bars(b: Breakdown, label_width: int) -> list[str]:
    values = [[g[name] or 0.0 for name in PART_NAMES] for g in b.groups]
    scale = max((sum(v) for v in values), default=0.0)
    return [f"{truncate(_label(g[b.by]), label_width).ljust(label_width)}  {stacked_bar(v, scale)}"
            f"  {fmt_part(sum(v))} ms"
            for g, v in zip(b.groups, values)]


def to_table(b: Breakdown) -> str:
    if b.missing_columns:
        return ("no breakdown: these requests were recorded before llmtap measured where TTFT goes "
                "(the columns of m004)\n")
    if not b.groups:
        extra = f" ({b.without} recorded before the breakdown)" if b.without else ""
        return f"no successful streamed requests with a breakdown match{extra}\n"
    shown = [(name, h) for name, _, h, _ in PARTS if name not in SPLIT or _stated(b)]
    headers = [b.by, "reqs", "new%"] + [h for _, h in shown] + ["TTFT", "decode"]
    rows = [[_label(g[b.by]), str(g["requests"]), f"{g['new_connection_pct']:.0f}%"]
            + [fmt_part(g[name]) for name, _ in shown] + [fmt_part(g["ttft_p50_ms"]), fmt_part(g["decode_p50_ms"])]
            for g in b.groups]
    table = layout(headers, rows, [False] + [True] * (len(headers) - 1),
                   groups=["", "", ""] + ["TTFT parts, p50 ms"] * len(shown) + ["p50 ms"] * 2,
                   limit=WIDTH, shrinkable=[0])
    label_width = min(max(len(_label(g[b.by])) for g in b.groups), 16)
    lines = [f"Where TTFT goes, by {b.by}: the median of each part (ms); new% opened a new connection", "",
             table.rstrip("\n"), "", *_bars(b, label_width), LEGEND, *([LEGEND_SPLIT] if _stated(b) else []),
             "Part medians need not add up to the TTFT median (--format json has the means, which do)."]
    if _stated(b):
        said = ", ".join(f"{_label(g[b.by])} {g['stated_requests']} of {g['requests']}" for g in b.groups)
        lines.append(f"Requests whose upstream stated its time: {said} (the others' wait is not split).")
    if b.without:
        lines.append(f"{b.without} matching requests were recorded before the breakdown columns: left out.")
    lines += b.notes
    return "\n".join(lines) + "\n"


def _stated(b: Breakdown) -> bool:
    return any(g["stated_requests"] for g in b.groups)


def _rounded(value: Any) -> Any:
    return round(value, 3) if isinstance(value, float) else value


def to_json(b: Breakdown) -> str:
    groups = []
    for g in b.groups:
        groups.append({
            b.by: g[b.by], "requests": g["requests"], "new_connection_pct": _rounded(g["new_connection_pct"]),
            "stated_requests": g["stated_requests"],
            "p50_ms": {name: _rounded(g[name]) for name in PART_NAMES}
            | {"ttft": _rounded(g["ttft_p50_ms"]), "decode": _rounded(g["decode_p50_ms"])},
            "mean_ms": {name: _rounded(g[f"mean_{name}"]) for name in PART_NAMES} | {"ttft": _rounded(g["mean_ttft_ms"])},
        })
    return dumps({"by": b.by, "groups": groups, "without_breakdown": b.without,
                  "missing_columns": b.missing_columns})


def to_csv(b: Breakdown) -> str:
    columns = [b.by, "requests", "new_connection_pct", *(f"{n}_p50" for n in PART_NAMES), "ttft_p50_ms",
               "decode_p50_ms"]
    return csv_text(columns, ([g[b.by], g["requests"], _rounded(g["new_connection_pct"]),
                               *(_rounded(g[n]) for n in PART_NAMES), _rounded(g["ttft_p50_ms"]),
                               _rounded(g["decode_p50_ms"])] for g in b.groups))


RENDERERS = {"table": to_table, "json": to_json, "csv": to_csv}


# -- HTML --------------------------------------------------------------------------

COLORS = ("#9aa0a6", "#edc948", "#f28e2b", "#e15759", "#76b7b2", "#b07aa1", "#4e79a7", "#59a14f")  # one per part


def html_panel(b: Breakdown) -> str:
    """The same as a stacked bar chart in HTML and CSS (no script): one bar per group, its
    segments as wide as the parts' medians, each with its value in a tooltip."""
    if b.missing_columns or not b.groups:
        return ""
    e = html.escape
    scale = max(sum(g[n] or 0.0 for n in PART_NAMES) for g in b.groups) or 1.0
    shown = [(part, c) for part, c in zip(PARTS, COLORS) if part[0] not in SPLIT or _stated(b)]
    legend = "".join(f'<span><span class="swatch" style="background:{c}"></span>{e(h)}</span> '
                     for (_, _, h, _), c in shown)
    rows = []
    for g in b.groups:
        segments = "".join(
            f'<span class="seg" style="width:{100 * max(g[n] or 0.0, 0.0) / scale:.3f}%;background:{c}" '
            f'title="{e(h)}: {fmt_part(g[n])} ms"></span>'
            for (n, _, h, _), c in shown)
        rows.append(
            f'<tr><th scope="row">{e(_label(g[b.by]))}</th><td class="n">{g["requests"]}</td>'
            f'<td class="n">{g["new_connection_pct"]:.0f}%</td>'
            f'<td class="bar"><div class="stack">{segments}</div></td>'
            f'<td class="n">{fmt_part(g["ttft_p50_ms"])} ms</td></tr>')
    return (
        '<section class="panel breakdown"><h2>Where TTFT goes, by ' + e(b.by) + "</h2>"
        '<p class="note">The median of each part of TTFT over successful streams: llmtap and the pool, '
        "DNS, TCP connect and TLS (zero on a reused connection), the wait from the request sent to the "
        "response headers (queueing, and prefill for most APIs), and headers to the first token. "
        "New: requests that opened a connection. Part medians need not add up to the TTFT median."
        + (" Stated: the part of the wait the upstream says it spent; path: the rest of it (network, "
           "gateways)." if _stated(b) else "") + "</p>"
        f'<p class="legend">{legend}</p>'
        '<div class="scroll"><table class="num breakdown"><thead><tr><th></th><th>Requests</th><th>New</th>'
        '<th>Parts (p50)</th><th>TTFT p50</th></tr></thead><tbody>' + "".join(rows) + "</tbody></table></div>"
        "<style>.breakdown td.bar{width:60%;min-width:12rem}.breakdown .stack{display:flex;height:1.1rem}"
        ".breakdown .seg{display:block;height:100%}.breakdown .legend span{margin-right:.8rem}</style>"
        "</section>"
    )
