"""Numbers and text from outside, checked against the columns that keep them.

An upstream states token counts (its usage, read by the dialects) and limits (its rate-limit and
retry-after headers, read by ratelimits.py); a client states `max_tokens`. These are the numbers a
row takes from someone else, and each enters the row here, once (`Meter.finish`): a value its
column's type cannot hold, or that no count or duration can be, becomes NULL and the row's
`parse_error` names it. The row stays. Unchecked, an integer past 64 bits makes the store's batch
fail (every row in it lost), and `output_tokens = -5` or `retry_after_s = -1e308` would be kept as
facts.

By the column's type (proxy/common/schema.py): BIGINT and INTEGER hold an integer from 0 to the type's
largest; DOUBLE a finite number from 0, and `retry_after_s` at most `RETRY_AFTER_MAX_S`. The other
types are not numbers (a reset time that overflows is NULL already: ratelimits.py).

Text: a header's bytes that are not UTF-8 (`User-Agent: a\\xff`, an `Origin` quoted in a refusal's
message) reach Python as lone surrogates (aiohttp decodes with `surrogateescape`), which no UTF-8
column, JSON body or batch can hold: the row would be rejected. `utf8` shows each such byte as
U+FFFD, in every VARCHAR value of a row (`text_checked`) and in llmtap's own error bodies.
"""

from __future__ import annotations

import math
from typing import Any

from proxy.common.schema import REQUEST_COLUMNS

RETRY_AFTER_MAX_S = 366 * 86400.0  # a year: an API's longest window is a month
_TYPES = dict(REQUEST_COLUMNS)
_INT_MAX = {"BIGINT": 2**63 - 1, "INTEGER": 2**31 - 1}
_DOUBLE_MAX = {"retry_after_s": RETRY_AFTER_MAX_S}
SHOWN_CHARS = 40  # of each value named in parse_error
_TEXT_COLUMNS = tuple(name for name, kind in REQUEST_COLUMNS if kind == "VARCHAR")


def fits(name: str, value: Any) -> bool:
    """Whether `value` (not None) is a number the column `name` may keep."""
    kind = _TYPES[name]
    if kind in _INT_MAX:
        return type(value) is int and 0 <= value <= _INT_MAX[kind]
    if kind == "DOUBLE":
        return (type(value) in (int, float) and math.isfinite(value)
                and 0 <= value <= _DOUBLE_MAX.get(name, math.inf))
    return True


def checked(*groups: dict[str, Any]) -> str | None:
    """Sets each value of `groups` (column name to value) that its column may not keep to None;
    returns what was dropped, for `parse_error` (None when every value fits)."""
    shown = []
    for values in groups:
        for name, value in values.items():
            if value is not None and not fits(name, value):
                shown.append(f"{name} {str(value)[:SHOWN_CHARS]}")
                values[name] = None
    return f"out of range, not kept: {', '.join(shown)}" if shown else None


def utf8(text: str) -> str:
    """`text`, each byte that was not UTF-8 (a lone surrogate) shown as U+FFFD."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        try:
            raw = text.encode("utf-8", "surrogateescape")  # the bytes as sent
        except UnicodeEncodeError:  # a surrogate no byte made
            raw = text.encode("utf-8", "surrogatepass")
        return raw.decode("utf-8", "replace")


def text_checked(row: dict[str, Any]) -> None:
    """Every VARCHAR value of a request row made valid UTF-8 (ASCII, the common case, costs one test)."""
    for name in _TEXT_COLUMNS:
        value = row[name]
        if value is not None and not value.isascii():
            row[name] = utf8(value)
