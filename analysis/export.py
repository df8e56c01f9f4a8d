"""`llmtap export`: the requests and chunks tables as Parquet or CSV, one directory per UTC day.

DuckDB writes the files (`COPY ... TO DIR (FORMAT parquet, PARTITION_BY
(day))`). From the database file, COPY runs on it directly. While `llmtap
serve` holds the file, its endpoint runs only SELECTs and caps the rows of
an answer, so the rows are fetched in pages (ordered by key), spooled to a
local NDJSON file with the column types the endpoint reports, and an
in-memory DuckDB writes them. Chunks get their day from their request. The
files hold the table's own columns (not the view's derived ones); `day` is in the
directory name (`DIR/requests/day=2026-11-30/data_0.parquet`), and readers
such as DuckDB's `read_parquet(..., hive_partitioning = true)` restore it.
Local files are owner-only (0600, directories 0700), as the database is; in CSV, text that a
spreadsheet would run as a formula starts with a `'` (formatting.csv_cell).

DIR may be an object-storage URL (`s3://bucket/prefix`): DuckDB's httpfs, or
s3fs, writes there (see `remote.py` for which, and credentials). Remote stores cannot be
emptied first, so there `--overwrite` replaces the files of the days it
writes and leaves other days' files alone; its `--since` starts at the
beginning of its UTC day (`whole_days`), so no day is replaced by part of it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import timezone
from pathlib import Path
from typing import Any

import duckdb
import orjson

from analysis.filters import Filters, sql_identifier, sql_string
from analysis.formatting import csv_cell_sql, plain
from analysis.remote import RemoteError, enable_remote, explain, is_remote
from analysis.source import FileSource, Source, SourceError
from analysis.views import DERIVED_COLUMNS
from proxy.common import duck

FORMATS = ("parquet", "csv")
TABLES = ("requests", "chunks")
KEYS = {"requests": ("id",), "chunks": ("request_id", "seq")}
PAGE_ROWS = 50_000  # under the proxy endpoint's cap on rows per answer


class ExportError(Exception):
    """An export that would overwrite files, or failed; the message is for the user."""


@dataclass
class Written:
    table: str
    directory: Path | str  # as the user named it (a str for a remote URL)
    days: list[tuple[str, int]]  # (day, rows), in day order

    @property
    def rows(self) -> int:
        return sum(n for _, n in self.days)


def select_sql(table: str, filters: Filters) -> str:
    """The rows of one table, with their `day`, as the export writes them."""
    if table == "requests":
        derived = ", ".join(c for c in DERIVED_COLUMNS if c != "day")
        return f"SELECT * EXCLUDE ({derived}) FROM requests WHERE {filters.where()}"
    return (
        "SELECT c.*, r.day FROM chunks c JOIN requests r ON c.request_id = r.id"
        f" WHERE {filters.where('r.')}"
    )


def csv_safe(select: str, columns: list[str], types: list[str]) -> str:
    """`select` with its text columns quoted against formulas, as every CSV the CLI writes
    (formatting.csv_cell): a model name or error message such as =HYPERLINK(...) comes out '=HYPERLINK(...)."""
    text = [c for c, t in zip(columns, types) if t.upper() == "VARCHAR"]
    if not text:
        return select
    replaced = ", ".join(f"{csv_cell_sql(sql_identifier(c))} AS {sql_identifier(c)}" for c in text)
    return f"SELECT * REPLACE ({replaced}) FROM ({select})"


def _file_select(source: FileSource, table: str, filters: Filters, fmt: str) -> str:
    select = select_sql(table, filters)
    if fmt != "csv":
        return select
    columns, types, _ = source.query(f"SELECT * FROM ({select}) LIMIT 0")
    return csv_safe(select, columns, types)


def copy_sql(select: str, target: Path | str, fmt: str, overwrite: bool) -> str:
    options = [f"FORMAT {fmt}", "PARTITION_BY (day)"]
    if fmt == "csv":
        options.append("HEADER true")
    if overwrite:  # OVERWRITE empties the directory first, which remote stores cannot do
        options.append("OVERWRITE_OR_IGNORE true" if is_remote(str(target)) else "OVERWRITE true")
    return f"COPY ({select}) TO {sql_string(str(target))} ({', '.join(options)})"


def _literal(value: Any) -> str:
    return sql_string(value) if isinstance(value, str) else str(int(value))


def after_sql(keys: tuple[str, ...], values: list[Any]) -> str:
    """Rows after `values` in `keys` order: a > x OR (a = x AND b > y) ..."""
    first, rest = keys[0], keys[1:]
    term = f"{first} > {_literal(values[0])}"
    if not rest:
        return term
    return f"({term} OR ({first} = {_literal(values[0])} AND {after_sql(rest, values[1:])}))"


def spool_pages(source: Source, table: str, filters: Filters, spool: Path,
                page_rows: int = PAGE_ROWS) -> tuple[list[str], list[str]]:
    """Fetch a table's rows page by page into an NDJSON file; its columns and types."""
    keys, after = KEYS[table], None
    with spool.open("wb") as out:
        while True:
            condition = "TRUE" if after is None else after_sql(keys, after)
            columns, types, rows = source.query(
                f"SELECT * FROM ({select_sql(table, filters)}) WHERE {condition}"
                f" ORDER BY {', '.join(keys)} LIMIT {int(page_rows)}"
            )
            for row in rows:
                out.write(orjson.dumps(dict(zip(columns, plain(list(row))))) + b"\n")
            if len(rows) < page_rows:
                return columns, types
            last = [rows[-1][columns.index(k)] for k in keys]
            if last == after:
                raise ExportError(f"paging {table} did not advance past {last}")
            after = last


def copy_through(source: Source, table: str, filters: Filters, target: Path | str, fmt: str,
                 overwrite: bool, page_rows: int = PAGE_ROWS, env: Mapping[str, str] | None = None) -> None:
    """COPY from a source that only answers SELECTs: fetch, spool, write here."""
    with tempfile.TemporaryDirectory(prefix="llmtap-export-") as tmp:
        spool = Path(tmp) / f"{table}.ndjson"
        columns, types = spool_pages(source, table, filters, spool, page_rows)
        spec = ", ".join(f"{sql_string(c)}: {sql_string(t)}" for c, t in zip(columns, types))
        select = (f"SELECT * FROM read_json({sql_string(str(spool))}, format = 'newline_delimited',"
                  f" columns = {{{spec}}})")
        if fmt == "csv":
            select = csv_safe(select, columns, types)
        with duck.connect() as con, duck.private_umask():
            if is_remote(str(target)):
                enable_remote(con, os.environ if env is None else env, [str(target)])
            con.execute(copy_sql(select, target, fmt, overwrite))


def _not_empty(directory: Path) -> bool:
    return directory.exists() and (not directory.is_dir() or any(directory.iterdir()))


def count_written(directory: Path, fmt: str) -> list[tuple[str, int]]:
    """Rows per day partition, read back from the files."""
    if not any(directory.glob(f"*/*.{fmt}")):
        return []
    pattern = sql_string(str(directory / "*" / f"*.{fmt}"))
    reader = "read_parquet" if fmt == "parquet" else "read_csv"
    with duck.connect() as con:
        rows = con.execute(
            f"SELECT CAST(day AS VARCHAR), count(*) FROM {reader}({pattern}, hive_partitioning = true)"
            " GROUP BY 1 ORDER BY 1"
        ).fetchall()
    return [(day, int(n)) for day, n in rows]


def export(
    source: Source, out_dir: Path | str, fmt: str, filters: Filters, overwrite: bool = False,
    page_rows: int = PAGE_ROWS, env: Mapping[str, str] | None = None,
) -> list[Written]:
    """Write both tables under `out_dir`; refuse to touch non-empty directories unless `overwrite`."""
    if fmt not in FORMATS:
        raise ExportError(f"cannot export as {fmt!r}: choose one of {', '.join(FORMATS)}")
    if is_remote(str(out_dir)):
        if overwrite:
            filters = whole_days(filters)
        try:
            return export_remote(source, str(out_dir), fmt, filters, overwrite, page_rows,
                                 os.environ if env is None else env)
        except RemoteError as exc:
            raise ExportError(str(exc)) from None
    out_dir = Path(out_dir)
    targets = {table: out_dir / table for table in TABLES}
    if not overwrite:
        taken = [str(d) for d in targets.values() if _not_empty(d)]
        if taken:
            raise ExportError(f"{' and '.join(taken)} already exist: pass --overwrite to replace them")
    out_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    written = []
    for table, directory in targets.items():
        try:
            if isinstance(source, FileSource):
                select = _file_select(source, table, filters, fmt)
                with duck.private_umask():  # the files hold prompts and errors: owner-only, as the database
                    source.query(copy_sql(select, directory.resolve(), fmt, overwrite))
            else:
                copy_through(source, table, filters, directory.resolve(), fmt, overwrite, page_rows)
        except (SourceError, duckdb.Error) as exc:
            raise ExportError(f"cannot export {table}: {exc}") from None
        written.append(Written(table, directory, count_written(directory, fmt)))
    return written


def whole_days(filters: Filters) -> Filters:
    """`--since` from the start of its UTC day: an overwrite replaces a day's files whole, so a window
    starting mid-day (`--since 2d`) would otherwise replace its first day with that day's later rows."""
    if filters.since is None:
        return filters
    since = filters.since.astimezone(timezone.utc)
    return replace(filters, since=since.replace(hour=0, minute=0, second=0, microsecond=0))


def export_remote(source: Source, url: str, fmt: str, filters: Filters, overwrite: bool, page_rows: int,
                  env: Mapping[str, str]) -> list[Written]:
    """`export` to object storage: the same layout, written and counted through httpfs or s3fs."""
    targets = {table: f"{url.rstrip('/')}/{table}" for table in TABLES}
    with duck.connect() as con:
        enable_remote(con, env, [url])
        if not overwrite:
            taken = [t for t in targets.values() if _remote_files(con, t, "*")]
            if taken:
                raise ExportError(f"{' and '.join(taken)} already hold files: pass --overwrite to replace them")
        written = []
        for table, target in targets.items():
            try:
                if isinstance(source, FileSource):
                    enable_remote(source.con, env, [url])
                    source.query(copy_sql(_file_select(source, table, filters, fmt), target, fmt, overwrite))
                else:
                    copy_through(source, table, filters, target, fmt, overwrite, page_rows, env)
                days = _count_remote(con, target, fmt)
            except (SourceError, duckdb.Error) as exc:
                raise ExportError(f"cannot export {table}: {explain(exc)}") from None
            written.append(Written(table, target, days))
    return written


def _remote_files(con: duckdb.DuckDBPyConnection, directory: str, ext: str) -> int:
    pattern = sql_string(f"{directory}/*/*.{ext}")
    return con.execute(f"SELECT count(*) FROM glob({pattern})").fetchone()[0]  # type: ignore[index]


def _count_remote(con: duckdb.DuckDBPyConnection, directory: str, fmt: str) -> list[tuple[str, int]]:
    if not _remote_files(con, directory, fmt):
        return []
    reader = "read_parquet" if fmt == "parquet" else "read_csv"
    rows = con.execute(
        f"SELECT CAST(day AS VARCHAR), count(*) FROM {reader}({sql_string(f'{directory}/*/*.{fmt}')},"
        " hive_partitioning = true) GROUP BY 1 ORDER BY 1").fetchall()
    return [(day, int(n)) for day, n in rows]


def summary(written: list[Written], fmt: str) -> str:
    lines = []
    for w in written:
        days = "day" if len(w.days) == 1 else "days"
        lines.append(f"{w.table}: {w.rows} rows in {len(w.days)} {days} -> {w.directory} ({fmt})")
        lines += [f"  day={day}  {n:>6} rows" for day, n in w.days]
    return "\n".join(lines) + "\n"
