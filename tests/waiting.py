"""Waiting for a condition, with a deadline: the tests' one way to let time pass.

A test never sleeps in the hope that something has happened by then; it polls until it has, and fails
with `what` when the deadline passes first. The deadlines are generous (a loaded 2-core machine, a
faked clock): a test that passes waits only as long as the condition takes.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
POLL_S = 0.02
# A process's start-up (serve, a stand-in, a browser): importing the SDKs alone took 10 s at a load
# average of 40. A bound that only keeps a broken start from hanging the test, never a measurement.
START_S = 60.0


async def wait_until(condition: Callable[[], T], timeout: float = 10.0, what: str = "the condition",
                     poll_s: float = POLL_S) -> T:
    """Poll `condition()` on the running loop until it returns something true, and return that."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not reached in {timeout:g} s")
        await asyncio.sleep(poll_s)
    return value


def wait_until_sync(condition: Callable[[], T], timeout: float = 10.0, what: str = "the condition",
                    poll_s: float = POLL_S) -> T:
    """`wait_until` for a test without a loop (a thread or a subprocess is what it waits on)."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not reached in {timeout:g} s")
        time.sleep(poll_s)
    return value


async def wait_until_still(read: Callable[[], T], still_s: float, timeout: float = 30.0,
                           what: str = "the value", poll_s: float = POLL_S) -> T:
    """Poll `read()` until it has not changed for `still_s` seconds (a stream that stalled, a count
    that settled), and return it. Stillness has to last a while to be seen: `still_s` is that while,
    not a guess at how long the change takes."""
    deadline = time.monotonic() + timeout
    value, since = read(), time.monotonic()
    while (now := time.monotonic()) - since < still_s:
        if now >= deadline:
            raise AssertionError(f"{what} still changing after {timeout:g} s (last {value!r})")
        await asyncio.sleep(poll_s)
        if (latest := read()) != value:
            value, since = latest, time.monotonic()
    return value


def real_clock_env() -> dict[str, str]:
    """The environment less libfaketime (.ci/run's run at 23:30 UTC), for a child whose own timers
    hang or go wrong under it: Chromium's timed waits never open its DevTools port, wrk measures no
    request. Their dates come from llmtap, which keeps the faked clock."""
    preload = " ".join(p for p in os.environ.get("LD_PRELOAD", "").split() if "faketime" not in p)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKETIME") and k != "LD_PRELOAD"}
    return env | ({"LD_PRELOAD": preload} if preload else {})
