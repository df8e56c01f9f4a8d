"""Percentiles outside SQL: the one definition llmtap uses (`quantile`, as DuckDB's), and the gaps
between a stream's output events: exact while the meter keeps every event, a constant-memory
histogram past MAX_EVENTS_KEPT (proxy/meter/meter.py)."""

from __future__ import annotations

from collections.abc import Sequence
from operator import sub


def quantile(ordered: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks of sorted values: numpy's default, and
    DuckDB's `quantile_cont`, so Python and SQL figures agree. None for no values."""
    if not ordered:
        return None
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def gaps_ms(times: list[int]) -> tuple[float | None, float | None, float | None]:
    """p50, p99 and max of the gaps between output events, in ms."""
    if len(times) < 2:
        return None, None, None
    gaps = sorted(map(sub, times[1:], times))  # each gap b - a, without a Python-level loop
    return _gap_ms(gaps, 0.5), _gap_ms(gaps, 0.99), gaps[-1] / 1e6


def _gap_ms(sorted_ns: list[int], q: float) -> float | None:
    value = quantile(sorted_ns, q)
    return None if value is None else value / 1e6


class GapHistogram:
    """The gaps between a long stream's output events (past MAX_EVENTS_KEPT) in constant memory:
    a count per bucket, 16 buckets per power of two of nanoseconds (a gap's top five bits, as HDR
    histograms do; under 32 ns exact). A bucket's middle is within 1/32 of any gap in it, so p50
    and p99 are within about 3% of the exact figures (interpolated between ranks as `quantile`
    does); the maximum is exact."""

    __slots__ = ("counts", "n", "top")

    def __init__(self) -> None:
        self.counts = [0] * 1024  # 8 KiB: up to gaps of 2**64 ns
        self.n = 0
        self.top = 0

    def add(self, prev: int, times: list[int]) -> None:
        """The gaps from `prev` to times[0], and between the times that follow."""
        counts, top = self.counts, self.top
        for t in times:
            gap = t - prev if t > prev else 0
            prev = t
            if gap > top:
                top = gap
            if gap < 32:
                counts[gap] += 1
            else:
                shift = gap.bit_length() - 5
                counts[min((shift << 4) + (gap >> shift), 1023)] += 1
        self.n += len(times)
        self.top = top

    def quantiles_ms(self) -> tuple[float | None, float | None, float | None]:
        """p50, p99 and max, in ms (as `gaps_ms`)."""
        if not self.n:
            return None, None, None
        return self._quantile(0.5) / 1e6, self._quantile(0.99) / 1e6, self.top / 1e6

    def _quantile(self, q: float) -> float:
        pos = (self.n - 1) * q
        lo = int(pos)
        a, b = self._at(lo), self._at(min(lo + 1, self.n - 1))
        return a + (b - a) * (pos - lo)

    def _at(self, rank: int) -> float:
        """The middle of the bucket holding the gap of this rank (0: the smallest)."""
        seen = 0
        for i, count in enumerate(self.counts):
            seen += count
            if seen > rank:
                if i < 32:
                    return float(i)
                shift = (i >> 4) - 1
                return float((((i & 15) + 16) << shift) + (1 << shift) / 2)
        return float(self.top)
