"""What an upstream says about the account's limits, read off every response's headers, typed.

Three families, each looked for with one header lookup and read only when that header is there
(`raw`, on the relay's path; `parse`, when the row is built):

- Anthropic, API key: `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}`
  (the reset an RFC 3339 time);
- Anthropic, subscription (Claude Code on a Claude login): `anthropic-ratelimit-unified-status` and, per
  window (`5h`, `7d`), `-utilization` (a fraction, 0 to 1), `-reset` (Unix seconds) and `-status`
  (`allowed`, `allowed_warning`, `rejected`);
- OpenAI (and the servers that copy it): `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, the
  reset a duration from now (`1s`, `6m0s`, `20ms`).

And `retry-after` (seconds or an HTTP date; `retry-after-ms` where only that is sent) as seconds.
The row keeps the numbers and times (`RATELIMIT_COLUMNS`), never the header block.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

from proxy.common.schema import BUCKETS, RATELIMIT_COLUMNS, WINDOWS

ANTHROPIC = "anthropic-ratelimit-requests-limit"  # the sentinel of each family
ANTHROPIC_TOKENS = "anthropic-ratelimit-tokens-limit"
UNIFIED = "anthropic-ratelimit-unified-status"
OPENAI_REQUESTS = "x-ratelimit-limit-requests"
OPENAI_TOKENS = "x-ratelimit-limit-tokens"

NAMES = tuple(name for name, _ in RATELIMIT_COLUMNS)
EMPTY: dict[str, Any] = dict.fromkeys(NAMES)


def raw(headers: Mapping[str, str]) -> dict[str, str] | None:
    """The limit headers of a response, as sent, when it has any family (else None, at the cost of
    four lookups)."""
    get = headers.get
    found: dict[str, str] | None = None
    if get(ANTHROPIC) is not None or get(ANTHROPIC_TOKENS) is not None:
        found = {}
        for bucket in ("requests", "tokens", "input-tokens", "output-tokens"):
            for part in ("limit", "remaining", "reset"):
                name = f"anthropic-ratelimit-{bucket}-{part}"
                if (value := get(name)) is not None:
                    found[name] = value
    if (status := get(UNIFIED)) is not None:
        found = found or {}
        found[UNIFIED] = status
        for window in WINDOWS:
            for part in ("utilization", "reset", "status"):
                name = f"anthropic-ratelimit-unified-{window}-{part}"
                if (value := get(name)) is not None:
                    found[name] = value
    if get(OPENAI_REQUESTS) is not None or get(OPENAI_TOKENS) is not None:
        found = found or {}
        for part in ("limit", "remaining", "reset"):
            for bucket in ("requests", "tokens"):
                name = f"x-ratelimit-{part}-{bucket}"
                if (value := get(name)) is not None:
                    found[name] = value
    return found


def parse(found: Mapping[str, str] | None, retry_after: str | None, retry_after_ms: str | None,
          at: datetime) -> dict[str, Any]:
    """The row's typed columns from `raw`'s headers; `at` is when the headers arrived (UTC), for the
    resets given as a duration. Values that do not parse are NULL."""
    row = dict(EMPTY)
    row["retry_after_s"] = retry_seconds(retry_after, at) if retry_after is not None else (
        _number(retry_after_ms) / 1000 if _number(retry_after_ms) is not None else None)  # type: ignore[operator]
    if not found:
        return row
    get = found.get
    for bucket in BUCKETS:
        name = bucket.replace("_", "-")
        for part in ("limit", "remaining"):
            value = get(f"anthropic-ratelimit-{name}-{part}")
            if value is None and bucket in ("requests", "tokens"):
                value = get(f"x-ratelimit-{part}-{bucket}")
            row[f"ratelimit_{bucket}_{part}"] = _int(value)
        reset = get(f"anthropic-ratelimit-{name}-reset")
        if reset is not None:
            row[f"ratelimit_{bucket}_reset"] = _time(reset)
        elif bucket in ("requests", "tokens") and (reset := get(f"x-ratelimit-reset-{bucket}")) is not None:
            row[f"ratelimit_{bucket}_reset"] = _after(at, duration_seconds(reset))
    row["ratelimit_status"] = get(UNIFIED)
    for window in WINDOWS:
        prefix = f"anthropic-ratelimit-unified-{window}"
        row[f"ratelimit_{window}_utilization"] = _number(get(f"{prefix}-utilization"))
        epoch = _number(get(f"{prefix}-reset"))
        row[f"ratelimit_{window}_reset"] = None if epoch is None else _epoch(epoch)
        row[f"ratelimit_{window}_status"] = get(f"{prefix}-status")
    return row


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")


def duration_seconds(text: str) -> float | None:
    """OpenAI's reset durations: '1s', '6m0s', '1h2m3.5s', '20ms'; a bare number is seconds."""
    text = text.strip()
    if (number := _number(text)) is not None:
        return number
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(float(n) * scale[u] for n, u in parts)


def retry_seconds(text: str, at: datetime) -> float | None:
    """`retry-after`: seconds, or an HTTP date (as seconds after `at`)."""
    if (number := _number(text)) is not None:
        return number
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - at).total_seconds(), 0.0)


def _number(text: str | None) -> float | None:
    """A header's number as sent, NaN, infinities and negatives too: its range is checked where it
    enters the row (proxy/common/bounds.py), which says in `parse_error` what it dropped."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _int(text: str | None) -> int | float | None:
    """A count: an integer, or the float itself when it is none (NaN, infinite), for bounds.py to drop."""
    value = _number(text)
    return value if value is None or not math.isfinite(value) else int(value)


def _after(at: datetime, seconds: float | None) -> datetime | None:
    """`seconds` after `at`; None when there is no such time (NaN, or past the year 9999)."""
    if seconds is None:
        return None
    try:
        return at + timedelta(seconds=seconds)
    except (OverflowError, ValueError):
        return None


def _time(text: str) -> datetime | None:
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def _epoch(seconds: float) -> datetime | None:
    try:
        return datetime.fromtimestamp(seconds, UTC)
    except (OverflowError, OSError, ValueError):
        return None
