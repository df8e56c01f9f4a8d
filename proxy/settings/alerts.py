"""The thresholds people watch, from the config file's `[alerts]` table: `llmtap check` tests them over a
window of recorded rows (analysis/check.py), and `serve` writes one warning line when one is crossed
(proxy/observe/thresholds.py). deploy/alerts.yml holds the same conditions as Prometheus rules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# key -> (what it is, whether it is a fraction of 1)
KEYS = {
    "ttft_p95_ms": "p95 time to first token of streamed generations, in ms",
    "error_rate": "share of requests that failed, a fraction (0.05: 5 %)",
    "window_5h_utilization": "a subscription's 5-hour window used, a fraction (0.8: 80 %)",
    "daily_budget_usd": "spend per UTC day (list price), in USD",
}
FRACTIONS = ("error_rate", "window_5h_utilization")


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
