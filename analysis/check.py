"""`llmtap check`: the config's [alerts] thresholds over a window of recorded rows, judged as serve's
warning judges them (proxy/settings/alerts.py's `judge`), as one line: "ok …" (exit 0) or what crossed
(exit 1), for cron and CI. deploy/alerts.yml has the same conditions as Prometheus rules.

- ttft_p95_ms: the p95 TTFT of the window's successful streamed generations;
- error_rate: the share of the window's requests (every kind) that did not end ok;
- window_5h_utilization: the highest latest 5-hour window use of a key (one whose stated reset is
  already past has started a new window: left out);
- daily_budget_usd: the spend of each UTC day from the window's start (today at least), at list price;
  a subscription's list-price equivalent is not money spent and is left out.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from proxy.settings.alerts import Finding, Thresholds, judge
from proxy.settings.config import key_names

from analysis.filters import Filters
from analysis.formatting import dumps
from analysis.source import Source


def evaluate(source: Source, filters: Filters, limits: Thresholds, now: datetime) -> list[Finding]:
    """A Finding per threshold set, measured over the window's rows."""
    where = filters.where()
    out: list[Finding] = []
    if limits.ttft_p95_ms is not None:
        _, _, ((p95, n),) = source.query(
            "SELECT quantile_cont(ttft_ms, 0.95), count(ttft_ms) FROM requests"
            f" WHERE ({where}) AND kind = 'generation' AND NOT error AND stream")
        out.append(judge(limits, "ttft_p95_ms", p95, f"{n} streams" if n else "no streams"))
    if limits.error_rate is not None:
        _, _, ((failed, total),) = source.query(
            f"SELECT count(*) FILTER (WHERE error), count(*) FROM requests WHERE {where}")
        out.append(judge(limits, "error_rate", failed / total if total else None,
                         f"{failed} of {total}" if total else "no requests"))
    if limits.window_5h_utilization is not None:
        out.append(_window(source, where, limits, now))
    if limits.daily_budget_usd is not None:
        out.append(_budget(source, filters, limits, now))
    return out


def _window(source: Source, where: str, limits: Thresholds, now: datetime) -> Finding:
    """The highest latest 5-hour window use of a key whose window is still current."""
    _, _, rows = source.query(
        "SELECT key_fingerprint, arg_max(ratelimit_5h_utilization, started_at),"
        " arg_max(ratelimit_5h_reset, started_at) FROM requests"
        f" WHERE ({where}) AND ratelimit_5h_utilization IS NOT NULL GROUP BY ALL")
    names = key_names()
    current = [(used, f"{names[key]}, {key}" if key in names else key) for key, used, reset in rows
               if reset is None or _time(reset) > now]
    used, key = max(current, key=lambda r: r[0]) if current else (None, "none stated")
    return judge(limits, "window_5h_utilization", used, str(key))


def _budget(source: Source, filters: Filters, limits: Thresholds, now: datetime) -> Finding:
    """The spend of the costliest UTC day from the window's start (today at least), API keys only."""
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    since = min(filters.since, today) if filters.since is not None else None
    day_filters = Filters(since, filters.until, filters.tags, filters.models, filters.tools, filters.kinds)
    _, _, rows = source.query(
        "SELECT strftime(day, '%Y-%m-%d'), sum(cost_usd) FROM requests"
        f" WHERE ({day_filters.where()}) AND billing IS DISTINCT FROM 'subscription'"
        " GROUP BY day HAVING sum(cost_usd) IS NOT NULL ORDER BY 2 DESC, 1 DESC LIMIT 1")
    day, spent = rows[0] if rows else (None, None)
    return judge(limits, "daily_budget_usd", spent, "" if day else "nothing priced",
                 label=f"spend {day}" if day else "")


def _time(value: Any) -> datetime:
    return datetime.fromisoformat(value) if isinstance(value, str) else value


def line(findings: list[Finding], window: str) -> str:
    crossed = [f for f in findings if f.crossed]
    if crossed:
        return f"llmtap check: {'; '.join(f.text for f in crossed)} (since {window})"
    return f"ok since {window}: " + ", ".join(f.text for f in findings)


def to_json(findings: list[Finding], window: str) -> str:
    return dumps({"ok": not any(f.crossed for f in findings), "since": window,
                  "checks": [f.__dict__ for f in findings]})
