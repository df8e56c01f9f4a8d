"""Rows per second the store writes, with the insert method it uses and the alternatives.

  store           end to end through Store.put() and Store.flush(): put() makes a request
                  row its tuple; request and chunk rows go in as Arrow arrays built by
                  nanoarrow (proxy/record/batch.py)
  json            request rows as JSON text parsed by DuckDB (`from_json_strict`): the store's
                  way until #32 (encoded inside the timing)
  batch           the same INSERTs on a bare connection, as many rows per INSERT as Store
                  (request rows encoded first, inside the timing)
  typed unnest    INSERT INTO t SELECT c0::T0, ... FROM (SELECT unnest($1) AS c0, ...) with one
                  duckdb.ListValue of the column's type per parameter (the store's method until
                  it used Arrow): DuckDB converts each Python value itself
  executemany     INSERT INTO t VALUES (?, ...) once per row

"stall" is the longest another thread waited for the GIL meanwhile: building the
batches holds it, and the event loop that calls put() would wait as long. The GIL
switch interval is `llmtap serve`'s (proxy/serve/server.py SWITCH_INTERVAL_S, 0.5 ms), not
CPython's default 5 ms. On a busy machine the OS scheduler adds its own share.

Run: python benchmarks/store_throughput.py [--requests N] [--chunk-requests N] [--chunks-per-request N]
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb

from array import array
from itertools import accumulate

import nanoarrow as na
import orjson

from proxy.record.batch import BATCH_VIEW, CHUNKS, REQUESTS, RowTable, Table
from proxy.record.migrations import migrate
from proxy.serve.server import SWITCH_INTERVAL_S
from proxy.common.schema import CHUNK_COLUMNS, REQUEST_COLUMNS
from proxy.record.store import Store


def request_row(i: int) -> dict[str, Any]:
    row = {
        "id": f"req_{i:010d}", "started_at": dt.datetime.now(dt.timezone.utc), "route": "openai",
        "upstream_host": "api.openai.com", "method": "POST", "path": "/v1/chat/completions",
        "dialect": "openai_chat", "tool": "python-openai", "user_agent": "OpenAI/Python 1.54.0",
        "tag": None, "key_fingerprint": "sk-...a1b2", "session_id": None,
        "request_model": "gpt-4.1-mini", "stream": True, "max_tokens": 1024, "message_count": 3,
        "request_bytes": 2048, "request_parse_error": None, "status": 200,
        "response_model": "gpt-4.1-mini-2025-04-14", "finish_reason": "stop", "response_bytes": 40960,
        "error_type": None, "error_message": None, "outcome": "ok", "parse_error": None,
        "empty_choices_chunks": 1, "retry_after": None, "proxy_overhead_ms": 0.21,
        "upstream_headers_ms": 180.5, "first_byte_ms": 181.0, "ttft_ms": 230.2, "first_text_ms": 230.2,
        "last_token_ms": 2900.7, "e2e_ms": 2901.3, "tpot_ms": 10.4, "gap_p50_ms": 9.8, "gap_p99_ms": 31.0,
        "gap_max_ms": 55.2, "output_events": 258, "output_tokens_per_s": 96.1, "input_tokens": 812,
        "output_tokens": 256, "cache_read_tokens": 0, "cache_creation_tokens": None,
        "reasoning_tokens": 0, "tokens_source": "usage",
    }
    # every later column (kind, the breakdown, rate limits, ...) as NULL: a full row, as the meter's are
    return {name: row.get(name) for name, _ in REQUEST_COLUMNS}


def chunk_rows(request_id: str, n: int) -> list[tuple[Any, ...]]:
    return [(request_id, seq, 230.2 + seq * 10.4, 160, "chat.completion.chunk") for seq in range(n)]


class StallMeter:
    """A thread that sleeps 1 ms at a time and records the longest oversleep."""

    def __init__(self) -> None:
        self.worst_ms = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.perf_counter()
            time.sleep(0.001)
            self.worst_ms = max(self.worst_ms, (time.perf_counter() - t - 0.001) * 1000)

    def __enter__(self) -> "StallMeter":
        gc.collect()
        gc.freeze()  # the test data's own garbage-collector passes are not the store's
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        gc.unfreeze()


def fresh_db(tmp: Path) -> Path:
    return Path(tempfile.mkdtemp(dir=tmp)) / "llmtap.duckdb"


def through_store(tmp: Path, n_requests: int, chunks_per_request: int) -> dict[str, float]:
    rows = [request_row(i) for i in range(n_requests)]
    chunks = [chunk_rows(r["id"], chunks_per_request) for r in rows]
    store = Store(fresh_db(tmp), max_pending_requests=10**7, max_pending_chunks=10**8)
    store.start()
    with StallMeter() as stall:
        started = time.perf_counter()
        for row, cs in zip(rows, chunks):
            store.put(row, cs)
        put_s = time.perf_counter() - started
        assert store.flush(600)
        elapsed = time.perf_counter() - started
    stats = store.stats()
    store.close()
    assert stats["requests_written"] == n_requests and stats["requests_dropped"] == 0, stats
    rows_written = n_requests * chunks_per_request or n_requests
    return {"rows_per_s": rows_written / elapsed, "put_us": put_s / n_requests * 1e6, "stall_ms": stall.worst_ms}


def bare(tmp: Path, method: str, table: Table, rows: list[Any]) -> dict[str, float]:
    con = duckdb.connect(str(fresh_db(tmp)))
    migrate(con)
    with StallMeter() as stall:
        started = time.perf_counter()
        con.execute("BEGIN TRANSACTION")
        if method == "executemany":
            sql = f"INSERT INTO {table.name} VALUES ({', '.join('?' * len(table.names))})"
            con.executemany(sql, [tuple(r[n] for n in table.names) if isinstance(r, dict) else r for r in rows])
        elif method == "batch":
            table.insert(con, [table.encode(r) for r in rows] if isinstance(table, (RowTable, JsonTable)) else rows)
        else:
            sql = typed_unnest_sql(table)
            types = [duckdb.sqltype(t) for _, t in TYPES[table.name]]
            step = table.rows_per_insert
            for part in (rows[i:i + step] for i in range(0, len(rows), step)):
                columns = ([r[n] for r in part] for n in table.names) if table.name == "requests" else zip(*part)
                con.execute(sql, [duckdb.ListValue(list(col), t) for col, t in zip(columns, types)])
        con.execute("COMMIT")
        elapsed = time.perf_counter() - started
    con.close()
    return {"rows_per_s": len(rows) / elapsed, "stall_ms": stall.worst_ms}


TYPES = {"requests": REQUEST_COLUMNS, "chunks": CHUNK_COLUMNS}


class JsonTable(Table):
    """The store's way with request rows until #32: each row's JSON text (orjson, on the loop),
    parsed by DuckDB in one INSERT (`from_json_strict`)."""

    def __init__(self, name: str, columns: tuple[tuple[str, str], ...], rows_per_insert: int) -> None:
        super().__init__(name, columns, rows_per_insert)
        struct = ", ".join(f'"{n}": "{t}"' for n, t in columns)
        self.sql = (f"INSERT INTO {name} ({', '.join(self.names)}) "
                    f"SELECT unnest(from_json_strict(j, '{{{struct}}}')) FROM {BATCH_VIEW}")

    def encode(self, row: dict[str, Any]) -> bytes:
        return orjson.dumps(row if len(row) == len(self.names) else {n: row.get(n) for n in self.names})

    def batch(self, rows: list[bytes]) -> na.ArrayStream:
        offsets = array("q", [0])
        offsets.extend(accumulate(map(len, rows)))
        text = na.c_array_from_buffers(na.large_string(), len(rows), [None, offsets, b"".join(rows)])
        return na.ArrayStream(na.c_array_from_buffers(na.struct({"j": na.large_string()}), len(rows), [None],
                                                      children=[text]))


JSON_REQUESTS = JsonTable("requests", REQUEST_COLUMNS, 2_000)


def typed_unnest_sql(table: Table) -> str:
    columns = TYPES[table.name]
    casts = ", ".join(f"c{i}::{t}" for i, (_, t) in enumerate(columns))
    unnests = ", ".join(f"unnest(${i + 1}) AS c{i}" for i in range(len(columns)))
    return f"INSERT INTO {table.name} ({', '.join(table.names)}) SELECT {casts} FROM (SELECT {unnests})"


def median_of(n: int, fn: Callable[..., dict[str, float]], *args: Any) -> dict[str, float]:
    """Each figure's median over n runs: the machine may be busy with other work."""
    runs = [fn(*args) for _ in range(n)]
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50_000, help="request rows, no chunks")
    parser.add_argument("--chunk-requests", type=int, default=5_000, help="requests of the chunk run")
    parser.add_argument("--chunks-per-request", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3, help="print the median of this many runs")
    args = parser.parse_args()
    sys.setswitchinterval(SWITCH_INTERVAL_S)  # as in `llmtap serve`
    reqs = [request_row(i) for i in range(20_000)]
    chunks = [c for r in reqs[:1000] for c in chunk_rows(r["id"], 200)]
    lines = []
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        r = median_of(args.runs, through_store, tmp, args.requests, 0)
        lines.append(("store", "requests", r, f"{args.requests:,} requests, put() {r['put_us']:.1f} us"))
        c = median_of(args.runs, through_store, tmp, args.chunk_requests, args.chunks_per_request)
        lines.append(("store", "chunks", c, f"{args.chunk_requests:,} requests x {args.chunks_per_request}"
                      f" chunks, put() {c['put_us']:.1f} us"))
        for method, n_req, n_chunk in (("batch", 20_000, 200_000), ("json", 20_000, 0), ("typed", 20_000, 200_000),
                                       ("executemany", 1_000, 10_000)):
            for table, data in ((REQUESTS, reqs[:n_req]), (CHUNKS, chunks[:n_chunk])):
                if not data:
                    continue
                table = JSON_REQUESTS if method == "json" else table
                res = median_of(args.runs, bare, tmp, "batch" if method == "json" else method, table, data)
                name = {"typed": "typed unnest", "json": "json (until #32)"}.get(method, method)
                per_insert = "" if method == "executemany" else f", {table.rows_per_insert:,} per INSERT"
                note = f"{len(data):,} rows{per_insert}"
                lines.append((name, table.name, res, note))
    print(f"duckdb {duckdb.__version__}, median of {args.runs} runs")
    for name, table_name, res, note in lines:
        print(f"{name:15} {table_name:9} {res['rows_per_s']:>10,.0f} rows/s"
              f"   stall {res['stall_ms']:6.1f} ms   ({note})")


if __name__ == "__main__":
    main()
