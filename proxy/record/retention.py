"""Keeping the database small: old rows deleted, and the file rewritten so that it shrinks.

- `prune_step` deletes, in one transaction, at most `BATCH_REQUESTS` of the requests started
  before a cutoff with their chunks and bodies (and, with a second cutoff, the bodies alone of
  older requests). `serve --retain-days/--retain-bodies-days` runs it in the store's writer thread,
  one step between two writes of new rows, so the writer is never held for long
  (proxy/record/store.py); `llmtap prune` runs it until nothing is left (`prune`).
- `compact` rewrites the file: DuckDB never gives a file's space back on DELETE (the freed
  blocks are reused by later rows, so a pruned file stops growing but keeps its size). It copies
  the database into a new file beside it (`ATTACH`, `COPY FROM DATABASE`) and renames that over
  the old one, owner-only like every file llmtap writes. Only while no `llmtap serve` holds
  the file: DuckDB lets one process open it for writing.

`compact`'s connection is not locked down (proxy/common/duck.py `lock_down`): it must ATTACH two files,
which a locked-down instance refuses; it runs no SQL but its own.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import duckdb

from proxy.common import duck, instances as running

BATCH_REQUESTS = 2_000  # requests, with their chunks and bodies, deleted per transaction


class RetentionError(Exception):
    """The database cannot be pruned or compacted now; the message says why and what to do."""


@dataclass
class Pruned:
    """Rows deleted."""

    requests: int = 0
    chunks: int = 0
    bodies: int = 0

    def add(self, other: "Pruned") -> None:
        self.requests += other.requests
        self.chunks += other.chunks
        self.bodies += other.bodies

    def describe(self) -> str:
        return f"{self.requests:,} request(s), {self.chunks:,} chunk(s) and {self.bodies:,} body row(s)"


def prune_step(con: duckdb.DuckDBPyConnection, *, rows_before: datetime | None,
               bodies_before: datetime | None = None, batch: int | None = None) -> tuple[Pruned, bool]:
    """One transaction: at most `batch` (default BATCH_REQUESTS) requests started before `rows_before`
    (None: none), with their chunks and bodies; then the bodies of at most `batch` requests started
    before `bodies_before`. Returns what it deleted and whether more may be left (a batch was full)."""
    batch = batch or BATCH_REQUESTS
    done = Pruned()
    more = False
    con.execute("BEGIN TRANSACTION")
    try:
        if rows_before is not None:
            found = con.execute("SELECT rowid, id FROM requests WHERE started_at < ? LIMIT ?",
                                [rows_before, batch]).fetchall()
            if found:
                rowids = [r[0] for r in found]
                ids = [r[1] for r in found if r[1] is not None]
                done.chunks = _deleted(con, "DELETE FROM chunks WHERE request_id IN (SELECT unnest(?::VARCHAR[]))", ids)
                done.bodies = _deleted(con, "DELETE FROM bodies WHERE request_id IN (SELECT unnest(?::VARCHAR[]))", ids)
                done.requests = _deleted(con, "DELETE FROM requests WHERE rowid IN (SELECT unnest(?::BIGINT[]))", rowids)
            more = len(found) >= batch
        if bodies_before is not None and not more:
            found = con.execute(
                "SELECT b.rowid FROM bodies b JOIN requests r ON r.id = b.request_id WHERE r.started_at < ? LIMIT ?",
                [bodies_before, batch]).fetchall()
            if found:
                done.bodies += _deleted(con, "DELETE FROM bodies WHERE rowid IN (SELECT unnest(?::BIGINT[]))",
                                        [r[0] for r in found])
            more = len(found) >= batch
        con.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(duckdb.Error):
            con.execute("ROLLBACK")
        raise
    return done, more


def _deleted(con: duckdb.DuckDBPyConnection, sql: str, values: list[object]) -> int:
    if not values:
        return 0
    row = con.execute(sql, [values]).fetchone()
    return int(row[0]) if row else 0


def prune(con: duckdb.DuckDBPyConnection, *, rows_before: datetime | None, bodies_before: datetime | None = None,
          batch: int | None = None) -> Pruned:
    """`prune_step` until nothing older is left."""
    total = Pruned()
    more = True
    while more:
        done, more = prune_step(con, rows_before=rows_before, bodies_before=bodies_before, batch=batch)
        total.add(done)
    return total


def refuse_if_served(path: Path, doing: str) -> None:
    """RetentionError when a running `llmtap serve` records to `path`."""
    holder = next((s for s in running.states() if s.holds(path)), None)
    if holder is None:
        return
    if doing == "compact":
        then = " (and start it again after); serve's own retention (--retain-days N) keeps it from growing meanwhile"
    else:
        then = ", or let serve delete old rows as it runs (serve --retain-days N, --retain-bodies-days N)"
    raise RetentionError(f"llmtap serve (PID {holder.pid}, {holder.url}) records to {path}: "
                         f"stop it before you {doing} the file{then}")


def open_for_writing(path: Path, doing: str) -> duckdb.DuckDBPyConnection:
    """The database file opened read-write by this command, or RetentionError."""
    if not path.exists():
        raise RetentionError(f"no database at {path}")
    refuse_if_served(path, doing)
    try:
        with duck.private_umask():
            return duck.connect(path)
    except duckdb.Error as exc:
        raise _cannot(path, doing, exc) from None


def compact(path: Path) -> tuple[int, int]:
    """Rewrite the database at `path` into a new file and put it in its place; (size before,
    size after) in bytes. The old file is attached for writing (its lock held) from the start
    until the new one has replaced it, so no `llmtap serve` can start writing to it meanwhile."""
    path = Path(path).expanduser()
    if not path.exists():
        raise RetentionError(f"no database at {path}")
    refuse_if_served(path, "compact")
    tmp = path.with_name(f".{path.name}.compact-{os.getpid()}")
    before = path.stat().st_size
    con = duck.connect(":memory:")
    try:
        with duck.private_umask():
            duck.refuse_untrusted(path)  # ATTACH does not go through duck.connect
            for leftover in (tmp, tmp.with_name(tmp.name + ".wal")):
                leftover.unlink(missing_ok=True)
            con.execute(f"ATTACH {_quote(path)} AS old_db")
            con.execute("CHECKPOINT old_db")  # what a crash left in its .wal, into the file first
            con.execute(f"ATTACH {_quote(tmp)} AS new_db")
            con.execute("COPY FROM DATABASE old_db TO new_db")
            con.execute("DETACH new_db")
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
            con.execute("DETACH old_db")
    except duckdb.Error as exc:
        tmp.unlink(missing_ok=True)
        raise _cannot(path, "compact", exc) from None
    finally:
        con.close()
    return before, path.stat().st_size


def _cannot(path: Path, doing: str, exc: duckdb.Error) -> RetentionError:
    message = " ".join(str(exc).split())
    if isinstance(exc, duck.UntrustedDatabase):
        return RetentionError(message)
    if "lock" in message.lower():
        return RetentionError(f"another process holds {path} ({message}); stop it before you {doing} the file")
    return RetentionError(f"cannot {doing} {path}: {message}")


def _quote(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"



