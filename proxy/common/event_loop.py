"""Running a coroutine to its end on uvloop where the platform has it: `serve`, `run`, the demo, `top`
and `bench` alike. Here, not in proxy/serve/, so a command that only reads never imports the server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


def run(coro_fn: Callable[[], Any]) -> Any:
    """Run a coroutine on uvloop where the platform has it."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.run(coro_fn())
    return uvloop.run(coro_fn())
