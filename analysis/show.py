"""`llmtap show ID`: one request whole: what it was, its timing as a small text chart, its output
events over time, its error, and every recorded column.

`ID` is any unique prefix of a request id (the `report`'s slowest list prints the shortest that
tell its rows apart). The chart puts each timing mark on one scale from the request's arrival
(0) to its end (`e2e_ms`); the events line is a histogram of the `chunks` table's offsets on the
same scale, one character per column.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from proxy.common.terminal_text import printable

from analysis.filters import sql_string
from analysis.formatting import cell, dumps, fmt_ms, short_ids
from analysis.source import Source
from analysis.views import DERIVED_COLUMNS

MAX_MATCHES = 5
CHART_WIDTH = 50
BARS = " ▁▂▃▄▅▆▇█"
# (column, label) of the marks on the chart, in the order they happen
MARKS = (
    ("proxy_overhead_ms", "upstream sent"),
    ("upstream_headers_ms", "headers"),
    ("first_byte_ms", "first byte"),
    ("ttft_ms", "first token"),
    ("first_text_ms", "first text"),
    ("last_token_ms", "last token"),
    ("e2e_ms", "end"),
)
_ID_CHARS = frozenset(string.hexdigits + "-")


class ShowError(Exception):
    """No request, or several, match the id; the message is for the user."""


class NoMatch(ShowError):
    """No request id starts with the prefix."""


@dataclass
class Shown:
    row: dict[str, Any]
    chunks: list[dict[str, Any]]  # seq, offset_ms, bytes, event_type


def find(source: Source, prefix: str) -> Shown:
    """The request whose id starts with `prefix` (it must be the only one), and its chunks."""
    prefix = prefix.strip().lower()
    if not prefix or not set(prefix) <= _ID_CHARS:
        raise ShowError(f"{prefix!r} is not a request id: ids are hex digits (see `llmtap report`)")
    derived = ", ".join(c for c in DERIVED_COLUMNS if c not in ("cost_usd", "price_source", "billing"))  # its price shown
    columns, _, rows = source.query(
        f"SELECT * EXCLUDE ({derived}) FROM requests WHERE starts_with(lower(id), {sql_string(prefix)})"
        f" ORDER BY started_at, id LIMIT {MAX_MATCHES + 1}"
    )
    if not rows:
        raise NoMatch(f"no request id starts with {prefix}")
    if len(rows) > 1:
        ids = short_ids([r[columns.index("id")] for r in rows[:MAX_MATCHES]], len(prefix) + 1)
        more = "more than " if len(rows) > MAX_MATCHES else ""
        raise ShowError(f"{prefix} matches {more}{min(len(rows), MAX_MATCHES)} requests"
                        f" ({', '.join(ids)}{', ...' if more else ''}): give more of the id")
    row = dict(zip(columns, rows[0]))
    return Shown(row, chunks_of(source, row))


CHUNK_COLUMNS = "seq, offset_ms, bytes, event_type"
SCAN_ALL_BELOW = 2_000_000  # chunk rows: fewer, and one scan of them all is quick
FIRST_WINDOW = 1 << 18  # rows each side of the guess first, then 4x wider each time


def chunks_of(source: Source, row: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's chunks, in order. The proxy writes a request's chunk rows together, one run
    (proxy/record/store.py appends each request's whole), in about the order the requests started;
    so on a big table, rather than scan every row for its id (400 ms at 15M rows), read a window of
    row ids around where its run should be (DuckDB skips the other row groups), widening it until
    it holds one run of as many rows as the request's `output_events`; else (rows written otherwise, no
    count, or a stream past the meter's cap of kept events, which keeps fewer rows), the whole table."""
    where = f"request_id = {sql_string(row['id'])}"
    events, started = row.get("output_events"), row.get("started_at")
    if events is not None and started is not None:
        if events == 0:
            return []
        total = source.query("SELECT count(*) FROM chunks")[2][0][0]
        if total >= SCAN_ALL_BELOW:
            found = _windowed(source, where, started, total, events)
            if found is not None:
                return found
    columns, _, rows = source.query(f"SELECT {CHUNK_COLUMNS} FROM chunks WHERE {where} ORDER BY seq")
    return [dict(zip(columns, r)) for r in rows]


def _windowed(source: Source, where: str, started: Any, total: int, events: int) -> list[dict[str, Any]] | None:
    stamp = started.isoformat() if isinstance(started, datetime) else str(started)
    before, requests = source.query(f"SELECT count(*) FILTER (WHERE started_at < TIMESTAMPTZ {sql_string(stamp)}),"
                                    " count(*) FROM requests")[2][0]
    guess, width = int(total * before / max(requests, 1)), FIRST_WINDOW
    while width < total:
        low, high = max(0, guess - width), guess + width
        columns, _, rows = source.query(f"SELECT rowid AS row_number, {CHUNK_COLUMNS} FROM chunks"
                                        f" WHERE rowid BETWEEN {low} AND {high} AND {where} ORDER BY row_number")
        if rows:
            first, last, n = rows[0][0], rows[-1][0], len(rows)
            if n == events and last - first + 1 == n and (low == 0 or first > low) and last < high:
                return sorted((dict(zip(columns[1:], r[1:])) for r in rows), key=lambda c: c["seq"])
            if last - first + 1 != n:
                return None  # not one run: written some other way
        width *= 4
    return None


# -- rendering -------------------------------------------------------------------

def _scale(row: dict[str, Any], chunks: list[dict[str, Any]]) -> float:
    ends = [row.get(c) for c, _ in MARKS] + [c["offset_ms"] for c in chunks[-1:]]
    return max((v for v in ends if v is not None), default=0.0) or 1.0


def timing_chart(row: dict[str, Any], chunks: list[dict[str, Any]], width: int = CHART_WIDTH) -> list[str]:
    """One line per known mark (a bar from arrival to it), then the events histogram."""
    scale = _scale(row, chunks)
    lines = []
    for column, label in MARKS:
        value = row.get(column)
        if value is not None:
            bar = "=" * max(1, round(width * value / scale)) if value > 0 else ""
            lines.append(f"  {label:<14} |{bar:<{width}} {fmt_ms(value):>7}")
    if chunks:
        lines.append(f"  {'events':<14} |{event_bars(chunks, scale, width)} {len(chunks):>7}")
        kinds: dict[str, int] = {}
        for c in chunks:
            kinds[c["event_type"] or "?"] = kinds.get(c["event_type"] or "?", 0) + 1
        lines.append(f"  {'':<14}  " + ", ".join(f"{n} {kind}" for kind, n in kinds.items())
                     + f"; gaps p50 {fmt_ms(row.get('gap_p50_ms'))}, max {fmt_ms(row.get('gap_max_ms'))}")
    return lines


def event_bars(chunks: list[dict[str, Any]], scale: float, width: int = CHART_WIDTH) -> str:
    """The events' offsets as a histogram over `width` columns spanning 0..`scale` ms."""
    counts = [0] * width
    for c in chunks:
        counts[min(width - 1, max(0, int(width * (c["offset_ms"] or 0) / scale)))] += 1
    top = max(counts)
    return "".join(BARS[0] if n == 0 else BARS[max(1, round(n * (len(BARS) - 1) / top))] for n in counts)


def _value(value: Any) -> str:
    """A column's value as text; a timestamp in the one format `show` uses: 2026-12-01 09:43:49.046 UTC."""
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(timezone.utc)
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"
    return cell(value)


def _summary(row: dict[str, Any]) -> list[str]:
    model = row.get("request_model") or "-"
    answered = row.get("response_model")
    if answered and answered != model:
        model += f" -> {answered}"
    when = _value(row.get("started_at"))
    stream = "stream" if row.get("stream") else "no stream"
    return [
        f"request {row['id']}",
        f"  {row.get('method')} {row.get('path')}  {row.get('kind') or '-'}  {row.get('dialect') or '-'}  {stream}",
        f"  {when}  tool {row.get('tool') or '-'}  model {model}",
        f"  status {cell(row.get('status')) or '-'}  outcome {row.get('outcome') or '-'}"
        f"  tokens in {cell(row.get('input_tokens')) or '-'}, out {cell(row.get('output_tokens')) or '-'}",
    ]


def to_text(shown: Shown) -> str:
    row = shown.row
    lines = _summary(row)
    if row.get("error_type") or row.get("error_message"):
        lines.append(f"  error {row.get('error_type') or '-'}: {row.get('error_message') or ''}".rstrip())
    for column in ("parse_error", "request_parse_error"):
        if row.get(column):
            lines.append(f"  {column} {row[column]}")
    lines += ["", "timing (ms from arrival at the proxy)", *timing_chart(row, shown.chunks), "", "columns"]
    known = [(name, _value(value)) for name, value in row.items() if value is not None]
    width = max(len(name) for name, _ in known)
    lines += [f"  {name:<{width}}  {value}" for name, value in known]
    return "\n".join(map(printable, lines)) + "\n"  # one line each, whatever a value holds


def to_json(shown: Shown) -> str:
    return dumps({"request": shown.row, "chunks": shown.chunks})


RENDERERS = {"table": to_text, "json": to_json}
