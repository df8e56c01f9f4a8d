"""The monotonic clock and the wall clock read together: to date a monotonic moment (a row's
`started_at`) or to time a wall-clock one (the kernel's receive stamp, proxy/relay/kernel_timing.py).

Two reads in a row straddle a preemption now and then on a loaded machine: the pair then disagrees by
however long the thread was off its CPU, milliseconds, and a request's `started_at`, or a kernel stamp
made monotonic, moves by as much (two requests a few ms apart came out in the wrong order). `pair`
reads the monotonic clock on both sides of the wall clock and keeps the tightest of a few tries.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from time import perf_counter_ns, time_ns

TRIES = 3
TIGHT_NS = 20_000  # a pair read within 20 µs had no preemption in it
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def pair() -> tuple[int, int]:
    """(perf_counter_ns, time_ns) of one moment: the monotonic value is the middle of two reads around
    the wall clock's, of the tightest of TRIES tries (the first within TIGHT_NS)."""
    best = (0, 0, 0)
    for _ in range(TRIES):
        before, wall, after = perf_counter_ns(), time_ns(), perf_counter_ns()
        if after - before <= TIGHT_NS:
            return (before + after) // 2, wall
        if not best[0] or after - before < best[0]:
            best = (after - before, (before + after) // 2, wall)
    return best[1], best[2]


def wall_of(mono_ns: int) -> datetime:
    """The UTC wall-clock time of a moment of the monotonic clock (perf_counter_ns), to the microsecond."""
    mono, wall = pair()
    return EPOCH + timedelta(microseconds=(wall - (mono - mono_ns)) // 1000)
