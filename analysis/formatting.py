"""Rows to text: aligned tables, CSV, JSON, NDJSON, Markdown, and humanised numbers.

A table's cells hold stored data (a path, a tag, an upstream's error message): each is shown with its
control characters escaped (proxy/common/terminal_text.py) before it is laid out, so a line break cannot
start a row and the columns stay aligned; the whole text then leaves through `terminal_text.echo`."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Sequence
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

import orjson

from proxy.common.prices import fmt_usd as fmt_usd  # re-exported: one way a price reads
from proxy.common.terminal_text import printable, printable_cells

FORMATS = ("table", "csv", "json", "ndjson", "markdown")
ELLIPSIS = "…"
MIN_SHRUNK_WIDTH = 8


# -- values --------------------------------------------------------------------

def plain(value: Any) -> Any:
    """A value JSON can hold: datetimes as ISO strings (like the proxy's endpoint sends them)."""
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, (UUID, timedelta, bytes)):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return value


def cell(value: Any) -> str:
    """One value as text for a table or CSV: NULL is empty."""
    value = plain(value)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return orjson.dumps(value).decode()
    return str(value)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float, Decimal)) and not isinstance(value, bool)


def fmt_ms(ms: float | None) -> str:
    """820 -> '820ms', 6400 -> '6.4s'; None -> '-'."""
    if ms is None:
        return "-"
    if round(ms) < 1000:
        return f"{ms:.0f}ms"
    return f"{ms / 1000:.1f}s"


def fmt_count(n: float | None) -> str:
    """950 -> '950', 12345 -> '12.3k', 4_200_000 -> '4.2M'."""
    if n is None:
        return "-"
    if abs(n) < 1000:
        return f"{n:.0f}"
    for unit in ("k", "M", "G", "T"):
        n /= 1000
        if round(abs(n), 1) < 1000 or unit == "T":
            return f"{n:.1f}{unit}"
    raise AssertionError("unreachable")


def fmt_pct(fraction_or_pct: float | None, *, scale: float = 1.0) -> str:
    """A percentage with one decimal; `scale=100` for a fraction."""
    if fraction_or_pct is None:
        return "-"
    return f"{fraction_or_pct * scale:.1f}%"


def fmt_number(x: float | None, decimals: int = 0) -> str:
    return "-" if x is None else f"{x:.{decimals}f}"


# -- tables --------------------------------------------------------------------

def _shrink(widths: list[int], shrinkable: Sequence[int], limit: int) -> list[int]:
    """Narrow the widest shrinkable columns until the table fits in `limit`."""
    widths = list(widths)
    total = sum(widths) + 2 * (len(widths) - 1)
    while total > limit:
        candidates = [i for i in shrinkable if widths[i] > MIN_SHRUNK_WIDTH]
        if not candidates:
            break
        widest = max(candidates, key=lambda i: widths[i])
        widths[widest] -= 1
        total -= 1
    return widths


def truncate(text: str, width: int) -> str:
    """`text` cut to `width` characters, the last one an ellipsis when cut."""
    return text if len(text) <= width else text[: width - 1] + ELLIPSIS


def short_ids(ids: Sequence[str], shortest: int = 8) -> list[str]:
    """Each id cut to the fewest leading characters (at least `shortest`) that still tell these ids
    apart: what `llmtap show` accepts (any unique prefix)."""
    distinct = set(ids)
    width = shortest
    longest = max(map(len, distinct), default=0)
    while width < longest and len({i[:width] for i in distinct}) < len(distinct):
        width += 1
    return [i[:width] for i in ids]


def column_widths(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[int]:
    return [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]


def _group_line(groups: Sequence[str], widths: list[int]) -> str:
    """Labels centred over runs of columns that share them."""
    line, i = "", 0
    while i < len(groups):
        j = i
        while j + 1 < len(groups) and groups[j + 1] == groups[i]:
            j += 1
        span = sum(widths[i : j + 1]) + 2 * (j - i)
        line += ("  " if i else "") + groups[i].center(span)
        i = j + 1
    return line.rstrip()


def layout(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    right: Sequence[bool],
    *,
    groups: Sequence[str] | None = None,
    limit: int | None = None,
    shrinkable: Sequence[int] = (),
) -> str:
    """An aligned text table: header, dashes, rows; two spaces between columns.

    `groups` labels runs of columns on a line above the header. With `limit`,
    the `shrinkable` columns are narrowed (cut with an ellipsis) to fit.
    """
    headers = printable_cells(headers)
    rows = [printable_cells(r) for r in rows]
    widths = column_widths(headers, rows)
    if limit is not None:
        widths = _shrink(widths, shrinkable, limit)

    def line(cells: Sequence[str]) -> str:
        parts = [
            truncate(c, w).rjust(w) if r else truncate(c, w).ljust(w)
            for c, w, r in zip(cells, widths, right)
        ]
        return "  ".join(parts).rstrip()

    lines = [_group_line(groups, widths)] if groups and any(groups) else []
    lines += [line(headers), line(["-" * w for w in widths])]
    lines += [line(r) for r in rows]
    return "\n".join(lines) + "\n"


# -- whole results ---------------------------------------------------------------

def to_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    right = [bool(rows) and all(is_number(r[i]) or r[i] is None for r in rows)
             and any(is_number(r[i]) for r in rows) for i in range(len(columns))]
    return layout(columns, [[cell(v) for v in r] for r in rows], right)


# A spreadsheet runs a cell that starts with one of these as a formula (OWASP, "CSV Injection"):
# a model name or an upstream's error such as =HYPERLINK(...) would. Such text gets a leading
# single quote, which shows it as text; a number (-5, +1.5e3) is left as it is. Their full-width
# forms too (＝ ＋ － ＠), which a spreadsheet that folds full-width input may take for the same.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\uff1d", "\uff0b", "\uff0d", "\uff20")
NUMBER = r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?"
_FORMULA_CLASS = "[=+\\-@\\t\\r\uff1d\uff0b\uff0d\uff20]"  # FORMULA_STARTS as a regex class, for re and DuckDB's RE2


def csv_cell(value: Any) -> Any:
    """One value for a CSV file: text a spreadsheet would take for a formula is quoted with `'`;
    anything else (numbers, None) as it is, for the csv module to write."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS) and not re.fullmatch(NUMBER, value):
        return "'" + value
    return value


def csv_cell_sql(expr: str) -> str:
    """`csv_cell` as a DuckDB expression on a VARCHAR, for the CSV files DuckDB writes (export)."""
    return (f"CASE WHEN regexp_matches({expr}, '^{_FORMULA_CLASS}')"
            f" AND NOT regexp_full_match({expr}, '{NUMBER}') THEN chr(39) || {expr} ELSE {expr} END")


def csv_text(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A header and rows as CSV, every cell through `csv_cell`: the one CSV writer of the CLI."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([csv_cell(c) for c in columns])
    writer.writerows([csv_cell(v) for v in r] for r in rows)
    return out.getvalue()


def to_csv(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    return csv_text(columns, ([cell(v) for v in r] for r in rows))


def records(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    return [{c: plain(v) for c, v in zip(columns, r)} for r in rows]


def to_json(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    return dumps(records(columns, rows))


def to_ndjson(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    return "".join(orjson.dumps(r).decode() + "\n" for r in records(columns, rows))


def _md_escape(text: str) -> str:
    return printable(text.replace("|", "\\|").replace("\n", " "))


def to_markdown(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    right = [any(is_number(r[i]) for r in rows) for i in range(len(columns))]
    lines = [
        "| " + " | ".join(_md_escape(c) for c in columns) + " |",
        "| " + " | ".join("---:" if r else "---" for r in right) + " |",
    ]
    lines += ["| " + " | ".join(_md_escape(cell(v)) for v in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def dumps(data: Any) -> str:
    """Indented JSON with a final newline."""
    return orjson.dumps(plain(data), option=orjson.OPT_INDENT_2).decode() + "\n"


RENDERERS = {
    "table": to_table,
    "csv": to_csv,
    "json": to_json,
    "ndjson": to_ndjson,
    "markdown": to_markdown,
}


def render(columns: Sequence[str], rows: Sequence[Sequence[Any]], fmt: str) -> str:
    return RENDERERS[fmt](columns, rows)
