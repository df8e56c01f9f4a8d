"""Rows a worker of `serve --workers N` finished after its primary died: kept in a spill file,
written by the next primary that records to the same database, exactly once.

A worker whose primary is gone (its channel closed without `stop`) still lets its requests in
flight end (the server's shutdown timeout), but has nobody to send their rows to. It holds them
(`Held`, at most `MAX_HELD` requests) and, as it exits, writes them to
`<run dir>/spill-<pid>.jsonl`: created under a temporary name, owner-only (0600), in the 0700 run
directory, and renamed into place once whole, so a reader never sees half a file. It is JSON lines,
not a pickle: the first line says which database the rows belong to, each next one is one
request (`{"row": {...}, "chunks": [[...], ...], "body": [...] | null}`).

`load` runs in the primary as `serve` starts and every `RESCAN_S` after (a worker may spill after
the new primary started): for each spill file of this database (only regular files of this user,
owner-only, opened without following a symlink), the rows whose id the database does not have yet
are put into the store, the store is flushed, and the file is removed. A crash between the flush
and the removal leaves a file whose rows are already there: the next load skips them by id, so no
row is written twice. A file that is not this user's, or that others can write, is left alone and
reported.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from proxy.common import instances as running
from proxy.common.schema import BODY_COLUMNS, CHUNK_COLUMNS
from proxy.record.store_reader import StoreError

MAX_HELD = 20_000  # requests a worker without a primary holds (its requests in flight as it stops)
RESCAN_S = 15.0
VERSION = 1
_NAME = re.compile(r"spill-\d+\.jsonl")
Spilled = tuple[dict[str, Any], list[tuple[Any, ...]], "tuple[Any, ...] | None"]  # row, chunk rows, body row


class Held:
    """A worker's finished requests that could not be sent (its primary is gone)."""

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []
        self.dropped = 0

    def add(self, batch: list[tuple[Any, ...]]) -> None:
        room = max(0, MAX_HELD - len(self.rows))
        self.rows.extend(batch[:room])
        self.dropped += len(batch) - min(room, len(batch))


def write(rows: list[tuple[Any, ...]], db: Path) -> Path:
    """The rows (row, chunk rows, body row) as this process's spill file, owner-only; its path."""
    directory = running.private_dir()
    path = directory / f"spill-{os.getpid()}.jsonl"
    tmp = directory / f".spill-{os.getpid()}.tmp"
    lines = [orjson.dumps({"llmtap_spill": VERSION, "db": str(Path(db).expanduser().resolve()),
                           "pid": os.getpid(), "requests": len(rows)})]
    lines += [orjson.dumps({"row": row, "chunks": list(chunks or ()), "body": body}) for row, chunks, body in rows]
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(b"\n".join(lines) + b"\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def load(store: Any, db: Path, report: Callable[[str], None]) -> int:
    """Write the spilled rows of `db` into `store` (a started Store) and remove their files; how many.
    Blocks (file reads, a query, a flush): call it off the event loop."""
    total = 0
    for path in _files():
        try:
            found = _read(path, db)
        except (OSError, ValueError) as exc:  # not ours, or not a spill file
            report(f"llmtap: left {path} alone: {exc}")
            continue
        if found is None:  # another database's
            continue
        try:
            total += _write(store, path, found, report)
        except StoreError as exc:  # the database is being reopened after a write error
            report(f"llmtap: {path}: its rows are not written yet ({exc}); kept for the next try")
    return total


def _write(store: Any, path: Path, found: list[Spilled], report: Callable[[str], None]) -> int:
    written = _put_new(store, found)
    store.flush(60)
    missing = len(found) - len(_present(store, [row["id"] for row, _, _ in found]))
    if missing and (store.stats()["failing_since"] is not None or store.closed):
        report(f"llmtap: {path}: {missing} of its rows are not written yet; kept for the next try")
        return 0
    path.unlink(missing_ok=True)  # what is still missing was refused by the schema (reported by the store)
    skipped = len(found) - written
    report(f"llmtap: wrote {written} request row(s) a worker kept after its primary stopped ({path.name}"
           f"{f'; {skipped} already there' if skipped else ''})")
    return written


def _files() -> list[Path]:
    directory = running.private_dir()
    try:
        return sorted(directory / name for name in os.listdir(directory) if _NAME.fullmatch(name))
    except OSError:
        return []


def _read(path: Path, db: Path) -> list[Spilled] | None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise ValueError("not an owner-only file of this user")
        lines = f.read().splitlines()
    head = orjson.loads(lines[0]) if lines else None
    if not isinstance(head, dict) or head.get("llmtap_spill") != VERSION:
        raise ValueError("not a spill file of this llmtap")
    if not running.same_file(str(head.get("db")), db):
        return None
    try:
        return [_entry(orjson.loads(line)) for line in lines[1:] if line]
    except (KeyError, TypeError, IndexError) as exc:
        raise ValueError(f"a line that is not a spilled request ({exc!r})") from None


def _entry(data: Any) -> Spilled:
    row, chunks, body = data["row"], data["chunks"] or [], data["body"]
    if not isinstance(row, dict) or not isinstance(row.get("id"), str):
        raise ValueError("a spilled request without its id")  # noqa: TRY004 - bad data, as the others
    if any(len(c) != len(CHUNK_COLUMNS) for c in chunks) or (body is not None and len(body) != len(BODY_COLUMNS)):
        raise ValueError("a spilled chunk or body row of another shape")
    return row, [tuple(c) for c in chunks], tuple(body) if body is not None else None


def _put_new(store: Any, found: list[Spilled]) -> int:
    """Put the requests the database does not hold yet (a file loaded before, not yet removed); how many."""
    have = _present(store, [row["id"] for row, _, _ in found])
    n = 0
    for row, chunks, body in found:
        if row["id"] in have:
            continue
        have.add(row["id"])
        if body is not None:
            store.put_body(body)
        store.put(row, chunks)
        n += 1
    return n


def _present(store: Any, ids: list[str]) -> set[str]:
    """Which of these request ids the database holds."""
    _, _, rows = store.query("SELECT id FROM requests WHERE id IN (SELECT unnest(?::VARCHAR[]))", [ids], len(ids) + 1)
    return {r[0] for r in rows}
