"""Loaded by every Python process of a test run under `faketime` with only the wall clock faked
(tests/conftest.py puts this folder on PYTHONPATH; .ci/run runs the clock tests so).

libfaketime 0.9.10 takes the monotonic deadline of Python's time.sleep (clock_nanosleep with
TIMER_ABSTIME) for a faked one and the call fails with EINVAL; select's timeout is relative and
left alone. With the monotonic clock faked as well, every thread wait with a timeout (Event.wait,
Thread.join) would sleep for decades instead: glibc's sem_clockwait is not intercepted.
"""

import os
import select
import time


def _sleep(seconds: float) -> None:
    select.select([], [], [], max(0.0, seconds))


if os.environ.get("FAKETIME_DONT_FAKE_MONOTONIC") == "1" and "faketime" in os.environ.get("LD_PRELOAD", ""):
    time.sleep = _sleep
