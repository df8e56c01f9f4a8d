"""The progress line on stderr: rewritten in place on a terminal, plus one final line."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from proxy.common.terminal_text import printable

REDRAW_S = 0.1


class ProgressLine:
    def __init__(self, stream: TextIO | None = None, *, live: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.t0 = time.monotonic()
        self._drawn = 0.0
        self._width = 0

    def __call__(self, done: int, planned: int, label: str) -> None:
        now = time.monotonic()
        if not self.live or (now - self._drawn < REDRAW_S and done < planned):
            return
        self._drawn = now
        text = f"bench: {done}/{planned} requests  {now - self.t0:5.1f} s  {label}"
        self.stream.write("\r" + printable(text).ljust(self._width))
        self.stream.flush()
        self._width = len(text)

    def clear(self) -> None:
        if self.live and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0

    def finish(self, message: str) -> None:
        """Replace the live line with `message` (written on any stream)."""
        self.clear()
        self.stream.write(printable(message, layout=True) + "\n")
        self.stream.flush()
