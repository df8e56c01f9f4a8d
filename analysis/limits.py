"""`llmtap report --limits`: how close each key came to its upstream's limits, from the rows' typed
rate-limit columns (proxy/meter/ratelimits.py), and what preceded each run of 429s (`llmtap errors`).

For each key fingerprint and upstream: the latest remaining requests and tokens (with the limits)
and the next reset, a subscription's 5-hour and weekly window utilization, and the 429s; then the
lowest headroom seen per hour (the smallest share of requests and tokens left, the highest window
utilization), which for a subscription is its windows over time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from proxy.settings.config import key_names

from analysis.filters import Filters
from analysis.formatting import csv_text, dumps, fmt_count, fmt_pct, layout, truncate
from analysis.source import Source
from analysis.window_projection import project

WIDTH = 80
NONE = "(none)"
_STATED = ("ratelimit_requests_remaining IS NOT NULL OR ratelimit_tokens_remaining IS NOT NULL"
           " OR ratelimit_input_tokens_remaining IS NOT NULL OR ratelimit_output_tokens_remaining IS NOT NULL"
           " OR ratelimit_5h_utilization IS NOT NULL OR ratelimit_7d_utilization IS NOT NULL")
# tokens: Anthropic's combined bucket, else the scarcer of its input and output ones, else OpenAI's
_TOKENS_LEFT = ("coalesce(ratelimit_tokens_remaining, least(ratelimit_input_tokens_remaining,"
                " ratelimit_output_tokens_remaining))")
_TOKENS_LIMIT = "coalesce(ratelimit_tokens_limit, ratelimit_input_tokens_limit + ratelimit_output_tokens_limit)"
_TOKENS_SHARE = ("coalesce(ratelimit_tokens_remaining / nullif(ratelimit_tokens_limit, 0), least("
                 "ratelimit_input_tokens_remaining / nullif(ratelimit_input_tokens_limit, 0),"
                 " ratelimit_output_tokens_remaining / nullif(ratelimit_output_tokens_limit, 0)))")


def _latest(column: str) -> str:
    return f"arg_max({column}, started_at) FILTER (WHERE {column} IS NOT NULL)"


@dataclass
class KeyLimits:
    key: str | None
    upstream: str | None
    credential_kind: str | None
    last_seen: str | None
    requests_remaining: int | None
    requests_limit: int | None
    tokens_remaining: int | None
    tokens_limit: int | None
    reset: str | None  # the sooner reset of requests and tokens (UTC), or the 5-hour window's
    utilization_5h: float | None
    utilization_7d: float | None
    status: str | None
    rate_limited: int  # 429s
    key_name: str | None = None  # `llmtap keys name` (the config's [key_names])
    runs_out: str | None = None  # at the 5-hour window's current rate, when it is used up (UTC; projection)
    runs_out_note: str | None = None  # why there is no projection, or "after the reset"


@dataclass
class HourLimits:
    hour: str
    key: str | None
    upstream: str | None
    requests_left_min: float | None  # the lowest share of requests left, 0 to 1
    tokens_left_min: float | None
    utilization_5h_max: float | None
    utilization_7d_max: float | None
    rate_limited: int


@dataclass
class LimitsReport:
    first: str | None
    last: str | None
    keys: list[KeyLimits] = field(default_factory=list)
    hours: list[HourLimits] = field(default_factory=list)


class LimitsUnknown(Exception):
    """The rows predate the rate-limit columns (an older database or export)."""


def _project(source: Source, where: str, keys: list[KeyLimits], now: datetime) -> None:
    """Each key's 5-hour window projection (analysis/window_projection.py) from its last 30 minutes."""
    _, _, rows = source.query(f"""
WITH w AS (SELECT key_fingerprint AS k, upstream_host AS h, started_at AS t, ratelimit_5h_utilization AS u,
             ratelimit_5h_reset AS r FROM requests WHERE ({where}) AND ratelimit_5h_utilization IS NOT NULL),
last AS (SELECT k, h, max(t) AS newest FROM w GROUP BY ALL)
SELECT w.k, w.h, w.t, w.u, w.r FROM w JOIN last ON w.k IS NOT DISTINCT FROM last.k
  AND w.h IS NOT DISTINCT FROM last.h AND w.t >= last.newest - INTERVAL 30 MINUTE ORDER BY w.t""")
    points: dict[tuple[Any, Any], list[tuple[Any, float, Any]]] = {}
    for k, h, t, u, r in rows:
        points.setdefault((k, h), []).append((t, u, r))
    for k in keys:
        if (k.key, k.upstream) in points:
            found = project(points[(k.key, k.upstream)], now)
            k.runs_out = found.runs_out.strftime("%Y-%m-%d %H:%M:%S") if found.runs_out else None
            k.runs_out_note = found.note


def build_limits(source: Source, filters: Filters, now: datetime | None = None) -> LimitsReport:
    columns, _, _ = source.query("SELECT * FROM requests LIMIT 0")
    if "ratelimit_requests_remaining" not in columns:
        raise LimitsUnknown("these rows predate the rate-limit columns (recorded before llmtap kept them):"
                            " no headroom to show")
    where = f"({filters.where()}) AND (({_STATED}) OR status = 429)"
    columns, _, rows = source.query(f"""
SELECT key_fingerprint, upstream_host,
  {_latest('credential_kind')},
  strftime(max(started_at) AT TIME ZONE 'UTC', '%Y-%m-%d %H:%M'),
  {_latest('ratelimit_requests_remaining')}, {_latest('ratelimit_requests_limit')},
  {_latest(_TOKENS_LEFT)}, {_latest(_TOKENS_LIMIT)},
  strftime({_latest('coalesce(least(ratelimit_requests_reset, ratelimit_tokens_reset, ratelimit_input_tokens_reset,'
                    ' ratelimit_output_tokens_reset), ratelimit_5h_reset)')} AT TIME ZONE 'UTC', '%Y-%m-%d %H:%M:%S'),
  {_latest('ratelimit_5h_utilization')}, {_latest('ratelimit_7d_utilization')},
  {_latest('coalesce(ratelimit_status, ratelimit_5h_status)')},
  count(*) FILTER (WHERE status = 429)
FROM requests WHERE {where} GROUP BY ALL ORDER BY 4 DESC, 1 NULLS LAST, 2""")
    names = key_names()
    keys = [KeyLimits(*row) for row in rows]
    for k in keys:
        k.key_name = names.get(k.key or "")
    _project(source, where, keys, now or datetime.now(UTC))
    _, _, rows = source.query(f"""
SELECT strftime(hour, '%Y-%m-%d %H:00'), key_fingerprint, upstream_host,
  min(ratelimit_requests_remaining / nullif(ratelimit_requests_limit, 0)), min({_TOKENS_SHARE}),
  max(ratelimit_5h_utilization), max(ratelimit_7d_utilization), count(*) FILTER (WHERE status = 429)
FROM requests WHERE {where} GROUP BY ALL ORDER BY 1, 2 NULLS LAST, 3""")
    hours = [HourLimits(*row) for row in rows]
    _, _, span = source.query(
        "SELECT strftime(min(started_at) AT TIME ZONE 'UTC', '%Y-%m-%d %H:%M'),"
        f" strftime(max(started_at) AT TIME ZONE 'UTC', '%Y-%m-%d %H:%M') FROM requests WHERE {where}")
    return LimitsReport(span[0][0], span[0][1], keys, hours)


# -- what preceded the 429s (llmtap errors) --------------------------------------------------

BUCKETS = (("requests", "ratelimit_requests_remaining", "ratelimit_requests_reset"),
           ("tokens", "ratelimit_tokens_remaining", "ratelimit_tokens_reset"),
           ("input tokens", "ratelimit_input_tokens_remaining", "ratelimit_input_tokens_reset"),
           ("output tokens", "ratelimit_output_tokens_remaining", "ratelimit_output_tokens_reset"))
WINDOWS = (("5-hour window", "ratelimit_5h_utilization", "ratelimit_5h_reset"),
           ("weekly window", "ratelimit_7d_utilization", "ratelimit_7d_reset"))


def headroom_before_429s(source: Source, filters: Filters) -> list[str]:
    """One line per key and upstream that got 429s: the last one, and the headroom that preceded it
    ("remaining tokens fell to 0 at 14:02:05; reset 14:03:00")."""
    names = [c for _, c, _ in BUCKETS] + [r for _, _, r in BUCKETS] + [c for _, c, _ in WINDOWS] + \
        [r for _, _, r in WINDOWS]
    keyed = (f"(key_fingerprint, upstream_host) IN (SELECT (key_fingerprint, upstream_host) FROM requests"
             f" WHERE ({filters.where()}) AND status = 429)")
    columns, _, rows = source.query(
        f"SELECT key_fingerprint, upstream_host, started_at, status, retry_after_s, {', '.join(names)}"
        f" FROM requests WHERE ({filters.where()}) AND {keyed} AND (({_STATED}) OR status = 429)"
        " ORDER BY key_fingerprint NULLS LAST, upstream_host, started_at")
    found: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for row in rows:
        record = dict(zip(columns, row))
        found.setdefault((record["key_fingerprint"], record["upstream_host"]), []).append(record)
    lines = [_explain(key, host, records) for (key, host), records in found.items()]
    return [line for line in lines if line is not None]


def _time(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else value  # an ISO string over admin


def _clock(value: Any, since: Any = None) -> str:
    """HH:MM:SS, with the days after `since`'s day when later (04:30:00+1d), else the date (12-09 04:30):
    never wider than 11 columns, whatever the hour."""
    value, since = _time(value), _time(since)
    if value is None:
        return "?"
    days = (value.date() - since.date()).days if since is not None else 0
    if days == 0:
        return value.strftime("%H:%M:%S")
    return value.strftime("%H:%M:%S") + f"+{days}d" if 0 < days < 10 else value.strftime("%m-%d %H:%M")


def _explain(key: Any, host: Any, records: list[dict[str, Any]]) -> str | None:
    """None when the upstream stated no limit to this key at all (nothing to link)."""
    stated = [c for _, c, _ in (*BUCKETS, *WINDOWS)]
    if not any(r[c] is not None for r in records for c in stated):
        return None
    zero_since: dict[str, Any] = {}  # bucket -> when it was first seen spent, in the current run
    last_429, count, cause = None, 0, None
    for r in records:
        for name, column, _ in BUCKETS:
            if r[column] is not None:
                if r[column] > 0:
                    zero_since.pop(name, None)
                else:
                    zero_since.setdefault(name, r["started_at"])
        for name, column, _ in WINDOWS:
            if r[column] is not None:
                if r[column] < 1:
                    zero_since.pop(name, None)
                else:
                    zero_since.setdefault(name, r["started_at"])
        if r["status"] == 429:
            count += 1
            last_429 = r
            cause = dict(zero_since)
    who = f"{key or 'no key'} at {host or '?'}: {count} × 429, the last at {_clock(last_429['started_at'])}"  # type: ignore[index]
    resets = {name: reset for name, _, reset in (*BUCKETS, *WINDOWS)}
    if cause:
        name, since = min(cause.items(), key=lambda item: str(item[1]))
        reset = _latest_value(records, last_429, resets[name])
        fell = "reached 100%" if "window" in name else "fell to 0"
        text = f"{who}; remaining {name} {fell} at {_clock(since)}" if "window" not in name else \
            f"{who}; the {name} {fell} at {_clock(since)}"
        text += f"; reset {_clock(reset, last_429['started_at'])}" if reset is not None else ""  # type: ignore[index]
    else:
        text = f"{who}; no limit was stated as spent before it"
    if last_429 is not None and last_429.get("retry_after_s") is not None:
        text += f" (retry-after {last_429['retry_after_s']:g} s)"
    return text


def _latest_value(records: Sequence[dict[str, Any]], until: dict[str, Any] | None, column: str) -> Any:
    value = None
    for r in records:
        if r[column] is not None:
            value = r[column]
        if r is until:
            break
    return value


# -- rendering ----------------------------------------------------------------------------

def _n(value: Any) -> str:
    """Exact below 100,000 (3,979 of 4,000 is no '4.0k'), else short."""
    return f"{int(value):,}" if abs(value) < 100_000 else fmt_count(value)


def _of(left: Any, limit: Any) -> str:
    if left is None:
        return "-"
    return f"{_n(left)}/{_n(limit)}" if limit is not None else _n(left)


def _pct(share: float | None) -> str:
    return fmt_pct(share, scale=100) if share is not None else "-"


def _reset(text: str | None, last_seen: str | None) -> str:
    """HH:MM:SS, with +1d when on the day after the day last seen (see _clock)."""
    return _clock(text, last_seen) if text is not None else "-"


def to_table(report: LimitsReport) -> str:
    if not report.keys:
        return "no rate-limit headers or 429s in these requests\n"
    out = [f"limits the upstreams stated from {report.first} to {report.last} UTC", ""]
    rows = [[truncate(k.key_name or k.key or NONE, 14), k.upstream or NONE, _of(k.requests_remaining, k.requests_limit),
             _of(k.tokens_remaining, k.tokens_limit), _pct(k.utilization_5h), _pct(k.utilization_7d),
             _reset(k.reset, k.last_seen), str(k.rate_limited)] for k in report.keys]
    out.append(layout(["key", "upstream", "requests", "tokens", "5h", "7d", "reset", "429s"], rows,
                      [False, False, True, True, True, True, False, True], limit=WIDTH, shrinkable=[1]))
    projected = [k for k in report.keys if k.runs_out or k.runs_out_note]
    if projected:
        out.append("5-hour window at the current rate (the last 30 minutes' rise)")
        for k in projected:
            when = f"runs out at {_clock(k.runs_out, k.last_seen)} UTC" if k.runs_out else k.runs_out_note
            out.append(f"  {truncate(k.key_name or k.key or NONE, 14)} at {k.upstream or NONE}: {when}")
        out.append("")
    out.append("lowest headroom per hour (share left; a subscription's windows used)")
    names = {k.key: k.key_name for k in report.keys if k.key_name}
    rows = [[h.hour, truncate(names.get(h.key) or h.key or NONE, 14), truncate(h.upstream or NONE, 17), _pct(h.requests_left_min),
             _pct(h.tokens_left_min), _pct(h.utilization_5h_max), _pct(h.utilization_7d_max), str(h.rate_limited)]
            for h in report.hours]
    out.append(layout(["hour", "key", "upstream", "requests", "tokens", "5h", "7d", "429s"], rows,
                      [False, False, False, True, True, True, True, True], limit=WIDTH, shrinkable=[2]))
    return "\n".join(out)


def to_json(report: LimitsReport) -> str:
    return dumps(asdict(report))


def to_csv(report: LimitsReport) -> str:
    """The latest limits per key (the hourly lows are in the json)."""
    names = list(KeyLimits.__dataclass_fields__)
    return csv_text(names, (["" if v is None else v for v in asdict(k).values()] for k in report.keys))


RENDERERS = {"table": to_table, "json": to_json, "csv": to_csv}
