"""What bounds one query through the admin endpoint: a stop another thread can pull (DuckDB's
`interrupt()`), and its answer's size, counted as it is fetched."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import duckdb
import orjson

FIRST_BATCH_ROWS = 1  # an answer is fetched in batches of at most 1/8 of its byte cap, sized from the rows so far


class QueryStopped(Exception):
    """An admin query stopped from outside (its timeout, its client gone, the proxy stopping)."""


class ResultTooLarge(Exception):
    """An admin query's answer past its byte cap (serve --sql-max-mb)."""


class QueryStop:
    """One query's cursor, for another thread to interrupt (DuckDB's `interrupt()`) with a reason."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cur: duckdb.DuckDBPyConnection | None = None
        self.reason: str | None = None

    def attach(self, cur: duckdb.DuckDBPyConnection) -> None:
        with self._lock:
            if self.reason is not None:
                raise QueryStopped(self.reason)
            self._cur = cur

    def detach(self) -> None:
        with self._lock:
            self._cur = None

    def stop(self, reason: str) -> None:
        with self._lock:
            self.reason = self.reason or reason
        self.interrupt()

    def interrupt(self) -> None:
        """Interrupt the cursor's statement, if stopped. DuckDB forgets an interrupt when the next
        statement begins (one of the query's setup statements, say): its owner calls this again
        until the query has ended (admin_sql.AdminSql)."""
        with self._lock:
            if self.reason is not None and self._cur is not None:
                with contextlib.suppress(duckdb.Error):
                    self._cur.interrupt()

    def check(self) -> None:
        if self.reason is not None:
            raise QueryStopped(self.reason)


def fetch_capped(cur: duckdb.DuckDBPyConnection, max_rows: int, max_bytes: int | None,
           stop: QueryStop | None) -> list[tuple[Any, ...]]:
    """The answer's rows, batch by batch, with a running total of their size as JSON."""
    if max_bytes is None:
        return cur.fetchmany(max_rows)
    rows: list[tuple[Any, ...]] = []
    size, batch = 0, FIRST_BATCH_ROWS
    while len(rows) < max_rows:
        got = cur.fetchmany(min(batch, max_rows - len(rows)))
        if not got:
            break
        size += len(orjson.dumps(got, default=str))
        if size > max_bytes:
            raise ResultTooLarge(
                f"the answer is larger than the {max_bytes / 2**20:g} MiB that a query through the proxy may "
                "return (serve --sql-max-mb): select fewer rows or columns, or aggregate")
        if stop is not None:
            stop.check()
        rows.extend(got)
        batch = max(1, min(2048, len(rows) * max_bytes // (8 * size)))
    return rows
