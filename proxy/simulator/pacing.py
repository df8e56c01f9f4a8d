"""When each output token is due.

Targets are absolute times on the loop's monotonic clock, each one the
previous target plus one inter-token delay, so sleeping late once does not
push every later token back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class TokenClock:
    def __init__(self, started: float, ttft_s: float, itl_s: float, load: Callable[[], float]) -> None:
        """load() is the current slowdown factor (>= 1), read once per token."""
        self._next = started + ttft_s
        self._itl_s = itl_s
        self._load = load

    async def next_token(self) -> None:
        """Sleep until the next token is due."""
        await _sleep_until(self._next)
        self._next += self._itl_s * self._load()

    async def all_tokens(self, n: int) -> None:
        """Sleep until the last of n tokens is due (the TTFT when n is 0)."""
        for _ in range(n - 1):
            self._next += self._itl_s * self._load()
        await self.next_token()


async def _sleep_until(target: float) -> None:
    delay = target - asyncio.get_running_loop().time()
    if delay > 0:
        await asyncio.sleep(delay)


def queue_load(active: int, capacity: int) -> float:
    """The slowdown when `active` generations share room for `capacity`."""
    if capacity <= 0 or active <= capacity:
        return 1.0
    return active / capacity
