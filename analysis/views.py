"""Named views over the recorded requests, created on every connection we query.

`create_views(con)` makes TEMP views (they live only in that connection and
are replaced each time, so calling it twice is harmless):

- `requests`: every column of the `requests` table plus
  - `error`: outcome is not 'ok' (BOOLEAN)
  - `day`: the UTC date of `started_at` (DATE)
  - `hour`: `started_at` truncated to the UTC hour (TIMESTAMP, UTC)
  - `decode_tokens_per_s`: 1000 / tpot_ms
  - `cache_read_share`: cache_read_tokens / input_tokens
  - `cost_usd`: the tokens at the list price that applied on the request's
    date (`proxy/common/prices.py`, from genai-prices), NULL for an unknown model
  - `price_source`: the package and version priced from, or 'unknown model'
  - `billing`: 'subscription' for a Claude or ChatGPT login (its cost is a
    list-price equivalent, not money spent), else 'api'
- `errors`: the rows of `requests` whose outcome is not 'ok'.
- `tool_runs`: one row per tool call a response asked for, with its run: from its block's end to
  the request that brought its result (`run_ms`; NULL when none came), for `llmtap sessions`.
- `hourly`, `daily`: one row per UTC hour / day with `ROLLUP_METRICS`, over
  generations (`kind = 'generation'`: token counts, probes, model lists and
  prewarms take a few milliseconds and would pull the percentiles down).

Rows recorded before the `kind` column (an older database or export) get the
kind their method and path say (`proxy.meter.request_kind.path_kind_sql`).

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

import os
import time
from collections.abc import Collection, Iterable
from typing import Any

from analysis.agent_account import create_agent_views
from proxy.common.prices import HOST_SQL, MODEL_SQL, SUBSCRIPTION_KINDS, cost_sql, generation as prices_generation
from proxy.meter.request_kind import path_kind_sql

DERIVED_COLUMNS = ("error", "day", "hour", "decode_tokens_per_s", "cache_read_share", "cost_usd", "price_source",
                   "billing")

_PERCENTILES = (
    ("ttft", "ttft_ms", (50, 90, 95, 99), "NOT error AND stream"),
    ("tpot", "tpot_ms", (50, 95, 99), "NOT error"),
    ("e2e", "e2e_ms", (50, 95, 99), "NOT error"),
)


def _rollup_terms() -> list[str]:
    terms = [
        "count(*) AS requests",
        "count(*) FILTER (WHERE error) AS errors",
        "100.0 * count(*) FILTER (WHERE error) / count(*) AS error_pct",
    ]
    for name, column, points, condition in _PERCENTILES:  # one state per column (the same aggregate, once)
        every = f"(quantile_cont({column}, [{', '.join(str(p / 100) for p in points)}]) FILTER (WHERE {condition}))"
        terms += [f"{every}[{i}] AS {name}_p{p}_ms" for i, p in enumerate(points, 1)]
    terms += [
        "quantile_cont(output_tokens_per_s, 0.5) FILTER (WHERE NOT error) AS output_tokens_per_s_p50",
        "CAST(sum(input_tokens) AS BIGINT) AS input_tokens",
        "CAST(sum(output_tokens) AS BIGINT) AS output_tokens",
        "CAST(sum(cache_read_tokens) AS BIGINT) AS cache_read_tokens",
        "sum(cache_read_tokens) / nullif(sum(input_tokens), 0) AS cache_read_share",
        "sum(cost_usd) AS cost_usd",
        "avg(cost_usd) AS cost_per_request_usd",
        "count(*) FILTER (WHERE cost_usd IS NULL AND (input_tokens IS NOT NULL OR output_tokens IS NOT NULL))"
        " AS unpriced",
        "count(*) FILTER (WHERE billing = 'subscription') AS subscription_requests",
    ]
    return terms


ROLLUP_TERMS: tuple[str, ...] = tuple(_rollup_terms())
ROLLUP_METRICS: tuple[str, ...] = tuple(term.rsplit(" AS ", 1)[1] for term in ROLLUP_TERMS)
ROLLUP_SQL = ",\n  ".join(ROLLUP_TERMS)


# A session's key for pairing calls with results: its session id, else its tool and key (as timeline.py groups).
SESSION_KEY_SQL = ("coalesce('s:' || nullif(session_id, ''),"
                   " 'k:' || coalesce(tool, '') || chr(10) || coalesce(key_fingerprint, ''))")


def tool_runs_sql(where: str = "TRUE", results_from: str | None = None) -> str:
    """Each tool call a response asked for (of the requests matching `where`) and its run, a SELECT:

    - `request_id`, `session_id`, `session_key` (SESSION_KEY_SQL), `tool`, `position` (1 for the first),
      `calls` (how many the response asked for together), `call_id`, `name`;
    - `asked_at`: the response's end; `ended_at`: the call's own block's end (`tool_calls.ended_ms`, else
      the response's end); `answered_at` and `result_request_id`: the first request at or after the
      response's end (less 1 ms) whose `tool_results` carry the result; `run_ms`: `ended_at` to
      `answered_at` (NULL: no result came). For a call in a group (`calls` > 1) that is the most it ran:
      the results come back together, the wire does not say when each one ended.

    A result pairs with its call by call id within the session. The calls left and the results whose id
    is none of the session's calls' (Gemini CLI makes one up for a `functionCall` without an id) pair by
    name and order: each such result answers the session's latest response before it that asked for a
    call of that name, its k-th result of the name the response's k-th unanswered call of it. Both are
    as-of joins on equality keys (sort-merge, no quadratic step). Results are read from the requests
    since `results_from` (an SQL timestamp; None: all), which should be at most the first call's start."""
    since = "" if results_from is None else f" AND started_at >= {results_from}"
    return f"""
WITH calls AS (
  SELECT request_id, session_id, session_key, tool, position, calls, c.id AS call_id, c.name AS name, asked_at,
    CASE WHEN c.ended_ms IS NULL THEN asked_at
      ELSE started_at + to_microseconds(CAST(round(c.ended_ms * 1000) AS BIGINT)) END AS ended_at
  FROM (SELECT id AS request_id, session_id, {SESSION_KEY_SQL} AS session_key, tool, started_at,
      started_at + to_microseconds(CAST(round(coalesce(e2e_ms, 0) * 1000) AS BIGINT)) AS asked_at,
      len(tool_calls) AS calls, generate_subscripts(tool_calls, 1) AS position, unnest(tool_calls) AS c
    FROM requests WHERE tool_calls IS NOT NULL AND ({where}))
), results AS (
  SELECT result_request_id, session_key, answered_at, slot, r.id AS result_id, r.name AS name
  FROM (SELECT id AS result_request_id, {SESSION_KEY_SQL} AS session_key, started_at AS answered_at,
      generate_subscripts(tool_results, 1) AS slot, unnest(tool_results) AS r
    FROM requests WHERE tool_results IS NOT NULL{since})
), by_id AS (
  SELECT c.request_id, c.position, r.answered_at, r.result_request_id
  FROM (SELECT *, asked_at - INTERVAL 1 MILLISECOND AS after FROM calls WHERE call_id IS NOT NULL) c
  ASOF JOIN results r ON c.session_key = r.session_key AND c.call_id = r.result_id AND r.answered_at >= c.after
), unanswered AS (
  SELECT c.* FROM calls c ANTI JOIN by_id b ON c.request_id = b.request_id AND c.position = b.position
  WHERE c.name IS NOT NULL
), asking AS (
  SELECT DISTINCT session_key, name, request_id, asked_at - INTERVAL 1 MILLISECOND AS after FROM unanswered
), loose AS (
  SELECT r.* FROM results r ANTI JOIN calls c ON r.session_key = c.session_key AND r.result_id = c.call_id
  WHERE r.name IS NOT NULL
), placed AS (
  SELECT l.*, a.request_id, row_number() OVER (PARTITION BY a.request_id, l.name
    ORDER BY l.answered_at, l.result_request_id, l.slot) AS k
  FROM loose l ASOF JOIN asking a ON l.session_key = a.session_key AND l.name = a.name AND l.answered_at >= a.after
), by_name AS (
  SELECT u.request_id, u.position, p.answered_at, p.result_request_id
  FROM (SELECT *, row_number() OVER (PARTITION BY request_id, name ORDER BY position) AS k FROM unanswered) u
  JOIN placed p ON u.request_id = p.request_id AND u.name = p.name AND u.k = p.k
)
SELECT c.request_id, c.session_id, c.session_key, c.tool, c.position, c.calls, c.call_id, c.name, c.asked_at,
  c.ended_at, coalesce(i.answered_at, n.answered_at) AS answered_at,
  coalesce(i.result_request_id, n.result_request_id) AS result_request_id,
  (epoch_us(coalesce(i.answered_at, n.answered_at)) - epoch_us(c.ended_at)) / 1000.0 AS run_ms
FROM calls c
LEFT JOIN by_id i ON c.request_id = i.request_id AND c.position = i.position
LEFT JOIN by_name n ON c.request_id = n.request_id AND c.position = n.position"""


# `tool_runs`: every call and its run (tool_runs_sql); analysis/timeline.py builds the sessions' tool spans
# with the same pairing over the window asked for.
TOOL_RUNS_SQL = f"CREATE OR REPLACE TEMP VIEW tool_runs AS {tool_runs_sql()};\n"


def _table(catalog: str) -> str:
    return '"' + catalog.replace('"', '""') + '".main.requests'


def table_columns(con: Any, catalog: str) -> list[str]:
    """The columns of `catalog`'s `requests` table (or view)."""
    return [d[0] for d in con.execute(f"SELECT * FROM {_table(catalog)} LIMIT 0").description]


def kind_nulls(con: Any, catalog: str) -> bool:
    """Whether some row has no `kind` (DuckDB's row-group statistics make this quick when none has)."""
    return bool(con.execute(f"SELECT EXISTS (SELECT 1 FROM {_table(catalog)} WHERE kind IS NULL)").fetchone()[0])


def views_sql(catalog: str, columns: Collection[str] | None = None, nulls: bool = True,
              models: Iterable[tuple[str, str]] = ()) -> str:
    """`columns`: the table's, when it may lack `kind` (None: it has every column of schema.py);
    `nulls`: whether rows may lack a kind (deriving it costs a third more per query); `models`: the
    (model, upstream host) pairs to price (`priced_models`), the rest cost NULL."""
    table = _table(catalog)
    cost, price_source = cost_sql(models)
    has_kind = columns is None or "credential_kind" in columns
    billing = (f"CASE WHEN credential_kind IN {tuple(SUBSCRIPTION_KINDS)} THEN 'subscription'"
               " WHEN credential_kind IS NOT NULL THEN 'api' END" if has_kind else "CAST(NULL AS VARCHAR)")
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
  cache_read_tokens / nullif(input_tokens, 0) AS cache_read_share,
  {cost} AS cost_usd,
  {price_source} AS price_source,
  {billing} AS billing
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
{TOOL_RUNS_SQL if columns is None or "tool_calls" in columns else ""}"""


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
        con.execute(views_sql(catalog, columns, "kind" in columns and kind_nulls(con, catalog),
                              priced_models(con, catalog)))
        if {"tool_calls", "upstream_headers_ms", "session_id"} <= set(columns):  # the agent's own account, joined to the wire's (#39)
            create_agent_views(con)


# The (model, host) pairs found per database file: a first look reads every row; later ones read only the
# rows since the last look (less an hour, for requests that started earlier and ended after it) and at most
# every few seconds, so the views of a busy proxy's every admin query stay cheap (`create_views`).
_MODELS: dict[str, tuple[float, Any, set[tuple[str, str]], int]] = {}  # path -> (looked, newest, pairs, prices)
_LOOK_EVERY_S = 5.0
_LATE = "INTERVAL 1 HOUR"
MAX_PRICED = 5_000  # (model, host) pairs priced per database, the busiest first: a client inventing names is capped


def priced_models(con: Any, catalog: str) -> list[tuple[str, str]]:
    """The (model as reported, upstream host) pairs of `catalog`'s rows, for the cost columns."""
    table = _table(catalog)
    select = (f"SELECT {MODEL_SQL} AS m, {HOST_SQL} AS h, max(started_at) FROM {table}"
              f" WHERE {MODEL_SQL} IS NOT NULL")
    (path,) = con.execute("SELECT path FROM duckdb_databases() WHERE database_name = ?", [catalog]).fetchone()
    busiest = f" GROUP BY ALL ORDER BY count(*) DESC LIMIT {MAX_PRICED}"
    if not path:  # an in-memory catalog (--from): no file to remember it by
        return [(m, h) for m, h, _ in con.execute(select + busiest).fetchall()]
    try:  # a file made anew at the same path (a test's, a demo's) is another database
        path = f"{path}#{os.stat(path).st_ino}"
    except OSError:
        pass
    now, known = time.monotonic(), _MODELS.get(path)
    if known is not None and now - known[0] < _LOOK_EVERY_S and known[3] == prices_generation():
        return sorted(known[2])
    if known is None or known[1] is None:
        rows, pairs = con.execute(select + busiest).fetchall(), set()
    else:
        rows = con.execute(select + f" AND started_at >= ? - {_LATE}" + busiest, [known[1]]).fetchall()
        pairs = set(known[2])
    newest = max([r[2] for r in rows if r[2] is not None] + ([known[1]] if known and known[1] else []), default=None)
    for m, h, _ in rows:
        if len(pairs) >= MAX_PRICED:
            break
        pairs.add((m, h))
    _MODELS[path] = (now, newest, pairs, prices_generation())
    return sorted(pairs)
