"""The terminal for `llmtap top`: plain ANSI on the alternate screen, keys without Enter.

`with Terminal(on_key) as term:` switches to the alternate screen, hides the
cursor and puts a tty stdin in cbreak mode (keys arrive at once, Ctrl-C
still signals); leaving the block restores all three, whatever happened.
`draw` repaints from the top-left corner, clearing the rest of each line and
of the screen, so nothing flickers and nothing stale is left.

When stdout is not a terminal (a pipe, a file) there are no escapes at all:
each frame is plain lines and a blank line after it, like `top -b`. With
NO_COLOR set (https://no-color.org) headings are not in reverse video.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, TextIO

from proxy.common.terminal_text import printable

from analysis.top.render import Line

ALT_SCREEN_ON, ALT_SCREEN_OFF = "\x1b[?1049h", "\x1b[?1049l"
HIDE_CURSOR, SHOW_CURSOR = "\x1b[?25l", "\x1b[?25h"
HOME, CLEAR_LINE_END, CLEAR_SCREEN_END = "\x1b[H", "\x1b[K", "\x1b[J"
REVERSE, RESET = "\x1b[7m", "\x1b[0m"


def paint(lines: Sequence[Line], styled: bool = True) -> str:
    """One frame as ANSI: headings in reverse video (unless not `styled`), no newline after the last
    line (no scrolling)."""
    body = "\r\n".join((REVERSE + printable(line.text) + RESET if line.heading and styled else printable(line.text))
                       + CLEAR_LINE_END for line in lines)
    return HOME + body + CLEAR_SCREEN_END


def plain(lines: Sequence[Line]) -> str:
    """One frame for a pipe: its lines, then a blank line."""
    return "".join(printable(line.text) + "\n" for line in lines) + "\n"


def no_color() -> bool:
    """NO_COLOR set to anything but the empty string."""
    return bool(os.environ.get("NO_COLOR"))


class Terminal:
    def __init__(self, on_key: Callable[[bytes], None], out: TextIO = sys.stdout, stdin: TextIO = sys.stdin) -> None:
        self.on_key, self.out, self.stdin = on_key, out, stdin
        self._saved: Any = None  # termios attributes to restore
        self._fd: int | None = None
        self.screen = out.isatty()  # else plain frames, no escapes
        self.styled = not no_color()

    def __enter__(self) -> "Terminal":
        if self.stdin.isatty():
            import termios
            import tty

            self._fd = self.stdin.fileno()
            self._saved = termios.tcgetattr(self._fd)
            tty.setcbreak(self._fd)
            asyncio.get_running_loop().add_reader(self._fd, self._read)
        if self.screen:
            self.out.write(ALT_SCREEN_ON + HIDE_CURSOR)
            self.out.flush()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.screen:
            self.out.write(RESET + SHOW_CURSOR + ALT_SCREEN_OFF)
            self.out.flush()
        if self._fd is not None:
            import termios

            asyncio.get_running_loop().remove_reader(self._fd)
            termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved)
            self._fd = None

    def _read(self) -> None:
        try:
            data = os.read(self._fd, 64) if self._fd is not None else b""
        except OSError:
            data = b""
        self.on_key(data or b"\x04")  # end of input counts as a key: EOF (Ctrl-D) quits

    def draw(self, lines: Sequence[Line]) -> None:
        self.out.write(paint(lines, self.styled) if self.screen else plain(lines))
        self.out.flush()
