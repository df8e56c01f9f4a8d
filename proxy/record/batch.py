"""How a batch of rows becomes one INSERT.

`requests` rows are queued as their JSON text, one `orjson.dumps` each as the row is
put, and DuckDB parses a batch of them in one INSERT (`from_json_strict`, in C++).
Queued as text, a row's Python objects are freed at once, while the code that made
them is still warm: side by side in a saturated `llmtap serve`, each request costs
8 µs less than with the row kept as a dict until the writer converts it to Arrow
(benchmarks/paired_cost.py --against; benchmarks/HISTORY.md "Fourth round"), though
on its own the JSON path takes more CPU per row (benchmarks/store_throughput.py).

`chunks` and `bodies` rows are tuples in column order, built as Arrow arrays by
nanoarrow (Apache Arrow's small C library) and scanned by DuckDB without
conversion: some 200 times faster than `executemany` (benchmarks/store_throughput.py).

A row that does not fit its table raises ValueError, from `JsonTable.encode` (not a
dict, a naive datetime, an integer over 64 bits), from `columns()` or from DuckDB's
cast (text in a number column, a number too large for its column); the store
rejects that row and keeps the others.
"""

from __future__ import annotations

import contextlib
from array import array
from datetime import datetime
from itertools import accumulate
from typing import Any

import duckdb
import nanoarrow as na
import orjson

from proxy.common.schema import BODY_COLUMNS, CHUNK_COLUMNS, REQUEST_COLUMNS

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
    """One table's rows as tuples in column order (`chunks`, `bodies`)."""

    def __init__(self, name: str, columns: tuple[tuple[str, str], ...], rows_per_insert: int) -> None:
        self.name = name
        self.names = tuple(n for n, _ in columns)
        self.types = tuple(_ARROW_TYPES.get(t) for _, t in columns)  # None: a nested type, JSON only
        self.timestamps = frozenset(i for i, (_, t) in enumerate(columns) if t == "TIMESTAMPTZ")
        self.struct = None if None in self.types else na.struct(dict(zip(self.names, self.types)))
        # Each INSERT holds the GIL while it builds its arrays: short ones keep the event loop's waits short.
        self.rows_per_insert = rows_per_insert
        self.sql = f"INSERT INTO {name} ({', '.join(self.names)}) SELECT * FROM {BATCH_VIEW}"

    def columns(self, rows: list[Any]) -> list[Any]:
        width = len(self.names)
        if any(len(row) != width for row in rows):
            raise ValueError(f"a {self.name} row is not a tuple of {width} values")
        cols: list[Any] = list(zip(*rows))
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


class JsonTable(Table):
    """A table whose rows are dicts, queued as their JSON text (`encode`)."""

    def __init__(self, name: str, columns: tuple[tuple[str, str], ...], rows_per_insert: int) -> None:
        super().__init__(name, columns, rows_per_insert)
        self._stamped = tuple(self.names[i] for i in sorted(self.timestamps))
        struct = ", ".join(f'"{n}": "{t}"' for n, t in columns)
        self.sql = (f"INSERT INTO {name} ({', '.join(self.names)}) "
                    f"SELECT unnest(from_json_strict(j, '{{{struct}}}')) FROM {BATCH_VIEW}")

    def encode(self, row: dict[str, Any]) -> bytes:
        """One row as JSON text. A missing column is NULL, as are NaN and infinities (JSON has none)."""
        if not isinstance(row, dict):
            raise ValueError(f"a {self.name} row is a dict, not {type(row).__name__}")
        if len(row) != len(self.names):  # the meter's rows have every column, and only those
            row = {name: row.get(name) for name in self.names}
        for name in self._stamped:
            value = row[name]
            if isinstance(value, datetime) and value.tzinfo is None:
                raise ValueError("a TIMESTAMPTZ value must be an aware datetime")
        try:
            return orjson.dumps(row)
        except orjson.JSONEncodeError as exc:  # an integer over 64 bits, a type JSON lacks
            raise ValueError(f"{self.name} row: {exc}") from exc

    def batch(self, rows: list[bytes]) -> na.ArrayStream:
        """The rows' JSON texts as one column `j`: one buffer and its offsets, no per-row conversion."""
        offsets = array("q", [0])
        offsets.extend(accumulate(map(len, rows)))
        text = na.c_array_from_buffers(na.large_string(), len(rows), [None, offsets, b"".join(rows)])
        return na.ArrayStream(na.c_array_from_buffers(na.struct({"j": na.large_string()}), len(rows), [None],
                                                      children=[text]))


REQUESTS = JsonTable("requests", REQUEST_COLUMNS, 2_000)
CHUNKS = Table("chunks", CHUNK_COLUMNS, 10_000)
BODIES = Table("bodies", BODY_COLUMNS, 200)
