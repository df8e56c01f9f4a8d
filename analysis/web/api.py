"""The web UI's JSON API, `GET /_llmtap/api/<name>?...` (docs/ui.md lists every endpoint).

Each endpoint is `fn(query, params) -> (status, JSON bytes)`: `query` runs one read-only statement
on the `requests` view and its siblings (analysis/views.py), in the proxy's admin SQL thread
(proxy/relay/admin.py gives it), `params` is the URL's query, each name with its list of values.
Every figure comes from the function the CLI prints it from, so the page shows what
`llmtap report|show|sessions|session|compare --format json` print for the same requests:

- `requests`: a page of rows of the `requests` view, filtered, sorted, counted;
- `request/<id>`: `show`'s request and chunks, its waterfall (the breakdown's parts,
  analysis/breakdown.py), its rate-limit headroom, its error's diagnosis (analysis/diagnose.py),
  its captured bodies;
- `report`: `report --format json`; `overview`: the HTML report's data and charts (analysis/html/), drawn
  by the report's own renderer (static/report.js);
- `sessions`, `session/<key>`: `sessions` / `session KEY --format json` (analysis/timeline.py);
- `compare`: `compare --by COLUMN A B --format json` (analysis/compare.py);
- `facets`: the values the filters offer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import orjson

from proxy.common.schema import KINDS, Outcome

from analysis import report as report_mod, show as show_mod
from analysis.breakdown import stated_split
from analysis.filters import Filters, sql_string
from analysis.formatting import plain
from analysis.timewindow import WindowError, parse_time, utc_now

Query = Callable[[str], tuple[list[str], list[str], list[tuple[Any, ...]]]]
Params = dict[str, list[str]]
Answer = tuple[int, bytes]

PAGE = 50
MAX_PAGE = 500
LIST_COLUMNS = ("id", "started_at", "tool", "request_model", "kind", "outcome", "status", "stream", "ttft_ms",
                "tpot_ms", "e2e_ms", "input_tokens", "output_tokens", "cost_usd", "session_id", "tag", "error_type",
                "error_message")
SORTABLE = frozenset(LIST_COLUMNS) - {"error_message"}
FACETS = ("request_model", "tool", "tag", "session_id")
FACET_VALUES = 50
MAX_SESSIONS = 200  # the newest sessions listed
MAX_GAP_MIN = 7 * 24 * 60  # a week
RATELIMIT_PREFIX = "ratelimit_"


class BadRequest(ValueError):
    """A parameter the endpoint cannot take; the message is for the page."""


class QuerySource:
    """A `query` callable as the `Source` the CLI's builders take."""

    def __init__(self, query: Query) -> None:
        self.query = query

    def close(self) -> None:
        pass


def dump(data: Any, status: int = 200) -> Answer:
    return status, orjson.dumps(plain(data), default=str)


def one(params: Params, name: str, default: str | None = None) -> str | None:
    values = [v for v in params.get(name, ()) if v != ""]
    return values[-1] if values else default


def number(params: Params, name: str, default: int, low: int, high: int) -> int:
    text = one(params, name)
    if text is None:
        return default
    try:
        return max(low, min(high, int(text)))
    except ValueError:
        raise BadRequest(f"{name} is a whole number, not {text!r}") from None


def filters_of(params: Params, kinds: tuple[str, ...] = ()) -> Filters:
    """The filters the pages send: since/until (the CLI's forms: 30m, 24h, today, an ISO time), and
    each of model, tool, tag, kind, session, outcome (repeatable: OR-ed)."""
    now = utc_now()
    try:
        since = parse_time(s, now) if (s := one(params, "since")) else None
        until = parse_time(u, now) if (u := one(params, "until")) else None
    except WindowError as exc:
        raise BadRequest(str(exc)) from None
    values = {name: tuple(v for v in params.get(name, ()) if v) for name in ("model", "tool", "tag", "kind",
                                                                            "session", "outcome")}
    bad = [k for k in values["kind"] if k not in KINDS] + [o for o in values["outcome"] if o not in set(Outcome)]
    if bad:
        raise BadRequest(f"no such kind or outcome: {', '.join(bad)}")
    conditions = []
    for column, name in (("session_id", "session"), ("outcome", "outcome")):
        if values[name]:
            conditions.append(f"{column} IN ({', '.join(sql_string(v) for v in values[name])})")
    return Filters(since=since, until=until, tags=values["tag"], models=values["model"], tools=values["tool"],
                   kinds=values["kind"] or kinds, conditions=tuple(conditions))


def rows_of(query: Query, sql: str) -> list[dict[str, Any]]:
    columns, _, rows = query(sql)
    return [dict(zip(columns, row)) for row in rows]


# -- the endpoints ---------------------------------------------------------------


def requests(query: Query, params: Params, rest: str) -> Answer:
    """A page of requests: `sort` (a column of LIST_COLUMNS), `order` (asc/desc), `offset`, `limit`."""
    where = filters_of(params).where()
    sort = one(params, "sort", "started_at")
    if sort not in SORTABLE:
        raise BadRequest(f"cannot sort by {sort!r}: one of {', '.join(sorted(SORTABLE))}")
    order = "ASC" if one(params, "order", "desc") == "asc" else "DESC"
    limit, offset = number(params, "limit", PAGE, 1, MAX_PAGE), number(params, "offset", 0, 0, 10**9)
    total = query(f"SELECT count(*) FROM requests WHERE {where}")[2][0][0]
    rows = rows_of(query, f"SELECT {', '.join(LIST_COLUMNS)} FROM requests WHERE {where}"
                          f" ORDER BY {sort} {order} NULLS LAST, id LIMIT {limit} OFFSET {offset}")
    return dump({"total": total, "offset": offset, "limit": limit, "sort": sort, "order": order.lower(),
                 "columns": list(LIST_COLUMNS), "rows": rows})


def waterfall(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's time, in the order it passed, as the browser's network panel draws it: each part
    of the TTFT breakdown (analysis/breakdown.py's parts, by their columns), then the decode, then the
    rest to the end. `start_ms` from the arrival at the proxy. Where the upstream stated its time, the
    part it splits (analysis/breakdown.py `stated_split`) is drawn as the upstream's stated time, then the path."""
    parts = [("proxy overhead", "proxy_overhead_ms"), ("pool wait", "pool_wait_ms"), ("llmtap wait", "proxy_wait_ms"),
             ("DNS", "dns_ms"), ("connect", "connect_ms"), ("TLS", "tls_ms"), ("upstream wait", "upstream_wait_ms"),
             ("headers → first token", "headers_to_first_token_ms"), ("decode", "decode_ms")]
    out, at = [], 0.0
    split = stated_split(row)  # the wait the upstream accounts for, and the path's rest of it
    for label, column in parts:
        value = row.get(column)
        if value is None:
            continue
        pieces = [(label, column, float(value))]
        if split is not None and split[0] == column:
            pieces = [("upstream's stated time", split[1], split[2]), ("path", column, split[3])]
        for part, name, ms in pieces:
            out.append({"part": part, "column": name, "start_ms": round(at, 3), "ms": round(ms, 3)})
            at += ms
    end = row.get("e2e_ms")
    if out and end is not None and end - at > 0.0005:
        out.append({"part": "to the end", "column": "e2e_ms", "start_ms": round(at, 3), "ms": round(end - at, 3)})
    return out


def diagnosis(query: Query, row: dict[str, Any]) -> list[str]:
    """`llmtap errors`' causes and fixes for this one request's failure (its group of one)."""
    if row.get("outcome") in (None, "ok"):
        return []
    from analysis.diagnose import diagnose, error_groups

    groups = error_groups(QuerySource(query), Filters(conditions=(f"id = {sql_string(row['id'])}",)))
    return diagnose(groups[0]) if groups else []


def bodies(query: Query, request_id: str) -> dict[str, Any] | None:
    have = {r[0] for r in query("SELECT table_name FROM duckdb_tables() WHERE table_name = 'bodies'")[2]}
    if not have:
        return None
    found = rows_of(query, f"SELECT * FROM bodies WHERE request_id = {sql_string(request_id)} LIMIT 1")
    return found[0] if found else None


def request(query: Query, params: Params, rest: str) -> Answer:
    """One request: `show`'s JSON (`request`, `chunks`) and the page's sections made from it."""
    try:
        shown = show_mod.find(QuerySource(query), rest)
    except show_mod.NoMatch as exc:
        return dump({"error": str(exc)}, 404)
    except show_mod.ShowError as exc:
        raise BadRequest(str(exc)) from None
    row = shown.row
    return dump({
        "request": row, "chunks": shown.chunks,
        "waterfall": waterfall(row),
        "ratelimits": {k: v for k, v in row.items() if k.startswith(RATELIMIT_PREFIX) and v is not None},
        "diagnosis": diagnosis(query, row),
        "bodies": bodies(query, row["id"]),
        "agent": agent_account(query, row),
    })


def agent_account(query: Query, row: dict[str, Any]) -> list[dict[str, Any]]:
    """The agent's own account of this request (analysis/agent_account.py): its time for it against llmtap's,
    the difference its client-side time; none where the agent sent no telemetry (or the views are absent)."""
    if row.get("started_at") is None or not row.get("kind") == "generation":
        return []
    at = f"{sql_string(str(row['started_at']))}::TIMESTAMPTZ"
    try:
        return rows_of(query, "SELECT agent, event_name, measure, agent_ms, wire_ms, client_ms FROM api_request_accounts"
                              f" WHERE event_at BETWEEN {at} AND {at} + INTERVAL 1 HOUR"
                              f" AND request_id = {sql_string(row['id'])}")
    except Exception:  # noqa: BLE001  (a source without the agent views)
        return []


def report(query: Query, params: Params, rest: str) -> Answer:
    """`llmtap report --by BY --format json` (generations unless `kind`)."""
    by = one(params, "by", "model")
    if by not in report_mod.GROUPINGS:
        raise BadRequest(f"cannot group by {by!r}: one of {', '.join(report_mod.GROUPINGS)}")
    filters = filters_of(params, kinds=("generation",) if by != "kind" else ())
    return 200, report_mod.to_json(report_mod.build_report(QuerySource(query), by, filters)).encode()


def overview(query: Query, params: Params, rest: str) -> Answer:
    """The HTML report's figures, as its file embeds them for the same renderer (analysis/html/)."""
    from analysis.html.charts import build_charts
    from analysis.html.page import overview_data
    from analysis.html.queries import fetch_report_data

    data = fetch_report_data(query, filters_of(params, kinds=("generation",)).where())
    return dump(overview_data(data, build_charts(data) if data["totals"]["requests"] else [], filtered=True,
                              counted="generations"))


def _gap_s(params: Params) -> float:
    from analysis.timeline import GAP_S

    gap_min = one(params, "gap")
    if not gap_min:
        return GAP_S
    try:
        minutes = float(gap_min)
    except ValueError:
        minutes = math.nan
    if not 0 < minutes <= MAX_GAP_MIN:  # nan, inf, 0, negative: not a gap (DuckDB's own error said so, raw)
        raise BadRequest(f"gap is minutes, above 0 and at most {MAX_GAP_MIN:g}, not {gap_min!r}")
    return minutes * 60


def sessions(query: Query, params: Params, rest: str) -> Answer:
    """`llmtap sessions --format json`, the newest MAX_SESSIONS first (their timelines alone built)."""
    from analysis.session_report import session_json
    from analysis.timeline import newest

    total, found = newest(query, filters_of(params).where(), _gap_s(params), MAX_SESSIONS)
    return dump({"total": total, "sessions": [session_json(s) for s in reversed(found)]})


def session(query: Query, params: Params, rest: str) -> Answer:
    """`llmtap session KEY --format json` (its spans from its start), with the same filters as the list."""
    from analysis.session_report import session_json
    from analysis.timeline import matching

    where, gap_s = filters_of(params).where(), _gap_s(params)
    found = matching(query, rest, where, gap_s)
    if (rid := one(params, "request")) is not None:  # the session of this request (a request page's link)
        def holding(sessions: list[Any]) -> list[Any]:
            return [s for s in sessions if any(sp.request_id == rid for sp in s.spans)]
        found = holding(found) or holding(matching(query, rest.rstrip("/") + "/", where, gap_s))
    if len(found) != 1:
        return dump({"error": f"{len(found) or 'no'} sessions start with {rest}"}, 404 if not found else 400)
    return dump({**session_json(found[0], spans=True), "side": side_requests(query, found[0], where, gap_s)})


def side_requests(query: Query, s: Any, where: str, gap_s: float) -> list[dict[str, Any]]:
    """The session's side requests (`kind` 'side': an agent's requests beside its turns, which the
    timeline leaves out), from its start to a gap past its end, for the page to fold under the turn
    each falls in; `start_s` from the session's start."""
    by = f"session_id = {sql_string(s.session_id)}" if s.session_id else \
        f"session_id IS NULL AND tool IS NOT DISTINCT FROM {sql_string(s.tool) if s.tool else 'NULL'}"
    rows = rows_of(query, f"SELECT id AS request_id, epoch(started_at) - {s.start_s!r} AS start_s, ttft_ms, e2e_ms,"
                          f" request_model AS model FROM requests WHERE kind = 'side' AND {by} AND {where}"
                          f" AND epoch(started_at) BETWEEN {s.start_s!r} AND {s.end_s + gap_s!r} ORDER BY started_at, id")
    return [{**r, "start_s": round(r["start_s"], 6)} for r in rows]


def compare(query: Query, params: Params, rest: str) -> Answer:
    """`llmtap compare --by BY A B --format json`: `by` one of compare's --by names, `a` the baseline."""
    from analysis.compare import CompareError, Side, as_dict, compare as run_compare
    from analysis.compare_cli import BY, _value_side

    by = one(params, "by", "model")
    if by not in BY:
        raise BadRequest(f"compare by one of {', '.join(BY)}, not {by!r}")
    names = [n for n in (one(params, "a"), one(params, "b")) if n]
    if len(names) != 2:
        raise BadRequest("give two sides: a (the baseline) and b")
    where = filters_of(params, kinds=("generation",)).where()
    try:
        result = run_compare(query, [Side(*_value_side(BY[by], n)) for n in names], where, by)
    except CompareError as exc:
        raise BadRequest(str(exc)) from None
    return dump(as_dict(result))


def facets(query: Query, params: Params, rest: str) -> Answer:
    """The busiest values of each filter's column in the window (for the pages' choices)."""
    where = replace(filters_of(params), models=(), tools=(), tags=(), kinds=(), conditions=()).where()
    union = " UNION ALL ".join(
        f"(SELECT '{column}' AS facet, CAST({column} AS VARCHAR) AS value, count(*) AS n FROM requests"
        f" WHERE {where} AND {column} IS NOT NULL GROUP BY 2 ORDER BY n DESC, 2 LIMIT {FACET_VALUES})" for column in FACETS)
    out: dict[str, Any] = {column: [] for column in FACETS}
    for facet, value, _ in query(f"SELECT * FROM ({union}) ORDER BY facet, n DESC, value")[2]:
        out[facet].append(value)
    out["kinds"], out["outcomes"] = list(KINDS), [o.value for o in Outcome]
    out["compare_by"] = ["model", "tool", "route", "upstream_host", "tag", "key", "dialect"]
    out["report_by"] = list(report_mod.GROUPINGS)
    return dump(out)


ENDPOINTS: dict[str, Callable[[Query, Params, str], Answer]] = {
    "requests": requests, "request": request, "report": report, "overview": overview, "sessions": sessions,
    "session": session, "compare": compare, "facets": facets,
}


def endpoint(name: str) -> Callable[[Query, Params], Answer] | None:
    """The handler for `/_llmtap/api/<name>` (`request/<id>`, `session/<key>`: the rest is its argument)."""
    head, _, rest = name.partition("/")
    fn = ENDPOINTS.get(head)
    if fn is None or (head in ("request", "session")) != bool(rest):
        return None
    from urllib.parse import unquote

    argument = unquote(rest)

    def answer(query: Query, params: Params) -> Answer:
        try:
            return fn(query, params, argument)
        except BadRequest as exc:
            return dump({"error": str(exc)}, 400)

    return answer
