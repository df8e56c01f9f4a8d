"""Every DuckDB connection llmtap opens: one place for the settings they all need."""

from __future__ import annotations

from pathlib import Path

import duckdb


def connect(path: str | Path = ":memory:", *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """llmtap never downloads anything at run time: an extension (httpfs for s3://) loads only
    when it is already installed. Set after opening, not as a connect() config, so that other
    connections to the same file in this process are not refused for a different configuration."""
    con = duckdb.connect(str(path), read_only=read_only)
    con.execute("SET autoinstall_known_extensions = false")
    return con
