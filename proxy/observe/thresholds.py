"""`serve`'s warning line when a budget or quota threshold of the config's [alerts] is crossed: once per
crossing, not per request. The judgement and its words are `llmtap check`'s (proxy/settings/alerts.py's
`judge`); only the measure differs: from the rows as they finish, not over the database.

A recorder observer (`on_rows`): it runs on the event loop once per finished row, so it keeps a few
numbers in memory and never queries the database:

- window_5h_utilization: per key fingerprint and upstream, the latest 5-hour window use the upstream
  stated; a line when it goes over, armed again once it is back under (a new window);
- daily_budget_usd: the list price of the API-key generations finished since serve started, per UTC day
  (a subscription's list-price equivalent is not money spent); a line when the day's spend goes over,
  armed again the next day. Spend from before this start is not counted here (`llmtap check` counts it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, date, datetime
from typing import Any

from proxy.common.prices import SUBSCRIPTION_KINDS, row_cost
from proxy.settings.alerts import Finding, Thresholds, judge

MAX_KEYS = 1_000  # keys followed at once: a client inventing keys cannot grow it without bound


class ThresholdWatch:
    def __init__(self, limits: Thresholds, report: Callable[[str], None],
                 key_names: Mapping[str, str] | None = None) -> None:
        self.limits, self.report, self.key_names = limits, report, dict(key_names or {})
        self.over_5h: dict[tuple[Any, Any], bool] = {}
        self.day: date | None = None
        self.spent = 0.0
        self.warned_budget = False

    def observe(self, row: Mapping[str, Any]) -> None:
        try:
            if self.limits.window_5h_utilization is not None:
                self._window(row)
            if self.limits.daily_budget_usd is not None:
                self._budget(row)
        except Exception as exc:  # an observer never breaks the recorder
            self.report(f"llmtap: threshold watch failed: {type(exc).__name__}: {exc}")

    def _name(self, key: Any) -> str:
        return f"{self.key_names[key]}, {key}" if key in self.key_names else str(key or "no key")

    def _warn(self, finding: Finding) -> None:
        self.report(f"llmtap: warning: [alerts] {finding.name}: {finding.text}")

    def _window(self, row: Mapping[str, Any]) -> None:
        used = row.get("ratelimit_5h_utilization")
        if used is None:
            return
        key = (row.get("key_fingerprint"), row.get("upstream_host"))
        reset = row.get("ratelimit_5h_reset")
        when = f"; it resets at {reset.astimezone(UTC):%H:%M} UTC" if isinstance(reset, datetime) else ""
        finding = judge(self.limits, "window_5h_utilization", used, f"{self._name(key[0])} at {key[1] or '?'}{when}")
        over = finding.crossed
        if over and not self.over_5h.get(key, False):
            self._warn(finding)
        if key in self.over_5h or len(self.over_5h) < MAX_KEYS:
            self.over_5h[key] = over

    def _budget(self, row: Mapping[str, Any]) -> None:
        if row.get("credential_kind") in SUBSCRIPTION_KINDS:
            return
        cost = row_cost(row)
        if not cost:
            return
        started = row.get("started_at")
        day = started.astimezone(UTC).date() if isinstance(started, datetime) else datetime.now(UTC).date()
        if day != self.day:
            self.day, self.spent, self.warned_budget = day, 0.0, False
        self.spent += cost
        finding = judge(self.limits, "daily_budget_usd", self.spent, "since serve started", label=f"spend {day}")
        if finding.crossed and not self.warned_budget:
            self.warned_budget = True
            self._warn(finding)
