"""The thresholds people watch, from the config file's `[alerts]` table, and the one judgement of a
measure against them (`judge`): `llmtap check` measures over a window of recorded rows
(analysis/check.py), `serve` from the rows as they finish, for its warning line
(proxy/observe/thresholds.py); both say a crossing in the same words. deploy/alerts.yml holds the same
conditions as Prometheus rules (tests/test_alerts.py holds it to these keys)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.common.prices import fmt_usd

# key -> what it is
KEYS = {
    "ttft_p95_ms": "p95 time to first token of streamed generations, in ms",
    "error_rate": "share of requests that failed, a fraction (0.05: 5 %)",
    "window_5h_utilization": "a subscription's 5-hour window used, a fraction (0.8: 80 %)",
    "daily_budget_usd": "spend per UTC day (list price), in USD",
}
FRACTIONS = ("error_rate", "window_5h_utilization")


def _pct(v: float) -> str:
    return f"{100 * v:.1f} %"


# key -> (what a finding calls the measure, how its values read)
SHOWN: dict[str, tuple[str, Callable[[float], str]]] = {
    "ttft_p95_ms": ("p95 TTFT", lambda v: f"{v:,.0f} ms"),
    "error_rate": ("errors", _pct),
    "window_5h_utilization": ("5h window", _pct),
    "daily_budget_usd": ("spend", fmt_usd),
}


class AlertsError(ValueError):
    pass


@dataclass(frozen=True)
class Thresholds:
    ttft_p95_ms: float | None = None
    error_rate: float | None = None
    window_5h_utilization: float | None = None
    daily_budget_usd: float | None = None

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.ttft_p95_ms, self.error_rate, self.window_5h_utilization,
                                           self.daily_budget_usd))


@dataclass
class Finding:
    name: str  # the [alerts] key
    value: float | None  # None: nothing to measure
    threshold: float
    crossed: bool
    text: str  # "p95 TTFT 812 ms within 10,000 ms (40 streams)"


def judge(limits: Thresholds, name: str, value: float | None, detail: str = "", label: str = "") -> Finding:
    """A measure against its threshold (set): crossed when over it, as Prometheus's `>` in
    deploy/alerts.yml. `detail` goes in parentheses (with no value: why there is none); `label` names the
    measure when SHOWN's name is not enough ("spend 2026-12-02")."""
    threshold = getattr(limits, name)
    assert threshold is not None, name
    what, show = SHOWN[name]
    what = label or what
    if value is None:
        return Finding(name, None, threshold, False, f"{what} - ({detail})")
    crossed = value > threshold
    text = f"{what} {show(value)} {'over' if crossed else 'within'} {show(threshold)}"
    return Finding(name, value, threshold, crossed, f"{text} ({detail})" if detail else text)


def check_alerts(table: Any) -> Thresholds:
    """The `[alerts]` table as Thresholds; an AlertsError naming the bad key."""
    if not isinstance(table, dict):
        raise AlertsError("alerts is a table: " + ", ".join(KEYS))
    unknown = set(table) - set(KEYS)
    if unknown:
        raise AlertsError(f"alerts: unknown key(s) {', '.join(sorted(unknown))}; known: {', '.join(KEYS)}")
    for key, value in table.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise AlertsError(f"alerts.{key} is {KEYS[key]}: a number above 0, not {value!r}")
        if key in FRACTIONS and value > 1:
            raise AlertsError(f"alerts.{key} is a fraction of 1 (0.8 for 80 %), not {value!r}")
    return Thresholds(**{k: float(v) for k, v in table.items()})
