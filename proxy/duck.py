"""Every DuckDB connection llmtap opens: one place for the settings they all need."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import duckdb


def connect(path: str | Path = ":memory:", *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """llmtap never downloads anything at run time: an extension (httpfs for s3://) loads only
    when it is already installed. Set after opening, not as a connect() config, so that other
    connections to the same file in this process are not refused for a different configuration."""
    con = duckdb.connect(str(path), read_only=read_only)
    try:
        con.execute("SET autoinstall_known_extensions = false")
    except duckdb.InvalidInputException:  # this process has the file open already, locked down
        pass
    return con


@contextlib.contextmanager
def private_umask() -> Iterator[None]:
    """Files DuckDB creates meanwhile (the database, its .wal) are readable by their owner only.

    The umask is per process: a file another thread creates in this window is private too,
    which errs on the safe side.
    """
    old = os.umask(0o077)
    os.umask(old | 0o077)
    try:
        yield
    finally:
        os.umask(old)


def _sql_list(values: Iterable[str]) -> str:
    return "[" + ", ".join("'" + v.replace("'", "''") + "'" for v in values) + "]"


def lock_down(con: duckdb.DuckDBPyConnection, *, directories: Iterable[str | Path] = (),
              paths: Iterable[str | Path] = ()) -> None:
    """From now on SQL on this database instance touches nothing but its own files: no file or
    network access (`read_text`, `glob`, `COPY ... TO`, `ATTACH`, http), no extension installed
    or loaded, no setting changed — except the `directories` and `paths` named here.

    DuckDB's own controls, not a deny-list of statements: `enable_external_access` cannot be
    turned back on, and `lock_configuration` refuses every later SET. Settings a connection
    needs (TimeZone, memory_limit) must be set before this call."""
    directories = [str(Path(d).expanduser().resolve()) for d in directories]
    paths = [str(Path(p).expanduser().resolve()) for p in paths]
    if directories:
        con.execute(f"SET allowed_directories = {_sql_list(directories)}")
    if paths:
        con.execute(f"SET allowed_paths = {_sql_list(paths)}")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET allow_community_extensions = false")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
