"""One request's chunk rows (schema.CHUNK_COLUMNS), as the meter keeps them: columns, not tuples.

A stream of a hundred output events has a hundred chunk rows. Made one tuple each, they cost the
event loop a tuple per event as the row is built, and the writer a transposition back into
columns before DuckDB takes them as Arrow arrays (proxy/record/batch.py). `ChunkRows` keeps the
meter's own lists (the event sizes and kinds it appended as it parsed) and the offsets beside
them; the writer joins the columns of a batch of requests with `list.extend`. They travel so to
the store, to a `serve --workers` primary (pickled: fewer objects than tuples) and to a spill file
(as rows: `rows()`).

It reads as the list of its rows too (`len`, iteration, indexing), for what wants tuples.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, overload


@dataclass(frozen=True, slots=True)
class ChunkRows:
    """The chunk rows of request `request_id`: row i is (request_id, seqs[i], offsets_ms[i], sizes[i],
    kinds[i]). `seqs` is `range(n)` but past the meter's cap (a last row with its own seq)."""

    request_id: str
    seqs: Sequence[int]
    offsets_ms: list[float]
    sizes: list[int]
    kinds: list[str]

    def __len__(self) -> int:
        return len(self.offsets_ms)

    def rows(self) -> list[tuple[Any, ...]]:
        """Each row as its tuple, in CHUNK_COLUMNS order."""
        return list(zip(repeat(self.request_id), self.seqs, self.offsets_ms, self.sizes, self.kinds))

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self.rows())

    @overload
    def __getitem__(self, i: int) -> tuple[Any, ...]: ...
    @overload
    def __getitem__(self, i: slice) -> list[tuple[Any, ...]]: ...

    def __getitem__(self, i: int | slice) -> tuple[Any, ...] | list[tuple[Any, ...]]:
        return self.rows()[i]


