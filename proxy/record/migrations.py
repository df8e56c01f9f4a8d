"""Schema migrations for the llmtap database, in the style of simonw/llm.

An append-only list of named functions. Each one runs in a transaction together
with its row in `_llmtap_migrations`, so a database is never left half-migrated.
A migration is history: once released it is never edited, even when
`proxy/common/schema.py` grows; a new column is a new migration (`m002_...`) that
`ALTER TABLE`s it in. `tests/test_migrations.py` checks that the result of all
of them equals `schema.REQUEST_COLUMNS` and `schema.CHUNK_COLUMNS`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import duckdb

Migration = Callable[[duckdb.DuckDBPyConnection], None]

MIGRATIONS: list[Migration] = []


def migration(fn: Migration) -> Migration:
    MIGRATIONS.append(fn)
    return fn


def migrate(
    con: duckdb.DuckDBPyConnection, migrations: Sequence[Migration] = MIGRATIONS
) -> list[str]:
    """Apply the migrations not yet recorded in `con`; return their names, in order."""
    con.execute(
        "CREATE TABLE IF NOT EXISTS _llmtap_migrations"
        " (name VARCHAR PRIMARY KEY, applied_at TIMESTAMPTZ)"
    )
    applied = {name for (name,) in con.execute("SELECT name FROM _llmtap_migrations").fetchall()}
    done = []
    for fn in migrations:
        if fn.__name__ not in applied:
            _apply(con, fn)
            done.append(fn.__name__)
    return done


def _apply(con: duckdb.DuckDBPyConnection, fn: Migration) -> None:
    con.execute("BEGIN TRANSACTION")
    try:
        fn(con)
        con.execute(
            "INSERT INTO _llmtap_migrations VALUES (?, current_timestamp)", [fn.__name__]
        )
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


@migration
def m001_initial(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(
        """
        CREATE TABLE requests (
            id VARCHAR,
            started_at TIMESTAMPTZ,
            route VARCHAR,
            upstream_host VARCHAR,
            method VARCHAR,
            path VARCHAR,
            dialect VARCHAR,
            tool VARCHAR,
            user_agent VARCHAR,
            tag VARCHAR,
            key_fingerprint VARCHAR,
            session_id VARCHAR,
            request_model VARCHAR,
            stream BOOLEAN,
            max_tokens BIGINT,
            message_count INTEGER,
            request_bytes BIGINT,
            request_parse_error VARCHAR,
            status INTEGER,
            response_model VARCHAR,
            finish_reason VARCHAR,
            response_bytes BIGINT,
            error_type VARCHAR,
            error_message VARCHAR,
            outcome VARCHAR,
            parse_error VARCHAR,
            empty_choices_chunks INTEGER,
            retry_after VARCHAR,
            proxy_overhead_ms DOUBLE,
            upstream_headers_ms DOUBLE,
            first_byte_ms DOUBLE,
            ttft_ms DOUBLE,
            first_text_ms DOUBLE,
            last_token_ms DOUBLE,
            e2e_ms DOUBLE,
            tpot_ms DOUBLE,
            gap_p50_ms DOUBLE,
            gap_p99_ms DOUBLE,
            gap_max_ms DOUBLE,
            output_events INTEGER,
            output_tokens_per_s DOUBLE,
            input_tokens BIGINT,
            output_tokens BIGINT,
            cache_read_tokens BIGINT,
            cache_creation_tokens BIGINT,
            reasoning_tokens BIGINT,
            tokens_source VARCHAR
        )
        """
    )
    con.execute(
        """
        CREATE TABLE chunks (
            request_id VARCHAR,
            seq INTEGER,
            offset_ms DOUBLE,
            bytes INTEGER,
            event_type VARCHAR
        )
        """
    )


@migration
def m002_bodies(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(
        """
        CREATE TABLE bodies (
            request_id VARCHAR,
            request_body VARCHAR,
            response_body VARCHAR,
            request_truncated BOOLEAN,
            response_truncated BOOLEAN
        )
        """
    )


@migration
def m003_request_kind(con: duckdb.DuckDBPyConnection) -> None:
    """`kind`, and for the rows recorded before it, the kind their method and path say; WebSocket
    responses (status 101, their events timed) were streams though their frame has no `stream`."""
    con.execute("ALTER TABLE requests ADD COLUMN kind VARCHAR")
    p = "lower(rtrim(replace(replace(split_part(path, '?', 1), '%3A', ':'), '%3a', ':'), '/'))"
    con.execute(
        f"""
        UPDATE requests SET kind = CASE
            WHEN upper(method) IN ('HEAD', 'OPTIONS') THEN 'probe'
            WHEN ends_with({p}, '/messages/count_tokens') OR ends_with({p}, '/responses/input_tokens')
                OR ends_with({p}, ':counttokens') THEN 'token_count'
            WHEN ends_with({p}, '/embeddings') OR ends_with({p}, ':embedcontent')
                OR ends_with({p}, ':batchembedcontents') THEN 'embedding'
            WHEN upper(method) = 'GET' AND (ends_with({p}, '/models') OR regexp_matches({p}, '/models/[^/:]+$'))
                THEN 'model_list'
            WHEN upper(method) = 'GET' AND {p} = '' THEN 'probe'
            WHEN upper(method) = 'GET' AND status = 101 AND ends_with({p}, '/responses') THEN 'generation'
            WHEN upper(method) = 'POST' AND (ends_with({p}, '/completions') OR ends_with({p}, '/messages')
                OR ends_with({p}, '/responses') OR ends_with({p}, ':generatecontent')
                OR ends_with({p}, ':streamgeneratecontent')) THEN 'generation'
            ELSE 'other' END
        """
    )
    con.execute("UPDATE requests SET stream = true WHERE status = 101 AND output_events > 0")


@migration
def m004_latency_breakdown(con: duckdb.DuckDBPyConnection) -> None:
    """Where each request's time went (docs/breakdown-and-compare.md). Rows recorded before have
    no breakdown: their two parts that older columns give are filled in (headers to first token,
    first to last token); the connection's parts stay NULL."""
    for name, type_ in (("connection_reused", "BOOLEAN"), ("pool_wait_ms", "DOUBLE"), ("dns_ms", "DOUBLE"),
                        ("connect_ms", "DOUBLE"), ("tls_ms", "DOUBLE"), ("upstream_wait_ms", "DOUBLE"),
                        ("headers_to_first_token_ms", "DOUBLE"), ("decode_ms", "DOUBLE")):
        con.execute(f"ALTER TABLE requests ADD COLUMN {name} {type_}")
    con.execute("UPDATE requests SET headers_to_first_token_ms = ttft_ms - upstream_headers_ms,"
                " decode_ms = last_token_ms - ttft_ms")


@migration
def m005_ratelimits(con: duckdb.DuckDBPyConnection) -> None:
    """The credential's kind and the account's limits as each response stated them (proxy/meter/ratelimits.py:
    remaining requests and tokens, their limits and resets, a subscription's 5-hour and 7-day windows,
    retry-after in seconds). Rows recorded before have none: they stay NULL."""
    columns = [("credential_kind", "VARCHAR")]
    for bucket in ("requests", "tokens", "input_tokens", "output_tokens"):
        columns += [(f"ratelimit_{bucket}_limit", "BIGINT"), (f"ratelimit_{bucket}_remaining", "BIGINT"),
                    (f"ratelimit_{bucket}_reset", "TIMESTAMPTZ")]
    columns.append(("ratelimit_status", "VARCHAR"))
    for window in ("5h", "7d"):
        columns += [(f"ratelimit_{window}_utilization", "DOUBLE"), (f"ratelimit_{window}_reset", "TIMESTAMPTZ"),
                    (f"ratelimit_{window}_status", "VARCHAR")]
    columns.append(("retry_after_s", "DOUBLE"))
    for name, type_ in columns:
        con.execute(f"ALTER TABLE requests ADD COLUMN {name} {type_}")


@migration
def m006_tool_calls(con: duckdb.DuckDBPyConnection) -> None:
    """The tool calls each response asked for and the tool results each request carried (ids and
    names: docs/columns.md). Rows recorded before have none: they stay NULL."""
    con.execute("ALTER TABLE requests ADD COLUMN tool_calls STRUCT(id VARCHAR, name VARCHAR, ended_ms DOUBLE)[]")
    con.execute("ALTER TABLE requests ADD COLUMN tool_results STRUCT(id VARCHAR, name VARCHAR)[]")


@migration
def m007_proxy_wait(con: duckdb.DuckDBPyConnection) -> None:
    """llmtap's own time inside the upstream's part of the breakdown (docs/breakdown-and-compare.md).
    Rows recorded before had it inside connect_ms and upstream_wait_ms: theirs is 0 where they have
    a breakdown, so their parts still add up, else NULL."""
    con.execute("ALTER TABLE requests ADD COLUMN proxy_wait_ms DOUBLE")
    con.execute("UPDATE requests SET proxy_wait_ms = 0 WHERE upstream_wait_ms IS NOT NULL OR connect_ms IS NOT NULL")


@migration
def m008_project(con: duckdb.DuckDBPyConnection) -> None:
    """The project each request's tool says it works in (docs/columns.md `project`). Rows recorded
    before have none: they stay NULL."""
    con.execute("ALTER TABLE requests ADD COLUMN project VARCHAR")


@migration
def m009_upstream_processing(con: duckdb.DuckDBPyConnection) -> None:
    """What the upstream says it spent on each request (proxy/meter/upstream_timing.py). Rows recorded
    before have none: they stay NULL."""
    for name, type_ in (("upstream_processing_ms", "DOUBLE"), ("upstream_processing_source", "VARCHAR"),
                        ("upstream_engine_ttft_ms", "DOUBLE"), ("upstream_overhead_ms", "DOUBLE")):
        con.execute(f"ALTER TABLE requests ADD COLUMN {name} {type_}")

@migration
def m010_agent_events(con: duckdb.DuckDBPyConnection) -> None:
    """What the agents report of themselves over OpenTelemetry (proxy/relay/otlp.py): one row per event,
    its attributes by an allow-list, never content (docs/columns.md `agent_events`)."""
    con.execute(
        """
        CREATE TABLE agent_events (
            received_at TIMESTAMPTZ, event_at TIMESTAMPTZ, source VARCHAR, source_version VARCHAR,
            session_id VARCHAR, event_name VARCHAR, sequence BIGINT, prompt_id VARCHAR,
            tool_name VARCHAR, call_id VARCHAR, decision VARCHAR, decision_source VARCHAR,
            duration_ms DOUBLE, ttft_ms DOUBLE, success BOOLEAN, model VARCHAR, request_id VARCHAR,
            attempt INTEGER, status_code INTEGER, input_tokens BIGINT, output_tokens BIGINT,
            span_id VARCHAR, parent_span_id VARCHAR
        )
        """
    )



@migration
def m011_client_details(con: duckdb.DuckDBPyConnection) -> None:
    """The client's version and mode, apart from its name (docs/columns.md `tool_version`, `tool_mode`).
    Rows recorded before have none: they stay NULL."""
    con.execute("ALTER TABLE requests ADD COLUMN tool_version VARCHAR")
    con.execute("ALTER TABLE requests ADD COLUMN tool_mode VARCHAR")
