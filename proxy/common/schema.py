"""The columns llmtap records, in one place.

`REQUEST_COLUMNS` is the `requests` table, one row per request that reached the
proxy; `CHUNK_COLUMNS` is the `chunks` table, one row per output event of a
stream; `BODY_COLUMNS` is the `bodies` table (filled with `--capture-bodies` only);
`AGENT_EVENT_COLUMNS` is the `agent_events` table (the agents' own telemetry).
Durations are milliseconds from the request's arrival at the proxy
(monotonic clock); `started_at` is the only wall-clock value (UTC).
docs/columns.md defines each one; tests/test_docs.py keeps the two in step.
"""

from __future__ import annotations

from enum import StrEnum

BUCKETS = ("requests", "tokens", "input_tokens", "output_tokens")
WINDOWS = ("5h", "7d")

# The rate-limit columns, in schema order (migration m005), read by proxy/meter/ratelimits.py
RATELIMIT_COLUMNS: tuple[tuple[str, str], ...] = (
    *((f"ratelimit_{b}_{part}", kind) for b in BUCKETS
      for part, kind in (("limit", "BIGINT"), ("remaining", "BIGINT"), ("reset", "TIMESTAMPTZ"))),
    ("ratelimit_status", "VARCHAR"),
    *((f"ratelimit_{w}_{part}", kind) for w in WINDOWS
      for part, kind in (("utilization", "DOUBLE"), ("reset", "TIMESTAMPTZ"), ("status", "VARCHAR"))),
    ("retry_after_s", "DOUBLE"),
)

TOOL_CALLS_TYPE = "STRUCT(id VARCHAR, name VARCHAR, ended_ms DOUBLE)[]"
TOOL_RESULTS_TYPE = "STRUCT(id VARCHAR, name VARCHAR)[]"

# (name, DuckDB type)
REQUEST_COLUMNS: tuple[tuple[str, str], ...] = (
    # who and what
    ("id", "VARCHAR"),
    ("started_at", "TIMESTAMPTZ"),
    ("route", "VARCHAR"),
    ("upstream_host", "VARCHAR"),
    ("method", "VARCHAR"),
    ("path", "VARCHAR"),
    ("dialect", "VARCHAR"),
    ("tool", "VARCHAR"),
    ("user_agent", "VARCHAR"),
    ("tag", "VARCHAR"),
    ("key_fingerprint", "VARCHAR"),
    ("session_id", "VARCHAR"),
    # request
    ("request_model", "VARCHAR"),
    ("stream", "BOOLEAN"),
    ("max_tokens", "BIGINT"),
    ("message_count", "INTEGER"),
    ("request_bytes", "BIGINT"),
    ("request_parse_error", "VARCHAR"),
    # response
    ("status", "INTEGER"),
    ("response_model", "VARCHAR"),
    ("finish_reason", "VARCHAR"),
    ("response_bytes", "BIGINT"),
    ("error_type", "VARCHAR"),
    ("error_message", "VARCHAR"),
    ("outcome", "VARCHAR"),
    ("parse_error", "VARCHAR"),
    ("empty_choices_chunks", "INTEGER"),
    ("retry_after", "VARCHAR"),
    # timing, ms from arrival at the proxy
    ("proxy_overhead_ms", "DOUBLE"),
    ("upstream_headers_ms", "DOUBLE"),
    ("first_byte_ms", "DOUBLE"),
    ("ttft_ms", "DOUBLE"),
    ("first_text_ms", "DOUBLE"),
    ("last_token_ms", "DOUBLE"),
    ("e2e_ms", "DOUBLE"),
    ("tpot_ms", "DOUBLE"),
    ("gap_p50_ms", "DOUBLE"),
    ("gap_p99_ms", "DOUBLE"),
    ("gap_max_ms", "DOUBLE"),
    ("output_events", "INTEGER"),
    ("output_tokens_per_s", "DOUBLE"),
    # tokens
    ("input_tokens", "BIGINT"),
    ("output_tokens", "BIGINT"),
    ("cache_read_tokens", "BIGINT"),
    ("cache_creation_tokens", "BIGINT"),
    ("reasoning_tokens", "BIGINT"),
    ("tokens_source", "VARCHAR"),
    # what the request is (proxy/meter/request_kind.py): generation, token_count, embedding, model_list,
    # probe, prewarm or other; last because m003 added it
    ("kind", "VARCHAR"),
    # where the time to headers and to the first token went (m004; docs/breakdown-and-compare.md):
    # proxy_overhead + pool_wait + dns + connect + tls + upstream_wait = upstream_headers_ms,
    # + headers_to_first_token = ttft_ms, + decode = last_token_ms
    ("connection_reused", "BOOLEAN"),
    ("pool_wait_ms", "DOUBLE"),
    ("dns_ms", "DOUBLE"),
    ("connect_ms", "DOUBLE"),
    ("tls_ms", "DOUBLE"),
    ("upstream_wait_ms", "DOUBLE"),
    ("headers_to_first_token_ms", "DOUBLE"),
    ("decode_ms", "DOUBLE"),
    # the account's limits as the upstream stated them on this response (m005; proxy/meter/ratelimits.py):
    # the credential's kind, then remaining requests and tokens with their limits and reset times, a
    # subscription's 5-hour and 7-day windows, and retry-after in seconds
    ("credential_kind", "VARCHAR"),
    *RATELIMIT_COLUMNS,
    # the tools the model and the client passed each other, ids and names only (m006; never arguments
    # or results): the calls the response asked for, in order, each with when its block ended (ms
    # from arrival), and the results the request carries that are new since the model last spoke
    ("tool_calls", TOOL_CALLS_TYPE),
    ("tool_results", TOOL_RESULTS_TYPE),
    # llmtap's own time inside the upstream's part (m007): connect_ms and upstream_wait_ms less what
    # the kernel saw of them (docs/breakdown-and-compare.md); with it
    # proxy_overhead + pool_wait + dns + connect + tls + upstream_wait + proxy_wait = upstream_headers_ms
    ("proxy_wait_ms", "DOUBLE"),
    # the project the tool says it works in (m008; proxy/meter/request_info.py project_of): the last
    # component of the working directory in its system prompt (Claude Code, Cline) or Codex's
    # environment_context, never from user messages or files
    ("project", "VARCHAR"),
    # what the upstream says it spent (m009; proxy/meter/upstream_timing.py): its processing time, the
    # header or frame that said so, and a Responses WebSocket turn's engine TTFT and overhead outside it
    ("upstream_processing_ms", "DOUBLE"),
    ("upstream_processing_source", "VARCHAR"),
    ("upstream_engine_ttft_ms", "DOUBLE"),
    ("upstream_overhead_ms", "DOUBLE"),
    # the client's own version and mode, as its User-Agent states them (m011; proxy/meter/clients.py):
    # `tool` is the name alone
    ("tool_version", "VARCHAR"),
    ("tool_mode", "VARCHAR"),
)

KINDS = ("generation", "side", "token_count", "embedding", "model_list", "probe", "prewarm", "other")
# the kinds that are a model generating (tokens spent, a cost): a turn's, or a side request beside the turns
GENERATING_KINDS = ("generation", "side")

CHUNK_COLUMNS: tuple[tuple[str, str], ...] = (
    ("request_id", "VARCHAR"),
    ("seq", "INTEGER"),
    ("offset_ms", "DOUBLE"),
    ("bytes", "INTEGER"),
    ("event_type", "VARCHAR"),
)

# `bodies`, with `serve --capture-bodies` only: one row per request, decoded, redacted, cut at --capture-max-kb.
BODY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("request_id", "VARCHAR"),
    ("request_body", "VARCHAR"),
    ("response_body", "VARCHAR"),
    ("request_truncated", "BOOLEAN"),
    ("response_truncated", "BOOLEAN"),
)

# `agent_events`: what the agents themselves report over OpenTelemetry (proxy/relay/otlp.py), one row per
# event the timeline uses, its attributes by an allow-list (proxy/meter/agent_events.py): never content.
AGENT_EVENT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("received_at", "TIMESTAMPTZ"),
    ("event_at", "TIMESTAMPTZ"),
    ("source", "VARCHAR"),
    ("source_version", "VARCHAR"),
    ("session_id", "VARCHAR"),
    ("event_name", "VARCHAR"),
    ("sequence", "BIGINT"),
    ("prompt_id", "VARCHAR"),
    ("tool_name", "VARCHAR"),
    ("call_id", "VARCHAR"),
    ("decision", "VARCHAR"),
    ("decision_source", "VARCHAR"),
    ("duration_ms", "DOUBLE"),
    ("ttft_ms", "DOUBLE"),
    ("success", "BOOLEAN"),
    ("model", "VARCHAR"),
    ("request_id", "VARCHAR"),
    ("attempt", "INTEGER"),
    ("status_code", "INTEGER"),
    ("input_tokens", "BIGINT"),
    ("output_tokens", "BIGINT"),
    ("span_id", "VARCHAR"),
    ("parent_span_id", "VARCHAR"),
)

REQUEST_COLUMN_NAMES: tuple[str, ...] = tuple(name for name, _ in REQUEST_COLUMNS)
CHUNK_COLUMN_NAMES: tuple[str, ...] = tuple(name for name, _ in CHUNK_COLUMNS)

ERROR_MESSAGE_MAX = 500  # characters of `error_message` kept in a row


class Outcome(StrEnum):
    """How a request ended: the `outcome` column (docs/columns.md defines each)."""

    OK = "ok"
    HTTP_ERROR = "http_error"
    UPSTREAM_UNREACHABLE = "upstream_unreachable"
    UPSTREAM_TIMEOUT = "upstream_timeout"
    CLIENT_DISCONNECTED = "client_disconnected"
    STREAM_TRUNCATED = "stream_truncated"
    STREAM_ERROR = "stream_error"
    PROXY_ERROR = "proxy_error"


OUTCOMES = tuple(Outcome)


def create_tables_sql() -> str:
    """DDL for the current schema (tests and fixtures; the store uses migrations)."""
    return "\n".join(
        f"CREATE TABLE IF NOT EXISTS {table} ({', '.join(f'{n} {t}' for n, t in cols)});"
        for table, cols in (("requests", REQUEST_COLUMNS), ("chunks", CHUNK_COLUMNS), ("bodies", BODY_COLUMNS),
                            ("agent_events", AGENT_EVENT_COLUMNS))
    )
