"""When a subscription's 5-hour window runs out at the current rate (ccusage's burn rate), from the
`ratelimit_5h_utilization` the upstream stated on the responses of one window (the same
`ratelimit_5h_reset`): the rise from the first of them to the last, over the time from the first to now
(a pause slows the rate down), extended in a straight line from now to 100 %. `report --limits` (analysis/limits.py) takes the last 30 minutes of the current window, `top` its
own window (analysis/top/).

The answer is a time (UTC), or why there is none: "used up" (100 % stated), "not before the reset" (the
line reaches 100 % after the window resets), "no rise" (use did not grow), "one response" (a rate needs
two), "reset past" (the window has reset since: a new one starts at the next request).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

RECENT = timedelta(minutes=30)  # the points of the current window report --limits reads


@dataclass(frozen=True)
class Projection:
    runs_out: datetime | None  # UTC
    note: str | None  # why there is no time, else None
    per_hour: float | None = None  # the window's share used per hour at this rate

    def text(self, now: datetime | None = None) -> str:
        """"14:05 (in 1h10m)", or the note."""
        if self.runs_out is None:
            return self.note or "-"
        clock = self.runs_out.astimezone(UTC).strftime("%H:%M")
        if now is None:
            return clock
        return f"{clock} (in {_span(self.runs_out - now)})"


def _span(delta: timedelta) -> str:
    seconds = max(int(delta.total_seconds()), 0)
    if seconds < 60:
        return f"{seconds}s"
    minutes = seconds // 60
    return f"{minutes}m" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


def _time(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return datetime.fromtimestamp(value, UTC)
    return datetime.fromisoformat(value) if isinstance(value, str) else value


def project(points: Iterable[tuple[Any, float, Any]], now: datetime) -> Projection:
    """`points`: (when, utilization 0 to 1, the stated reset) of one key, in any order; the reset of
    the latest point names the current window, whose points alone count."""
    known = sorted(((t, u, r) for t, u, r in ((_time(t), u, _time(r)) for t, u, r in points)
                    if t is not None and u is not None), key=lambda p: p[0])
    if not known:
        return Projection(None, "-")
    last_t, last_u, reset = known[-1]
    if reset is not None and reset <= now:
        return Projection(None, "reset past")
    if last_u >= 1:
        return Projection(None, "used up")
    same = [p for p in known if p[2] is None or reset is None or abs((p[2] - reset).total_seconds()) < 60]
    first_t, first_u, _ = same[0]
    seconds = (max(now, last_t) - first_t).total_seconds()
    if len(same) < 2 or last_t <= first_t or seconds <= 0:
        return Projection(None, "one response")
    rate = (last_u - first_u) / seconds
    if rate <= 0:
        return Projection(None, "no rise", 0.0)
    runs_out = max(now, last_t) + timedelta(seconds=(1 - last_u) / rate)
    if reset is not None and runs_out >= reset:
        return Projection(None, "not before the reset", rate * 3600)
    return Projection(runs_out, None, rate * 3600)
