"""Many proxies, one analysis: `--from` reads several databases and Parquet exports as one.

Each `--from` names one of:

- a DuckDB file (`*.duckdb`, or any existing file that is not Parquet), or
  a local glob of them (`gateways/*.duckdb`): attached read-only; its
  rows' `source` is the file's path;
- an `llmtap export` directory, or a glob of them (`exports/*`,
  `s3://bucket/llmtap/*`): its `requests/*/*.parquet` and
  `chunks/*/*.parquet`; a row's `source` is the export directory its file
  is in;
- Parquet files of requests (`.../requests/*/*.parquet`): the chunks are
  read from the sibling `chunks/` directory when there is one.

An in-memory DuckDB builds `memory.main.requests` and `memory.main.chunks` as
views that UNION ALL BY NAME over the inputs (a column missing from an older
input reads as NULL), each with a `source` column, kept when the input
already has one (an export of a combined view). `views.py` then layers its
TEMP views on top exactly as on a database file, so every command and every
derived column works unchanged. Remote locations load httpfs, or register
s3fs, first (`remote.py`). A database file held by a running `llmtap serve` cannot be
attached: export it and name the export instead.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb

from proxy.common.schema import CHUNK_COLUMNS

from analysis.filters import sql_identifier, sql_string
from analysis.remote import RemoteError, enable_remote, explain, is_remote
from analysis.source import FileSource, SourceError
from analysis.views import priced_models, table_columns, views_sql
from proxy.common import duck

CATALOG = "memory"  # an in-memory DuckDB's catalog
_GLOB = set("*?[")
_LAYOUT = r"/(requests|chunks)/day=[^/]*/[^/]*$"  # export root = file path less this


@dataclass(frozen=True)
class Input:
    spec: str  # as the user gave it
    kind: str  # "duckdb" or "parquet"
    requests: str  # a database path, or a Parquet glob
    chunks: str | None = None  # a Parquet glob


def classify(spec: str) -> Input:
    """What one `--from` names; raises SourceError for a local path that is not there."""
    remote = is_remote(spec)
    has_glob = any(c in _GLOB for c in spec)
    local = None if remote or has_glob else Path(spec).expanduser()
    if local is not None and not local.exists():
        raise SourceError(f"--from {spec}: no such file or directory")
    if spec.endswith(".parquet"):
        chunks = spec.replace("/requests/", "/chunks/") if "/requests/" in spec else None
        return Input(spec, "parquet", spec, chunks)
    if spec.endswith((".duckdb", ".db")) or (local is not None and local.is_file()):
        return Input(spec, "duckdb", str(local) if local is not None else spec)
    root = (str(local) if local is not None else spec).rstrip("/")
    return Input(spec, "parquet", f"{root}/requests/*/*.parquet", f"{root}/chunks/*/*.parquet")


def open_sources(specs: Sequence[str], env: Mapping[str, str] | None = None, *,
                 writes_to: str | Path | None = None, lock: bool = True) -> FileSource:
    """One FileSource over every input, with `requests`, `chunks` and the views of views.py.

    Locked down as `open_source` is, to the inputs (and `writes_to`); not when an input is remote
    (httpfs needs the network)."""
    if not specs:
        raise SourceError("--from needs at least one database or export")
    inputs = _unique([classify(spec) for spec in _expand(specs)])
    con = duck.connect()
    try:
        remote = [i.requests for i in inputs if is_remote(i.requests)]
        if remote:
            enable_remote(con, os.environ if env is None else env, remote)
        requests, chunks = _relations(con, inputs)
        con.execute(f"CREATE VIEW {CATALOG}.main.requests AS {_union(requests)}")
        con.execute(f"CREATE VIEW {CATALOG}.main.chunks AS {_union(chunks) if chunks else _no_chunks()}")
        source = FileSource(con)
        con.execute(views_sql(CATALOG, table_columns(con, CATALOG), models=priced_models(con, CATALOG)))
        if lock and not remote:
            duck.lock_down(con, directories=[*_roots(inputs), *([writes_to] if writes_to else [])],
                           paths=[i.requests for i in inputs if i.kind == "duckdb"])
        return source
    except (RemoteError, SourceError, duckdb.Error) as exc:
        con.close()
        raise SourceError(explain(exc)) from None


def _roots(inputs: list[Input]) -> list[str]:
    """The directories Parquet inputs read: each glob's part before its first wildcard."""
    roots = []
    for item in inputs:
        for pattern in (item.requests, item.chunks):
            if item.kind == "parquet" and pattern:
                head = re.split(r"[*?\[]", pattern, maxsplit=1)[0]
                roots.append(head if head.endswith("/") else os.path.dirname(head) or ".")
    return roots


def _expand(specs: Sequence[str]) -> list[str]:
    """Local globs of database files become the files (DuckDB attaches one file at a time)."""
    expanded = []
    for spec in specs:
        if not is_remote(spec) and any(c in _GLOB for c in spec) and spec.endswith((".duckdb", ".db")):
            files = sorted(glob.glob(os.path.expanduser(spec)))
            if not files:
                raise SourceError(f"--from {spec}: no database files match")
            expanded += files
        else:
            expanded.append(spec)
    return expanded


def _unique(inputs: list[Input]) -> list[Input]:
    """The same database named twice is read once (DuckDB cannot attach a file twice)."""
    seen: set[str] = set()
    kept = []
    for item in inputs:
        local_db = item.kind == "duckdb" and not is_remote(item.requests)
        key = str(Path(item.requests).resolve()) if local_db else item.requests
        if key not in seen:
            seen.add(key)
            kept.append(item)
    return kept


def _relations(con: duckdb.DuckDBPyConnection, inputs: list[Input]) -> tuple[list[str], list[str]]:
    """A SELECT (with `source`) per input for each table."""
    requests, chunks = [], []
    for n, item in enumerate(inputs):
        if item.kind == "duckdb":
            found = _attach(con, item, f"src{n}")
        else:
            found = _parquet(con, item)
        requests.append(found[0])
        if found[1] is not None:
            chunks.append(found[1])
    return requests, chunks


def _attach(con: duckdb.DuckDBPyConnection, item: Input, alias: str) -> tuple[str, str | None]:
    try:
        con.execute(f"ATTACH {sql_string(item.requests)} AS {sql_identifier(alias)} (READ_ONLY)")
    except duckdb.Error as exc:
        if "lock" in str(exc).lower():
            raise SourceError(
                f"--from {item.spec} is in use by another process (a running `llmtap serve`?): name an"
                f" export of it instead (`llmtap export --db {item.spec} --out DIR`), or stop the proxy"
            ) from None
        raise SourceError(f"--from {item.spec}: cannot open it as a DuckDB database: {exc}") from None
    tables = {name for (name,) in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = ? AND schema_name = 'main'",
        [alias]).fetchall()}
    if "requests" not in tables:
        raise SourceError(f"--from {item.spec}: no llmtap requests table in this database")
    label = sql_string(item.spec)
    selects = [_with_source(con, f"{sql_identifier(alias)}.main.{table}", label)
               for table in ("requests", "chunks")]
    return selects[0], selects[1] if "chunks" in tables else None


def _parquet(con: duckdb.DuckDBPyConnection, item: Input) -> tuple[str, str | None]:
    if not _matches(con, item.requests):
        raise SourceError(f"--from {item.spec}: no Parquet files match {item.requests}")
    chunks = item.chunks if item.chunks and _matches(con, item.chunks) else None
    return _read_parquet(con, item.requests), _read_parquet(con, chunks) if chunks else None


def _matches(con: duckdb.DuckDBPyConnection, pattern: str) -> bool:
    return con.execute(f"SELECT count(*) FROM glob({sql_string(pattern)})").fetchone()[0] > 0  # type: ignore[index]


def _read_parquet(con: duckdb.DuckDBPyConnection, pattern: str) -> str:
    """The files' rows, `source` being the export directory each file is in."""
    relation = (f"read_parquet({sql_string(pattern)}, hive_partitioning = false, union_by_name = true,"
                " filename = '_llmtap_file')")
    label = f"regexp_replace(_llmtap_file, {sql_string(_LAYOUT)}, '')"
    return _with_source(con, relation, label, exclude="_llmtap_file")


def _with_source(con: duckdb.DuckDBPyConnection, relation: str, label: str, exclude: str | None = None) -> str:
    columns = {row[0] for row in con.execute(f"DESCRIBE SELECT * FROM {relation}").fetchall()}
    star = f"* EXCLUDE ({exclude})" if exclude else "*"
    if "source" in columns:
        return f"SELECT {star} FROM {relation}"
    return f"SELECT {star}, {label} AS source FROM {relation}"


def _union(selects: list[str]) -> str:
    return "\nUNION ALL BY NAME\n".join(selects)


def _no_chunks() -> str:
    """An empty `chunks` when no input has any."""
    columns = ", ".join(f"CAST(NULL AS {kind}) AS {name}" for name, kind in CHUNK_COLUMNS)
    return f"SELECT {columns}, CAST(NULL AS VARCHAR) AS source WHERE false"
