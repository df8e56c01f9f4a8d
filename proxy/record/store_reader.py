"""Reading the database. While the proxy writes it, `StoreReader` (which proxy/record/store.py's
`Store` is) runs the CLI's queries beside the writer, on the writer's connection: DuckDB lets one
process open a file for writing, so `query()` runs one read-only statement on its own cursor, inside
a READ ONLY transaction, and `reader()` several in one. When no proxy holds the file, `open_readonly`
gives the analysis CLI a read-only connection of its own.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb

from proxy.common import duck
from proxy.record import sql_filter
from proxy.record.query_limits import QueryStop, QueryStopped, fetch_capped

READER_SETUP_S = 10.0  # a reader cursor's views (and the prices in them) are made again after this
READ_ONLY = sql_filter.READ_ONLY
QuerySetup = Callable[[duckdb.DuckDBPyConnection], None]


class StoreError(Exception):
    pass


class DatabaseLocked(StoreError):
    """Another process holds the database file (DuckDB allows one writer process)."""

    def __init__(self, path: Path, pid: int | None, holder: str | None = None, message: str | None = None) -> None:
        self.path, self.pid, self.holder = path, pid, holder
        who = f" (PID {pid}{', ' + holder if holder else ''})" if pid is not None else ""
        super().__init__(message or (
            f"the database {path} is in use by another process{who}; if that is a running "
            "`llmtap serve`, query through it with `llmtap sql`"
        ))


@contextlib.contextmanager
def _as_store_errors(stop: QueryStop | None) -> Iterator[None]:
    """The filter's refusal and DuckDB's errors as StoreError; a query stopped (`stop`) as QueryStopped,
    with why; a write refused by a read-only database says what to do (READ_ONLY)."""
    try:
        yield
    except sql_filter.Refused as exc:
        raise StoreError(str(exc)) from None
    except duckdb.Error as exc:
        if stop is not None and stop.reason is not None:
            raise QueryStopped(stop.reason) from None
        read_only = isinstance(exc, duckdb.TransactionException) and "read-only" in str(exc)
        raise StoreError(f"{READ_ONLY}: {exc}" if read_only else str(exc)) from exc


class StoreReader:
    """Read-only statements on the connection the writer (`Store`) opens, swaps and closes under
    `_con_lock`."""

    # Called with each query's own cursor before the query (the analysis package adds temp views).
    query_setup: QuerySetup | None = None

    def __init__(self) -> None:
        self._con: duckdb.DuckDBPyConnection | None = None
        self._con_lock = threading.Lock()  # cursor() and close() on the shared connection
        self._readers = threading.local()  # each admin SQL thread's reader cursor (`reader`)

    def query(
        self, sql: str, params: list[Any] | None = None, max_rows: int = 100_000, *,
        max_bytes: int | None = None, stop: QueryStop | None = None,
    ) -> tuple[list[str], list[str], list[tuple[Any, ...]]]:
        """Run one read-only statement (sql_filter.check): (column names, DuckDB type names, at most
        max_rows rows). `max_bytes`: the answer's rows as JSON are at most this long, else
        ResultTooLarge. `stop`: another thread may stop the query with it (QueryStop.stop)."""
        with self._con_lock:
            if self._con is None:
                raise StoreError("the database is not open (it is reopened after a write error; try again)")
            cur = self._con.cursor()
        try:
            if stop is not None:
                stop.attach(cur)
            with _as_store_errors(stop):
                sql_filter.check(sql, cur)
                return self._run_query(cur, sql, params, max_rows, max_bytes, stop)
        finally:
            if stop is not None:
                stop.detach()
            with contextlib.suppress(duckdb.Error):
                cur.close()

    @contextlib.contextmanager
    def reader(self, stop: QueryStop | None = None, max_rows: int = 100_000, *,
               max_bytes: int | None = None) -> Iterator[Callable[[str], tuple[list[str], list[str], list[tuple[Any, ...]]]]]:
        """Several read-only statements on one cursor, in one READ ONLY transaction (one snapshot), the
        views set up once: `with store.reader(stop) as query: query("SELECT ...")`, each statement checked
        and capped as `query()`'s (for the web UI's API, whose one answer takes a few statements)."""
        cur = self._reader_cursor()
        ok = False
        try:
            if stop is not None:
                stop.attach(cur)
            cur.execute("BEGIN TRANSACTION READ ONLY")

            def query(sql: str) -> tuple[list[str], list[str], list[tuple[Any, ...]]]:
                with _as_store_errors(stop):
                    sql_filter.check(sql, cur)
                    if stop is not None:
                        stop.check()
                    cur.execute(sql)
                    description = cur.description or []
                    rows = fetch_capped(cur, max_rows, max_bytes, stop) if description else []
                return [d[0] for d in description], [str(d[1]) for d in description], rows

            yield query
            ok = True
        finally:
            if stop is not None:
                stop.detach()
            with contextlib.suppress(duckdb.Error):
                cur.execute("ROLLBACK")
            if not ok:  # a failed or stopped one is not kept: the next reader starts afresh
                self._readers.cursor = None
                with contextlib.suppress(duckdb.Error):
                    cur.close()

    def _reader_cursor(self) -> duckdb.DuckDBPyConnection:
        """This thread's reader cursor, its views set up at most every READER_SETUP_S (creating them
        takes ~90 ms on a big database: more than a page's query itself)."""
        with self._con_lock:
            con = self._con
            if con is None:
                raise StoreError("the database is not open (it is reopened after a write error; try again)")
            kept = getattr(self._readers, "cursor", None)
            if kept is not None and kept[1] is con and time.monotonic() - kept[2] < READER_SETUP_S:
                return kept[0]
            cur = con.cursor()
        if kept is not None:
            with contextlib.suppress(duckdb.Error):
                kept[0].close()
        self._readers.cursor = None
        if self.query_setup is not None:
            self.query_setup(cur)
        self._readers.cursor = (cur, con, time.monotonic())
        return cur

    def _run_query(
        self, cur: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None, max_rows: int,
        max_bytes: int | None = None, stop: QueryStop | None = None,
    ) -> tuple[list[str], list[str], list[tuple[Any, ...]]]:
        if self.query_setup is not None:
            self.query_setup(cur)
        cur.execute("BEGIN TRANSACTION READ ONLY")
        try:
            if stop is not None:
                stop.check()
            cur.execute(sql, params)
            description = cur.description or []
            rows = fetch_capped(cur, max_rows, max_bytes, stop) if description else []
        finally:
            with contextlib.suppress(duckdb.Error):
                cur.execute("ROLLBACK")
        return [d[0] for d in description], [str(d[1]) for d in description], rows


def open_readonly(path: str | Path) -> duckdb.DuckDBPyConnection:
    """A read-only connection for the analysis CLI, when no proxy holds the file."""
    path = Path(path)
    if not path.exists():
        raise StoreError(f"no database at {path}: run `llmtap serve` to record one")
    try:
        con = duck.connect(path, read_only=True)
    except duckdb.Error as exc:
        raise open_error(path, exc) from exc
    con.execute("SET TimeZone = 'UTC'")
    return con


_LOCK_HOLDER = re.compile(r"held in (?P<holder>.+?) \(PID (?P<pid>\d+)\)")


def open_error(path: Path, exc: duckdb.Error) -> StoreError:
    message = one_line(exc)
    if isinstance(exc, duck.UntrustedDatabase):
        return StoreError(message)
    if "Could not set lock" in message:
        m = _LOCK_HOLDER.search(message)
        return DatabaseLocked(path, int(m["pid"]) if m else None, m["holder"] if m else None)
    if "different configuration than existing connections" in message:  # this very process
        return DatabaseLocked(path, os.getpid(), message=(
            f"the database {path} is already open in this process in the other mode (read-write or "
            "read-only); while a Store has it, query through Store.query()"))
    hint = " (a read-only or full disk? choose another file with --db)" if "IO Error" in message else ""
    return StoreError(f"cannot open the database {path}: {message}{hint}")


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
