"""The DuckDB store's writer: rows go in on the event loop, a writer thread writes them.

`put()` runs on the event loop for every request, so it only turns the row into
its tuple of values (batch.RowTable.encode) and appends it to a list under a short lock. One daemon thread takes
everything pending about every `flush_interval_s` and writes it in one
transaction, each table's rows in one INSERT per batch (proxy/record/batch.py).

The queries that run beside the writer while the proxy serves are proxy/record/store_reader.py's
(`Store` is a `StoreReader`).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import duckdb

from proxy.common import duck, latency, thread_priority
from proxy.record import retention
from proxy.common.chunk_rows import ChunkRows
from proxy.record.batch import AGENT_EVENTS, BODIES, CHUNKS, REQUESTS, Table
from proxy.record.migrations import migrate
from proxy.record.store_reader import StoreError, StoreReader, one_line, open_error
from proxy.common.terminal_text import stderr_line

# The writer's interval is its share of the row's latency budget (proxy/common/latency.py).
WAKE_REQUESTS = 5_000  # this many pending rows wake the writer before the interval is up
WAKE_CHUNKS = 100_000
RETRY_FIRST_S = 0.1
RETRY_MAX_S = 5.0
# While the database cannot be written (a full disk), rows wait in memory up to these bounds, some
# 100 MB in all (a request row about 1.2 KB, a chunk row about 130 bytes); then new rows are dropped.
MAX_PENDING_REQUESTS = 20_000
MAX_PENDING_CHUNKS = 500_000
MAX_PENDING_BODY_BYTES = 64 * 1024 * 1024  # captured bodies (--capture-bodies) waiting to be written
MAX_PENDING_AGENT_EVENTS = 100_000  # the agents' own events (proxy/relay/otlp.py), some 200 bytes each
# Retention (serve --retain-days, --retain-bodies-days): old rows are deleted when the writer starts, then
# this often; one batch (retention.BATCH_REQUESTS) per wake of the writer, between writes of new rows.
PRUNE_INTERVAL_S = 3600.0
# The writer runs beside the event loop, often on the same core: DuckDB's own worker threads only add
# hand-offs to an INSERT of a few thousand rows (a chunk row costs 1.0 µs of CPU with one thread, 1.5
# with two; benchmarks/README.md). The writer thread keeps the loop's priority: it holds the GIL while
# it builds a batch, and a lower priority on a busy core made the loop wait for it (benchmarks/README.md).
WRITER_THREADS = 1

# Errors raised by the rows themselves (a value that does not fit its column): the batch
# is split to find and drop them. Any other error (I/O, a missing table) is retried.
_DATA_ERRORS: tuple[type[Exception], ...] = (
    duckdb.DataError,  # Conversion, OutOfRange, TypeMismatch
    duckdb.IntegrityError,
    duckdb.InvalidInputException,
    duckdb.InvalidTypeException,
    duckdb.NotImplementedException,  # a Python value DuckDB cannot convert
    TypeError,
    ValueError,
    OverflowError,
    IndexError,
    AttributeError,
)

Unit = list[tuple[Table, list[Any]]]  # written in one transaction


_print_stderr = stderr_line


class Store(StoreReader):
    def __init__(
        self,
        path: str | Path,
        *,
        flush_interval_s: float = latency.STORE_FLUSH_S,
        max_pending_requests: int = MAX_PENDING_REQUESTS,
        max_pending_chunks: int = MAX_PENDING_CHUNKS,
        record_chunks: bool = True,
        memory_limit_mb: int | None = None,
        retain_days: float | None = None,
        retain_bodies_days: float | None = None,
        report: Callable[[str], None] = _print_stderr,
    ) -> None:
        super().__init__()
        self.path = Path(path)
        self._retain = (retain_days, retain_bodies_days)
        self._prune_at: float | None = 0.0 if retain_days or retain_bodies_days else None  # monotonic; None: off
        self._pruned = retention.Pruned()  # by the run of the pruning under way
        self._prune_runs = 0
        # DuckDB keeps the blocks it wrote cached up to its memory limit (80% of RAM by default):
        # without a limit of its own, a proxy that runs for weeks grows with its database.
        self._memory_limit_mb = memory_limit_mb
        self._interval = flush_interval_s
        self._max_requests = max_pending_requests
        self._max_chunks = max_pending_chunks
        self._record_chunks = record_chunks
        self._report_fn = report
        self._lock = threading.Lock()
        self._written = threading.Condition(self._lock)
        self._requests: list[tuple[Any, ...]] = []  # in column order (batch.RowTable.encode)
        self._unfit: list[Exception] = []  # why rows put since the last take could not be encoded
        self._chunks: list[Any] = []  # each a request's ChunkRows, or one row (batch.ChunkTable)
        self._chunk_rows = 0  # the rows in _chunks
        self._put_seq = 0  # requests accepted by put()
        self._done_seq = 0  # of those, how many the writer has finished with
        self._inflight = [0, 0]  # requests, chunks taken by the writer and not yet finished
        self._bodies: list[tuple[Any, ...]] = []
        self._body_bytes = 0
        self._agent_events: list[tuple[Any, ...]] = []  # schema.AGENT_EVENT_COLUMNS, in order
        self._counts = dict.fromkeys(
            ("requests_written", "chunks_written", "bodies_written", "requests_dropped", "chunks_dropped",
             "bodies_dropped", "write_errors", "rows_rejected", "files_recreated", "requests_pruned",
             "chunks_pruned", "bodies_pruned", "agent_events_written", "agent_events_dropped"), 0)
        self._last_error: str | None = None
        self._failing: tuple[datetime, float] | None = None  # writes fail since (UTC label, monotonic)
        self._warnings: deque[str] = deque(maxlen=10)  # what /_llmtap/health shows besides the counts
        self._file: tuple[int, int] | None = None  # (st_dev, st_ino) of the file opened (_check_file)
        self._dropping = False  # the queue is full: reported once, until a write succeeds
        self._closed = False
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._abandon = threading.Event()
        self._cur: duckdb.DuckDBPyConnection | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> None:
        if self._closed or self._con is not None:
            raise StoreError("a Store starts once")
        con = _open_for_writing(self.path)
        try:
            with duck.private_umask():
                migrate(con)
            cur = self._writer_cursor(con)
        except duckdb.Error as exc:
            con.close()
            raise StoreError(f"cannot prepare the database {self.path}: {one_line(exc)}") from exc
        self._con, self._cur = con, cur
        self._file = _file_id(self.path)
        self._thread = threading.Thread(target=self._run, name="llmtap-store", daemon=True)
        self._thread.start()

    def _writer_cursor(self, con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
        """The writer's cursor, after the instance is locked down: queries through the admin
        endpoint (`query`) read the database and touch nothing else (duck.lock_down)."""
        if self._memory_limit_mb:
            con.execute(f"SET memory_limit = '{int(self._memory_limit_mb)}MiB'")
        con.execute("SET GLOBAL TimeZone = 'UTC'")
        con.execute(f"SET threads = {WRITER_THREADS}")  # the instance's: queries through the proxy too
        duck.lock_down(con)
        return con.cursor()

    def close(self, timeout: float = 10) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        thread = self._thread
        if thread is not None:
            self._stop.set()
            self._wake.set()
            thread.join(timeout)
            if thread.is_alive():  # still failing to write: give up on what is left
                self._give_up(thread)
        self._drop_pending()
        if thread is None or not thread.is_alive():
            self._close_connection()

    def _give_up(self, thread: threading.Thread) -> None:
        before = self.stats()
        self._abandon.set()
        thread.join(2.0)
        lost = before["pending_requests"], before["pending_chunks"]
        self._report(f"llmtap store: closed without writing {lost[0]} request row(s) and {lost[1]} chunk row(s)"
                     f" to {self.path} ({before['last_error']})")

    @property
    def closed(self) -> bool:
        """close() was called: rows put from now on are dropped."""
        return self._closed

    def _close_connection(self) -> None:
        with self._con_lock, duck.private_umask():
            for con in (self._cur, self._con):
                if con is not None:
                    with contextlib.suppress(duckdb.Error):
                        con.close()
            self._con = self._cur = None

    # -- the event loop's side ---------------------------------------------

    def put(self, row: dict[str, Any], chunks: ChunkRows | list[tuple[Any, ...]] | None = None) -> None:
        """Queue one request's row and its chunk rows. Never blocks, never raises.

        The row is encoded at once; the store keeps the chunk rows as they are (a request's `ChunkRows`,
        or tuples): do not change them.
        A row that cannot be encoded is rejected as the writer rejects rows that do not fit the schema.
        """
        try:
            blob: tuple[Any, ...] | Exception = REQUESTS.encode(row)
        except Exception as exc:  # whatever a row that is not one raises: rejected, reported by the writer
            blob = exc
        try:
            n = len(chunks) if chunks and self._record_chunks else 0
            with self._lock:
                if self._closed or len(self._requests) >= self._max_requests:
                    self._counts["requests_dropped"] += 1
                    self._counts["chunks_dropped"] += n
                    first = not self._closed and not self._dropping
                    self._dropping = self._dropping or first
                    waiting = len(self._requests) + self._inflight[0]
                else:
                    first = None
                    if n and self._chunk_rows + n > self._max_chunks:
                        self._counts["chunks_dropped"] += n
                    elif n:
                        if isinstance(chunks, ChunkRows):
                            self._chunks.append(chunks)
                        else:
                            self._chunks.extend(chunks)  # type: ignore[arg-type]
                        self._chunk_rows += n
                    if not isinstance(blob, Exception):
                        self._requests.append(blob)
                    else:
                        self._unfit.append(blob)
                    self._put_seq += 1
                    wake = len(self._requests) >= WAKE_REQUESTS or self._chunk_rows >= WAKE_CHUNKS
            if first is not None:
                if first:
                    self._report(f"llmtap store: {waiting} request rows are waiting to be written to {self.path};"
                                 " new rows are dropped until it can be written again")
                return
            if wake:
                self._wake.set()
        except Exception:
            with self._lock:
                self._counts["requests_dropped"] += 1

    def put_body(self, row: tuple[Any, ...]) -> None:
        """Queue one `bodies` row (schema.BODY_COLUMNS), before its request's `put`. Never blocks, never raises."""
        try:
            size = sum(len(v) for v in row[1:3] if v)
            with self._lock:
                if self._closed or self._body_bytes + size > MAX_PENDING_BODY_BYTES:
                    self._counts["bodies_dropped"] += 1
                    return
                self._bodies.append(row)
                self._body_bytes += size
        except Exception:
            with self._lock:
                self._counts["bodies_dropped"] += 1

    def put_agent_events(self, rows: list[tuple[Any, ...]]) -> None:
        """Queue `agent_events` rows (schema.AGENT_EVENT_COLUMNS), written with the next batch. Never blocks."""
        with self._lock:
            if self._closed or len(self._agent_events) + len(rows) > MAX_PENDING_AGENT_EVENTS:
                self._counts["agent_events_dropped"] += len(rows)
                return
            self._agent_events.extend(rows)
            self._put_seq += 1  # `flush` waits for them too

    def flush(self, timeout: float = 10) -> bool:
        """Wait until every row put before the call is written (or dropped); False on timeout."""
        with self._lock:
            target = self._put_seq
            if self._thread is None or not self._thread.is_alive():
                return self._done_seq >= target
        self._wake.set()
        with self._lock:
            return self._written.wait_for(lambda: self._done_seq >= target, timeout)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                **self._counts,
                "pending_requests": len(self._requests) + self._inflight[0],
                "pending_chunks": self._chunk_rows + self._inflight[1],
                "pending_bodies": len(self._bodies),
                "last_error": self._last_error,
                "failing_since": self._failing[0].isoformat() if self._failing else None,
                "write_failing_s": round(time.monotonic() - self._failing[1], 3) if self._failing else 0.0,
                "warnings": [w for w in (self._failing_warning(),) if w] + list(self._warnings),
            }

    def _failing_warning(self) -> str | None:
        """While no write succeeds (under the lock): since when, and what waits or was lost meanwhile."""
        if self._failing is None:
            return None
        since, started = self._failing
        waiting = len(self._requests) + self._inflight[0], self._chunk_rows + self._inflight[1]
        dropped = self._counts["requests_dropped"]
        return (f"cannot write to {self.path} since {since:%Y-%m-%d %H:%M:%S} UTC "
                f"({time.monotonic() - started:.0f} s, {self._counts['write_errors']} failed attempt(s) so far; "
                f"last: {self._last_error}): {waiting[0]} request row(s) and {waiting[1]} chunk row(s) wait in "
                f"memory and are lost if the process stops now; {dropped} request row(s) dropped so far "
                f"(the queue holds {self._max_requests:,})")

    # -- the writer thread -----------------------------------------------------

    def _run(self) -> None:
        thread_priority.lower_this_thread()  # the event loop first (proxy/common/thread_priority.py)
        taken = time.monotonic()
        while True:
            # Every interval from the last take, however long the write took: a crash loses at most
            # the rows of one interval plus those of the write under way.
            self._wake.wait(max(0.0, taken + self._interval - time.monotonic()))
            self._wake.clear()
            taken = time.monotonic()
            self._check_file()
            with self._lock:
                requests, chunks, bodies, seq = self._requests, self._chunks, self._bodies, self._put_seq
                agents, self._agent_events = self._agent_events, []
                unfit, self._unfit = self._unfit, []
                self._inflight = [len(requests), self._chunk_rows]
                self._requests, self._chunks, self._bodies, self._body_bytes, self._chunk_rows = [], [], [], 0, 0
            if requests or chunks or bodies or unfit or agents:
                self._write_batch(requests, chunks, bodies, unfit, agents)
            if self._prune_at is not None and taken >= self._prune_at and not self._stop.is_set():
                self._prune()
            with self._lock:
                self._done_seq = seq
                self._inflight = [0, 0]
                self._written.notify_all()
                if self._stop.is_set() and not (self._requests or self._chunks or self._bodies or self._agent_events):
                    return

    def _write_batch(self, requests: list[Any], chunks: list[Any], bodies: list[Any] | None = None,
                     unfit: list[Exception] | None = None, agents: list[Any] | None = None) -> None:
        first: Unit = [(t, rows) for t, rows in ((REQUESTS, requests), (CHUNKS, chunks), (BODIES, bodies or []),
                                                 (AGENT_EVENTS, agents or [])) if rows]
        units: deque[Unit] = deque([first] if first else [])
        rejected: dict[str, int] = {"requests": len(unfit or ()), "chunks": 0, "bodies": 0, "agent_events": 0}
        first_failure: Exception | None = unfit[0] if unfit else None
        delay = RETRY_FIRST_S
        failures = 0
        while units:
            if self._abandon.is_set():
                self._drop(units)
                return
            try:
                if self._cur is None:
                    self._reopen()
                self._write_unit(units[0])
            except _DATA_ERRORS as exc:
                first_failure = first_failure or exc
                units.extendleft(reversed(_split(units.popleft(), rejected)))
                continue
            except Exception as exc:  # noqa: BLE001 - the writer must survive anything
                failures += 1
                if _invalidated(exc):
                    self._close_connection()  # the next attempt opens the file anew
                self._failed(exc, first=failures == 1)
                self._abandon.wait(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            if self._wrote(units.popleft()) or failures:
                self._recovered(failures)
                failures, delay = 0, RETRY_FIRST_S
        if first_failure is not None:
            self._rejected(rejected, first_failure)

    def _write_unit(self, unit: Unit) -> None:
        cur = self._cur
        if cur is None:
            raise StoreError("the store is closed")
        with duck.private_umask():
            cur.execute("BEGIN TRANSACTION")
            try:
                for table, rows in unit:
                    table.insert(cur, rows)
                cur.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(duckdb.Error):
                    cur.execute("ROLLBACK")
                raise

    def _wrote(self, unit: Unit) -> bool:
        """Count what was written; True if rows had been dropped for want of room until now."""
        with self._lock:
            for table, rows in unit:
                self._counts[f"{table.name}_written"] += table.count(rows)
            was_dropping, self._dropping = self._dropping, False
        return was_dropping

    def _recovered(self, failures: int) -> None:
        with self._lock:
            self._failing = None
            dropped = self._counts["requests_dropped"]
        after = f" after {failures} failed attempt(s)" if failures else ""
        lost = f"; {dropped} request row(s) dropped so far" if dropped else ""
        self._report(f"llmtap store: writing to {self.path} again{after}{lost}")

    def _reopen(self) -> None:
        """Open the file anew: DuckDB invalidates a database after a fatal error, such as a
        checkpoint that failed on a full disk, and only a new instance can write again."""
        con = _open_for_writing(self.path)
        try:
            with duck.private_umask():
                migrate(con)  # a file created anew (see _check_file): its tables; a no-op otherwise
            cur = self._writer_cursor(con)
        except duckdb.Error:
            con.close()
            raise
        with self._con_lock:
            self._con, self._cur = con, cur
        self._file = _file_id(self.path)

    def _check_file(self) -> None:
        """The database file removed or replaced while serving (`rm`, another file renamed over it):
        DuckDB would go on writing to the file it holds open, which no one can open again. One
        `os.stat` per wake of the writer, before it writes: when the path no longer names the file
        opened, close it and open the path anew (a new file, with its tables, or the one put
        there), so that the rows from now on land there; reported once, and in `stats()`."""
        now = _file_id(self.path)
        if self._cur is None or self._file is None or now == self._file:
            return
        what = "removed" if now is None else "replaced"
        self._close_connection()  # first: the old instance's .wal goes with it, never into the new file
        try:
            self._reopen()
        except Exception as exc:  # noqa: BLE001 - the write loop retries the open (_write_batch)
            warning = (f"llmtap store: {self.path} was {what} while serving and cannot be opened anew "
                       f"({_describe(exc)}); retrying")
        else:
            kept = "recreated it" if what == "removed" else "opened the new file"
            warning = f"llmtap store: {self.path} was {what} while serving; {kept}, rows from now on are kept there"
        with self._lock:
            self._counts["files_recreated"] += 1
            self._warnings.append(warning)
        self._report(warning)

    def _prune(self) -> None:
        """One step of retention (retention.prune_step): the oldest requests past `retain_days`, with
        their chunks and bodies, or bodies past `retain_bodies_days`. While more are left the writer
        wakes again at once, writing new rows between two steps; when none are, what this run deleted
        is reported (the first run's always, later ones' when they deleted something), and the next
        run is PRUNE_INTERVAL_S later. A failure is reported and tried again at the next run."""
        days, body_days = self._retain
        now = datetime.now(timezone.utc)
        try:
            if self._cur is None:
                self._reopen()
            assert self._cur is not None
            done, more = retention.prune_step(self._cur, rows_before=now - timedelta(days=days) if days else None,
                                              bodies_before=now - timedelta(days=body_days) if body_days else None)
        except Exception as exc:  # noqa: BLE001 - the writer must survive anything
            if _invalidated(exc):
                self._close_connection()
            self._report(f"llmtap store: cannot delete old rows from {self.path}: {_describe(exc)}; "
                         f"trying again in {_span(PRUNE_INTERVAL_S)}")
            self._prune_at = time.monotonic() + PRUNE_INTERVAL_S
            return
        with self._lock:
            for table in ("requests", "chunks", "bodies"):
                self._counts[f"{table}_pruned"] += getattr(done, table)
        self._pruned.add(done)
        if more:
            self._wake.set()
            return
        if self._prune_runs == 0 or self._pruned.requests or self._pruned.bodies:
            kept = [f"{what} older than {n:g} day(s)" for what, n in (("requests", days), ("bodies", body_days)) if n]
            self._report(f"llmtap store: retention deleted {self._pruned.describe()} from {self.path} "
                         f"({', '.join(kept)}); next in {_span(PRUNE_INTERVAL_S)}")
        self._prune_runs += 1
        self._pruned = retention.Pruned()
        self._prune_at = time.monotonic() + PRUNE_INTERVAL_S

    def _drop(self, units: deque[Unit]) -> None:
        with self._lock:
            for unit in units:
                for table, rows in unit:
                    self._counts[f"{table.name}_dropped"] += table.count(rows)

    def _drop_pending(self) -> None:
        with self._lock:
            self._counts["requests_dropped"] += len(self._requests) + len(self._unfit)
            self._counts["rows_rejected"] += len(self._unfit)
            self._counts["chunks_dropped"] += self._chunk_rows
            self._counts["bodies_dropped"] += len(self._bodies)
            self._counts["agent_events_dropped"] += len(self._agent_events)
            self._agent_events = []
            self._requests, self._chunks, self._bodies, self._body_bytes, self._unfit = [], [], [], 0, []
            self._chunk_rows = 0
            self._done_seq = self._put_seq
            self._written.notify_all()

    def _failed(self, exc: Exception, *, first: bool) -> None:
        with self._lock:
            self._counts["write_errors"] += 1
            self._last_error = _describe(exc)
            if self._failing is None:
                self._failing = (datetime.now(timezone.utc), time.monotonic())
        if first:
            self._report(f"llmtap store: cannot write to {self.path}: {_describe(exc)}; retrying")

    def _rejected(self, rejected: dict[str, int], exc: Exception) -> None:
        with self._lock:
            for table, n in rejected.items():
                self._counts[f"{table}_dropped"] += n
            self._counts["rows_rejected"] += sum(rejected.values())
            self._last_error = _describe(exc)
        self._report(
            f"llmtap store: dropped {rejected['requests']} request row(s) and {rejected['chunks']} "
            f"chunk row(s) that do not fit the schema ({_describe(exc)})"
        )

    def _report(self, message: str) -> None:
        with contextlib.suppress(Exception):
            self._report_fn(message)

def _split(unit: Unit, rejected: dict[str, int]) -> list[Unit]:
    """A unit that failed on its data: its tables apart, then halves; a single row is rejected."""
    if len(unit) > 1:
        return [[part] for part in unit]
    ((table, rows),) = unit
    if len(rows) == 1:
        rejected[table.name] += table.count(rows)  # one row, or one request's chunk rows
        return []
    mid = len(rows) // 2
    return [[(table, rows[:mid])], [(table, rows[mid:])]]


def _open_for_writing(path: Path) -> duckdb.DuckDBPyConnection:
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create the directory for the database {path}: {exc.strerror}") from exc
    try:
        with duck.private_umask():
            return duck.connect(path)
    except duckdb.Error as exc:
        raise open_error(path, exc) from exc


def _file_id(path: Path) -> tuple[int, int] | None:
    """Which file the path names now (device and inode); None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _invalidated(exc: BaseException) -> bool:
    return isinstance(exc, duckdb.FatalException) or "database has been invalidated" in str(exc)


def _span(seconds: float) -> str:
    return f"{seconds / 3600:g} h" if seconds >= 3600 else f"{seconds:g} s"


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {one_line(exc)}"
