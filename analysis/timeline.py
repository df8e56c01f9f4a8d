"""Where an agent session's time went: the model, each tool, and the person (#29).

One library function, `sessions(source, filters)`, that `llmtap sessions`, `llmtap session ID`, the
HTML report and the web UI all call. Within a session (its `session_id`; where a tool sends none,
the tool and key, said to be inferred), ordered in time, a timeline of spans:

- **model**: a generation's wait for its first token (`wait`), then its generating (`generating`);
  a response that is not streamed is all `wait`;
- **tool**: a response that asked for tool calls, from its end to the arrival of the request that
  carries their results (the calls one response asked for share one span, named `Bash+Read`); a
  result that never comes is an open span (`end_s` None);
- **you**: a response that asked for no tool, from its end to the next request, when nothing else
  of the session ran in between (the person reading and typing).

Where the agent sent its own account (analysis/agent_account.py, docs/sessions.md), a tool span splits
into **you** `approving` (the person's decision), **tool** (each call's own run, a group's overlap once)
and **agent** (the CLI's own time, the rest); a request the agent timed that never reached llmtap is an
**agent** `request` span. Without it every span is the wire's alone.

Requests that overlap (Claude Code's subagents, its side requests to a small model) are counted
once in wall-clock terms: each instant of the session goes to one part, the model before tools before
the agent's own before you (`Totals`), and what none covers is `other`. A gap longer than `gap_s` (30 minutes
unless told) splits a session in two; the later part's key gets `/2`, `/3`.
"""

from __future__ import annotations

import statistics
from bisect import bisect_left, insort
from heapq import heappop, heappush
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from analysis.filters import Filters, sql_string
from analysis.timewindow import utc_now

Query = Callable[[str], tuple[list[str], list[str], list[tuple[Any, ...]]]]

GAP_S = 30 * 60
WEEK = timedelta(days=7)  # the window `sessions`, `session`, `errors`' slow sessions and tool runs look at unless told
SLOW_FACTOR = 3.0  # a session this many times the median of its peers' TPOT or TTFT per input token is slow
PEER_WINDOW_S = 3600.0  # its peers: the sessions on the same model within this of it
# Each instant goes to the first of these that covers it.
PRIORITY = ("generating", "wait", "tool", "agent", "approving", "you")

ROWS_SQL = """
SELECT id, epoch(started_at) AS t0, coalesce(e2e_ms, 0) AS e2e_ms, ttft_ms, session_id, tool, key_fingerprint,
  request_model, input_tokens, output_tokens, {cost} AS cost_usd, tpot_ms, outcome
FROM requests WHERE kind = 'generation' AND {where} ORDER BY started_at, id
"""
# The sessions, grouped as the module docstring says: by session id (an empty one is none), else tool
# and key, each split where its requests so far had ended more than {gap} s before the next began.
# A session is (seen, part): the first row number of its group, its part within it; its key is the
# first request's session id or `~` and its id, `/2`, `/3` for a later one of the same key.
GROUPED_SQL = """
WITH r AS (
  SELECT *, row_number() OVER (ORDER BY started_at, id) AS n, t0 + e2e_ms / 1000 AS t1,
    nullif(session_id, '') AS sid, CASE WHEN sid IS NULL THEN tool END AS g_tool,
    CASE WHEN sid IS NULL THEN key_fingerprint END AS g_key
  FROM (SELECT started_at, {columns} FROM requests WHERE kind = 'generation' AND {where})),
e AS (
  SELECT *, min(n) OVER (PARTITION BY sid, g_tool, g_key) AS seen,
    coalesce(t0 - greatest(first_value(t0) OVER (PARTITION BY sid, g_tool, g_key ORDER BY n),
      max(t1) OVER (PARTITION BY sid, g_tool, g_key ORDER BY n ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING))
      > {gap}, false) AS split
  FROM r),
p AS (SELECT *, sum(split::INTEGER) OVER (PARTITION BY seen ORDER BY n ROWS UNBOUNDED PRECEDING) AS part FROM e)
"""
# Those sessions (`ord`: by their start), each with its key and its first request's tool.
KEYED_SQL = GROUPED_SQL + """, s AS (
  SELECT seen, part, coalesce(any_value(sid), '~' || left(arg_min(id, n), 12)) AS base, min(t0) AS start_s,
    max(t0) AS last_s, arg_min_null(tool, n) AS first_tool FROM p GROUP BY seen, part),
o AS (
  SELECT base || CASE WHEN k > 1 THEN '/' || k ELSE '' END AS key, seen, part, start_s, last_s, first_tool,
    row_number() OVER (ORDER BY start_s, seen, part) AS ord, count(*) OVER () AS total
  FROM (SELECT *, row_number() OVER (PARTITION BY base ORDER BY seen, part) AS k FROM s))
"""
# One pass over the sessions (the grouping costs the most), a row per session: for the sessions that {shown}
# picks (a condition on a session's key, `ord` and the `total`), their requests; for those and the sessions
# near enough to be their peers (all: {every}), per model what `flag_slow` takes of their successful
# requests: the medians of their starts, TPOTs and TTFTs per input token (in its rows' order, so a
# session's first cell is its first model's). A row per session keeps the answer within a query's caps.
SESSIONS_SQL = KEYED_SQL + """, o2 AS (SELECT *, {shown} AS shown FROM o),
w AS (SELECT min(start_s) - {window} AS low, max(last_s) + {window} AS high FROM o2 WHERE shown),
o3 AS (SELECT o2.*, shown OR {every} OR (start_s <= high AND last_s >= low) AS near FROM o2, w),
q AS (SELECT *, outcome = 'ok' AND request_model <> '' AS counted
  FROM p JOIN (SELECT * FROM o3 WHERE near) USING (seen, part)),
c AS (
  SELECT key, ord, total, first_tool, request_model, bool_or(counted) AS counted, min(n) AS first,
    list_sort(list(t0) FILTER (counted)) AS t0, list_sort(list(tpot_ms) FILTER (counted AND tpot_ms IS NOT NULL)) AS tpot,
    list_sort(list(ttft_ms / input_tokens) FILTER (counted AND ttft_ms IS NOT NULL AND input_tokens <> 0)) AS ttft,
    list(struct_pack(n, {names})) FILTER (shown) AS requests
  FROM q GROUP BY key, ord, total, first_tool, shown, request_model),
m AS (SELECT key, ord, total, first_tool, request_model, counted, first, {t0}, {tpot}, {ttft}, requests FROM c)
SELECT key, any_value(total) AS total, any_value(first_tool) AS first_tool,
  list(struct_pack(request_model, t0, tpot, ttft) ORDER BY first) FILTER (counted) AS cells,
  flatten(list(requests) FILTER (requests IS NOT NULL)) AS requests
FROM m GROUP BY key, ord ORDER BY ord
"""


def _median_sql(values: str) -> str:
    """The median of a sorted list as `statistics.median` takes it (the two middle values' mean), in SQL."""
    n = f"len({values})"
    return (f"CASE WHEN {n} % 2 = 1 THEN {values}[{n} // 2 + 1]"
            f" ELSE ({values}[{n} // 2] + {values}[{n} // 2 + 1]) / 2 END AS {values}")


COUNT_SQL = GROUPED_SQL + "SELECT count(DISTINCT (seen, part)) FROM p"
COLUMNS = ("id", "epoch(started_at) AS t0", "coalesce(e2e_ms, 0) AS e2e_ms", "ttft_ms", "session_id", "tool",
           "key_fingerprint", "request_model", "input_tokens", "output_tokens", "{cost} AS cost_usd", "tpot_ms",
           "outcome", "{project} AS project")
# Each call of the requests in a stretch of time and when its result came (analysis/views.py's pairing).
# With the agent's account of each (analysis/agent_account.py): its approval and run (ms), when it reported
# the run's end, and the accounts it comes from.
RUNS_SQL = """
SELECT request_id, name, epoch(answered_at) AS answered, epoch(ended_at) AS ended, approval_ms, tool_ms,
  epoch(result_at) AS result_at, accounts FROM ({runs})
ORDER BY request_id, position
"""
# The agent's API requests of the sessions shown, from the time they span: the client-side time it took
# around a wire request's, and those that never reached llmtap (analysis/agent_account.py).
AGENT_REQUESTS_SQL = """
SELECT session_id, request_id, measure, client_ms, epoch(event_at) AS at, agent_ms, never_reached_llmtap
FROM api_request_accounts WHERE event_at >= to_timestamp({low!r}) AND event_at <= to_timestamp({high!r})
  AND (never_reached_llmtap OR client_ms IS NOT NULL)
"""
# `report --by tool_name`: a call alone in its response counts its own run under its name; the calls of a
# parallel group count once, as the group (`Bash+Read`: from its first block's end to its last result), and
# under their names as `in_groups` (the wire does not say when each one of them ended).
# With the agent's account (analysis/agent_account.py) a call counts its own run (`tool_ms`), alone or in a group,
# and a group whose calls all have one is not counted as a group.
TOOL_NAME_SQL = """
WITH runs AS (SELECT *, tool_ms IS NOT NULL AS own FROM ({runs})),
groups AS (
  SELECT list(coalesce(name, '?') ORDER BY position) AS names,
    CASE WHEN count(answered_at) = count(*) THEN (epoch_us(max(answered_at)) - epoch_us(min(ended_at))) / 1000.0
    END AS run_ms
  FROM runs WHERE calls > 1 GROUP BY request_id HAVING NOT bool_and(own)),
timed AS (
  SELECT name AS tool_name, CASE WHEN own THEN tool_ms WHEN calls = 1 THEN span_ms END AS run_ms,
    calls = 1 OR own AS timed FROM runs
  UNION ALL SELECT array_to_string(list_filter(names, lambda x, i: list_position(names, x) = i), '+'), run_ms, true
  FROM groups)
SELECT tool_name, count(run_ms) AS runs, count(*) FILTER (WHERE timed AND run_ms IS NULL) AS open,
  count(*) FILTER (WHERE NOT timed) AS in_groups,
  quantile_cont(run_ms, 0.5) / 1000 AS p50_s, quantile_cont(run_ms, 0.95) / 1000 AS p95_s,
  quantile_cont(run_ms, 0.99) / 1000 AS p99_s, max(run_ms) / 1000 AS max_s, coalesce(sum(run_ms), 0) / 1000 AS total_s
FROM timed GROUP BY tool_name ORDER BY total_s DESC, tool_name
"""
# request id -> its calls' (name, when the result came, when the call's block ended: None, the response's end,
# and the agent's account: approval ms, the tool's run ms, when it reported the run, 'wire' or 'wire+agent')
Runs = dict[str, list[tuple[Any, ...]]]


@dataclass(frozen=True)
class Span:
    kind: str  # "model", "tool", "agent" (the agent's own time, its account) or "you"
    # model: "wait" or "generating"; tool: the tools' names ("Bash+Read"); you: "you" or "approving" (a call,
    # the agent's account); agent: "agent", or "request" (one it made that never reached llmtap)
    part: str
    start_s: float  # epoch seconds (UTC)
    end_s: float | None  # None: open, a tool result that never came
    request_id: str  # the request it belongs to (model) or follows (tool, you)
    model: str | None = None
    calls: tuple[str, ...] = ()  # a tool span's calls, each tool's name (twice for two calls of one tool)

    @property
    def seconds(self) -> float | None:
        return None if self.end_s is None else self.end_s - self.start_s


@dataclass
class Totals:
    """Wall-clock seconds, each instant counted once (module docstring)."""

    wall_s: float = 0.0
    wait_s: float = 0.0
    generating_s: float = 0.0
    tools_s: dict[str, float] = field(default_factory=dict)  # by span name, longest first
    you_s: float = 0.0  # approving_s in it
    other_s: float = 0.0
    agent_s: float = 0.0  # the agent's own time within tool spans (its account)
    approving_s: float = 0.0  # you, approving a tool call (the agent's account)

    @property
    def model_s(self) -> float:
        return self.wait_s + self.generating_s

    @property
    def tool_s(self) -> float:
        return sum(self.tools_s.values())


@dataclass
class Session:
    key: str  # the session id (with /2, /3 for later parts), or `~` and the first request's id when inferred
    session_id: str | None
    inferred: bool  # no session id: grouped by tool and key
    tool: str | None
    start_s: float
    end_s: float
    requests: int
    turns: int
    input_tokens: int | None
    output_tokens: int | None
    cost_usd: float | None
    models: list[str]
    spans: list[Span]
    totals: Totals
    slow: str | None = None  # why the session is flagged slow (`flag_slow`), else None
    project: str | None = None  # the project its tool said it works in (its last request's that says one)

    accounts: str = "wire"  # what it was built from: "wire", or "wire + agent" (the agent's own account too)
    # the agent's client-side time around the wire's (ms, by `measure`: e2e, headers, ttft; and per request)
    client_ms: dict[str, float] = field(default_factory=dict)
    request_client_ms: dict[str, float] = field(default_factory=dict)

    @property
    def first_tool(self) -> str | None:
        """The tools of its first tool span (`Bash+Read`): with the project, what tells sessions apart."""
        return next((s.part for s in self.spans if s.kind == "tool"), None)


def a_week(filters: Filters) -> Filters:
    """`filters`, or the last WEEK when they set no window (the window a person means by "my sessions")."""
    if filters.since is not None or filters.until is not None:
        return filters
    return replace(filters, since=utc_now() - WEEK)


def latest(query: Query, where: str = "TRUE", count: int = 12, gap_s: float = GAP_S) -> list[Session]:
    """The newest `count` sessions (no slow flags) among those of the last WEEK of the requests matching
    `where`: the HTML report's panel, in a time bounded by a week's requests, however long the window."""
    newest_at = query(f"SELECT CAST(max(started_at) AS VARCHAR) FROM requests WHERE kind = 'generation' AND ({where})")
    if newest_at[2][0][0] is None:
        return []
    week = f"({where}) AND started_at >= {sql_string(newest_at[2][0][0])}::TIMESTAMPTZ - INTERVAL {WEEK.days} DAY"
    return newest(query, week, gap_s, count, flags=False)[1]


def sessions(query: Query, where: str = "TRUE", gap_s: float = GAP_S) -> list[Session]:
    """The sessions of the generations matching `where` (an SQL predicate on the `requests` view),
    oldest first, slow ones flagged. `query`: a Source's (columns, types, rows) query."""
    return newest(query, where, gap_s)[1]


def newest(query: Query, where: str = "TRUE", gap_s: float = GAP_S, count: int | None = None, flags: bool = True
           ) -> tuple[int, list[Session]]:
    """How many sessions `sessions` finds, and the newest `count` of them (all: None), oldest first:
    the same sessions, spans and flags (none looked for unless `flags`), the requests of those alone
    read (a day of 20,000 sessions, listed a page at a time by the web UI)."""
    if count is not None and count <= 0:
        return int(query(COUNT_SQL.format(**_grouped(query, where, gap_s)[1]))[2][0][0]), []
    return _picked(query, where, gap_s, "TRUE" if count is None else f"ord > total - {int(count)}", flags)


def matching(query: Query, key: str, where: str = "TRUE", gap_s: float = GAP_S) -> list[Session]:
    """`find(sessions(...), key)`: the sessions whose key is `key`, else those it starts, their
    timelines alone built (`llmtap session KEY`, the web UI's session page). `key` as `llmtap sessions`
    prints it is taken back (`9d1118b7-6f36…`, with its slow mark ` !`), and an inferred session's
    without its `~`."""
    key = pasted(key)
    for k in (sql_string(key), sql_string("~" + key)):
        found = _picked(query, where, gap_s, f"CASE WHEN sum((key = {k})::INTEGER) OVER () > 0 THEN key = {k}"
                                             f" ELSE starts_with(key, {k}) END")[1]
        if found or key.startswith("~") or not key:
            return found
    return found


def pasted(key: str) -> str:
    """A session key as `llmtap sessions` printed it: its shortening's `…` (or `...`) and slow mark cut off."""
    key = key.strip().removesuffix("!").rstrip()
    return key.removesuffix("…").removesuffix("...")


def _picked(query: Query, where: str, gap_s: float, shown_sql: str, flags: bool = True) -> tuple[int, list[Session]]:
    """The sessions that `shown_sql` (a condition on a session's key, `ord` and the `total`) picks: their
    requests alone read and their timelines built; the slow flags from every session's cells."""
    have, total, cells, _, members = _sessions_pass(query, where, gap_s, shown_sql, flags)
    if not members:
        return total, []
    everyone = [row for rows in members.values() for row in rows]
    runs = _runs(query, have, where, everyone)
    agent = _agent_requests(query, everyone)
    found = []
    for key, rows in members.items():
        mine = [*agent.get(rows[0]["session_id"] or "", ()), *(a for r in rows for a in agent.get(r["id"], ()))]
        session = timeline(rows, runs, mine)
        session.key = key
        found.append(session)
    found_flags = _flags(cells, {s.key for s in found}) if flags else {}
    for session in found:
        session.slow = found_flags.get(session.key)
    return total, found


def _sessions_pass(query: Query, where: str, gap_s: float, shown_sql: str, with_cells: bool = True
                   ) -> tuple[set[str], int, Cells, list[tuple[str, str | None]], dict[str, list[dict[str, Any]]]]:
    """SESSIONS_SQL: the columns the database has, how many sessions, their cells (`flag_slow`), those
    that have one as (key, first request's tool), and the picked sessions' requests by key, oldest first
    (without `with_cells`, no cells: their medians are not computed)."""
    have, grouped = _grouped(query, where, gap_s)
    names = ", ".join(c.split(" AS ")[-1] for c in COLUMNS)
    cells: Cells = {}
    keyed: dict[str, str | None] = {}
    members: dict[str, list[dict[str, Any]]] = defaultdict(list)
    total = 0
    medians = {name: _median_sql(name) if with_cells else f"NULL AS {name}" for name in ("t0", "tpot", "ttft")}
    every = "TRUE" if shown_sql == "FALSE" else "FALSE"  # no session shown: every one's flag wanted
    for key, sessions_in_all, tool, found, rows in query(SESSIONS_SQL.format(
            **grouped, names=names, shown=shown_sql, window=repr(PEER_WINDOW_S), every=every, **medians))[2]:
        total = sessions_in_all
        for cell in (found or []) if with_cells else []:
            cells[(key, cell["request_model"])] = (
                cell["t0"], {m: v for m, v in zip(METRICS, (cell["tpot"], cell["ttft"])) if v is not None})
            keyed.setdefault(key, tool)
        if rows is not None:
            members[key] = rows
    for rows in members.values():
        rows.sort(key=lambda r: r["n"])
        for r in rows:
            del r["n"]
    return have, total, cells, list(keyed.items()), members


def _runs(query: Query, have: set[str], where: str, rows: list[dict[str, Any]]) -> Runs:
    """The tool calls of `rows` (generations matching `where`) and their runs: the calls of the stretch of
    time the rows span read (analysis/views.py's pairing, results from the first row's start on)."""
    runs: Runs = defaultdict(list)
    if "tool_calls" not in have or "cost_usd" not in have:  # a bare table or an older database: no tool spans
        return runs
    from analysis.views import tool_runs_sql

    low, high = min(r["t0"] for r in rows), max(r["t0"] for r in rows)
    stretch = (f"kind = 'generation' AND ({where}) AND started_at >= to_timestamp({low!r}) - INTERVAL 1 SECOND"
               f" AND started_at <= to_timestamp({high!r}) + INTERVAL 1 SECOND")
    wanted = {r["id"] for r in rows}
    from analysis.agent_account import runs_with_accounts

    since = f"to_timestamp({low!r}) - INTERVAL 1 SECOND"
    for request_id, *call in query(RUNS_SQL.format(runs=runs_with_accounts(query, tool_runs_sql(stretch, since), since)))[2]:
        if request_id in wanted:
            runs[request_id].append(tuple(call))
    return runs


def _agent_requests(query: Query, rows: list[dict[str, Any]]) -> dict[str, list[tuple[Any, ...]]]:
    """The agent's API requests (AGENT_REQUESTS_SQL) around the time `rows` span: by the wire request they
    were, and those that never reached llmtap by the agent's session id."""
    from analysis.agent_account import reported

    found: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    low, high = min(r["t0"] for r in rows) - 60, max(_end(r) for r in rows) + 60
    if not reported(query, f"to_timestamp({low!r})"):
        return found
    for session_id, *request in query(AGENT_REQUESTS_SQL.format(low=low, high=high))[2]:
        found[request[0] or session_id or ""].append(tuple(request))
    return found


def slow_sessions(query: Query, where: str = "TRUE", gap_s: float = GAP_S) -> list[dict[str, str | None]]:
    """The sessions `flag_slow` flags among those of `where`, oldest first: (session key, its tool, why),
    from their requests' medians alone (no timeline built: `llmtap errors`)."""
    _, _, cells, keyed, _ = _sessions_pass(query, where, gap_s, "FALSE")
    flags = _flags(cells)
    return [{"session": key, "tool": tool, "why": flags[key]} for key, tool in keyed if key in flags]


def _grouped(query: Query, where: str, gap_s: float) -> tuple[set[str], dict[str, str]]:
    """The columns the database has (a bare table or an older database lacks some) and GROUPED_SQL's terms."""
    have = set(query("SELECT * FROM requests LIMIT 0")[0])
    columns = ", ".join(COLUMNS).format(cost="cost_usd" if "cost_usd" in have else "NULL",
                                        project="project" if "project" in have else "NULL")
    return have, {"columns": columns, "where": where, "gap": repr(float(gap_s))}


def find(all_sessions: Iterable[Session], key: str) -> list[Session]:
    """The sessions whose key starts with `key` (as `llmtap show` takes an id's prefix)."""
    return [s for s in all_sessions if s.key == key] or [s for s in all_sessions if s.key.startswith(key)]


def _end(row: dict[str, Any]) -> float:
    return row["t0"] + row["e2e_ms"] / 1000


def timeline(rows: list[dict[str, Any]], runs: Runs, agent: list[tuple[Any, ...]] | None = None) -> Session:
    """One session's spans and totals, from its generations in time order, their tool calls' runs and the
    agent's API requests (`_agent_requests`: those that never reached llmtap are spans of their own)."""
    spans = [*_model_spans(rows), *_tool_spans(rows, runs)]
    spans += _you_spans(rows, spans, runs)
    first = rows[0]
    start, end = first["t0"], max(_end(r) for r in rows)
    ids = {r["id"] for r in rows}
    agent = agent or []
    lost = [Span("agent", "request", at - agent_ms / 1000, at, "") for _, _, _, at, agent_ms, never in agent
            if never and start <= at <= end and agent_ms]
    spans += lost
    spans.sort(key=lambda s: (s.start_s, PRIORITY.index(s.part) if s.part in PRIORITY else 2))
    mine = [(rid, measure, ms) for rid, measure, ms, *_ in agent if rid in ids and ms is not None]
    client: dict[str, float] = defaultdict(float)
    for _, measure, ms in mine:
        client[measure] += ms
    joined = lost or mine or any(c[6] == "wire+agent" for r in rows for c in runs.get(r["id"], ()) if len(c) > 6)
    return Session(
        accounts="wire + agent" if joined else "wire", client_ms=dict(client),
        request_client_ms={rid: ms for rid, measure, ms in mine if measure != "ttft"},
        key=_key(first), session_id=first["session_id"], inferred=not first["session_id"], tool=first["tool"],
        start_s=start, end_s=end, requests=len(rows), turns=1 + sum(s.part == "you" for s in spans),
        input_tokens=_sum(r["input_tokens"] for r in rows), output_tokens=_sum(r["output_tokens"] for r in rows),
        cost_usd=_sum(r["cost_usd"] for r in rows), models=sorted({r["request_model"] for r in rows if r["request_model"]}),
        spans=spans, totals=totals(spans, start, end),
        project=next((r["project"] for r in reversed(rows) if r.get("project")), None))


def _key(first: dict[str, Any]) -> str:
    return first["session_id"] or "~" + first["id"][:12]


def _sum(values: Iterable[Any]) -> Any:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _model_spans(rows: list[dict[str, Any]]) -> Iterable[Span]:
    for row in rows:
        start, end, model = row["t0"], _end(row), row["request_model"]
        first = start + row["ttft_ms"] / 1000 if row["ttft_ms"] is not None else end
        yield Span("model", "wait", start, min(first, end), row["id"], model)
        if first < end:
            yield Span("model", "generating", first, end, row["id"], model)


def _tool_spans(rows: list[dict[str, Any]], runs: Runs) -> Iterable[Span]:
    """From the end of the first call's block of each response that asked for tools to the first later
    request carrying their results (the last of them: the calls of one response share a span); open
    while one has not come."""
    for row in rows:
        calls = runs.get(row["id"])
        if not calls:
            continue
        answered = [call[1] for call in calls]
        names = tuple(call[0] or "?" for call in calls)
        ended = [call[2] for call in calls if len(call) > 2 and call[2] is not None]
        end = None if None in answered else max(answered)
        yield from _split(Span("tool", "+".join(dict.fromkeys(names)), min(ended, default=_end(row)), end, row["id"],
                               row["request_model"], names), calls)


def _split(span: Span, calls: list[tuple[Any, ...]]) -> Iterable[Span]:
    """A tool span by the agent's account of its calls (analysis/agent_account.py): from its start, the
    person approving (of a group, the longest approval); the calls' runs (each from its reported end back
    by its duration, a group's overlapping runs once); the rest the agent's own. Unchanged without one."""
    approvals = [c[3] for c in calls if len(c) > 3 and c[3] is not None]
    timed = [c for c in calls if len(c) > 4 and c[4] is not None]
    if span.end_s is None or not (approvals or timed):
        yield span
        return
    start, end = span.start_s, span.end_s
    cursor = min(end, start + max(approvals, default=0.0) / 1000)
    if cursor > start:
        yield replace(span, kind="you", part="approving", end_s=cursor, calls=())
    if not timed:
        yield replace(span, start_s=cursor)
        return
    runs = sorted((c[5] - c[4] / 1000, c[5]) if c[5] is not None else (cursor, cursor + c[4] / 1000) for c in timed)
    merged: list[list[float]] = []
    for a, b in ((max(a, cursor), min(b, end)) for a, b in runs):
        if b <= a:
            continue
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    for a, b in merged:
        if a > cursor:
            yield replace(span, kind="agent", part="agent", start_s=cursor, end_s=a, calls=())
        yield replace(span, start_s=a, end_s=b)
        cursor = b
    if end > cursor:
        yield replace(span, kind="agent", part="agent", start_s=cursor, end_s=end, calls=())


def _you_spans(rows: list[dict[str, Any]], spans: list[Span], runs: Runs) -> list[Span]:
    """The quiet stretches that follow a response that asked for no tool (and end at a request)."""
    asked = {row["id"] for row in rows if runs.get(row["id"])}
    busy = sorted((s for s in spans if s.end_s is not None), key=lambda s: (s.start_s, s.end_s))
    found = []
    reach, last = None, None
    for span in busy:
        start, end = span.start_s, span.end_s
        if reach is not None and start > reach and last is not None and last.kind == "model" \
                and last.request_id not in asked:
            found.append(Span("you", "you", reach, start, last.request_id))
        if reach is None or end >= reach:  # type: ignore[operator]  # busy spans have an end
            reach, last = end, span
    return found


def totals(spans: list[Span], start: float, end: float) -> Totals:
    """Each instant from `start` to `end` to the first part of PRIORITY that covers it (of tools, the one
    that started first). One sweep over the spans' edges: a span enters at its start, and leaves a heap
    (by its end; tools' by their start) once it has ended, so a session of thousands of requests takes
    milliseconds, not minutes."""
    edges = sorted({start, end, *(s.start_s for s in spans), *(s.end_s for s in spans if s.end_s is not None)})
    closed = sorted(((s.start_s, i, s) for i, s in enumerate(s for s in spans if s.end_s is not None)),
                    key=lambda e: (e[0], e[1]))
    out = Totals(wall_s=end - start)
    tools: dict[str, float] = defaultdict(float)
    active: dict[str, list[tuple[float, int, Span]]] = {part: [] for part in PRIORITY}
    entered = 0
    for a, b in zip(edges, edges[1:]):
        while entered < len(closed) and closed[entered][0] <= a:
            _, i, span = closed[entered]
            order = span.start_s if span.kind == "tool" else (span.end_s or 0.0)
            heappush(active[span.kind if span.kind in ("tool", "agent") else span.part], (order, i, span))
            entered += 1
        if b <= start or a >= end:
            continue
        top = None
        for part in PRIORITY:
            heap = active[part]
            while heap and heap[0][2].end_s < b:  # type: ignore[operator]  # ended: never active again
                heappop(heap)
            if heap:
                top = part
                break
        if top is None:
            out.other_s += b - a
        elif top == "generating":
            out.generating_s += b - a
        elif top == "wait":
            out.wait_s += b - a
        elif top == "tool":
            tools[active["tool"][0][2].part] += b - a
        elif top == "agent":
            out.agent_s += b - a
        else:
            out.you_s += b - a
            out.approving_s += (b - a) * (top == "approving")
    out.tools_s = dict(sorted(tools.items(), key=lambda kv: -kv[1]))
    return out


def tool_names(query: Query, where: str = "TRUE") -> list[dict[str, Any]]:
    """`llmtap report --by tool_name`: each tool's runs (a call alone in its response: from its block's end
    to the request that brought its result; a parallel group's: once, by the group's name), their count,
    those never answered, the calls counted in groups, percentiles and total (TOOL_NAME_SQL)."""
    if "tool_calls" not in query("SELECT * FROM requests LIMIT 0")[0]:
        return []
    from analysis.views import tool_runs_sql

    calls = f"kind = 'generation' AND ({where})"
    low = query(f"SELECT CAST(min(started_at) AS VARCHAR) FROM requests WHERE tool_calls IS NOT NULL AND {calls}")[2][0][0]
    if low is None:
        return []
    first = f"{sql_string(low)}::TIMESTAMPTZ - INTERVAL 1 MILLISECOND"
    from analysis.agent_account import runs_with_accounts

    columns, _, data = query(TOOL_NAME_SQL.format(runs=runs_with_accounts(query, tool_runs_sql(calls, first), first)))
    return [dict(zip(columns, r)) for r in data]


def flag_slow(found: list[Session], rows: list[dict[str, Any]]) -> None:
    """Flag a session whose median TPOT, or TTFT per input token, on a model is SLOW_FACTOR times the
    median of at least two other sessions on that model within PEER_WINDOW_S of it (the medians of
    their requests' times; anthropics/claude-code#91413)."""
    of = {span.request_id: s.key for s in found for span in s.spans if span.kind == "model"}
    members: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if row["id"] in of:
            members[of[row["id"]]].append(row)
    flags = _flags(_cells(list(members.items())))
    for s in found:
        if s.slow is None:
            s.slow = flags.get(s.key)


# (session key, model) -> the median of its successful requests' starts, and of each of its METRICS
Cells = dict[tuple[str, str], tuple[float, dict[str, float]]]


def _flags(cells: Cells, wanted: set[str] | None = None) -> dict[str, str]:
    """`flag_slow`'s findings by session key, from the sessions' cells (a session's first finding, in
    its rows' order, is the one it shows); for the sessions `wanted` alone (None: all), the peers of
    those alone looked at (the cells within PEER_WINDOW_S of theirs)."""
    if wanted is not None:
        mine = [c[0] for k, c in cells.items() if k[0] in wanted]
        low, high = min(mine, default=0.0) - PEER_WINDOW_S, max(mine, default=0.0) + PEER_WINDOW_S
        cells = {k: c for k, c in cells.items() if low <= c[0] <= high}
    at = {k: c[0] for k, c in cells.items()}
    medians = {k: c[1] for k, c in cells.items()}
    typical = _peer_medians(medians, at)
    flags: dict[str, str] = {}
    for place in cells:
        key, model = place
        if wanted is not None and key not in wanted:
            continue
        for metric in METRICS:
            peers = typical.get((place, metric))
            if peers is None:
                continue
            count, middle = peers
            value = medians[place][metric]
            if middle > 0 and value >= SLOW_FACTOR * middle and key not in flags:
                flags[key] = (f"{metric} {value / middle:.1f}x the median of {count} other sessions"
                              f" on {model} within the hour")
    return flags


def _cells(groups: list[tuple[str, list[dict[str, Any]]]]) -> Cells:
    """(session key, model) -> the medians of the starts, TPOTs and TTFTs per input token of its successful
    requests, for sessions given as (key, their rows in time order)."""
    lists: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for key, rows in groups:
        for row in rows:
            if row["outcome"] != "ok" or not row["request_model"]:
                continue
            cell = lists[(key, row["request_model"])]
            cell["t0"].append(row["t0"])
            if row["tpot_ms"] is not None:
                cell["TPOT"].append(row["tpot_ms"])
            if row["ttft_ms"] is not None and row["input_tokens"]:
                cell["TTFT per input token"].append(row["ttft_ms"] / row["input_tokens"])
    return {k: (statistics.median(c["t0"]), {m: statistics.median(c[m]) for m in METRICS if c[m]})
            for k, c in lists.items()}


METRICS = ("TPOT", "TTFT per input token")


def _peer_medians(medians: dict[tuple[str, str], dict[str, float]], at: dict[tuple[str, str], float]
                  ) -> dict[tuple[tuple[str, str], str], tuple[int, float]]:
    """For each cell (session, model) and metric: how many other cells on the model have the metric
    within PEER_WINDOW_S of it (at least two), and the median of their medians. A window slides over
    the model's cells in time order, its values kept sorted: a day of 7,500 sessions takes
    milliseconds (the median of every peer list anew took seconds)."""
    out: dict[tuple[tuple[str, str], str], tuple[int, float]] = {}
    models: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for cell in medians:
        models[cell[1]].append(cell)
    for cells in models.values():
        for metric in METRICS:
            entries = sorted((at[c], medians[c][metric], c) for c in cells if metric in medians[c])
            window: list[float] = []
            low = high = 0
            for when_s, mine, cell in entries:
                while high < len(entries) and entries[high][0] <= when_s + PEER_WINDOW_S:
                    insort(window, entries[high][1])
                    high += 1
                while entries[low][0] < when_s - PEER_WINDOW_S:
                    del window[bisect_left(window, entries[low][1])]
                    low += 1
                n = len(window) - 1  # the others: the window less this cell's one value
                if n < 2:
                    continue
                skip = bisect_left(window, mine)
                out[(cell, metric)] = (n, _median_without(window, skip))
    return out


def _median_without(window: list[float], skip: int) -> float:
    """The median of a sorted window less its element at `skip`."""
    n = len(window) - 1

    def kth(k: int) -> float:
        return window[k if k < skip else k + 1]

    return kth(n // 2) if n % 2 else (kth(n // 2 - 1) + kth(n // 2)) / 2
