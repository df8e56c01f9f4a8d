"""Where queries run: the database file, or the running proxy that holds it.

DuckDB lets one process write a file and locks it against every other
process, readers included. So `open_source` first opens the file read-only;
when a running `llmtap serve` holds the lock, it finds the proxy through its
state file and sends each query to `POST /_llmtap/sql` instead. Either way a
query answers `(columns, type names, rows)` and sees the views of `views.py`
(the proxy creates them on its query cursor too). Over HTTP, timestamps
arrive as ISO strings.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Protocol

import duckdb

from proxy.common import duck, paths, instances as running
from proxy.common.instances import AdminClient, AdminError
from proxy.common.terminal_text import echo

from analysis.views import create_views

Result = tuple[list[str], list[str], list[tuple[Any, ...]]]


class SourceError(Exception):
    """A query or a connection failed; the message is for the user."""


class Source(Protocol):
    def query(self, sql: str) -> Result: ...

    def close(self) -> None: ...


class FileSource:
    """A read-only DuckDB connection to the database file."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con
        create_views(con)

    def query(self, sql: str) -> Result:
        try:
            cursor = self.con.execute(sql)
            if cursor.description is None:
                return [], [], []
            rows = cursor.fetchall()
        except duckdb.Error as exc:
            raise SourceError(str(exc)) from None
        columns = [d[0] for d in cursor.description]
        types = [str(d[1]) for d in cursor.description]
        return columns, types, rows

    def close(self) -> None:
        self.con.close()


class ServeSource:
    """Queries sent to a running `llmtap serve` (its admin SQL endpoint, with its token)."""

    def __init__(self, admin: AdminClient, timeout: float = 300.0) -> None:
        self.admin, self.timeout = admin, timeout

    @property
    def url(self) -> str:
        return self.admin.endpoint("sql")

    def query(self, sql: str) -> Result:
        try:
            result, truncated = self.admin.sql(sql, self.timeout)
        except AdminError as exc:
            raise SourceError(str(exc)) from None
        if truncated:
            echo("llmtap: the running proxy returned only the first 100,000 rows; "
                 "add a LIMIT or use `llmtap export`", err=True)
        return result

    def close(self) -> None:
        pass


def open_source(db_path: str | Path, *, writes_to: str | Path | None = None, lock: bool = True) -> Source:
    """The file itself when we can open it, else the `llmtap serve` holding it.

    The file's connection is locked down as the proxy's is (duck.lock_down): SQL reads the
    database and nothing else, but for the directory `writes_to` (an export's). `lock=False`
    for what needs more (httpfs, for an export to object storage)."""
    path = Path(db_path).expanduser()
    if not path.exists():
        raise SourceError(f"no database at {path} yet: {_elsewhere() or 'run `llmtap serve` or `llmtap demo` first'}")
    try:
        con = duck.connect(path, read_only=True)
    except (duckdb.IOException, duckdb.ConnectionException) as exc:
        if not _is_lock_error(exc):
            raise SourceError(f"cannot open {path}: {exc}") from None
        return _serve_source(path, str(exc))
    except duckdb.Error as exc:
        raise SourceError(f"cannot open {path}: {exc}") from None
    try:
        source = FileSource(con)
        if lock:
            duck.lock_down(con, directories=[writes_to] if writes_to else ())
        return source
    except duckdb.Error as exc:
        con.close()
        raise SourceError(f"cannot read {path}: {exc}") from None


def _elsewhere() -> str | None:
    """Where the running `llmtap serve`s record, and how to read it, when they record to another file."""
    found = [s for s in running.states() if s.db]
    if not found:
        return None
    return "; ".join(f"the running `llmtap serve` on port {s.port} records to {s.db}: read it with"
                     f" --db {shlex.quote(s.db or '')}" for s in found)


def _is_lock_error(exc: duckdb.Error) -> bool:
    """Another process holds the file, or this one holds it read-write."""
    return isinstance(exc, duckdb.ConnectionException) or "lock" in str(exc).lower()


def _serve_source(path: Path, lock_message: str) -> ServeSource:
    found = running.states()
    holder = next((state for state in found if state.holds(path)), None)
    if holder is None:
        where = (f"the running `llmtap serve` records to {', '.join(str(s.db) for s in found)}, not to this file"
                 if found else f"no running `llmtap serve` was found (no state file in {paths.state_dir()})")
        raise SourceError(f"{path} is in use by another process, and {where}: {lock_message}")
    return ServeSource(running.AdminClient(holder.url, holder.admin_token))
