"""Text for a terminal: the one way llmtap prints what it did not write itself.

Stored data comes from anyone who can reach the proxy: a path or a `/_tag/` prefix (even on a
request answered 401), a model name, an upstream's error message. A terminal obeys what such text
holds: `ESC ]52;c;…` writes the clipboard (OSC), `ESC P` (DCS), `ESC _`/`ESC ^`/`ESC X`
(APC/PM/SOS), `ESC [` (CSI) move the cursor or clear the screen, the C1 controls U+0080–U+009F
(CSI is U+009B) do the same on terminals that take them, CR and LF forge lines. So every text the CLI
writes, and every stderr line `serve` writes, goes through `printable`: each C0 control, DEL and C1
control is shown as JSON escapes it (`\\n`, `\\r`, `\\t`, `\\u001b`), as printable characters, never
sent. One regex search per text; a substitution only when one is there.

Escaped the JSON way, a JSON text stays valid and means the same: outside its strings a JSON text
holds no control but line breaks (kept), and inside them the escape is JSON's own. So
`--format json` output passes through unchanged but for raw C1 controls (orjson writes them raw),
which become `\\u0085`-style escapes of the same value. In CSV on stdout an escape is text (CSV has
no escapes): `--format json` keeps every value exactly.

`echo` is the output layer of every command (tests/test_terminal_text.py checks that no command
module writes to stdout or stderr another way); tables escape each cell before laying it out, so
their columns stay aligned and a line break in a value cannot start a line.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence

# C0 controls, DEL and the C1 controls: everything a terminal may act on rather than show.
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# The same but line breaks and tabs: what a whole text's layout may hold.
_CONTROLS_BUT_LAYOUT = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def _escaped(m: re.Match[str]) -> str:
    return _SHORT.get(m[0]) or f"\\u{ord(m[0]):04x}"


def printable(text: str, *, layout: bool = False) -> str:
    """`text` with every control character shown as its JSON escape. `layout=True` keeps line
    breaks and tabs (a whole text's own layout); a table cell or a log line keeps none."""
    pattern = _CONTROLS_BUT_LAYOUT if layout else _CONTROLS
    return pattern.sub(_escaped, text) if pattern.search(text) else text


def printable_cells(cells: Sequence[str]) -> Sequence[str]:
    """A table row's cells, each `printable` (one search for the whole row: most have nothing to escape)."""
    return [printable(c) for c in cells] if _CONTROLS.search("".join(cells)) else cells


def echo(text: str = "", *, nl: bool = True, err: bool = False, redraw: bool = False) -> None:
    """`click.echo` of a command's output, its line breaks and tabs kept, every other control escaped.
    `redraw`: start with a carriage return, rewriting the line in place (a progress line)."""
    import click  # here: the relay's stderr lines need only `printable`

    click.echo(("\r" if redraw else "") + printable(text, layout=True), nl=nl, err=err)


def stderr_line(line: str) -> None:
    """One line of `serve`'s (and its workers' and exporters') stderr, flushed at once."""
    print(printable(line, layout=True), file=sys.stderr, flush=True)
