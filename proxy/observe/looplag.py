"""Event-loop lag: how late the loop wakes a timer, i.e. the delay every read and write also waits.

A blocked loop (a slow parse, a synchronous call) shows here before it shows in TTFT.
"""

from __future__ import annotations

import asyncio
from collections import deque
from time import perf_counter


class LoopLag:
    def __init__(self, interval_s: float = 0.05, window: int = 1200) -> None:
        self.interval_s = interval_s
        self.samples: deque[float] = deque(maxlen=window)  # ms; 1,200 × 50 ms = the last minute
        self._cached: dict[str, float | None] | None = None
        self._cached_at = 0.0

    async def run(self) -> None:
        while True:
            start = perf_counter()
            await asyncio.sleep(self.interval_s)
            self.samples.append(max(0.0, (perf_counter() - start - self.interval_s) * 1000))

    def summary(self) -> dict[str, float | None]:
        """p50/p99/max over the window; computed at most once a second, however often asked."""
        now = perf_counter()
        if self._cached is None or now - self._cached_at > 1.0:
            self._cached, self._cached_at = self._summarise(), now
        return self._cached

    def _summarise(self) -> dict[str, float | None]:
        ordered = sorted(self.samples)
        if not ordered:
            return {"p50_ms": None, "p99_ms": None, "max_ms": None}
        pick = lambda q: round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)  # noqa: E731
        return {"p50_ms": pick(0.5), "p99_ms": pick(0.99), "max_ms": round(ordered[-1], 3)}
