"""`llmtap check`: the config's [alerts] thresholds (proxy/settings/alerts.py) over a window of recorded
rows, as one line: "ok …" (exit 0) or what crossed (exit 1), for cron and CI. deploy/alerts.yml has the
same conditions as Prometheus rules.

- ttft_p95_ms: the p95 TTFT of the window's successful streamed generations;
- error_rate: the share of the window's requests (every kind) that did not end ok;
- window_5h_utilization: the highest latest 5-hour window use of a key (one whose stated reset is
  already past has started a new window: left out);
- daily_budget_usd: the spend of each UTC day from the window's start (today at least), at list price;
  a subscription's list-price equivalent is not money spent and is left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from proxy.settings.alerts import Thresholds
from proxy.settings.config import key_names

from analysis.filters import Filters
from analysis.formatting import dumps, fmt_usd
from analysis.source import Source


@dataclass
class Finding:
    name: str  # the [alerts] key
    value: float | None  # None: nothing to measure in the window
    threshold: float
    crossed: bool
    text: str  # "p95 TTFT 812 ms (limit 10,000 ms, 40 streams)"


def _ms(v: float) -> str:
    return f"{v:,.0f} ms"


def _pct(v: float) -> str:
    return f"{100 * v:.1f} %"


def evaluate(source: Source, filters: Filters, limits: Thresholds, now: datetime) -> list[Finding]:
    where = filters.where()
    out: list[Finding] = []
    if limits.ttft_p95_ms is not None:
        _, _, ((p95, n),) = source.query(
            "SELECT quantile_cont(ttft_ms, 0.95), count(ttft_ms) FROM requests"
            f" WHERE ({where}) AND kind = 'generation' AND NOT error AND stream")
        crossed = p95 is not None and p95 > limits.ttft_p95_ms
        text = (f"p95 TTFT {_ms(p95)} {'over' if crossed else 'within'} {_ms(limits.ttft_p95_ms)} ({n} streams)"
                if p95 is not None else "p95 TTFT - (no streams)")
        out.append(Finding("ttft_p95_ms", p95, limits.ttft_p95_ms, crossed, text))
    if limits.error_rate is not None:
        _, _, ((failed, total),) = source.query(
            f"SELECT count(*) FILTER (WHERE error), count(*) FROM requests WHERE {where}")
        rate = failed / total if total else None
        crossed = rate is not None and rate > limits.error_rate
        text = (f"errors {_pct(rate)} {'over' if crossed else 'within'} {_pct(limits.error_rate)}"
                f" ({failed} of {total})" if rate is not None else "errors - (no requests)")
        out.append(Finding("error_rate", rate, limits.error_rate, crossed, text))
    if limits.window_5h_utilization is not None:
        _, _, rows = source.query(
            "SELECT key_fingerprint, arg_max(ratelimit_5h_utilization, started_at),"
            " arg_max(ratelimit_5h_reset, started_at) FROM requests"
            f" WHERE ({where}) AND ratelimit_5h_utilization IS NOT NULL GROUP BY ALL")
        names = key_names()
        current = [(used, f"{names[key]}, {key}" if key in names else key) for key, used, reset in rows
                   if reset is None or _time(reset) > now]
        used, key = max(current, key=lambda r: r[0]) if current else (None, None)
        crossed = used is not None and used > limits.window_5h_utilization
        text = (f"5h window {_pct(used)} {'over' if crossed else 'within'} {_pct(limits.window_5h_utilization)}"
                f" ({key})" if used is not None else "5h window - (none stated)")
        out.append(Finding("window_5h_utilization", used, limits.window_5h_utilization, crossed, text))
    if limits.daily_budget_usd is not None:
        today = now.replace(hour=0, minute=0, second=0, microsecond=0)
        since = min(filters.since, today) if filters.since is not None else None
        day_filters = Filters(since, filters.until, filters.tags, filters.models, filters.tools, filters.kinds)
        _, _, rows = source.query(
            "SELECT strftime(day, '%Y-%m-%d'), sum(cost_usd) FROM requests"
            f" WHERE ({day_filters.where()}) AND billing IS DISTINCT FROM 'subscription'"
            " GROUP BY day HAVING sum(cost_usd) IS NOT NULL ORDER BY 2 DESC, 1 DESC LIMIT 1")
        day, spent = rows[0] if rows else (None, None)
        crossed = spent is not None and spent > limits.daily_budget_usd
        text = (f"spend {day} {fmt_usd(spent)} {'over' if crossed else 'within'} {fmt_usd(limits.daily_budget_usd)}"
                if spent is not None else "spend - (nothing priced)")
        out.append(Finding("daily_budget_usd", spent, limits.daily_budget_usd, crossed, text))
    return out


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
