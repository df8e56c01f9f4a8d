from __future__ import annotations

import collections
import contextlib
import datetime as dt
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import duckdb
import pytest

from proxy.common.chunk_rows import ChunkRows
from proxy.common.schema import CHUNK_COLUMN_NAMES, REQUEST_COLUMN_NAMES, REQUEST_COLUMNS, TOOL_CALLS_TYPE, TOOL_RESULTS_TYPE
from proxy.record.store import Store
from proxy.record.store_reader import DatabaseLocked, StoreError, open_readonly

from .waiting import wait_until_sync

UTC = dt.timezone.utc


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "data" / "llmtap.duckdb"


@pytest.fixture
def reports() -> list[str]:
    return []


@pytest.fixture
def store(db: Path, reports: list[str]):
    s = Store(db, report=reports.append)
    s.start()
    yield s
    s.close(timeout=2)


def full_row(i: int) -> dict[str, Any]:
    """Every column set, with the Python type the meter produces for it."""
    values = {
        "VARCHAR": lambda name: f"{name}-{i}",
        "BOOLEAN": lambda _: i % 2 == 0,
        "BIGINT": lambda _: 10_000_000_000 + i,
        "INTEGER": lambda _: 200 + i,
        "DOUBLE": lambda _: i + 0.25,
        "TIMESTAMPTZ": lambda _: dt.datetime(2025, 3, 4, 5, 6, 7, 890123, tzinfo=UTC) + dt.timedelta(seconds=i),
        TOOL_CALLS_TYPE: lambda _: [{"id": f"call-{i}", "name": "Bash", "ended_ms": i + 0.5},
                                    {"id": None, "name": "Read", "ended_ms": None}],
        TOOL_RESULTS_TYPE: lambda _: [{"id": f"call-{i}", "name": None}],
    }
    return {name: values[type_](name) for name, type_ in REQUEST_COLUMNS}


def rows(con: Any, sql: str) -> list[tuple[Any, ...]]:
    if isinstance(con, Store):
        return con.query(sql)[2]
    return con.execute(sql).fetchall()


# -- what goes in comes out ----------------------------------------------------


def test_rows_and_chunks_read_back_exactly(store: Store, db: Path):
    store.put(full_row(1), [("r1", 0, 12.5, 40, "message_start"), ("r1", 1, 13.0, 7, None)])
    store.put({"id": "sparse", "started_at": dt.datetime(2025, 1, 1, 2, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))})
    assert store.flush(5)
    store.close()

    con = open_readonly(db)
    got = con.execute(f"SELECT {', '.join(REQUEST_COLUMN_NAMES)} FROM requests ORDER BY id").fetchall()
    full = dict(zip(REQUEST_COLUMN_NAMES, got[0]))
    assert full == full_row(1)
    assert all(type(full[k]) is type(v) for k, v in full_row(1).items())
    assert full["started_at"].utcoffset() == dt.timedelta(0)

    sparse = dict(zip(REQUEST_COLUMN_NAMES, got[1]))
    assert sparse["started_at"] == dt.datetime(2025, 1, 1, 0, 0, tzinfo=UTC)
    assert sparse["started_at"].utcoffset() == dt.timedelta(0)
    assert {k for k, v in sparse.items() if v is not None} == {"id", "started_at"}

    chunks = con.execute(f"SELECT {', '.join(CHUNK_COLUMN_NAMES)} FROM chunks ORDER BY seq").fetchall()
    assert chunks == [("r1", 0, 12.5, 40, "message_start"), ("r1", 1, 13.0, 7, None)]
    con.close()


def test_a_requests_chunk_columns_land_as_its_rows_beside_tuples(store: Store, db: Path):
    """The meter's ChunkRows (columns) and rows given as tuples go in the same INSERT; a block
    whose columns do not line up is rejected whole, counted by its rows, and the rest lands."""
    store.put({"id": "cols"}, ChunkRows("cols", range(3), [1.5, 2.5, 9.0], [10, 11, 12], ["text", "text", "tool"]))
    store.put({"id": "capped"}, ChunkRows("capped", [0, 1, 70_000], [1.0, 2.0, 3.0], [1, 2, 3], ["a", "b", "c"]))
    store.put({"id": "tuples"}, [("tuples", 0, 4.0, 5, None)])
    store.put({"id": "uneven"}, ChunkRows("uneven", range(2), [1.0, 2.0], [1], ["a", "b"]))
    assert store.flush(5)
    assert rows(store, "SELECT * FROM chunks ORDER BY request_id, seq") == [
        ("capped", 0, 1.0, 1, "a"), ("capped", 1, 2.0, 2, "b"), ("capped", 70_000, 3.0, 3, "c"),
        ("cols", 0, 1.5, 10, "text"), ("cols", 1, 2.5, 11, "text"), ("cols", 2, 9.0, 12, "tool"),
        ("tuples", 0, 4.0, 5, None)]
    stats = store.stats()
    assert (stats["chunks_written"], stats["chunks_dropped"], stats["requests_written"]) == (7, 2, 4)
    assert ChunkRows("x", range(2), [1.0, 2.0], [3, 4], ["a", "b"])[1] == ("x", 1, 2.0, 4, "b")


def test_a_row_is_written_within_the_flush_interval_without_flush(store: Store):
    store.put({"id": "soon"})
    wait_until_sync(lambda: rows(store, "SELECT count(*) FROM requests") == [(1,)], 1.5, "the row written unflushed")


def test_close_writes_everything_pending(db: Path):
    s = Store(db, flush_interval_s=60)
    s.start()
    for i in range(3000):
        s.put({"id": str(i), "status": 200}, [(str(i), seq, seq * 1.0, 10, "delta") for seq in range(20)])
    s.close()
    s.close()  # idempotent
    assert s.stats()["requests_written"] == 3000
    con = open_readonly(db)
    assert rows(con, "SELECT count(*), count(DISTINCT id) FROM requests") == [(3000, 3000)]
    assert rows(con, "SELECT count(*) FROM chunks") == [(60_000,)]
    con.close()


def test_put_after_close_only_counts_drops(db: Path):
    s = Store(db)
    s.start()
    s.close()
    s.put({"id": "late"}, [("late", 0, 1.0, 1, None)] * 3)
    assert s.stats()["requests_dropped"] == 1 and s.stats()["chunks_dropped"] == 3
    assert s.flush(1)
    with pytest.raises(StoreError):
        s.start()


def test_record_chunks_false_keeps_requests_only(db: Path):
    s = Store(db, record_chunks=False)
    s.start()
    s.put({"id": "a"}, [("a", 0, 1.0, 1, None)])
    s.close()
    con = open_readonly(db)
    assert rows(con, "SELECT (SELECT count(*) FROM requests), (SELECT count(*) FROM chunks)") == [(1, 0)]
    assert s.stats()["chunks_dropped"] == 0
    con.close()


# -- bounded, and never failing the caller ------------------------------------


def test_chunks_are_dropped_before_requests_when_pending_is_full(db: Path):
    s = Store(db, flush_interval_s=60, max_pending_requests=3, max_pending_chunks=5)
    s.start()
    for i in range(5):
        s.put({"id": f"r{i}"}, [(f"r{i}", 0, 1.0, 1, None), (f"r{i}", 1, 2.0, 1, None)])
    stats = s.stats()
    assert (stats["pending_requests"], stats["pending_chunks"]) == (3, 4)
    # r2's chunks did not fit while r2 did; r3 and r4 found the request queue full
    assert (stats["requests_dropped"], stats["chunks_dropped"]) == (2, 6)
    assert s.flush(5)
    assert rows(s, "SELECT id FROM requests ORDER BY id") == [("r0",), ("r1",), ("r2",)]
    assert rows(s, "SELECT DISTINCT request_id FROM chunks ORDER BY 1") == [("r0",), ("r1",)]
    s.put({"id": "r5"})  # room again once written
    s.close()
    assert s.stats()["requests_written"] == 4


def test_rows_that_violate_the_schema_are_dropped_and_the_rest_lands(store: Store, reports: list[str]):
    for i in range(50):
        store.put({"id": f"ok{i}", "status": 200}, [(f"ok{i}", 0, 1.0, 5, "delta")])
    store.put({"id": "bad-status", "status": "teapot"})
    store.put({"id": "bad-seq"}, [("bad-seq", 2**40, 1.0, 5, "delta"), ("bad-seq", 1, 1.0)])
    store.put({"id": "naive", "started_at": dt.datetime(2025, 1, 1)})  # started_at must be aware
    store.put(None)  # type: ignore[arg-type]
    for i in range(50):
        store.put({"id": f"ok{50 + i}", "status": 200})
    assert store.flush(10)

    stats = store.stats()
    assert rows(store, "SELECT count(*) FROM requests WHERE id LIKE 'ok%'") == [(100,)]
    assert rows(store, "SELECT count(*) FROM requests") == [(101,)]  # bad-seq's row is fine
    assert rows(store, "SELECT count(*) FROM chunks") == [(50,)]
    assert stats["requests_written"] == 101 and stats["chunks_written"] == 50
    assert stats["requests_dropped"] == 3 and stats["chunks_dropped"] == 2
    assert stats["rows_rejected"] == 5
    assert len(reports) == 1 and "3 request row(s) and 2 chunk row(s)" in reports[0]


def test_put_never_raises(store: Store):
    store.put({"id": "x"}, chunks=object())  # type: ignore[arg-type]
    store.put({"id": "y"}, chunks=[("y",)])
    assert store.flush(5)
    assert store.stats()["requests_dropped"] == 1
    assert store.stats()["chunks_dropped"] == 1


@contextlib.contextmanager
def requests_table_missing(db: Path):
    """Another connection renames the table away, so every write fails until it is back."""
    con = duckdb.connect(str(db))  # same process, same settings: the same database instance
    con.execute("ALTER TABLE requests RENAME TO requests_away")
    try:
        yield
    finally:
        with contextlib.suppress(duckdb.Error):
            con.execute("ALTER TABLE requests_away RENAME TO requests")
        con.close()


def test_a_failing_write_is_retried_reported_once_and_loses_nothing(store: Store, db: Path, reports):
    with requests_table_missing(db):
        for i in range(10):
            store.put({"id": str(i)})
        assert not store.flush(timeout=1.0)
        stats = store.stats()
        assert stats["write_errors"] >= 3 and "requests" in stats["last_error"]
        assert stats["pending_requests"] == 10
        assert len(reports) == 1 and "retrying" in reports[0]
    assert store.flush(10)
    assert rows(store, "SELECT count(*) FROM requests") == [(10,)]
    assert len(reports) == 2 and "again" in reports[1]


def test_close_gives_up_in_time_when_writes_keep_failing(store: Store, db: Path, reports: list[str]):
    with requests_table_missing(db):
        for i in range(10):
            store.put({"id": str(i)})
        started = time.monotonic()
        store.close(timeout=0.5)
        assert time.monotonic() - started < 4
    assert store.stats()["requests_dropped"] == 10
    assert store.stats()["pending_requests"] == 0
    assert "closed without writing 10 request row(s)" in reports[-1]


def test_open_readonly_in_the_process_that_writes_says_so(store: Store, db: Path):
    with pytest.raises(DatabaseLocked, match="already open in this process"):
        open_readonly(db)


# -- files ---------------------------------------------------------------------------


def test_new_directory_is_0700_and_database_and_wal_are_0600(tmp_path: Path):
    db = tmp_path / "new" / "llmtap.duckdb"
    old = os.umask(0o022)
    try:
        s = Store(db)
        s.start()
        wal = Path(f"{db}.wal")
        with contextlib.closing(duckdb.connect(str(db))) as con:  # the same instance
            con.execute("CHECKPOINT")  # as DuckDB does by itself when the WAL grows
        assert not wal.exists()
        s.put({"id": "a"})
        assert s.flush(5)
        assert wal.exists()
        assert stat.S_IMODE(wal.stat().st_mode) == 0o600
        assert stat.S_IMODE(db.stat().st_mode) == 0o600
        assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700
        s.close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(db.stat().st_mode) == 0o600


def test_a_path_that_is_a_directory_is_a_clear_error(tmp_path: Path):
    with pytest.raises(StoreError, match=f"cannot open the database {tmp_path}"):
        Store(tmp_path).start()


def test_a_file_that_is_not_a_database_is_a_clear_error(tmp_path: Path):
    path = tmp_path / "notes.txt"
    path.write_text("not duckdb\n" * 1000)
    with pytest.raises(StoreError, match="not a valid DuckDB database") as info:
        Store(path).start()
    assert "\n" not in str(info.value)


def test_a_parent_that_is_a_file_is_a_clear_error(tmp_path: Path):
    (tmp_path / "file").write_text("")
    with pytest.raises(StoreError, match="cannot create the directory"):
        Store(tmp_path / "file" / "llmtap.duckdb").start()


HOLD_THE_FILE = """
import duckdb, sys, time
con = duckdb.connect(sys.argv[1])
print("ready", flush=True)
time.sleep(30)
"""


def test_another_process_holding_the_file_is_named(db: Path):
    s = Store(db)
    s.start()
    s.close()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_THE_FILE, str(db)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        with pytest.raises(DatabaseLocked) as info:
            Store(db).start()
        assert info.value.pid == holder.pid
        assert f"PID {holder.pid}" in str(info.value) and "llmtap sql" in str(info.value)
        with pytest.raises(DatabaseLocked, match=f"PID {holder.pid}"):
            open_readonly(db)
    finally:
        holder.kill()
        holder.wait(5)


def test_open_readonly_on_a_missing_file(tmp_path: Path):
    with pytest.raises(StoreError, match="no database at"):
        open_readonly(tmp_path / "nothing.duckdb")
    assert not (tmp_path / "nothing.duckdb").exists()


def test_open_readonly_refuses_writes(store: Store, db: Path):
    store.close()
    con = open_readonly(db)
    with pytest.raises(duckdb.Error):
        con.execute("INSERT INTO requests (id) VALUES ('x')")
    con.close()


# -- queries while serving --------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO requests (id) VALUES ('x')",
        "DROP TABLE requests",
        "SELECT 1; DROP TABLE requests",
        "SELECT 1; SELECT 2",
        "DELETE FROM requests",
        "CREATE TABLE t AS SELECT 1",
        "COPY requests TO '/tmp/llmtap-leak.csv'",
        "ATTACH ':memory:' AS other",
        "PRAGMA version",
        "SET threads = 1",
        "CALL checkpoint()",
        "EXPLAIN ANALYZE INSERT INTO requests (id) VALUES ('x')",
        "",
    ],
)
def test_query_refuses_anything_but_one_read(store: Store, sql: str):
    store.put({"id": "keep"})
    assert store.flush(5)
    with pytest.raises(StoreError, match="only read-only queries"):
        store.query(sql)
    assert rows(store, "SELECT id FROM requests") == [("keep",)]


def test_query_returns_names_types_rows_and_takes_params(store: Store):
    store.put({"id": "a", "status": 200, "started_at": dt.datetime(2025, 1, 1, tzinfo=UTC)})
    store.put({"id": "b", "status": 500})
    assert store.flush(5)
    names, types, got = store.query("SELECT id, status, started_at FROM requests WHERE status < ? ORDER BY id", [300])
    assert names == ["id", "status", "started_at"]
    assert types == ["VARCHAR", "INTEGER", "TIMESTAMP WITH TIME ZONE"]
    assert got == [("a", 200, dt.datetime(2025, 1, 1, tzinfo=UTC))]
    assert len(store.query("SELECT * FROM range(10)", max_rows=3)[2]) == 3
    assert "ttft_ms" in [r[0] for r in store.query("DESCRIBE requests")[2]]
    assert store.query("SUMMARIZE requests")[2]
    assert store.query("EXPLAIN SELECT * FROM requests")[2]
    with pytest.raises(StoreError, match="nope"):
        store.query("SELECT * FROM nope")


def test_query_setup_runs_on_the_query_cursor(store: Store):
    store.query_setup = lambda cur: cur.execute("CREATE TEMP VIEW ok AS SELECT * FROM requests WHERE status = 200")
    store.put({"id": "a", "status": 200})
    store.put({"id": "b", "status": 500})
    assert store.flush(5)
    assert rows(store, "SELECT id FROM ok") == [("a",)]


def test_a_long_query_does_not_stop_rows_being_written(store: Store, tmp_path: Path):
    gate, running = threading.Event(), threading.Event()
    result: dict[str, Any] = {}

    def hold(x: int) -> int:  # a query that runs until the test lets it end
        running.set()
        gate.wait(10)
        return x

    def setup(cur: Any) -> None:  # before every query, on its own cursor
        with contextlib.suppress(duckdb.CatalogException):  # made once for the database
            cur.create_function("hold", hold, ["INTEGER"], "INTEGER")

    store.query_setup = setup

    def long_query() -> None:
        result["rows"] = store.query("SELECT hold(2) AS n")[2]

    reader = threading.Thread(target=long_query, daemon=True)
    reader.start()
    try:
        assert running.wait(10), "the long query did not start"
        for i in range(2000):
            store.put({"id": str(i)}, [(str(i), 0, 1.0, 1, None)])
            if i % 500 == 0:
                time.sleep(0.05)
        assert store.flush(5)
        assert reader.is_alive(), "the long query should still be running"
        assert rows(store, "SELECT count(*) FROM requests") == [(2000,)]
        assert rows(store, "SELECT count(*) FROM chunks") == [(2000,)]
    finally:
        gate.set()
        reader.join(5)
    assert result["rows"] == [(2,)]
    assert store.stats()["requests_dropped"] == 0


def test_timestamps_come_back_in_utc_on_a_machine_in_another_time_zone(db: Path):
    script = """
import datetime as dt, sys
from proxy.record.store import Store
from proxy.record.store_reader import open_readonly
s = Store(sys.argv[1]); s.start()
s.put({"id": "a", "started_at": dt.datetime(2025, 1, 1, 12, 0, tzinfo=dt.timezone.utc)})
assert s.flush(5)
(ts,), = s.query("SELECT started_at FROM requests")[2]
s.close()
(ts2,), = open_readonly(sys.argv[1]).execute("SELECT started_at FROM requests").fetchall()
print(ts.isoformat(), ts2.isoformat())
"""
    env = {**os.environ, "TZ": "Asia/Kolkata"}
    out = subprocess.run([sys.executable, "-c", script, str(db)], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2025-01-01T12:00:00+00:00"] * 2


def test_edge_values_read_back_exactly(store: Store):
    """The Arrow batches (proxy/record/batch.py) keep every value as it was: text with NUL and
    non-ASCII characters, the int64 limits, floats to the last bit, microseconds."""
    texts = ["", "a\x00b", "日本語 ✓ 😀", "x" * 100_000]
    doubles = [0.1 + 0.2, -0.0, 1e-300, 1.7976931348623157e308]
    for i, (text, double) in enumerate(zip(texts, doubles)):
        store.put({"id": f"e{i}", "error_message": text, "e2e_ms": double, "max_tokens": [2**63 - 1, -2**63, 0, -1][i],
                   "started_at": dt.datetime(2025, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC) - dt.timedelta(microseconds=i)},
                  [(f"e{i}", 2**31 - 1, double, -2**31, text)])
    assert store.flush(5)
    got = rows(store, "SELECT error_message, e2e_ms, max_tokens, started_at FROM requests ORDER BY id")
    assert [g[:3] for g in got] == list(zip(texts, doubles, [2**63 - 1, -2**63, 0, -1]))
    assert [g[3].astimezone(UTC) for g in got] == [
        dt.datetime(2025, 12, 31, 23, 59, 59, 999_999 - i, tzinfo=UTC) for i in range(4)]
    assert rows(store, "SELECT offset_ms, event_type FROM chunks ORDER BY request_id") == list(zip(doubles, texts))


def test_a_value_of_the_wrong_type_costs_its_row_only(store: Store, reports: list[str]):
    store.put({"id": "big", "max_tokens": 2**64})  # over BIGINT
    store.put({"id": "text", "e2e_ms": "slow"})
    store.put({"id": "ok", "e2e_ms": 1})  # an int in a DOUBLE column is fine
    assert store.flush(5)
    assert rows(store, "SELECT id, e2e_ms FROM requests") == [("ok", 1.0)]
    assert store.stats()["rows_rejected"] == 2


def test_request_rows_travel_as_json_text(store: Store):
    """Request rows are queued as JSON (batch.JsonTable): what JSON cannot say is said plainly."""
    store.put({"id": "nan", "e2e_ms": float("nan"), "ttft_ms": float("inf")})  # JSON has neither: NULL
    store.put({"id": "extra", "not_a_column": 1, "status": 200})  # a key that is no column is left out
    store.put(collections.OrderedDict(id="ordered", status=201))  # any dict
    assert store.flush(5)
    assert rows(store, "SELECT id, e2e_ms, ttft_ms, status FROM requests ORDER BY id") == [
        ("extra", None, None, 200), ("nan", None, None, None), ("ordered", None, None, 201)]
    assert store.stats()["rows_rejected"] == 0


def test_a_row_of_every_width_but_the_wrong_keys_is_rejected_not_raised(store: Store, reports: list[str]):
    wrong = {name: None for name in REQUEST_COLUMN_NAMES if name != "started_at"} | {"id": "wrong", "zzz": 1}
    store.put(wrong)  # as many keys as columns, one of them no column: encoding it fails inside put
    store.put({"id": "fine"})
    assert store.flush(5)
    assert rows(store, "SELECT id FROM requests") == [("fine",)]
    assert store.stats()["rows_rejected"] == 1 and "1 request row(s)" in reports[0]


@pytest.mark.skipif(sys.platform != "linux", reason="a thread's own nice value is Linux's")
def test_the_writer_thread_runs_below_the_event_loop(db: Path):
    """The writer yields a contended core to the loop: nice raised by 5; the admin SQL threads keep theirs."""
    from proxy.common.thread_priority import BACKGROUND_NICE
    from proxy.record.admin_sql import AdminSql

    s = Store(db)
    s.start()
    sql = AdminSql(5.0)
    try:
        mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

        def nice_of(name: str) -> int | None:
            thread = next((t for t in threading.enumerate() if t.name == name), None)
            return None if thread is None or thread.native_id is None else os.getpriority(os.PRIO_PROCESS, thread.native_id)

        wait_until_sync(lambda: nice_of("llmtap-store") == min(19, mine + BACKGROUND_NICE), 5, "the writer's nice value")
        assert nice_of("llmtap-sql-0") == mine
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine  # the caller's own is untouched
    finally:
        sql.close()
        s.close()
