"""Which statements the admin endpoint runs (`llmtap sql` while serving): one read-only query of
the database's tables, and nothing that reads a file.

DuckDB's lock-down (duck.lock_down) keeps SQL away from every file but the database's own, and it
lets those through: the database file and its WAL hold pages that retention deleted, so
`read_blob('<db>.wal')` would give them back. Here, before the query runs:

- one statement, a SELECT (DESCRIBE, SHOW and SUMMARIZE are SELECTs), or an EXPLAIN [ANALYZE] of
  one: an EXPLAIN ANALYZE runs what it explains, and `EXPLAIN ANALYZE CHECKPOINT` wrote the
  database, `EXPLAIN ANALYZE CREATE TEMP TABLE` made a table;
- every table function it names is one of TABLE_FUNCTIONS, those that read no file (`read_*`,
  `glob`, `parquet_*`, `sniff_csv`, `query`, `checkpoint` are not);
- no table is named as a file path (`FROM 'llmtap.duckdb.wal'`, a replacement scan).

The statement's parse tree (DuckDB's own `json_serialize_sql`) is what is checked, not its text.
"""

from __future__ import annotations

import re
from typing import Any

import duckdb
import orjson

READ_ONLY = "only read-only queries (one SELECT, DESCRIBE, SHOW, SUMMARIZE or EXPLAIN) run through the proxy"

# Table functions a query through the proxy may use: none reads a file or changes the database.
TABLE_FUNCTIONS = frozenset({
    "range", "generate_series", "unnest", "repeat", "repeat_row", "json_each", "json_tree", "summary",
    "pg_timezone_names", "icu_calendar_names", "test_all_types",
    "duckdb_columns", "duckdb_constraints", "duckdb_databases", "duckdb_dependencies", "duckdb_extensions",
    "duckdb_functions", "duckdb_indexes", "duckdb_keywords", "duckdb_memory", "duckdb_optimizers",
    "duckdb_schemas", "duckdb_sequences", "duckdb_settings", "duckdb_tables", "duckdb_temporary_files",
    "duckdb_types", "duckdb_variables", "duckdb_views", "duckdb_approx_database_count",
    "duckdb_connection_count",
    "pragma_database_size", "pragma_storage_info", "pragma_table_info", "pragma_version", "pragma_platform",
    "pragma_show", "pragma_metadata_info", "pragma_collations", "pragma_user_agent",
})

_EXPLAIN = re.compile(r"\s*EXPLAIN\b(?:\s+ANALY[SZ]E\b|\s*\((?:[^()']|'[^']*')*\))?", re.IGNORECASE)
_FILE_LIKE = re.compile(r"[./\\:]")


class Refused(ValueError):
    """The statement does not run through the proxy; the message says why."""


def check(sql: str, cur: duckdb.DuckDBPyConnection) -> None:
    """Raise Refused unless `sql` is one statement the admin endpoint runs (see the module)."""
    statement = _one(sql)
    if statement.type == duckdb.StatementType.EXPLAIN:
        explained = _EXPLAIN.match(statement.query)
        inner = _one(statement.query[explained.end():]) if explained else None
        if inner is None or inner.type != duckdb.StatementType.SELECT:
            raise Refused(f"{READ_ONLY}; EXPLAIN runs here only on a SELECT")
        statement = inner
    elif statement.type != duckdb.StatementType.SELECT:
        raise Refused(READ_ONLY)
    tree = orjson.loads(cur.execute("SELECT json_serialize_sql(?)", [statement.query]).fetchall()[0][0])
    if tree.get("error"):
        raise Refused(f"{READ_ONLY}; this SELECT cannot be checked ({tree.get('error_message')})")
    _walk(tree)


def _one(sql: str) -> Any:
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise Refused(str(exc)) from exc
    if len(statements) != 1:
        raise Refused(READ_ONLY)
    return statements[0]


def _walk(node: Any) -> None:
    if isinstance(node, list):
        for item in node:
            _walk(item)
        return
    if not isinstance(node, dict):
        return
    kind = node.get("type")
    if kind == "TABLE_FUNCTION":
        name = str((node.get("function") or {}).get("function_name", "")).lower()
        if name not in TABLE_FUNCTIONS:
            raise Refused(f"the table function {name}() does not run through the proxy: queries here read the "
                          "database's tables, no file (the database's own files included)")
    elif kind in ("BASE_TABLE", "SHOW_REF") and _FILE_LIKE.search(str(node.get("table_name") or "").strip('"')):
        raise Refused(f"{node['table_name']!r} is not a table: queries through the proxy read no file")
    for value in node.values():
        if isinstance(value, (dict, list)):
            _walk(value)
