"""Set top-level keys (and one table) in a TOML file by text edits.

Everything else in the file stays byte-identical: comments, order, spacing.
The result is parsed again and must equal the old document with exactly the
requested changes, else `TomlEditError` (the file is then left alone).
"""

from __future__ import annotations

import copy
import json
import re
import tomllib
from typing import Any


class TomlEditError(ValueError):
    """The file cannot be edited safely by text edits; the message says what to do."""


# A line that is only a table or array-of-tables header (commas rule out array items).
_HEADER = re.compile(r"""^[ \t]*\[\[?[ \t]*[\w"'.\- \t]+\]\]?[ \t]*(#.*)?\r?\n?$""")


def toml_string(value: str) -> str:
    """A TOML basic string (JSON's escapes are all valid TOML escapes)."""
    return json.dumps(value, ensure_ascii=False)


def toml_key(key: str) -> str:
    """A bare key where TOML allows one, else quoted (a key fingerprint's `k:…`)."""
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else toml_string(key)


def _key_line(key: str) -> re.Pattern[str]:
    k = re.escape(key)
    return re.compile(rf"""^[ \t]*(?:{k}|"{k}"|'{k}')[ \t]*=""")


def _table_header(dotted: tuple[str, ...]) -> re.Pattern[str]:
    parts = [rf"""(?:{re.escape(p)}|"{re.escape(p)}"|'{re.escape(p)}')""" for p in dotted]
    return re.compile(r"^[ \t]*\[[ \t]*" + r"[ \t]*\.[ \t]*".join(parts) + r"[ \t]*\][ \t]*(#.*)?\r?\n?$")


def _is_content(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith("#")


def _same_value(line: str, key: str, value: str) -> bool:
    try:
        return tomllib.loads(line).get(key) == value
    except tomllib.TOMLDecodeError:
        return False


def _set_keys(lines: list[str], start: int, end: int, values: dict[str, str]) -> None:
    """Set `values` among lines[start:end] (a table body, or the top level)."""
    for key, value in values.items():
        new_line = f"{toml_key(key)} = {toml_string(value)}\n"
        pattern = _key_line(key)
        found = next((i for i in range(start, end) if pattern.match(lines[i])), None)
        if found is not None:
            if not _same_value(lines[found], key, value):
                ending = "\r\n" if lines[found].endswith("\r\n") else "\n"
                lines[found] = new_line[:-1] + ending
            continue
        last = max((i for i in range(start, end) if _is_content(lines[i])), default=start - 1)
        lines.insert(last + 1, new_line)
        end += 1


def _top_insert_at(lines: list[str], first_header: int) -> int:
    """After the last top-level key; with none, before the comments that introduce the first table."""
    last = max((i for i in range(first_header) if _is_content(lines[i])), default=None)
    if last is not None:
        return last + 1
    at = first_header
    while at > 0 and lines[at - 1].strip().startswith("#"):
        at -= 1
    return at


def set_key_and_table(text: str, top: dict[str, str], table: tuple[str, ...], values: dict[str, str]) -> str:
    """`text` with the top-level keys `top` set and the table `table` holding `values`.

    Other keys of that table are kept. Raises TomlEditError (or tomllib's
    TOMLDecodeError for a file that is not TOML).
    """
    doc = tomllib.loads(text)
    expected = copy.deepcopy(doc)
    node: dict[str, Any] = expected
    for part in table:
        node = node.setdefault(part, {})
    node.update(values)
    expected.update(top)

    lines = text.splitlines(keepends=True)
    header = _table_header(table)
    at = next((i for i, line in enumerate(lines) if header.match(line)), None)
    if at is not None:
        end = next((i for i in range(at + 1, len(lines)) if _HEADER.match(lines[i])), len(lines))
        _set_keys(lines, at + 1, end, values)
    else:
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        if lines and lines[-1].strip():
            lines.append("\n")
        lines.append(f"[{'.'.join(table)}]\n")
        lines.extend(f"{toml_key(key)} = {toml_string(value)}\n" for key, value in values.items())

    _set_top(lines, top)
    return _checked("".join(lines), expected, f"[{'.'.join(table)}] and {', '.join(top)}")


def set_top_keys(text: str, top: dict[str, str]) -> str:
    """`text` with the top-level keys `top` set; everything else byte-identical.

    Raises TomlEditError (or tomllib's TOMLDecodeError for a file that is not TOML).
    """
    expected = {**copy.deepcopy(tomllib.loads(text)), **top}
    lines = text.splitlines(keepends=True)
    _set_top(lines, top)
    return _checked("".join(lines), expected, ", ".join(top))


def _set_top(lines: list[str], top: dict[str, str]) -> None:
    """Set `top` among the keys before the first table; new ones after the last of those."""
    first_header = next((i for i, line in enumerate(lines) if _HEADER.match(line)), len(lines))
    missing = {k: v for k, v in top.items()
               if not any(_key_line(k).match(lines[i]) for i in range(first_header))}
    _set_keys(lines, 0, first_header, {k: v for k, v in top.items() if k not in missing})
    if missing:
        at = _top_insert_at(lines, first_header)
        new_lines = [f"{toml_key(key)} = {toml_string(value)}\n" for key, value in missing.items()]
        if at < len(lines) and lines[at].strip():
            new_lines.append("\n")
        if at > 0 and not lines[at - 1].endswith("\n"):
            lines[at - 1] += "\n"
        lines[at:at] = new_lines


def _checked(result: str, expected: dict[str, Any], what: str) -> str:
    """`result` if it parses to `expected`, else TomlEditError (the file is then left alone)."""
    try:
        ok = tomllib.loads(result) == expected
    except tomllib.TOMLDecodeError:
        ok = False
    if not ok:
        raise TomlEditError(f"cannot set {what} safely by a text edit "
                            f"(the file defines them in an unusual form): edit it by hand")
    return result
