"""`llmtap compare`: is one channel really slower than another, by how much, and how sure are we.

Two or more groups of recorded requests (sides: a route, an upstream host, a model, a tag, a key
fingerprint, a time window, any SQL condition) are compared on TTFT, TPOT and E2E. The first side
is the baseline; every other side gets, per metric, the difference of medians (side − baseline)
with a 95 % bootstrap confidence interval and a verdict in words.

Method (docs/breakdown-and-compare.md says it in full):

- Requests: successful ones (`outcome = 'ok'`) of the selected kinds (generations by default);
  TTFT over streams. A side's n, p50 and p95 are over all its requests (DuckDB); its comparison
  reads at most `MAX_ROWS` of them (beyond, a sample by the hash of the request id: the same rows
  every run).
- Prompt length is controlled for by comparing **at a shared input length**: per side and metric,
  a Theil–Sen line of the metric on `input_tokens` (the median of the slopes between pairs of
  requests: one slow request moves it little); each request's value is moved along its side's
  line to the input length compared at, and the difference is that of the two sides' medians of
  the moved values. The length compared at is the median input of the requests inside the range
  both sides cover (each side's middle `INPUT_RANGE` of its prompts); sides whose ranges do not
  meet are not compared, and the answer says so. With every request of one length
  (`llmtap bench --routes`), it is the plain difference of the two medians.
- The interval is a bootstrap one: `RESAMPLES` times, each side's requests are resampled
  with replacement, its line refitted and its median at the same length recomputed (numpy's
  Generator, seeded, so the same data gives the same interval). A plain percentile interval (the
  2.5th to 97.5th percentile of those differences) is too narrow with few requests: a resample's
  spread is that of n draws about the sample's own middle, smaller than the population's by
  about √((n−1)/n), and its tails are the normal's where a small sample's are Student's t. So the
  percentiles taken are widened as Hesterberg's expanded percentile interval does: at
  Φ(∓√(n/(n−1))·t₀.₉₇₅,ₙ₋₁), n the smaller side's requests (`expanded_tail`: 0.86 % and 99.14 %
  at n = 10, 1.9 % and 98.1 % at 30, 2.3 % and 97.7 % at 100, 2.4 % and 97.6 % at 300); with many
  requests it is the percentile interval. It assumes requests are independent draws from each
  side's distribution, that a side's metric grows about linearly with input length across its
  prompts, and that its spread about that line does not change much with the length.
  `benchmarks/compare_calibration.py` measures how often it claims a difference where there is
  none and how often its interval holds the truth.
- A side of more than `RESAMPLE_SIZE` requests (n) is resampled m out of n (`_bootstrap_levels`),
  so that the cost is bounded whatever n: each resample draws m = RESAMPLE_SIZE of them with
  replacement and fits its line over PAIRS·m/n pairs, and each resampled level's deviation from the
  side's level is scaled by √(m/n). Sound because the level (a median, or a median about a
  Theil–Sen line) is root-n consistent and asymptotically normal (Bickel, Götze and van Zwet 1997:
  the m-out-of-n bootstrap with the rate's rescaling): both parts of its variance, the requests'
  (∝ 1/requests) and the random pairs' (∝ 1/pairs), are m/n times the full sample's when the pairs
  are cut in the same proportion, and √(m/n) puts them back. (Without the pairs cut, the slope of
  2,000 pairs among 500 requests is too steady: at n = 20,000 the interval came out 3.2 times too
  narrow where the length compared at is far from a side's middle.) Its price: the distribution's
  shape is that of m requests (at 500, near the normal the level tends to), and its spread is a
  little wider than the full bootstrap's (5–12 % at n = 20,000): an interval on the safe side. The
  expanded tail still uses n (the narrowness it corrects is that of n requests), and so does the
  "more requests" figure, whose half-width is n's. Sides of up to RESAMPLE_SIZE requests get the
  plain bootstrap above, bit for bit.
- An interval that includes 0 says the data cannot tell the sides apart; the requests needed to
  tell a given difference from none are estimated from the interval's half-width h, which shrinks
  as 1/√n: n × (h / d)², for d the larger of the difference seen and 5 % of the baseline median.
- Where TTFT's difference is: the same difference of medians (no interval) of each of its parts
  (docs/breakdown-and-compare.md), and of the time to response headers as a whole; over the
  requests whose upstream stated its time (analysis/breakdown.py STATED), of that stated part, the
  path's rest of the wait, and the time to the stated span's end (the headers; a WebSocket turn's
  first token) outside it: which side of the upstream's line the difference is on.
"""

from __future__ import annotations

import copy
import hashlib
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any, Callable

import numpy as np

from analysis.breakdown import STATED, without_stated

Query = Callable[[str], tuple[list[str], list[str], list[tuple]]]

MAX_ROWS = 20_000
RESAMPLES = 2_000
SEED = 20  # issue #20
LEVEL = 0.95
MIN_REQUESTS = 10  # per side and metric, else it cannot compare
INPUT_RANGE = 0.90  # a side's input range: the middle 90 % of its prompts (one odd prompt does not widen it)
PAIRS = 2_000  # the Theil–Sen slope's pairs: every pair up to this many, else this many at random
DETECTABLE_SHARE = 0.05  # of the baseline median: the difference "needed" is sized for at least this
# The smallest difference called one: 2 % of the baseline median, and at least a floor per metric
# (below these, differences are scheduling jitter of a busy machine rather than the channel's).
NEGLIGIBLE_SHARE = 0.02
NEGLIGIBLE_FLOOR_MS = {"ttft": 1.0, "tpot": 0.05, "e2e": 1.0}
MEMO_SIZE = 16  # comparisons remembered (the web UI asks again for the same one: `_memo_key`)
RESAMPLE_SIZE = 500  # a resample's requests at most (beyond: m-out-of-n, `_bootstrap_levels`)
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
# Over the requests whose upstream stated its time (analysis/breakdown.py STATED): the stated part of
# the wait, the path's rest of it, and all of the time to the end of the stated span (the headers; a
# WebSocket turn's first token) that is not stated: llmtap's, the connection's and the path's, the
# near side of the upstream's line. (name, SQL expression, short words, long words)
STATED_PARTS: tuple[tuple[str, str, str, str], ...] = (
    ("upstream_stated", STATED, "stated", "in the upstream's stated processing"),
    ("path", f"CASE WHEN status = 101 THEN headers_to_first_token_ms ELSE upstream_wait_ms END - {STATED}",
     "path", "on the path"),
    ("outside_stated", f"CASE WHEN status = 101 THEN ttft_ms ELSE upstream_headers_ms END - {STATED}",
     "outside stated", "outside the upstream's stated processing"),
)
_STATED_NAMES = frozenset(name for name, _, _, _ in STATED_PARTS)


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
    n: int  # the side's requests in the comparison
    n_baseline: int
    verdict: str
    call: str = "cannot compare"  # "slower", "faster", "cannot tell" or "cannot compare"
    at_input_tokens: float | None = None  # the input length compared at (None: not adjusted)
    shared_inputs: tuple[float, float] | None = None
    slopes_ms_per_1k: tuple[float, float] | None = None  # (baseline, side), ms per 1,000 input tokens
    more_requests: int | None = None  # per side, to tell `detectable_ms` from none; None: not needed
    detectable_ms: float | None = None
    note: str | None = None  # a caveat (not adjusted for input length, and why)


@dataclass
class Comparison:
    by: str
    groups: list[Group]
    differences: list[Difference]
    ttft_parts: list[dict[str, Any]] = field(default_factory=list)  # per non-baseline group
    sampled: list[str] = field(default_factory=list)  # sides cut to MAX_ROWS


_MEMO: OrderedDict[tuple[Any, ...], Comparison] = OrderedDict()
_MEMO_LOCK = threading.Lock()  # the web UI's queries run in threads


class CompareError(ValueError):
    """The comparison cannot be made (too few sides, no data); the message says why."""


# -- data --------------------------------------------------------------------------------------

@dataclass
class _Rows:
    """One side's requests: each metric's values, each with its request's input tokens."""

    requests: int
    values: dict[str, Sample]  # metric or part -> its values
    stats: dict[str, Stat]  # metric -> n, p50 and p95 over all the side's requests (the values may be a sample)
    sampled: bool = False


def _side_stats(query: Query, condition: str) -> tuple[int, dict[str, Stat]]:
    """A side's requests, and per metric its n, p50 and p95 over all of them (one query, in DuckDB:
    quantile_cont, the same interpolation between ranks as `_quantile`)."""
    terms = ", ".join(f"count({col}) FILTER (WHERE {cond}), quantile_cont({col}, [0.5, 0.95]) FILTER (WHERE {cond})"
                      for col, cond, _ in METRICS.values())
    _, _, rows = query(f"SELECT count(*), {terms} FROM requests WHERE {condition}")
    total, *figures = rows[0]
    stats = {}
    for i, metric in enumerate(METRICS):
        n, (p50, p95) = int(figures[2 * i]), figures[2 * i + 1] or (None, None)
        stats[metric] = Stat(n, None if p50 is None else float(p50), None if p95 is None else float(p95))
    return int(total), stats


def _fetch(query: Query, side: Side, where: str, parts: bool) -> _Rows:
    part_terms = "".join(f",\n  {expr} AS {name}" for name, expr, _, _ in (*TTFT_PARTS, *STATED_PARTS)) if parts else ""
    headers = ",\n  upstream_headers_ms" if parts else ""
    condition = f"({where}) AND ({side.where}) AND outcome = 'ok'"
    total, stats = _side_stats(query, condition)
    sample = f" ORDER BY hash(id) LIMIT {MAX_ROWS}" if total > MAX_ROWS else ""
    columns, _, rows = query(without_stated(query, (
        f"SELECT input_tokens, stream, ttft_ms, tpot_ms, e2e_ms{headers}{part_terms}\n"
        f"FROM requests WHERE {condition}{sample}")))
    if not rows:
        return _Rows(total, {name: Sample.empty() for name in METRICS}, stats)
    table = np.array(rows, dtype=float)  # None: NaN; a column each
    data = dict(zip(columns, table.T))
    inputs = np.where(data["input_tokens"] < 0, np.nan, data["input_tokens"])
    stream = data["stream"] == 1
    values: dict[str, Sample] = {}
    names = [(m, col, m == "ttft") for m, (col, _, _) in METRICS.items()]
    if parts:
        names += [("upstream_headers", "upstream_headers_ms", True)]
        names += [(name, name, True) for name, _, _, _ in (*TTFT_PARTS, *STATED_PARTS)]
    for name, column, streams_only in names:
        v = data[column]
        keep = ~np.isnan(v) & (stream if streams_only else True)
        values[name] = Sample(v[keep], inputs[keep])
    return _Rows(total, values, stats, sampled=bool(sample))


def _has_breakdown(query: Query) -> bool:
    columns, _, _ = query("SELECT * FROM requests LIMIT 0")
    return all(c in columns for c in BREAKDOWN_COLUMNS)


# -- statistics -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sample:
    """One side's values of one metric, each with its request's input tokens (NaN: not counted)."""

    values: np.ndarray
    inputs: np.ndarray

    @staticmethod
    def empty() -> Sample:
        return Sample(np.empty(0), np.empty(0))


@dataclass
class Estimate:
    """The difference (side − baseline) at a shared input length, or why there is none."""

    diff_ms: float | None = None
    low_ms: float | None = None
    high_ms: float | None = None
    n: int = 0  # the side's requests used
    n_baseline: int = 0
    at_input_tokens: float | None = None  # None: not adjusted for input length
    shared_inputs: tuple[float, float] | None = None  # the range both sides' prompts cover
    slopes_ms_per_1k: tuple[float, float] | None = None  # (baseline, side): ms per 1,000 input tokens
    refusal: str | None = None  # why the sides cannot be compared (then no figures)
    note: str | None = None  # a caveat of the figures (not adjusted for input length, and why)


def _quantile(values: np.ndarray, q: float) -> float | None:
    """Linear interpolation between ranks: numpy's default, DuckDB's quantile_cont, proxy.common.stats."""
    return float(np.quantile(values, q)) if len(values) else None


def _pairs(n: int, rng: np.random.Generator, most: int = PAIRS) -> tuple[np.ndarray, np.ndarray]:
    """Positions (p, q) of the pairs a slope is the median over: every pair of the n requests up to
    `most` of them, else `most` pairs at random (the same positions in every resample)."""
    if n * (n - 1) // 2 <= most:
        p, q = np.triu_indices(n, 1)
        return p, q
    p = rng.integers(0, n, size=most)
    return p, (p + rng.integers(1, n, size=most)) % n  # never p itself


def _slopes(x: np.ndarray, y: np.ndarray, pairs: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Theil–Sen per row (rows: resamples): the median of the slopes between each pair's two
    requests. A pair of equal input lengths has no slope: every other one of them counts as +inf,
    the rest as −inf, which leaves the median about the other pairs'. No pair with a slope: 0."""
    p, q = pairs
    return _theil_sen(x[:, q] - x[:, p], y[:, q] - y[:, p])


def _theil_sen(dx: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """`_slopes` from the pairs' differences of input (dx) and of the metric (dy), a row each."""
    with np.errstate(divide="ignore", invalid="ignore"):
        slopes = dy / dx
        slopes = np.where(dx == 0, _FLAT[dx.shape[1]], slopes)
        out = np.median(slopes, axis=1, overwrite_input=True)  # the middle two +inf and −inf: NaN, no slope
    return np.where(np.isfinite(out), out, 0.0)


class _Flat(dict):
    """m -> +inf, −inf, +inf, ... (m values), made once per size."""

    def __missing__(self, m: int) -> np.ndarray:
        self[m] = np.where(np.arange(m) % 2 == 0, np.inf, -np.inf)
        return self[m]


_FLAT = _Flat()


def _levels(x: np.ndarray, y: np.ndarray, at: float | None, pairs: tuple[np.ndarray, np.ndarray]
            ) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the median of y moved along the row's Theil–Sen line to input length `at`
    (y − slope × (x − at)), and the slope; `at` None: the plain median, slope 0."""
    if at is None:
        return np.median(y, axis=1), np.zeros(len(y))
    slope = _slopes(x, y, pairs)
    return np.median(y - slope[:, None] * (x - at), axis=1), slope


def _resampled_levels(s: Sample, at: float | None, rng: np.random.Generator, resamples: int,
                      size: int | None = None, most: int = PAIRS) -> np.ndarray:
    """The level (`_levels`) of each of `resamples` resamples (with replacement) of the requests,
    each of `size` of them (default: all) with its line fitted over at most `most` pairs."""
    n = len(s.values)
    m = size or n
    pairs = _pairs(m, rng, most)
    step = max(1, ELEMENTS_PER_STEP // max(m, len(pairs[0])))
    out = np.empty(resamples)
    for start in range(0, resamples, step):
        stop = min(resamples, start + step)
        rows = rng.integers(0, n, size=(stop - start, m))
        # np.take: the same values as s.inputs[rows] (and x[:, q] as s.inputs[rows[:, q]]), gathered faster
        x, y = np.take(s.inputs, rows), np.take(s.values, rows)
        if at is None:
            out[start:stop] = np.median(y, axis=1, overwrite_input=True)
            continue
        p, q = (np.take(rows, side, axis=1) for side in pairs)
        slope = _theil_sen(np.take(s.inputs, q) - np.take(s.inputs, p), np.take(s.values, q) - np.take(s.values, p))
        out[start:stop] = np.median(y - slope[:, None] * (x - at), axis=1, overwrite_input=True)  # as `_levels`
    return out


def _bootstrap_levels(s: Sample, at: float | None, level: float, rng: np.random.Generator, resamples: int
                      ) -> np.ndarray:
    """The resampled levels of a side whose level is `level`: `_resampled_levels` up to RESAMPLE_SIZE
    requests; beyond, an m-out-of-n bootstrap (m = RESAMPLE_SIZE requests, PAIRS·m/n pairs: the
    full sample's share of pairs per request) with each deviation from `level` scaled by √(m/n)."""
    n = len(s.values)
    if n <= RESAMPLE_SIZE:
        return _resampled_levels(s, at, rng, resamples)
    m = RESAMPLE_SIZE
    drawn = _resampled_levels(s, at, rng, resamples, m, max(1, round(PAIRS * m / n)))
    return level + math.sqrt(m / n) * (drawn - level)


def _tokens(n: float) -> str:
    return f"{n:,.0f}"


def _shared_inputs(base: Sample, side: Sample, labels: tuple[str, str]
                   ) -> tuple[tuple[float, float], float] | str:
    """The input-token range both sides cover (each side's middle INPUT_RANGE of its prompts) and
    the point compared at (the median input of the requests inside it, else its middle), or why
    there is none."""
    tail = (1 - INPUT_RANGE) / 2
    ranges = [(float(np.quantile(s.inputs, tail)), float(np.quantile(s.inputs, 1 - tail))) for s in (base, side)]
    low, high = max(r[0] for r in ranges), min(r[1] for r in ranges)
    if low > high:
        spans = ", ".join(f"{label}'s {_tokens(a)}–{_tokens(b)}" for label, (a, b) in zip(labels, ranges))
        return (f"their prompts share no input length ({spans} input tokens, the middle "
                f"{INPUT_RANGE:.0%} of each); compare like requests (--where 'input_tokens BETWEEN …')")
    pooled = np.concatenate([base.inputs, side.inputs])
    inside = pooled[(pooled >= low) & (pooled <= high)]
    return (low, high), float(np.median(inside)) if len(inside) else (low + high) / 2


def _counted(s: Sample) -> Sample:
    keep = ~np.isnan(s.inputs)
    return Sample(s.values[keep], s.inputs[keep])


def estimate(base: Sample, side: Sample, labels: tuple[str, str], rng: np.random.Generator,
             resamples: int = RESAMPLES, noun: str = "requests") -> Estimate:
    """side − baseline: each side's median at a shared input length, through its own Theil–Sen line
    of the metric on input tokens; an expanded percentile bootstrap over each side's requests (the line refitted
    in every resample) for the interval (none with `resamples` 0). Refused with too few requests or
    no shared input length."""
    short = [f"{label} has {len(s.values)}" for label, s in zip(labels, (base, side)) if len(s.values) < MIN_REQUESTS]
    if short:
        return Estimate(n=len(side.values), n_baseline=len(base.values),
                        refusal=f"too few {noun} ({'; '.join(short)}; {MIN_REQUESTS} needed on each side)")
    counted = _counted(base), _counted(side)
    at: float | None = None
    out = Estimate()
    if all(len(s.values) >= MIN_REQUESTS for s in counted):
        shared = _shared_inputs(*counted, labels)
        if isinstance(shared, str):
            return Estimate(n=len(side.values), n_baseline=len(base.values), refusal=shared)
        (out.shared_inputs, at), (base, side) = shared, counted
        out.at_input_tokens = at
    else:
        few = [f"{label}: {len(c.values)} of {len(s.values)}" for label, s, c in zip(labels, (base, side), counted)
               if len(c.values) < MIN_REQUESTS]
        out.note = f"not adjusted for input length (requests with input-token counts: {', '.join(few)})"
    out.n, out.n_baseline = len(side.values), len(base.values)
    (level_b, slope_b), (level_s, slope_s) = (
        (float(v[0][0]), float(v[1][0])) for v in
        (_levels(s.inputs[None, :], s.values[None, :], at, _pairs(len(s.values), rng)) for s in (base, side)))
    out.diff_ms = level_s - level_b
    if at is not None:
        out.slopes_ms_per_1k = (slope_b * 1000, slope_s * 1000)
    if not resamples:
        return out
    diffs = _bootstrap_levels(side, at, level_s, rng, resamples) - _bootstrap_levels(base, at, level_b, rng, resamples)
    tail = expanded_tail(min(out.n, out.n_baseline)) * 100
    out.low_ms, out.high_ms = (float(v) for v in np.percentile(diffs, [tail, 100 - tail]))
    return out


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile: the normal's with the Cornish–Fisher terms to 1/df⁴ (Abramowitz and
    Stegun 26.7.5; within 1e-4 of the exact value from df = 9, the least `estimate` uses)."""
    z = NormalDist().inv_cdf(p)
    terms = ((z**3 + z) / 4, (5 * z**5 + 16 * z**3 + 3 * z) / 96, (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
             (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160)
    return z + sum(term / df ** (i + 1) for i, term in enumerate(terms))


def expanded_tail(n: int) -> float:
    """Each tail of the bootstrap distribution left out of the interval, for n requests on the
    smaller side: Hesterberg's expanded percentile interval, Φ(−√(n/(n−1))·t(1−(1−LEVEL)/2, n−1))."""
    if n < 2:
        return (1 - LEVEL) / 2
    return NormalDist().cdf(-math.sqrt(n / (n - 1)) * t_quantile(1 - (1 - LEVEL) / 2, n - 1))


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
        d.call = "cannot compare"
        d.verdict = f"cannot compare: {d.note or 'no figures'}"
        return
    interval = f"[95% CI {fmt_interval(d.ci_low_ms, d.ci_high_ms)} ms]"
    width = _width_digits(d.ci_high_ms - d.ci_low_ms)
    floor = negligible_ms(d.metric, base_median)
    excludes_zero = d.ci_low_ms > 0 or d.ci_high_ms < 0
    if excludes_zero and abs(d.median_diff_ms) >= floor:
        d.call = "slower" if d.median_diff_ms > 0 else "faster"
        d.verdict = f"{d.group} is {d.call}: {fmt_diff(d.median_diff_ms, True, width)} ms at p50 {interval}"
        return
    d.call = "cannot tell"
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


def difference(base: Sample, side: Sample, metric: str, base_label: str, label: str,
               rng: np.random.Generator, resamples: int = RESAMPLES) -> Difference:
    """One metric of one side against the baseline: the estimate at a shared input length, its
    interval and the verdict in words (what `compare` does per metric; the calibration runs it)."""
    noun = "streamed requests" if METRICS[metric][1] == "stream" else "requests"
    e = estimate(base, side, (base_label, label), rng, resamples, noun)
    d = Difference(label, base_label, metric, e.diff_ms, e.low_ms, e.high_ms, e.n, e.n_baseline, "",
                   at_input_tokens=e.at_input_tokens, shared_inputs=e.shared_inputs,
                   slopes_ms_per_1k=e.slopes_ms_per_1k, note=e.refusal or e.note)
    _verdict(d, METRICS[metric][2], _quantile(base.values, 0.5))
    if e.note and d.call != "cannot compare":
        d.verdict += f"; {e.note}"
    return d


def _part_differences(base: _Rows, side: _Rows, labels: tuple[str, str], rng: np.random.Generator
                      ) -> dict[str, float | None]:
    """Each part's difference at the shared input length (no interval)."""
    out: dict[str, float | None] = {}
    for name in ("upstream_headers", *(n for n, _, _, _ in (*TTFT_PARTS, *STATED_PARTS))):
        if name not in base.values or name not in side.values:
            out[name] = None
            continue
        out[name] = estimate(base.values[name], side.values[name], labels, rng, resamples=0).diff_ms
    return out


def compare(query: Query, sides: list[Side], where: str = "TRUE", by: str = "side") -> Comparison:
    """Compare `sides` (the first is the baseline) over the requests matching `where`."""
    if len(sides) < 2:
        raise CompareError("compare needs at least two groups")
    parts = _has_breakdown(query)
    fetched = [_fetch(query, side, where, parts) for side in sides]
    groups = [Group(s.label, r.requests, r.stats) for s, r in zip(sides, fetched)]
    empty = [g.label for g in groups if not g.requests]
    if empty:
        raise CompareError(f"no successful requests match {', '.join(empty)}")
    memo = _memo_key(by, sides, fetched, parts)
    with _MEMO_LOCK:
        if memo in _MEMO:  # the same requests give the same answer (the seed is fixed): computed once
            _MEMO.move_to_end(memo)
            return copy.deepcopy(_MEMO[memo])
    answer = _compare(by, sides, fetched, groups, parts)
    with _MEMO_LOCK:
        _MEMO[memo] = copy.deepcopy(answer)
        while len(_MEMO) > MEMO_SIZE:
            _MEMO.popitem(last=False)
    return answer


def _memo_key(by: str, sides: list[Side], fetched: list[_Rows], parts: bool) -> tuple[Any, ...]:
    """What a comparison is made of: the sides' labels and every value it reads (a digest of them)."""
    digest = hashlib.blake2b(digest_size=32)
    for rows in fetched:
        digest.update(f"{rows.requests} {rows.sampled} {rows.stats} {sorted(rows.values)}".encode())
        for name in sorted(rows.values):
            digest.update(rows.values[name].values.tobytes())
            digest.update(rows.values[name].inputs.tobytes())
    return by, tuple(s.label for s in sides), parts, digest.hexdigest()


def _compare(by: str, sides: list[Side], fetched: list[_Rows], groups: list[Group], parts: bool) -> Comparison:
    rng = np.random.default_rng(SEED)
    base, base_label = fetched[0], sides[0].label
    differences, ttft_parts = [], []
    for side, rows in zip(sides[1:], fetched[1:]):
        for metric in METRICS:
            differences.append(difference(base.values[metric], rows.values[metric], metric, base_label,
                                          side.label, rng))
        if parts:
            ttft_parts.append({"group": side.label, "baseline": base_label,
                               **_part_differences(base, rows, (base_label, side.label), rng)})
    return Comparison(by, groups, differences, ttft_parts, [s.label for s, r in zip(sides, fetched) if r.sampled])


# -- output -----------------------------------------------------------------------------------

def headline(c: Comparison, group: str) -> str | None:
    """One sentence for a group's TTFT: the verdict and where the difference is, e.g.
    "/b is +162 ms at p50 [CI 141–188]; +158 ms of it before response headers"."""
    d = next((d for d in c.differences if d.group == group and d.metric == "ttft"), None)
    if d is None or d.median_diff_ms is None or d.ci_low_ms is None or d.ci_high_ms is None:
        return None
    if d.call not in ("slower", "faster"):
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
    if parts and parts.get("outside_stated") is not None:
        text += f"; {fmt_diff(parts['outside_stated'])} ms of it is outside the upstream's stated processing"
    return text


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if abs(value) < 10 else f"{value:.0f}"


def _used(d: Difference) -> str:
    """' (n 30+30, at 2,480 input tokens)': the requests and the length compared at."""
    if d.call == "cannot compare":
        return ""
    at = "" if d.at_input_tokens is None else f", at {_tokens(d.at_input_tokens)} input tokens"
    return f" (n {d.n}+{d.n_baseline}{at})"


def to_table(c: Comparison) -> str:
    from analysis.formatting import layout, truncate

    headers = [c.by, "n"] + [h for m in METRICS for h in ("p50", "p95")]
    groups = [""] * 2 + [f"{METRICS[m][2]} ms" for m in METRICS for _ in range(2)]
    rows = [[g.label, str(g.requests)] + [_ms(getattr(g.metrics[m], f)) for m in METRICS for f in ("p50_ms", "p95_ms")]
            for g in c.groups]
    lines = [f"llmtap compare by {c.by}: successful requests; medians compared at an input length both sides share", "",
             layout(headers, rows, [False] + [True] * (len(headers) - 1), groups=groups, limit=80,
                    shrinkable=[0]).rstrip("\n")]
    for g in c.groups[1:]:
        lines += ["", f"{truncate(g.label, 30)} against {truncate(c.groups[0].label, 30)} "
                      "(difference of medians, 95% bootstrap interval):"]
        mine = [d for d in c.differences if d.group == g.label]
        if all(d.call == "cannot compare" for d in mine) and len({d.note for d in mine}) == 1:
            lines.append(f"  cannot compare: {mine[0].note}")  # one reason for every metric: said once
        else:
            lines += [f"  {METRICS[d.metric][2]:<4}  {d.verdict}{_used(d)}" for d in mine]
        parts = next((p for p in c.ttft_parts if p["group"] == g.label), None)
        if parts and parts.get("upstream_headers") is not None:
            where = ", ".join(f"{words} {fmt_diff(parts[name])}" for name, _, words, _ in TTFT_PARTS
                              if parts.get(name) is not None)
            lines.append(f"  TTFT by part (ms): {where}")
            stated = ", ".join(f"{words} {fmt_diff(parts[name])}" for name, _, words, _ in STATED_PARTS
                               if parts.get(name) is not None)
            if stated:
                lines.append(f"  where the upstream stated its time (ms): {stated}")
        if (line := headline(c, g.label)) is not None:
            lines.append(f"  In short: {line}")
    if c.sampled:
        lines.append(f"\n{', '.join(c.sampled)}: a sample of {MAX_ROWS} requests (by the hash of their id)")
    return "\n".join(lines) + "\n"


def _round(value: Any) -> Any:
    return round(value, 3) if isinstance(value, float) else value


def to_json(c: Comparison) -> str:
    from analysis.formatting import dumps

    return dumps(as_dict(c))


def as_dict(c: Comparison) -> dict[str, Any]:
    """The comparison as plain values (what `--format json` prints)."""
    return {
        "by": c.by,
        "method": {"statistic": "difference of medians (group - baseline) at a shared input length, each "
                                "request moved along its side's Theil-Sen line of the metric on input tokens",
                   "interval": f"expanded percentile bootstrap over each side's requests (line refitted), "
                               f"{RESAMPLES} resamples, seed {SEED}; beyond {RESAMPLE_SIZE} requests a side, "
                               f"{RESAMPLE_SIZE} out of n, scaled by sqrt({RESAMPLE_SIZE}/n)",
                   "level": LEVEL, "min_requests": MIN_REQUESTS, "input_range": INPUT_RANGE},
        "groups": [{"label": g.label, "requests": g.requests,
                    **{m: {"n": s.n, "p50_ms": _round(s.p50_ms), "p95_ms": _round(s.p95_ms)}
                       for m, s in g.metrics.items()}} for g in c.groups],
        "differences": [{"group": d.group, "baseline": d.baseline, "metric": d.metric,
                         "median_diff_ms": _round(d.median_diff_ms), "ci_low_ms": _round(d.ci_low_ms),
                         "ci_high_ms": _round(d.ci_high_ms), "n": d.n, "n_baseline": d.n_baseline,
                         "call": d.call, "verdict": d.verdict, "at_input_tokens": _round(d.at_input_tokens),
                         "shared_inputs": None if d.shared_inputs is None else [_round(v) for v in d.shared_inputs],
                         "slopes_ms_per_1k_tokens": None if d.slopes_ms_per_1k is None
                         else [_round(v) for v in d.slopes_ms_per_1k],
                         "more_requests": d.more_requests, "detectable_ms": _round(d.detectable_ms),
                         "note": d.note} for d in c.differences],
        "ttft_parts_diff_ms": [{k: _round(v) for k, v in p.items() if v is not None or k not in _STATED_NAMES}
                               for p in c.ttft_parts],  # the stated parts only where an upstream stated
        "sampled": c.sampled,
    }


RENDERERS = {"table": to_table, "json": to_json}
