"""Time windows for `--since` / `--until`.

A bound is either a span before now (`30m`, `24h`, `7d`, `2w`, also `90s`
and decimals like `1.5h`) or an ISO date or date-time (`2026-11-30`,
`2026-11-30T14:00`, `2026-11-30 14:00+01:00`); a date-time without an offset
is UTC, like the recorded `started_at`; or `today` / `yesterday`, the start
(00:00 UTC) of that UTC day, so `--since yesterday --until today` is all of
yesterday.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_SPAN = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")


class WindowError(ValueError):
    """A bound that is neither a span nor an ISO date-time."""


def parse_span(text: str) -> timedelta | None:
    """`24h` -> 24 hours; None when `text` is not a span."""
    match = _SPAN.match(text.strip().lower())
    if not match:
        return None
    return timedelta(seconds=float(match.group(1)) * UNIT_SECONDS[match.group(2)])


DAYS_BACK = {"today": 0, "yesterday": 1}


def day_start(text: str, now: datetime) -> datetime | None:
    """`today` -> 00:00 UTC of `now`'s UTC day, `yesterday` -> the day before; None otherwise."""
    back = DAYS_BACK.get(text.strip().lower())
    if back is None:
        return None
    midnight = now.astimezone(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    return midnight - timedelta(days=back)


def parse_time(text: str, now: datetime) -> datetime:
    """A bound as an aware UTC datetime: `now` minus a span, a UTC day's start, or an ISO value."""
    span = parse_span(text)
    if span is not None:
        return (now - span).astimezone(timezone.utc)
    day = day_start(text, now)
    if day is not None:
        return day
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise WindowError(
            f"{text!r} is neither a span like 30m, 24h, 7d, today, yesterday"
            " nor an ISO date-time like 2026-11-30T14:00"
        ) from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


def utc_now() -> datetime:
    return datetime.now(timezone.utc)
