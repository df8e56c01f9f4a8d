"""Set top-level keys, and the keys of one table, in a TOML file with tomlkit, which keeps the rest as
it was: comments, order, spacing, the other settings. The result is parsed again and must equal the
old document with exactly the requested changes, else `TomlEditError` (the file is then left alone).
"""

from __future__ import annotations

import tomllib
from typing import Any

import tomlkit
from tomlkit.container import Container
from tomlkit.items import Comment, Item, Key, Table, Whitespace


class TomlEditError(ValueError):
    """The edit did not give the document asked for; the message says what to do."""


def toml_string(value: str) -> str:
    """A TOML basic string, as a config line holds it."""
    return tomlkit.string(value).as_string()


def set_keys(text: str, top: dict[str, str], table: tuple[str, ...] = (), values: dict[str, str] | None = None) -> str:
    """`text` with the top-level keys `top` set and, given `table`, that table holding `values` (made when
    missing; its other keys kept). Raises TomlEditError, or tomllib's TOMLDecodeError for a file that is
    not TOML."""
    expected = tomllib.loads(text)
    doc = tomlkit.parse(text)
    doc.update(top)  # in place when set; a new one before the first table
    expected.update(top)
    if table:
        _set_in_table(doc, table, values or {})
        node: dict[str, Any] = expected
        for part in table:
            node = node.setdefault(part, {})
        node.update(values or {})
    result = tomlkit.dumps(doc)
    if tomllib.loads(result) != expected:
        raise TomlEditError(f"cannot set {', '.join([*top, *(['.'.join(table)] if table else [])])} safely:"
                            " edit it by hand")
    return result


def _set_in_table(doc: Any, path: tuple[str, ...], values: dict[str, str]) -> None:
    node = parent = doc
    for i, part in enumerate(path):
        if part not in node:
            node[part] = tomlkit.table(is_super_table=i < len(path) - 1)
        parent, node = node, node[part]
    for key in [k for k in values if k in node]:
        node[key] = values[key]  # in place, its comment kept
    new = {k: v for k, v in values.items() if k not in node}
    if new:
        _append(parent, path[-1], node, new)


def _append(parent: Any, name: str, table: Any, new: dict[str, str]) -> None:
    """New keys after the table's last key, not after the comments that introduce the next table
    (tomlkit holds those as the end of this table's body): the table is rebuilt around them."""
    body = table.value.body if isinstance(table, Table) else []
    cut = len(body)
    while cut and body[cut - 1][0] is None:
        cut -= 1
    if cut == len(body):
        table.update(new)
        return
    rebuilt = Table(Container(), table.trivia, False)
    for key, item in body[:cut]:
        _add(rebuilt, key, item)
    rebuilt.update(new)
    for key, item in body[cut:]:
        _add(rebuilt, key, item)
    parent[name] = rebuilt


def _add(table: Table, key: Key | None, item: Item) -> None:
    if key is not None:
        table.add(key, item)
    elif isinstance(item, (Comment, Whitespace)):  # a comment or a blank line
        table.add(item)
