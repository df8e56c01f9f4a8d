"""Request bodies held in memory at once, all requests together (`serve --body-memory-mb`).

The relay reads a request's body whole before it goes upstream (the meter reads the model and the
stream flag from it); each body is capped (`--max-body-mb`), and this caps their sum. A request
takes its Content-Length from the budget before reading (or its bytes as they come, when chunked),
and gives it back when its relay ends. A request alone always gets in (it is within the
`--max-body-mb` cap), so what is held is at most the larger of the two. A request the budget has no
room for is answered 503 with Retry-After (the SDKs retry it), in the API's error shape, and its
row says why (`error_type` = `body_memory_full`). Used on the event loop only: no lock.
"""

from __future__ import annotations

RETRY_AFTER_S = 1


class OverBudget(Exception):
    pass


class BodyBudget:
    def __init__(self, limit_bytes: int) -> None:
        self.limit = limit_bytes
        self.held = 0

    def lease(self) -> "Lease":
        return Lease(self)


class Lease:
    """One request's part of the budget."""

    __slots__ = ("budget", "size")

    def __init__(self, budget: BodyBudget) -> None:
        self.budget, self.size = budget, 0

    def take(self, n: int) -> None:
        """n more bytes of this request's body, or OverBudget. A request alone is let in whatever its
        size (it is within --max-body-mb): a budget below that would otherwise refuse it for ever."""
        budget = self.budget
        if n > 0 and budget.held + n > budget.limit and budget.held > self.size:
            raise OverBudget
        budget.held += n
        self.size += n

    def release(self) -> None:
        self.budget.held -= self.size
        self.size = 0
