"""The agent's own account joined to the wire's: SQL views over `agent_events` and the requests (#39).

The wire sees a tool span as one gap, from the response that asked for the call to the request that
carries its result; the agent itself reports what happened inside it (`agent_events`, from its
OpenTelemetry: docs/tools.md). Joined, a span splits into:

- **approval**: waiting for the person to approve the call, when the decision was the person's
  (`decision_source` `user…`, not `config`/`hook`): Claude Code's `claude_code.tool.blocked_on_user` span
  (its beta traces), else from the span's start to the agent's `tool_decision`;
- **the tool's run**: Claude Code's `claude_code.tool.execution` span, else the agent's `tool_result`
  (Gemini CLI: `tool_call`) `duration_ms`;
- **the agent's own time**: the rest of the span (its work before and after the run, its start-up).

And per request, the agent's `api_request` duration against llmtap's E2E (the difference is the agent's
client-side time: its SDK, its retries) and Codex's `turn_ttft` against llmtap's TTFT; an agent's request
that never reached llmtap (a retry given up on, an error before connecting) has no `request_id`.

Views (`create_agent_views`):
- `agent_tool_calls`: one row per call the agent reported, keyed (session_id, call_id); Gemini CLI's have
  no call id, and `call_order` (the call's place among its session's calls of that tool) instead;
- `tool_run_accounts`: one row per wire call (the `tool_runs` view), its agent's account LEFT JOINed: by
  session and call id, else (no id) by tool name and order within the wire span's time;
- `api_request_accounts`: one row per agent API event, with the wire request it was (or none).

The timeline (analysis/timeline.py) reads `tool_run_accounts_sql` over the runs of the time it shows (one
query, the same rows as `tool_runs`: `accounts` is `wire` where the agent said nothing) and splits each
tool span by it (docs/sessions.md), and `api_request_accounts` for the agent's `client_ms` per request and
its requests that never reached llmtap (`never_reached_llmtap`), shown as it saw them: from
`event_at - agent_ms` to `event_at`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proxy.common.schema import AGENT_EVENT_COLUMNS

PERSON = "lower(decision_source) LIKE 'user%'"  # Claude Code's user_temporary/_permanent/_reject/_abort, Codex's user
SLACK = "INTERVAL 1 SECOND"  # how far past a tool span's end the agent may report the call
# An API request's time as the agent took it holds the wire's, but for their clock readings' rounding (ms)
API_SLACK = "INTERVAL 50 MILLISECOND"


def same_session(wire: str, agent: str) -> str:
    """A wire row and an agent event of one session: its id, else (a CLI that sends none on the wire, as
    Gemini CLI) the wire row has none or one llmtap inferred (`~…`, proxy/meter/conversations.py) and its
    tool, if known, names the agent: their letters, one the other's start (`geminicli-tui` and
    `gemini-cli`, `codex` and `codex_exec`)."""
    w, a = (f"regexp_replace(lower({x}), '[^a-z]', '', 'g')" for x in (f"{wire}.tool", f"{agent}.source"))
    return (f"({wire}.session_id = {agent}.session_id OR (coalesce(starts_with({wire}.session_id, '~'), true) "
            f"AND ({wire}.tool IS NULL OR starts_with({w}, {a}) OR starts_with({a}, {w}))))")


AGENT_TOOL_CALLS_SQL = f"""
CREATE OR REPLACE TEMP VIEW agent_tool_calls AS
WITH e AS (SELECT *, regexp_extract(event_name, '[^.]*$') AS kind FROM agent_events),
decisions AS (
  SELECT session_id, call_id, arg_max(tool_name, event_at) AS tool_name, max(event_at) AS decided_at,
    arg_max(decision, event_at) AS decision, arg_max(decision_source, event_at) AS decision_source,
    any_value(source) AS source
  FROM e WHERE kind = 'tool_decision' GROUP BY session_id, call_id),
results AS (
  SELECT session_id, call_id, tool_name, event_at AS result_at, duration_ms AS run_ms, success, source,
    decision AS result_decision
  FROM e WHERE kind IN ('tool_result', 'tool_call')),
spans AS (  -- Claude Code's beta traces: a `claude_code.tool` span's wait for the person and its execution
  SELECT t.session_id, t.call_id,
    max(c.duration_ms) FILTER (WHERE c.kind = 'blocked_on_user') AS blocked_ms,
    max(c.duration_ms) FILTER (WHERE c.kind = 'execution') AS execution_ms
  FROM e t JOIN e c ON c.parent_span_id = t.span_id AND c.session_id IS NOT DISTINCT FROM t.session_id
  WHERE t.event_name LIKE '%.tool' AND t.call_id IS NOT NULL GROUP BY t.session_id, t.call_id)
SELECT coalesce(r.source, d.source) AS source, coalesce(r.session_id, d.session_id) AS session_id,
  coalesce(r.call_id, d.call_id) AS call_id, coalesce(r.tool_name, d.tool_name) AS tool_name,
  row_number() OVER (PARTITION BY coalesce(r.session_id, d.session_id), coalesce(r.tool_name, d.tool_name)
                     ORDER BY coalesce(r.result_at, d.decided_at)) AS call_order,
  d.decided_at, coalesce(d.decision, r.result_decision) AS decision, d.decision_source,
  coalesce({PERSON}, false) AS by_person, r.result_at, r.run_ms, r.success, s.blocked_ms, s.execution_ms
FROM results r FULL JOIN decisions d ON d.call_id = r.call_id AND d.session_id IS NOT DISTINCT FROM r.session_id
LEFT JOIN spans s ON s.call_id = coalesce(r.call_id, d.call_id)
  AND s.session_id IS NOT DISTINCT FROM coalesce(r.session_id, d.session_id);
"""

# The wire's calls (`tool_runs`: request_id, session_id, position, call_id, name, asked_at, answered_at,
# run_ms) with the agent's account. `k`: a call's place among its request's calls of one tool, for the
# agents that send no call id, whose k-th report within the span is the k-th call.
def tool_run_accounts_sql(runs: str = "SELECT * FROM tool_runs") -> str:
    """`runs` (the `tool_runs` view, or `views.tool_runs_sql` over a stretch of time) with the agent's
    account of each call, a SELECT: the timeline reads this one query for a session's spans."""
    return f"""
WITH w AS (
  SELECT *, row_number() OVER (PARTITION BY request_id, name ORDER BY position) AS k FROM ({runs})),
by_id AS (
  SELECT w.request_id, w.position, a.* FROM w JOIN agent_tool_calls a
    ON a.call_id = w.call_id AND a.session_id IS NOT DISTINCT FROM w.session_id),
by_time AS (
  SELECT w.request_id, w.position, w.k, a.*,
    dense_rank() OVER (PARTITION BY w.request_id, w.name ORDER BY a.result_at, a.call_order) AS nth
  FROM w JOIN agent_tool_calls a ON a.call_id IS NULL AND a.tool_name = w.name
    AND {same_session("w", "a")}
    AND a.result_at BETWEEN w.asked_at AND coalesce(w.answered_at, a.result_at) + {SLACK}),
a AS (
  SELECT * FROM by_id
  UNION ALL BY NAME
  SELECT * EXCLUDE (k, nth) FROM by_time WHERE nth = k
    AND (request_id, position) NOT IN (SELECT (request_id, position) FROM by_id))
SELECT *, span_ms - coalesce(approval_ms, 0) - tool_ms AS agent_ms FROM (
SELECT w.request_id, w.session_id, w.position, w.calls, w.call_id, w.name, w.asked_at, w.ended_at, w.answered_at,
  w.run_ms AS span_ms, a.result_at,
  CASE WHEN a.by_person THEN coalesce(a.blocked_ms,
    greatest(0, (epoch_us(a.decided_at) - epoch_us(w.ended_at)) / 1000.0)) END AS approval_ms,
  coalesce(a.execution_ms, a.run_ms) AS tool_ms,
  a.decision, a.decision_source, a.source AS agent,
  CASE WHEN a.source IS NULL THEN 'wire' ELSE 'wire+agent' END AS accounts
FROM w LEFT JOIN a USING (request_id, position))"""


TOOL_RUN_ACCOUNTS_SQL = f"CREATE OR REPLACE TEMP VIEW tool_run_accounts AS {tool_run_accounts_sql()};\n"


def reported(query: Callable[[str], Any], since: str) -> bool:
    """Whether the agents reported anything since `since` (an SQL timestamp) where `query` (a Source's)
    sees the agent views (`views.create_views`; not a source without them: an older server's, several files)."""
    try:
        query("SELECT 1 FROM tool_run_accounts, api_request_accounts LIMIT 0")  # the views are there
        return bool(query(f"SELECT count(*) FROM (SELECT 1 FROM agent_events WHERE event_at >= {since} LIMIT 1)")[2][0][0])
    except Exception:  # noqa: BLE001  (no agent views: the wire's account alone)
        return False


def runs_with_accounts(query: Callable[[str], Any], runs: str, since: str) -> str:
    """`tool_run_accounts_sql(runs)` where the agents `reported` since `since`, else `runs` with the
    accounts' columns empty (`wire`): a store without telemetry pays nothing for the join."""
    if reported(query, since):
        return tool_run_accounts_sql(runs)
    return (f"SELECT *, run_ms AS span_ms, CAST(NULL AS TIMESTAMPTZ) AS result_at, CAST(NULL AS DOUBLE) AS approval_ms,"
            f" CAST(NULL AS DOUBLE) AS tool_ms, CAST(NULL AS DOUBLE) AS agent_ms, 'wire' AS accounts FROM ({runs})")


# The agent logs an API request when it ends, with its duration: the wire request of its session (`same_session`)
# that lies within that time, the one ending nearest. What the agent's duration covers (`measure`): Claude Code's and
# Gemini CLI's, the whole response (llmtap's E2E); Codex's `api_request`, until the response's headers
# (llmtap's `upstream_headers_ms`), its `turn_ttft` from the turn's start to the first token (llmtap's TTFT
# of the turn's first request: the rest is Codex's own time before it sent the request).
API_REQUEST_ACCOUNTS_SQL = f"""
CREATE OR REPLACE TEMP VIEW api_request_accounts AS
WITH e AS (
  SELECT *, CASE WHEN kind = 'turn_ttft' THEN 'ttft' WHEN event_name LIKE 'codex.%' THEN 'headers' ELSE 'e2e' END
      AS measure,
    event_at - to_microseconds(CAST(round(coalesce(duration_ms, 0) * 1000) AS BIGINT)) AS began_at
  FROM (SELECT *, regexp_extract(event_name, '[^.]*$') AS kind FROM agent_events)
  WHERE kind IN ('api_request', 'api_response', 'api_error', 'turn_ttft') AND duration_ms IS NOT NULL),
r AS (
  SELECT id, session_id, tool, started_at, e2e_ms, ttft_ms, upstream_headers_ms,
    started_at + to_microseconds(CAST(round(coalesce(e2e_ms, 0) * 1000) AS BIGINT)) AS ended_at,
    started_at + to_microseconds(CAST(round(coalesce(upstream_headers_ms, e2e_ms, 0) * 1000) AS BIGINT)) AS headers_at
  FROM requests WHERE kind = 'generation'),
m AS (
  SELECT e.* RENAME (request_id AS agent_request_id), r.id AS wire_request_id,
    CASE e.measure WHEN 'ttft' THEN r.ttft_ms WHEN 'headers' THEN r.upstream_headers_ms ELSE r.e2e_ms END AS wire_ms
  FROM e LEFT JOIN r ON {same_session("r", "e")} AND r.started_at >= e.began_at - {API_SLACK}
    AND CASE e.measure WHEN 'ttft' THEN r.started_at <= e.event_at
        WHEN 'headers' THEN r.headers_at <= e.event_at + {API_SLACK} ELSE r.ended_at <= e.event_at + {API_SLACK} END
  QUALIFY row_number() OVER (PARTITION BY e.source, e.session_id, e.event_at, e.event_name, e.sequence
    ORDER BY CASE e.measure WHEN 'ttft' THEN epoch_us(r.started_at)
             WHEN 'headers' THEN abs(epoch_us(e.event_at) - epoch_us(r.headers_at))
             ELSE abs(epoch_us(e.event_at) - epoch_us(r.ended_at)) END) = 1)
SELECT source AS agent, session_id, event_name, event_at, model, attempt, status_code, agent_request_id,
  wire_request_id AS request_id, measure, duration_ms AS agent_ms, wire_ms, duration_ms - wire_ms AS client_ms,
  wire_request_id IS NULL AS never_reached_llmtap
FROM m;
"""


def create_agent_views(con: Any) -> bool:
    """Create the views on a DuckDB connection or cursor that has `requests` and the `tool_runs` view
    (analysis/views.py). Where the database has no `agent_events` (one older than m010, an export), an
    empty `agent_events` view stands in, so a query can always LEFT JOIN the accounts; False then."""
    found = con.execute("SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'main' AND "
                        "table_name = 'agent_events' AND database_name = current_database()").fetchone()[0]
    if not found:
        columns = ", ".join(f"CAST(NULL AS {kind}) AS {name}" for name, kind in AGENT_EVENT_COLUMNS)
        con.execute(f"CREATE OR REPLACE TEMP VIEW agent_events AS SELECT {columns} WHERE false")
    con.execute(AGENT_TOOL_CALLS_SQL + TOOL_RUN_ACCOUNTS_SQL + API_REQUEST_ACCOUNTS_SQL)
    return bool(found)
