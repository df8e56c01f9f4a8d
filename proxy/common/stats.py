"""The one percentile definition llmtap uses outside SQL."""

from __future__ import annotations

from collections.abc import Sequence


def quantile(ordered: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks of sorted values: numpy's default, and
    DuckDB's `quantile_cont`, so Python and SQL figures agree. None for no values."""
    if not ordered:
        return None
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)
