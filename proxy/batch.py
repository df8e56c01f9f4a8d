"""How a batch of rows becomes one INSERT: one Arrow column per table column.

DuckDB converts Python values one by one at 0.4-0.9 µs each (with every
column a typed list parameter, the fastest way through its Python API), some
20 µs for a request row of 47 columns. Built as Arrow arrays by nanoarrow
(Apache Arrow's small C library) and scanned by DuckDB without conversion, the
same row costs about 8 µs: the writer shares the proxy's core, so this is CPU
the relay gets back (see benchmarks/store_throughput.py).

A value that does not fit its column (a string for a number, an integer over
64 bits) makes `columns()` raise ValueError, which the store treats as bad data:
it splits the batch to find and drop that row.
"""

from __future__ import annotations

import contextlib
import operator
from datetime import datetime
from typing import Any

import duckdb
import nanoarrow as na

from .schema import BODY_COLUMNS, CHUNK_COLUMNS, REQUEST_COLUMNS

BATCH_VIEW = "llmtap_insert_batch"  # registered on the writer's own cursor for one INSERT
_ARROW_TYPES = {
    "VARCHAR": na.string(),
    "BOOLEAN": na.bool_(),
    "INTEGER": na.int32(),
    "BIGINT": na.int64(),
    "DOUBLE": na.float64(),
    "TIMESTAMPTZ": na.timestamp("us", timezone="UTC"),
}


def _micros(value: datetime | None) -> int | None:
    """An aware datetime as microseconds since the epoch (exact: a float's error here is under 0.3 µs).
    A naive one is refused: its zone is unknown."""
    if value is None:
        return None
    if value.tzinfo is None:
        raise ValueError("a TIMESTAMPTZ value must be an aware datetime")
    return round(value.timestamp() * 1e6)


class Table:
    """One table's rows, as dicts (`requests`) or tuples in column order (`chunks`, `bodies`)."""

    def __init__(self, name: str, columns: tuple[tuple[str, str], ...], rows_per_insert: int) -> None:
        self.name = name
        self.names = tuple(n for n, _ in columns)
        self.types = tuple(_ARROW_TYPES[t] for _, t in columns)
        self._pick = operator.itemgetter(*self.names)
        self.timestamps = frozenset(i for i, (_, t) in enumerate(columns) if t == "TIMESTAMPTZ")
        self.struct = na.struct(dict(zip(self.names, self.types)))
        # Each INSERT holds the GIL while it builds its arrays: short ones keep the event loop's waits short.
        self.rows_per_insert = rows_per_insert
        self.sql = f"INSERT INTO {name} ({', '.join(self.names)}) SELECT * FROM {BATCH_VIEW}"

    def columns(self, rows: list[Any]) -> list[Any]:
        if rows and isinstance(rows[0], dict):
            try:  # the meter's rows have every column: picked in C, twice as fast as one get each
                cols: list[Any] = list(zip(*map(self._pick, rows)))
            except KeyError:
                cols = [[row.get(name) for row in rows] for name in self.names]
        else:
            width = len(self.names)
            if any(len(row) != width for row in rows):
                raise ValueError(f"a {self.name} row is not a tuple of {width} values")
            cols = list(zip(*rows))
        for i in self.timestamps:
            cols[i] = [_micros(v) for v in cols[i]]
        return cols

    def batch(self, rows: list[Any]) -> na.ArrayStream:
        """The rows as one Arrow struct array, in a stream DuckDB scans."""
        try:
            children = [na.c_array(col, t) for col, t in zip(self.columns(rows), self.types)]
        except (TypeError, OverflowError, AttributeError) as exc:  # as nanoarrow's own ValueError: bad data
            raise ValueError(str(exc)) from exc
        return na.ArrayStream(na.c_array_from_buffers(self.struct, len(rows), [None], children=children))

    def insert(self, cur: duckdb.DuckDBPyConnection, rows: list[Any]) -> None:
        """INSERT every row, `rows_per_insert` at a time, in the caller's transaction."""
        step = self.rows_per_insert
        for i in range(0, len(rows), step):
            cur.register(BATCH_VIEW, self.batch(rows[i:i + step]))
            try:
                cur.execute(self.sql)
            finally:  # in an aborted transaction this fails too; the original error is the one to see
                with contextlib.suppress(duckdb.Error):
                    cur.unregister(BATCH_VIEW)


REQUESTS = Table("requests", REQUEST_COLUMNS, 2_000)
CHUNKS = Table("chunks", CHUNK_COLUMNS, 10_000)
BODIES = Table("bodies", BODY_COLUMNS, 200)
