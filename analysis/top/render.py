"""One screen of `llmtap top` as lines of text, fitted to the terminal.

A frame is a title line, then sections, each a heading line (the section's
name in the first column, the column names after it) and its rows. When the
rows do not all fit, every section gets rows in turn, one at a time, so each
keeps some. A column marked `grow` (the tool) widens to its longest value (up
to `MAX_GROW`) with the room the first column has beyond `GROW_LABEL` (so on
a wide terminal the width goes to both, not to the first alone). Columns that
do not fit the width are dropped from the right.
`frame` returns `Line`s; the terminal writer styles headings, `--once`
prints them plain.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from proxy.common.terminal_text import printable
from proxy.settings.config import key_names

from analysis.formatting import fmt_count, fmt_ms, fmt_number, fmt_pct, fmt_usd, truncate
from analysis.report import fmt_wall
from analysis.top.model import GroupStats, SessionStats, TopModel

MIN_LABEL = 10
MAX_GROW = 18
GROW_LABEL = 20
NONE = "(none)"


@dataclass(frozen=True)
class Line:
    text: str
    heading: bool = False


@dataclass(frozen=True)
class Column:
    header: str
    width: int
    right: bool = True
    grow: bool = False  # widen to the longest value (up to MAX_GROW)


@dataclass
class Section:
    heading: Line
    rows: list[Line]


def _cell(text: str, column: Column) -> str:
    text = truncate(text, column.width)
    return text.rjust(column.width) if column.right else text.ljust(column.width)


def _grown(columns: list[Column], rows: Sequence[tuple[str, Sequence[str]]], width: int) -> list[Column]:
    room = width - sum(c.width + 1 for c in columns) - GROW_LABEL
    for i, c in enumerate(columns):
        if c.grow and rows and room > 0:
            need = min(MAX_GROW, max(len(cells[i]) for _, cells in rows if i < len(cells))) - c.width
            if need > 0:
                columns[i] = replace(c, width=c.width + min(need, room))
                room -= min(need, room)
    return columns


def table(name: str, columns: Sequence[Column], rows: Sequence[tuple[str, Sequence[str]]], width: int) -> Section:
    """A section: first column `name` over the row labels (as wide as the rest leaves), then `columns`."""
    columns = _grown(list(columns), rows, width)
    while columns and width - sum(c.width + 1 for c in columns) < MIN_LABEL:
        columns.pop()
    label_width = max(width - sum(c.width + 1 for c in columns), 1)

    def line(label: str, cells: Sequence[str]) -> str:  # stored data: its controls escaped, then fitted
        parts = [truncate(printable(label), label_width).ljust(label_width)]
        parts += [_cell(printable(text), column) for text, column in zip(cells, columns)]
        return " ".join(parts)[:width].rstrip()

    heading = Line(line(name, [c.header for c in columns]), heading=True)
    return Section(heading, [Line(line(label, cells)) for label, cells in rows])


def _name(value: Any) -> str:
    return NONE if value is None else str(value)


def _rate(x: float | None) -> str:
    return "-" if x is None else fmt_number(x, 1 if x < 100 else 0)


# -- the sections ----------------------------------------------------------------

INFLIGHT = (Column("tool", 11, False, grow=True), Column("session", 9, False), Column("elapsed", 7),
            Column("ttft", 7), Column("tokens", 6), Column("tok/s", 6))
FINISHED = (Column("tool", 11, False, grow=True), Column("session", 9, False), Column("result", 10, False),
            Column("ttft", 7), Column("e2e", 7), Column("out", 6), Column("tok/s", 6))
GROUP = (Column("reqs", 5), Column("err", 4), Column("ttft50", 7), Column("ttft95", 7),
         Column("tpot50", 7), Column("tpot95", 7), Column("e2e50", 7), Column("e2e95", 7))
SESSIONS = (Column("tool", 11, False, grow=True), Column("reqs", 6), Column("ttft tot", 8), Column("ttft95", 7),
            Column("in", 6), Column("out", 6), Column("cache%", 6), Column("wall", 7))


def inflight_section(model: TopModel, width: int) -> Section:
    rows = sorted(model.inflight, key=lambda r: -r.get("elapsed_ms", 0))
    return table(f"in flight {len(rows)}", INFLIGHT, [
        (r.get("model") or r.get("path") or NONE,
         [_name(r.get("tool")), _name(r.get("session_id")), fmt_ms(r.get("elapsed_ms")), fmt_ms(r.get("ttft_ms")),
          fmt_count(r.get("tokens")), _rate(r.get("tokens_per_s"))])
        for r in rows
    ], width)


def result(row: dict[str, Any]) -> str:
    """`ok`, the HTTP status of an HTTP error, else the outcome."""
    outcome = row.get("outcome") or "?"
    if outcome == "http_error" and row.get("status"):
        return f"http {row['status']}"
    return outcome


def finished_section(model: TopModel, width: int) -> Section:
    rows = list(reversed(model.recent))
    return table(f"finished {model.finished_total}", FINISHED, [
        (r.get("request_model") or r.get("path") or NONE,
         [_name(r.get("tool")), _name(r.get("session_id")), result(r), fmt_ms(r.get("ttft_ms")),
          fmt_ms(r.get("e2e_ms")), fmt_count(r.get("output_tokens")), _rate(r.get("output_tokens_per_s"))])
        for r in rows
    ], width)


def group_section(name: str, groups: list[GroupStats], width: int) -> Section:
    return table(name, GROUP, [
        (_name(g.label),
         [str(g.requests), str(g.errors),
          fmt_ms(g.p50["ttft_ms"]), fmt_ms(g.p95["ttft_ms"]), fmt_ms(g.p50["tpot_ms"]), fmt_ms(g.p95["tpot_ms"]),
          fmt_ms(g.p50["e2e_ms"]), fmt_ms(g.p95["e2e_ms"])])
        for g in groups
    ], width)


def errors_section(model: TopModel, window: str, width: int) -> Section:
    counts = model.outcomes()
    ok = counts.pop("ok", 0)
    parts = [f"{outcome} {n}" for outcome, n in counts.most_common()] or ["none"]
    text = f"errors {window}  " + "  ".join(parts) + f"   (ok {ok})"
    if model.other_total:  # finished requests of other kinds than those shown
        text += f"   {model.other_total} other kinds not shown (--all)"
    if model.bench_total:
        text += f"   {model.bench_total} bench not shown (--include-bench)"
    return Section(Line(truncate(text, width), heading=True), [])


LIMITS = (Column("upstream", 14, False, grow=True), Column("requests", 11), Column("tokens", 13), Column("5h", 6),
          Column("7d", 6), Column("runs out", 20, False))


def _left(row: dict[str, Any], left: str, limit: str) -> str:
    if row.get(left) is None:
        return "-"
    return f"{fmt_count(row[left])}/{fmt_count(row[limit])}" if row.get(limit) is not None else fmt_count(row[left])


@functools.cache
def _key_names() -> dict[str, str]:
    """`llmtap keys name`'s names, read once per top."""
    return key_names()


def limits_section(model: TopModel, width: int) -> Section | None:
    """The latest limits per key, the scarcest first; none when no upstream stated any."""
    found = model.limits()
    if not found:
        return None
    names = _key_names()
    windowed = any("runs_out" in r for r in found)  # a subscription's window: when it runs out, at its rate
    return table(f"limits {len(found)} key{'' if len(found) == 1 else 's'}", LIMITS if windowed else LIMITS[:-1], [
        (names.get(r.get("key_fingerprint") or "") or _name(r.get("key_fingerprint")),
         [_name(r.get("upstream_host")), _left(r, "ratelimit_requests_remaining", "ratelimit_requests_limit"),
          _left(r, "ratelimit_tokens_remaining", "ratelimit_tokens_limit"),
          fmt_pct(r.get("ratelimit_5h_utilization"), scale=100), fmt_pct(r.get("ratelimit_7d_utilization"), scale=100),
          r.get("runs_out") or "-"])
        for r in found
    ], width)


def _requests(s: SessionStats) -> str:
    """Finished requests, `+N` for those in flight."""
    return f"{s.requests}+{s.live}" if s.live else str(s.requests)


def sessions_section(model: TopModel, width: int) -> Section:
    stats = model.session_stats()
    return table(f"sessions {len(stats)}", SESSIONS, [
        (s.session_id,
         [_name(s.tool), _requests(s), fmt_ms(s.ttft_total_ms), fmt_ms(s.ttft_p95_ms),
          fmt_count(s.input_tokens), fmt_count(s.output_tokens),
          fmt_pct(s.cache_read_share, scale=100), fmt_wall(s.wall_s)])
        for s in stats
    ], width)


# -- the frame -------------------------------------------------------------------

def window_label(seconds: float) -> str:
    if seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"


def title(model: TopModel, source: str, status: str | None, clock: Callable[[], float] = time.time) -> str:
    lag = model.loop_lag.get("p99_ms")
    parts = [f"llmtap top  {source}", f"{len(model.inflight)} in flight", f"{model.finished_total} done",
             f"lag p99 {lag:.1f}ms" if lag is not None else "lag -", time.strftime("%H:%M:%S", time.localtime(clock()))]
    if (cost := model.cost()) is not None:
        parts.insert(-1, f"cost {fmt_usd(cost)}/{window_label(model.window_s)}")
    if model.dropped or model.finished_dropped:
        parts.insert(-1, f"dropped {model.dropped} ticks, {model.finished_dropped} rows")
    if status:
        parts.insert(1, status)
    return " · ".join(parts)


def sections(model: TopModel, width: int) -> list[Section]:
    window = window_label(model.window_s)
    return [
        inflight_section(model, width),
        finished_section(model, width),
        group_section(f"model {window}", model.by("request_model"), width),
        group_section(f"tool {window}", model.by("tool"), width),
        errors_section(model, window, width),
        *([limits] if (limits := limits_section(model, width)) is not None else []),
        sessions_section(model, width),
    ]


def fit(parts: list[Section], budget: int) -> list[Line]:
    """Headings first (top to bottom while they fit), then rows to each section in turn."""
    parts = parts[:max(budget, 0)]
    shown = [0] * len(parts)
    room = budget - len(parts)
    while room > 0:
        grew = False
        for i, section in enumerate(parts):
            if room > 0 and shown[i] < len(section.rows):
                shown[i] += 1
                room -= 1
                grew = True
        if not grew:
            break
    lines: list[Line] = []
    for section, n in zip(parts, shown):
        lines.append(section.heading)
        lines += section.rows[:n]
    return lines


def frame(model: TopModel, width: int, height: int, source: str, status: str | None = None,
          clock: Callable[[], float] = time.time) -> list[Line]:
    """The screen: at most `height` lines of at most `width` characters; the title wraps at its ` · `."""
    head = [Line(text) for text in title_lines(title(model, source, status, clock), width)]
    return [*head, *fit(sections(model, width), height - len(head))][:max(height, 0)]


def title_lines(text: str, width: int) -> list[str]:
    """The title in lines of at most `width`, broken between its parts (a part longer than `width` is cut)."""
    lines: list[str] = []
    for part in text.split(" · "):
        if lines and len(lines[-1]) + 3 + len(part) <= width:
            lines[-1] += " · " + part
        else:
            lines.append(truncate(part, width))
    return lines
