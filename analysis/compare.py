"""`llmtap compare`: is one channel really slower than another, by how much, and how sure are we.

Two or more groups of recorded requests (sides: a route, an upstream host, a model, a tag, a key
fingerprint, a time window, any SQL condition) are compared on TTFT, TPOT and E2E. The first side
is the baseline; every other side gets, per metric, the difference of medians (side − baseline)
with a 95 % bootstrap confidence interval and a verdict in words.

Method (docs/breakdown-and-compare.md says it in full):

- Requests: successful ones (`outcome = 'ok'`) of the selected kinds (generations by default);
  TTFT over streams. A side holds at most `MAX_ROWS` requests (beyond, a sample by the hash of
  the request id: the same rows every run).
- Prompt size is controlled for by comparing **within input-token buckets**: powers of two of
  `input_tokens` (1-1023 tokens apart, 1024-2047, ...; requests without a count in a bucket of
  their own). The difference is the average over the buckets both sides have (at least
  `MIN_PER_BUCKET` requests each) of the bucket's difference of medians, weighted by the bucket's
  requests on both sides. Requests in a bucket only one side has are left out (the output says how
  many were used). With every request in one bucket (`llmtap bench --routes` sends the same
  lengths), it is the plain difference of the two medians.
- The interval is a percentile bootstrap: `RESAMPLES` times, each side's requests are resampled
  with replacement within each bucket (numpy's Generator, seeded, so the same data gives the same
  interval) and the difference recomputed; the interval is the 2.5th to 97.5th percentile of
  those differences. It assumes requests are independent draws, within a bucket, from each side's
  distribution (bursts, retries and one session's requests are not quite), and enough requests
  per bucket for a median to mean something (the percentile bootstrap of a median is rough
  below some 20 per side).
- An interval that includes 0 says the data cannot tell the sides apart; the requests needed to
  tell a given difference from none are estimated from the interval's half-width h, which shrinks
  as 1/√n: n × (h / d)², for d the larger of the difference seen and 5 % of the baseline median.
- Where TTFT's difference is: the same difference of medians (no interval) of each of its parts
  (docs/breakdown-and-compare.md), and of the time to response headers as a whole.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

Query = Callable[[str], tuple[list[str], list[str], list[tuple]]]

MAX_ROWS = 20_000
RESAMPLES = 2_000
SEED = 20  # issue #20
LEVEL = 0.95
MIN_PER_BUCKET = 3
DETECTABLE_SHARE = 0.05  # of the baseline median: the difference "needed" is sized for at least this
# The smallest difference called one: 2 % of the baseline median, and at least a floor per metric
# (below these, differences are scheduling jitter of a busy machine rather than the channel's).
NEGLIGIBLE_SHARE = 0.02
NEGLIGIBLE_FLOOR_MS = {"ttft": 1.0, "tpot": 0.05, "e2e": 1.0}
ELEMENTS_PER_STEP = 2_000_000  # resamples x requests drawn at once, for bounded memory

# metric -> (column, condition, title)
METRICS: dict[str, tuple[str, str, str]] = {
    "ttft": ("ttft_ms", "stream", "TTFT"),
    "tpot": ("tpot_ms", "TRUE", "TPOT"),
    "e2e": ("e2e_ms", "TRUE", "E2E"),
}
# TTFT's parts for "where the difference is": (name, SQL expression, short words, long words)
TTFT_PARTS: tuple[tuple[str, str, str, str], ...] = (
    ("llmtap", "proxy_overhead_ms + pool_wait_ms", "llmtap", "in llmtap"),
    ("connection", "dns_ms + connect_ms + coalesce(tls_ms, 0)", "connection", "opening connections"),
    ("upstream_wait", "upstream_wait_ms", "wait", "waiting for headers"),
    ("headers_to_first_token", "headers_to_first_token_ms", "→token", "headers to first token"),
)
BREAKDOWN_COLUMNS = ("pool_wait_ms", "upstream_wait_ms", "headers_to_first_token_ms")


@dataclass(frozen=True)
class Side:
    label: str
    where: str  # an SQL condition on the `requests` view


@dataclass
class Stat:
    n: int
    p50_ms: float | None
    p95_ms: float | None


@dataclass
class Group:
    label: str
    requests: int
    metrics: dict[str, Stat]


@dataclass
class Difference:
    group: str
    baseline: str
    metric: str
    median_diff_ms: float | None
    ci_low_ms: float | None
    ci_high_ms: float | None
    n: int  # the side's requests in the comparison (in buckets both sides have)
    n_baseline: int
    buckets: int
    verdict: str
    more_requests: int | None = None  # per side, to tell `detectable_ms` from none; None: not needed
    detectable_ms: float | None = None


@dataclass
class Comparison:
    by: str
    groups: list[Group]
    differences: list[Difference]
    ttft_parts: list[dict[str, Any]] = field(default_factory=list)  # per non-baseline group
    sampled: list[str] = field(default_factory=list)  # sides cut to MAX_ROWS


class CompareError(ValueError):
    """The comparison cannot be made (too few sides, no data); the message says why."""


# -- data --------------------------------------------------------------------------------------

@dataclass
class _Rows:
    """One side's requests: each metric's values, each with its input-token bucket."""

    requests: int
    values: dict[str, tuple[np.ndarray, np.ndarray]]  # metric or part -> (values, buckets)
    sampled: bool = False


def _bucket_sql() -> str:
    return "CASE WHEN input_tokens IS NULL OR input_tokens < 1 THEN -1 ELSE floor(log2(input_tokens))::INTEGER END"


def _fetch(query: Query, side: Side, where: str, parts: bool) -> _Rows:
    part_terms = "".join(f",\n  {expr} AS {name}" for name, expr, _, _ in TTFT_PARTS) if parts else ""
    headers = ",\n  upstream_headers_ms" if parts else ""
    condition = f"({where}) AND ({side.where}) AND outcome = 'ok'"
    _, _, counted = query(f"SELECT count(*) FROM requests WHERE {condition}")
    total = int(counted[0][0])
    sample = f" ORDER BY hash(id) LIMIT {MAX_ROWS}" if total > MAX_ROWS else ""
    columns, _, rows = query(
        f"SELECT {_bucket_sql()} AS bucket, stream, ttft_ms, tpot_ms, e2e_ms{headers}{part_terms}\n"
        f"FROM requests WHERE {condition}{sample}")
    if not rows:
        return _Rows(total, {name: (np.empty(0), np.empty(0, dtype=np.int64)) for name in METRICS})
    data = {c: [r[i] for r in rows] for i, c in enumerate(columns)}
    bucket = np.asarray(data["bucket"], dtype=np.int64)
    stream = np.asarray([bool(s) for s in data["stream"]])
    values: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    names = [(m, col, m == "ttft") for m, (col, _, _) in METRICS.items()]
    if parts:
        names += [("upstream_headers", "upstream_headers_ms", True)]
        names += [(name, name, True) for name, _, _, _ in TTFT_PARTS]
    for name, column, streams_only in names:
        v = np.asarray([np.nan if x is None else float(x) for x in data[column]])
        keep = ~np.isnan(v) & (stream if streams_only else True)
        values[name] = (v[keep], bucket[keep])
    return _Rows(total, values, sampled=bool(sample))


def _has_breakdown(query: Query) -> bool:
    columns, _, _ = query("SELECT * FROM requests LIMIT 0")
    return all(c in columns for c in BREAKDOWN_COLUMNS)


# -- statistics -------------------------------------------------------------------------------

def _quantile(values: np.ndarray, q: float) -> float | None:
    """Linear interpolation between ranks: numpy's default, DuckDB's quantile_cont, proxy.stats."""
    return float(np.quantile(values, q)) if len(values) else None


def _strata(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]
            ) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """(baseline values, side values, weight) of each bucket both have enough requests in."""
    out = []
    for bucket in np.intersect1d(np.unique(a[1]), np.unique(b[1])):
        va, vb = a[0][a[1] == bucket], b[0][b[1] == bucket]
        if len(va) >= MIN_PER_BUCKET and len(vb) >= MIN_PER_BUCKET:
            out.append((va, vb, len(va) + len(vb)))
    return out


def _estimate(strata: list[tuple[np.ndarray, np.ndarray, int]]) -> float:
    total = sum(w for _, _, w in strata)
    return sum(w * (float(np.median(vb)) - float(np.median(va))) for va, vb, w in strata) / total


def _resampled_medians(values: np.ndarray, rng: np.random.Generator, resamples: int) -> np.ndarray:
    """The median of each of `resamples` resamples (with replacement) of `values`."""
    n = len(values)
    step = max(1, ELEMENTS_PER_STEP // n)
    out = np.empty(resamples)
    for start in range(0, resamples, step):
        stop = min(resamples, start + step)
        out[start:stop] = np.median(values[rng.integers(0, n, size=(stop - start, n))], axis=1)
    return out


def _interval(strata: list[tuple[np.ndarray, np.ndarray, int]], rng: np.random.Generator,
              resamples: int = RESAMPLES) -> tuple[float, float]:
    total = sum(w for _, _, w in strata)
    diffs = np.zeros(resamples)
    for va, vb, w in strata:
        diffs += w * (_resampled_medians(vb, rng, resamples) - _resampled_medians(va, rng, resamples))
    diffs /= total
    tail = (1 - LEVEL) / 2 * 100
    low, high = np.percentile(diffs, [tail, 100 - tail])
    return float(low), float(high)


def _digits(ms: float) -> int:
    """Decimals for a figure of this size: two under 1 ms, one under 10, else none."""
    return 2 if abs(ms) < 1 else 1 if abs(ms) < 10 else 0


def fmt_diff(ms: float, sign: bool = True, digits: int = 0) -> str:
    """+162, −3.1, +0.42 (two decimals under 1 ms, one under 10; at least `digits`)."""
    text = f"{abs(ms):.{max(digits, _digits(ms))}f}"
    return ("+" if ms >= 0 else "−") + text if sign else ("" if ms >= 0 else "−") + text


def _width_digits(width: float) -> int:
    """Decimals that tell an interval this wide from its neighbours: 0 from 10 ms, 1 from 0.1 ms."""
    return 0 if width >= 10 else 1 if width >= 0.1 else 2


def fmt_interval(low: float, high: float) -> str:
    """'141–188' when both are above 0, else '−3.1 to +2.8'; as many decimals as its width needs."""
    digits = _width_digits(high - low)

    def fmt(ms: float, sign: bool) -> str:
        text = f"{abs(ms):.{digits}f}"
        return ("+" if ms >= 0 else "−") + text if sign else ("" if ms >= 0 else "−") + text

    if low > 0:
        return f"{fmt(low, False)}–{fmt(high, False)}"
    return f"{fmt(low, True)} to {fmt(high, True)}"


def negligible_ms(metric: str, base_median: float | None) -> float:
    """The smallest difference `compare` calls one, for this metric and baseline."""
    return max(NEGLIGIBLE_FLOOR_MS[metric], NEGLIGIBLE_SHARE * abs(base_median or 0.0))


def _verdict(d: Difference, title: str, base_median: float | None) -> None:
    """Fill the verdict: slower or faster when the interval excludes 0 and the difference is not
    negligible; else "cannot tell", with the requests needed to tell (when more would help)."""
    if d.median_diff_ms is None or d.ci_low_ms is None or d.ci_high_ms is None:
        d.verdict = f"cannot compare {title}: too few requests in common input-token buckets"
        return
    interval = f"[95% CI {fmt_interval(d.ci_low_ms, d.ci_high_ms)} ms]"
    width = _width_digits(d.ci_high_ms - d.ci_low_ms)
    floor = negligible_ms(d.metric, base_median)
    excludes_zero = d.ci_low_ms > 0 or d.ci_high_ms < 0
    if excludes_zero and abs(d.median_diff_ms) >= floor:
        word = "slower" if d.median_diff_ms > 0 else "faster"
        d.verdict = f"{d.group} is {word}: {fmt_diff(d.median_diff_ms, True, width)} ms at p50 {interval}"
        return
    base = f"cannot tell {d.group} from {d.baseline}: {fmt_diff(d.median_diff_ms, True, width)} ms {interval}"
    if excludes_zero:  # a real but negligible difference
        d.verdict = f"{base}, under the {fmt_diff(floor, False)} ms that counts as a difference here"
        return
    half = (d.ci_high_ms - d.ci_low_ms) / 2
    target = max(abs(d.median_diff_ms), DETECTABLE_SHARE * abs(base_median or 0.0), floor)
    factor = (half / target) ** 2
    if factor > 1:
        d.more_requests = math.ceil(max(d.n, d.n_baseline) * (factor - 1))
        d.detectable_ms = target
        d.verdict = (f"{base} includes 0; about {d.more_requests} more requests on each side would tell "
                     f"a {fmt_diff(target, False)} ms difference from none")
    else:
        bound = max(abs(d.ci_low_ms), abs(d.ci_high_ms))
        d.verdict = f"{base} includes 0: any difference is under {fmt_diff(bound, False)} ms"


def _difference(base: _Rows, side: _Rows, metric: str, base_label: str, label: str,
                rng: np.random.Generator) -> Difference:
    strata = _strata(base.values[metric], side.values[metric])
    n_side = sum(len(vb) for _, vb, _ in strata)
    n_base = sum(len(va) for va, _, _ in strata)
    d = Difference(label, base_label, metric, None, None, None, n_side, n_base, len(strata), "")
    if strata:
        d.median_diff_ms = _estimate(strata)
        d.ci_low_ms, d.ci_high_ms = _interval(strata, rng)
    _verdict(d, METRICS[metric][2], _quantile(base.values[metric][0], 0.5))
    return d


def _part_differences(base: _Rows, side: _Rows) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for name in ("upstream_headers", *(n for n, _, _, _ in TTFT_PARTS)):
        if name not in base.values or name not in side.values:
            out[name] = None
            continue
        strata = _strata(base.values[name], side.values[name])
        out[name] = _estimate(strata) if strata else None
    return out


def compare(query: Query, sides: list[Side], where: str = "TRUE", by: str = "side") -> Comparison:
    """Compare `sides` (the first is the baseline) over the requests matching `where`."""
    if len(sides) < 2:
        raise CompareError("compare needs at least two groups")
    parts = _has_breakdown(query)
    fetched = [_fetch(query, side, where, parts) for side in sides]
    groups = [Group(s.label, r.requests, {m: Stat(len(r.values[m][0]), _quantile(r.values[m][0], 0.5),
                                                   _quantile(r.values[m][0], 0.95)) for m in METRICS})
              for s, r in zip(sides, fetched)]
    empty = [g.label for g in groups if not g.requests]
    if empty:
        raise CompareError(f"no successful requests match {', '.join(empty)}")
    rng = np.random.default_rng(SEED)
    base, base_label = fetched[0], sides[0].label
    differences, ttft_parts = [], []
    for side, rows in zip(sides[1:], fetched[1:]):
        for metric in METRICS:
            differences.append(_difference(base, rows, metric, base_label, side.label, rng))
        if parts:
            ttft_parts.append({"group": side.label, "baseline": base_label, **_part_differences(base, rows)})
    return Comparison(by, groups, differences, ttft_parts, [s.label for s, r in zip(sides, fetched) if r.sampled])


# -- output -----------------------------------------------------------------------------------

def headline(c: Comparison, group: str) -> str | None:
    """One sentence for a group's TTFT: the verdict and where the difference is, e.g.
    "/b is +162 ms at p50 [CI 141–188]; +158 ms of it before response headers"."""
    d = next((d for d in c.differences if d.group == group and d.metric == "ttft"), None)
    if d is None or d.median_diff_ms is None or d.ci_low_ms is None or d.ci_high_ms is None:
        return None
    if not d.verdict.startswith(f"{group} is "):
        return d.verdict
    digits = _width_digits(d.ci_high_ms - d.ci_low_ms)
    text = (f"{group} is {fmt_diff(d.median_diff_ms, True, digits)} ms at p50 "
            f"[CI {fmt_interval(d.ci_low_ms, d.ci_high_ms)}]")
    parts = next((p for p in c.ttft_parts if p["group"] == group), None)
    if parts and parts.get("upstream_headers") is not None:
        text += f"; {fmt_diff(parts['upstream_headers'])} ms of it before response headers"
        named = [(words, parts[name]) for name, _, _, words in TTFT_PARTS if parts.get(name) is not None]
        big = [f"{fmt_diff(v)} {words}" for words, v in named if abs(v) >= max(1.0, 0.1 * abs(d.median_diff_ms))]
        if big:
            text += f" ({', '.join(big)})"
    return text


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if abs(value) < 10 else f"{value:.0f}"


def to_table(c: Comparison) -> str:
    from .formatting import layout, truncate

    headers = [c.by, "n"] + [h for m in METRICS for h in ("p50", "p95")]
    groups = [""] * 2 + [f"{METRICS[m][2]} ms" for m in METRICS for _ in range(2)]
    rows = [[g.label, str(g.requests)] + [_ms(getattr(g.metrics[m], f)) for m in METRICS for f in ("p50_ms", "p95_ms")]
            for g in c.groups]
    lines = [f"llmtap compare by {c.by}: successful requests, medians compared within input-token buckets "
             "(powers of two)", "",
             layout(headers, rows, [False] + [True] * (len(headers) - 1), groups=groups, limit=80,
                    shrinkable=[0]).rstrip("\n")]
    for g in c.groups[1:]:
        lines += ["", f"{truncate(g.label, 30)} against {truncate(c.groups[0].label, 30)} "
                      "(difference of medians, 95% bootstrap interval):"]
        for d in (d for d in c.differences if d.group == g.label):
            used = f"n {d.n}+{d.n_baseline}" + (f", {d.buckets} buckets" if d.buckets > 1 else "")
            lines.append(f"  {METRICS[d.metric][2]:<4}  {d.verdict} ({used})")
        parts = next((p for p in c.ttft_parts if p["group"] == g.label), None)
        if parts and parts.get("upstream_headers") is not None:
            where = ", ".join(f"{words} {fmt_diff(parts[name])}" for name, _, words, _ in TTFT_PARTS
                              if parts.get(name) is not None)
            lines.append(f"  TTFT by part (ms): {where}")
        if (line := headline(c, g.label)) is not None:
            lines.append(f"  In short: {line}")
    if c.sampled:
        lines.append(f"\n{', '.join(c.sampled)}: a sample of {MAX_ROWS} requests (by the hash of their id)")
    return "\n".join(lines) + "\n"


def _round(value: Any) -> Any:
    return round(value, 3) if isinstance(value, float) else value


def to_json(c: Comparison) -> str:
    from .formatting import dumps

    return dumps(as_dict(c))


def as_dict(c: Comparison) -> dict[str, Any]:
    """The comparison as plain values (what `--format json` prints)."""
    return {
        "by": c.by,
        "method": {"statistic": "difference of medians (group - baseline) within input-token buckets "
                                "(powers of two), weighted by the bucket's requests",
                   "interval": f"percentile bootstrap, {RESAMPLES} resamples within buckets, seed {SEED}",
                   "level": LEVEL},
        "groups": [{"label": g.label, "requests": g.requests,
                    **{m: {"n": s.n, "p50_ms": _round(s.p50_ms), "p95_ms": _round(s.p95_ms)}
                       for m, s in g.metrics.items()}} for g in c.groups],
        "differences": [{"group": d.group, "baseline": d.baseline, "metric": d.metric,
                         "median_diff_ms": _round(d.median_diff_ms), "ci_low_ms": _round(d.ci_low_ms),
                         "ci_high_ms": _round(d.ci_high_ms), "n": d.n, "n_baseline": d.n_baseline,
                         "buckets": d.buckets, "verdict": d.verdict, "more_requests": d.more_requests,
                         "detectable_ms": _round(d.detectable_ms)} for d in c.differences],
        "ttft_parts_diff_ms": [{k: _round(v) for k, v in p.items()} for p in c.ttft_parts],
        "sampled": c.sampled,
    }


RENDERERS = {"table": to_table, "json": to_json}
