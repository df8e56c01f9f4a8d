"""How a batch of rows becomes one INSERT.

Every table's rows are queued in column order (as tuples; a request's chunk rows as the columns
the meter kept, proxy/common/chunk_rows.py) and go to DuckDB as Arrow arrays built by nanoarrow
(Apache Arrow's small C library), which DuckDB scans without conversion: some 200
times faster than `executemany` (benchmarks/store_throughput.py).

`requests` rows come as dicts (the meter's, in schema order; a worker's; a test's with only some
keys): `RowTable.encode`, on the event loop as the row is put, turns one into its tuple, so the
dict is freed at once and only the values wait for the writer. A request row costs about a third
less CPU so than as JSON text parsed by DuckDB (`from_json_strict`, the store's way until #32:
about 7 µs to encode on the loop and 17-21 µs to parse in the writer, against 1-3 µs and 15;
benchmarks/README.md). Its nested columns (the tool calls) go as JSON text, cast by DuckDB;
NaN and infinities are NULL, as JSON made them (replaced in Python: a CASE per DOUBLE column made
DuckDB plan each INSERT some 1.4 ms longer, which a write of a few dozen rows paid in full).

A row that does not fit its table raises ValueError, from `RowTable.encode` (not a dict, a
naive datetime, every column's width but a key that is no column), from `columns()` or
nanoarrow (an integer over its column's bits, text in a number column) or from DuckDB's cast;
the store rejects that row and keeps the others.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import datetime
from itertools import repeat
from math import isfinite
from typing import Any

import duckdb
import nanoarrow as na
import orjson

from proxy.common.chunk_rows import ChunkRows
from proxy.common.schema import AGENT_EVENT_COLUMNS, BODY_COLUMNS, CHUNK_COLUMNS, REQUEST_COLUMNS

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
    if isinstance(value, str):  # ISO 8601, as a row read back from JSON has it (proxy/serve/spill.py)
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        raise ValueError("a TIMESTAMPTZ value must be an aware datetime")
    return round(value.timestamp() * 1e6)


def _finite(values: tuple[Any, ...]) -> bool:
    """Whether a DOUBLE column holds no NaN and no infinity, in one C-level pass: NaN and infinities
    survive a sum (NULLs and zeros are left out of it); a sum that overflows asks value by value."""
    if isfinite(sum(filter(None, values), 0.0)):
        return True
    return all(v is None or isfinite(v) for v in values)


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

    def count(self, rows: list[Any]) -> int:
        """How many table rows `rows` holds (ChunkTable: some items are many)."""
        return len(rows)

    def batch(self, rows: list[Any]) -> na.ArrayStream:
        """The rows as one Arrow struct array, in a stream DuckDB scans."""
        try:
            children = [na.c_array(col, t) for col, t in zip(self.columns(rows), self.types)]
        except (TypeError, OverflowError, AttributeError) as exc:  # as nanoarrow's own ValueError: bad data
            raise ValueError(str(exc)) from exc
        return na.ArrayStream(na.c_array_from_buffers(self.struct, self.count(rows), [None], children=children))

    def parts(self, rows: list[Any]) -> Iterator[list[Any]]:
        """The rows in parts of `rows_per_insert`, one INSERT each."""
        step = self.rows_per_insert
        for i in range(0, len(rows), step):
            yield rows[i:i + step]

    def insert(self, cur: duckdb.DuckDBPyConnection, rows: list[Any]) -> None:
        """INSERT every row, a part (`parts`) at a time, in the caller's transaction."""
        for part in self.parts(rows):
            cur.register(BATCH_VIEW, self.batch(part))
            try:
                cur.execute(self.sql)
            finally:  # in an aborted transaction this fails too; the original error is the one to see
                with contextlib.suppress(duckdb.Error):
                    cur.unregister(BATCH_VIEW)


class RowTable(Table):
    """A table whose rows are dicts, queued as tuples in column order (`encode`); its nested columns
    (a type nanoarrow does not build) as JSON text that the INSERT casts, its DOUBLE ones with NaN
    and infinities as NULL."""

    def __init__(self, name: str, columns: tuple[tuple[str, str], ...], rows_per_insert: int) -> None:
        super().__init__(name, columns, rows_per_insert)
        self._stamped = tuple(self.names[i] for i in sorted(self.timestamps))
        self.nested = frozenset(i for i, t in enumerate(self.types) if t is None)
        self.types = tuple(na.string() if t is None else t for t in self.types)
        self.struct = na.struct(dict(zip(self.names, self.types)))

        self.doubles = tuple(i for i, (_, t) in enumerate(columns) if t == "DOUBLE")

        def select(i: int, name: str, kind: str) -> str:
            return f"CAST(CAST({name} AS JSON) AS {kind})" if i in self.nested else name

        picks = ", ".join(select(i, n, t) for i, (n, t) in enumerate(columns))
        self.sql = f"INSERT INTO {name} ({', '.join(self.names)}) SELECT {picks} FROM {BATCH_VIEW}"

    def encode(self, row: dict[str, Any]) -> tuple[Any, ...]:
        """One row as its tuple in column order. A missing column is NULL; with fewer or more keys
        than columns, a key that is no column is left out."""
        if not isinstance(row, dict):
            raise ValueError(f"a {self.name} row is a dict, not {type(row).__name__}")
        for name in self._stamped:
            value = row.get(name)
            if isinstance(value, datetime) and value.tzinfo is None:
                raise ValueError("a TIMESTAMPTZ value must be an aware datetime")
        if len(row) != len(self.names):
            return tuple(map(row.get, self.names))
        if tuple(row) != self.names:  # the meter's rows are in column order: one comparison
            if row.keys() != set(self.names):
                raise ValueError(f"{self.name} row: keys that are no column: {sorted(row.keys() - set(self.names))}")
            return tuple(map(row.get, self.names))
        return tuple(row.values())

    def columns(self, rows: list[Any]) -> list[Any]:
        cols = super().columns(rows)
        for i in self.doubles:
            if not _finite(cols[i]):
                cols[i] = [v if v is None or isfinite(v) else None for v in cols[i]]
        for i in self.nested:
            try:
                cols[i] = [None if v is None else orjson.dumps(v).decode() for v in cols[i]]
            except orjson.JSONEncodeError as exc:
                raise ValueError(f"{self.name} row: {exc}") from exc
        return cols


def _rows_in(item: Any) -> int:
    return len(item) if isinstance(item, ChunkRows) else 1


class ChunkTable(Table):
    """The `chunks` table, whose items are a request's `ChunkRows` (its columns, joined here with
    `list.extend`) or single rows (tuples: a spill file's, a test's)."""

    def count(self, rows: list[Any]) -> int:
        return sum(map(_rows_in, rows))

    def columns(self, rows: list[Any]) -> list[Any]:
        loose = [item for item in rows if not isinstance(item, ChunkRows)]
        cols: list[Any] = [list(col) for col in super().columns(loose)] if loose else [[] for _ in self.names]
        ids, seqs, offsets, sizes, kinds = cols
        for item in rows:
            if isinstance(item, ChunkRows):
                ids.extend(repeat(item.request_id, len(item.offsets_ms)))
                seqs.extend(item.seqs)
                offsets.extend(item.offsets_ms)
                sizes.extend(item.sizes)
                kinds.extend(item.kinds)
        if not len(ids) == len(seqs) == len(offsets) == len(sizes) == len(kinds):
            raise ValueError("a request's chunk columns are not of one length")
        return cols

    def parts(self, rows: list[Any]) -> Iterator[list[Any]]:
        """Parts of about `rows_per_insert` rows, a request's rows together."""
        part: list[Any] = []
        n = 0
        for item in rows:
            part.append(item)
            n += _rows_in(item)
            if n >= self.rows_per_insert:
                yield part
                part, n = [], 0
        if part:
            yield part


REQUESTS = RowTable("requests", REQUEST_COLUMNS, 2_000)
CHUNKS = ChunkTable("chunks", CHUNK_COLUMNS, 10_000)
BODIES = Table("bodies", BODY_COLUMNS, 200)
AGENT_EVENTS = Table("agent_events", AGENT_EVENT_COLUMNS, 2_000)
