"""Named views over the recorded requests, created on every connection we query.

`create_views(con)` makes TEMP views (they live only in that connection and
are replaced each time, so calling it twice is harmless):

- `requests`: every column of the `requests` table plus
  - `error`: outcome is not 'ok' (BOOLEAN)
  - `day`: the UTC date of `started_at` (DATE)
  - `hour`: `started_at` truncated to the UTC hour (TIMESTAMP, UTC)
  - `decode_tokens_per_s`: 1000 / tpot_ms
  - `cache_read_share`: cache_read_tokens / input_tokens
- `errors`: the rows of `requests` whose outcome is not 'ok'.
- `hourly`, `daily`: one row per UTC hour / day with `ROLLUP_METRICS`, over
  generations (`kind = 'generation'`: token counts, probes, model lists and
  prewarms take a few milliseconds and would pull the percentiles down).

Rows recorded before the `kind` column (an older database or export) get the
kind their method and path say (`proxy.request_kind.path_kind_sql`).

Why the view is named `requests`, like the table: DuckDB looks a name up in
the temp schema before `main`, so the view shadows the table and users write
`SELECT * FROM requests` to get the derived columns. The view itself reads
the table by its catalog-qualified name (`"llmtap".main.requests`, the
catalog being the file's stem): an unqualified name, or `main.requests`
(the temp catalog has a `main` schema too), would resolve to the view
itself. This works the same in a read-only connection. The shadowing is per connection: never call
`create_views` on a connection that INSERTs into `requests` (the store's
writer), only on connections that read.

Percentiles use DuckDB's `quantile_cont`: linear interpolation between the
two closest ranks, like numpy's default. Aggregates skip NULLs, so each
percentile is over the rows where that metric is known. Timings describe
requests that worked: they are over rows with outcome 'ok' (TTFT also only
over streamed rows); failures show up in `error_pct` instead.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from proxy.request_kind import path_kind_sql

DERIVED_COLUMNS = ("error", "day", "hour", "decode_tokens_per_s", "cache_read_share")

_PERCENTILES = (
    ("ttft", "ttft_ms", (50, 90, 99), "NOT error AND stream"),
    ("tpot", "tpot_ms", (50, 99), "NOT error"),
    ("e2e", "e2e_ms", (50, 99), "NOT error"),
)


def _rollup_terms() -> list[str]:
    terms = [
        "count(*) AS requests",
        "count(*) FILTER (WHERE error) AS errors",
        "100.0 * count(*) FILTER (WHERE error) / count(*) AS error_pct",
    ]
    for name, column, points, condition in _PERCENTILES:
        terms += [
            f"quantile_cont({column}, {p / 100}) FILTER (WHERE {condition}) AS {name}_p{p}_ms"
            for p in points
        ]
    terms += [
        "quantile_cont(output_tokens_per_s, 0.5) FILTER (WHERE NOT error) AS output_tokens_per_s_p50",
        "CAST(sum(input_tokens) AS BIGINT) AS input_tokens",
        "CAST(sum(output_tokens) AS BIGINT) AS output_tokens",
        "CAST(sum(cache_read_tokens) AS BIGINT) AS cache_read_tokens",
        "sum(cache_read_tokens) / nullif(sum(input_tokens), 0) AS cache_read_share",
    ]
    return terms


ROLLUP_TERMS: tuple[str, ...] = tuple(_rollup_terms())
ROLLUP_METRICS: tuple[str, ...] = tuple(term.rsplit(" AS ", 1)[1] for term in ROLLUP_TERMS)
ROLLUP_SQL = ",\n  ".join(ROLLUP_TERMS)


def _table(catalog: str) -> str:
    return '"' + catalog.replace('"', '""') + '".main.requests'


def table_columns(con: Any, catalog: str) -> list[str]:
    """The columns of `catalog`'s `requests` table (or view)."""
    return [d[0] for d in con.execute(f"SELECT * FROM {_table(catalog)} LIMIT 0").description]


def kind_nulls(con: Any, catalog: str) -> bool:
    """Whether some row has no `kind` (DuckDB's row-group statistics make this quick when none has)."""
    return bool(con.execute(f"SELECT EXISTS (SELECT 1 FROM {_table(catalog)} WHERE kind IS NULL)").fetchone()[0])


def views_sql(catalog: str, columns: Collection[str] | None = None, nulls: bool = True) -> str:
    """`columns`: the table's, when it may lack `kind` (None: it has every column of schema.py);
    `nulls`: whether rows may lack a kind (deriving it costs a third more per query)."""
    table = _table(catalog)
    if columns is not None and "kind" not in columns:
        star = f"*, {path_kind_sql()} AS kind"
    elif nulls:
        star = f"* REPLACE (coalesce(kind, {path_kind_sql()}) AS kind)"
    else:
        star = "*"
    return f"""
CREATE OR REPLACE TEMP VIEW requests AS
SELECT {star},
  outcome IS DISTINCT FROM 'ok' AS error,
  CAST(started_at AT TIME ZONE 'UTC' AS DATE) AS day,
  date_trunc('hour', started_at AT TIME ZONE 'UTC') AS hour,
  1000.0 / nullif(tpot_ms, 0) AS decode_tokens_per_s,
  cache_read_tokens / nullif(input_tokens, 0) AS cache_read_share
FROM {table};
CREATE OR REPLACE TEMP VIEW errors AS SELECT * FROM requests WHERE error;
CREATE OR REPLACE TEMP VIEW hourly AS
SELECT hour,
  {ROLLUP_SQL}
FROM requests WHERE kind = 'generation' GROUP BY hour ORDER BY hour;
CREATE OR REPLACE TEMP VIEW daily AS
SELECT day,
  {ROLLUP_SQL}
FROM requests WHERE kind = 'generation' GROUP BY day ORDER BY day;
"""


def create_views(con: Any) -> None:
    """Create (or replace) the views on a DuckDB connection or cursor.

    Also sets the session's TimeZone to UTC, so TIMESTAMPTZ values come out
    in UTC like the views' `day` and `hour`, whatever the machine's zone.
    Creates nothing when the database has no `requests` table yet.
    """
    if con.execute("SELECT current_setting('TimeZone')").fetchone()[0] != "UTC":  # set already where locked
        con.execute("SET TimeZone = 'UTC'")
    catalog = con.execute("SELECT current_database()").fetchone()[0]
    found = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE database_name = ? AND schema_name = 'main'"
        " AND table_name = 'requests'",
        [catalog],
    ).fetchone()[0]
    if found:
        columns = table_columns(con, catalog)
        con.execute(views_sql(catalog, columns, "kind" in columns and kind_nulls(con, catalog)))
