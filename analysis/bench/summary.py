"""Median and p95 per point, output throughput, and the concurrency knee.

Percentiles interpolate linearly between closest ranks (numpy's default, as
vLLM's `bench serve` and `llmtap report` use). ITL percentiles are over every
gap of every request of the point, pooled. Output throughput is the point's
output tokens (successful requests) over its wall time, first send to last end.

The knee: walking up the concurrency sweep, the first point whose throughput
gain over the previous point is below KNEE_GAIN (20%) of the linear gain
(c/c_prev - 1 times the previous throughput) while median TPOT or median TTFT
rises by LATENCY_RISE (10%) or more: more clients only made each of them
wait, because the upstream started queueing (batched decode slows TPOT, a
waiting queue slows TTFT).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from proxy.common.stats import quantile

from analysis.bench.client import Result
from analysis.bench.plan import Point

KNEE_GAIN = 0.20
LATENCY_RISE = 0.10


def percentile(values: list[float], q: float) -> float | None:
    return quantile(sorted(values), q)


@dataclass(frozen=True, slots=True)
class Stat:
    p50: float | None
    p95: float | None

    @classmethod
    def of(cls, values: list[float]) -> "Stat":
        return cls(percentile(values, 0.5), percentile(values, 0.95))


@dataclass(slots=True)
class PointSummary:
    point: Point
    ok: int
    errors: int
    ttft_ms: Stat
    tpot_ms: Stat
    itl_ms: Stat
    e2e_ms: Stat
    input_tokens: float | None  # median reported by the upstream
    output_tokens: float | None
    output_tokens_per_s: float | None
    wall_s: float
    first_error: str | None = None
    knee: bool = False


@dataclass(slots=True)
class ExperimentSummary:
    name: str
    tag: str
    points: list[PointSummary] = field(default_factory=list)
    knee: int | None = None  # concurrency of the knee, concurrency sweep only


def summarize_point(point: Point, results: list[Result]) -> PointSummary:
    good = [r for r in results if r.ok]
    bad = [r for r in results if not r.ok]

    def values(name: str) -> list[float]:
        return [v for r in good if (v := getattr(r, name)) is not None]

    wall = (max(r.ended for r in results) - min(r.started for r in results)) if results else 0.0
    out_total = sum(values("output_tokens"))
    return PointSummary(
        point=point, ok=len(good), errors=len(bad),
        ttft_ms=Stat.of(values("ttft_ms")), tpot_ms=Stat.of(values("tpot_ms")),
        itl_ms=Stat.of([gap for r in good for gap in r.itl_ms]), e2e_ms=Stat.of(values("e2e_ms")),
        input_tokens=_median(values("input_tokens")), output_tokens=_median(values("output_tokens")),
        output_tokens_per_s=out_total / wall if good and wall > 0 else None,
        wall_s=wall, first_error=bad[0].error if bad else None,
    )


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def find_knee(points: list[PointSummary]) -> int | None:
    """The concurrency where queueing starts (see the module docstring), or None."""
    ordered = sorted((p for p in points if p.output_tokens_per_s), key=lambda p: p.point.concurrency)
    for prev, cur in zip(ordered, ordered[1:]):
        ratio = cur.point.concurrency / prev.point.concurrency
        linear_gain = prev.output_tokens_per_s * (ratio - 1)  # type: ignore[operator]
        gain = cur.output_tokens_per_s - prev.output_tokens_per_s  # type: ignore[operator]
        if gain < KNEE_GAIN * linear_gain and _rises(prev, cur):
            return cur.point.concurrency
    return None


def _rises(prev: PointSummary, cur: PointSummary) -> bool:
    pairs = ((prev.tpot_ms.p50, cur.tpot_ms.p50), (prev.ttft_ms.p50, cur.ttft_ms.p50))
    return any(a is not None and b is not None and b >= a * (1 + LATENCY_RISE) for a, b in pairs)


def mark_knee(summary: ExperimentSummary) -> None:
    summary.knee = find_knee(summary.points)
    for p in summary.points:
        p.knee = p.point.concurrency == summary.knee
