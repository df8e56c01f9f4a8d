"""A large side's bootstrap (analysis/compare.py `_bootstrap_levels`): m out of n, so its cost is
bounded whatever n, and its interval is still that of the whole sample (not of m requests)."""

from __future__ import annotations

from typing import Any

import numpy as np

from analysis.compare import RESAMPLE_SIZE, Sample, _bootstrap_levels, _levels, _pairs, _resampled_levels, estimate

TRUE_MS = 20.0


class Recording(np.random.Generator):
    """numpy's generator, noting the shape of every draw of integers (the resamples' rows among them)."""

    def __init__(self, seed: int) -> None:
        super().__init__(np.random.PCG64(seed))
        self.shapes: list[Any] = []

    def integers(self, *args: Any, size: Any = None, **kwargs: Any) -> Any:  # type: ignore[override]
        self.shapes.append(size)
        return super().integers(*args, size=size, **kwargs)


def channel(rng: np.random.Generator, n: int, prompts: tuple[int, int], extra_ms: float = 0.0) -> Sample:
    """compare_calibration.py's channel: 400 ms + 0.05 ms a token, t(3) noise, 1 in 20 stalls."""
    inputs = rng.integers(prompts[0], prompts[1] + 1, n).astype(float)
    stalls = np.where(rng.random(n) < 0.05, rng.exponential(300.0, n), 0.0)
    return Sample(400.0 + 0.05 * inputs + extra_ms + 30.0 * rng.standard_t(3, n) + stalls, inputs)


def sides(n: int) -> tuple[Sample, Sample]:
    """Shifted prompts (1k-3k against 2k-6k tokens): the length compared at (~2,500) is far from
    the second side's middle, where its slope's own uncertainty counts most."""
    rng = np.random.default_rng(38)
    return channel(rng, n, (1_000, 3_000)), channel(rng, n, (2_000, 6_000), TRUE_MS)


def test_a_large_sides_resamples_are_bounded_in_size() -> None:
    base, side = sides(20_000)
    rng = Recording(20)
    e = estimate(base, side, ("a", "b"), rng)
    drawn = [shape for shape in rng.shapes if isinstance(shape, tuple)]  # (resamples, requests) per draw
    assert drawn and max(shape[1] for shape in drawn) == RESAMPLE_SIZE
    assert e.n == e.n_baseline == 20_000  # the interval (and "more requests") is still that of n


def test_a_large_sides_interval_is_the_whole_samples() -> None:
    """The m-out-of-n interval holds the true difference and is about as wide as the full bootstrap's
    (each side resampled 20,000 at a time, fewer times): neither m's nor too steady a slope's."""
    base, side = sides(20_000)
    e = estimate(base, side, ("a", "b"), np.random.default_rng(20))
    assert e.low_ms is not None and e.high_ms is not None and e.at_input_tokens is not None
    assert e.low_ms < TRUE_MS < e.high_ms
    full = (_resampled_levels(side, e.at_input_tokens, np.random.default_rng(1), 300)
            - _resampled_levels(base, e.at_input_tokens, np.random.default_rng(2), 300))
    ratio = (e.high_ms - e.low_ms) / (2 * 1.96 * full.std())
    assert 0.9 < ratio < 1.3, ratio


def test_a_side_of_up_to_the_bound_gets_the_plain_bootstrap_bit_for_bit() -> None:
    s = channel(np.random.default_rng(5), RESAMPLE_SIZE, (1_000, 3_000))
    level = float(_levels(s.inputs[None, :], s.values[None, :], 2_000.0, _pairs(RESAMPLE_SIZE, np.random.default_rng(0)))[0][0])
    got = _bootstrap_levels(s, 2_000.0, level, np.random.default_rng(9), 200)
    assert np.array_equal(got, _resampled_levels(s, 2_000.0, np.random.default_rng(9), 200))
