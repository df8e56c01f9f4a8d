"""Where a session's time went (#29): model, tool and you spans from the rows, through the real proxy.

A client plays the agent against the simulated upstream: it asks, gets a tool call, "runs" the tool
for a time it measures itself, sends the result, gets the final text, then "thinks" before its next
prompt. The recorded spans must be the rows' own times, and the tool and you spans what the client
measured (plus the short way from the client to the proxy and back, far under the tolerance)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import duckdb
import orjson
import pytest
from click.testing import CliRunner

from analysis import timeline
from analysis.source import FileSource
from proxy.cli import main
from .serving import RunningProxy
from proxy.simulator.app import Simulator
from proxy.simulator.tokens import TOOL_NAME

from .cli_traffic import claude_tools
from .conftest import proxy_config

SESSION = "5e551011-aaaa-4bbb-8ccc-000000000029"
TOOL_S, YOU_S = 0.4, 0.3
FAST = {"x-sim-ttft-ms": "40", "x-sim-itl-ms": "5", "x-sim-tokens": "6"}


def claude_body(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": "claude-x", "max_tokens": 64, "stream": True, "messages": messages,
            "tools": claude_tools(TOOL_NAME, "Bash", "Read")}


async def turn(s: aiohttp.ClientSession, url: str, messages: list[dict[str, Any]], tool: bool,
               session: str | None = SESSION) -> tuple[list[dict[str, Any]], float]:
    """One request; the tool_use blocks of its answer, and when its last byte was read (monotonic)."""
    headers = {**FAST, "user-agent": "claude-cli/2.1.197 (external, cli)"}
    if session:
        headers["x-claude-code-session-id"] = session
    if tool:
        headers["x-sim-tool-call"] = "1"
    async with s.post(url + "/v1/messages", json=claude_body(messages), headers=headers) as r:
        assert r.status == 200
        body = await r.read()
    done = time.monotonic()
    calls = []
    for line in body.split(b"\n"):
        if line.startswith(b"data: "):
            event = orjson.loads(line[6:])
            if event.get("type") == "content_block_start" and event["content_block"]["type"] == "tool_use":
                calls.append(event["content_block"])
    return calls, done


async def agent(url: str, session: str | None = SESSION) -> dict[str, float]:
    """Prompt → tool call → the tool runs TOOL_S → result → text; you think YOU_S; prompt → text.
    What the client itself measured: the tool's span and your span."""
    async with aiohttp.ClientSession() as s:
        history: list[dict[str, Any]] = [{"role": "user", "content": "list the files " * 20}]
        calls, answered = await turn(s, url, history, tool=True, session=session)
        await asyncio.sleep(TOOL_S)  # the tool running on the user's machine
        history += [{"role": "assistant", "content": calls},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": c["id"], "content": "ok"}
                                                 for c in calls]}]
        sent = time.monotonic()
        _, finished = await turn(s, url, history, tool=False, session=session)
        tool_gap = sent - answered
        await asyncio.sleep(YOU_S)  # the person reading and typing
        history += [{"role": "assistant", "content": "done"}, {"role": "user", "content": "thanks, now the tests"}]
        prompted = time.monotonic()
        await turn(s, url, history, tool=False, session=session)
        return {"tool": tool_gap, "you": prompted - finished}


@pytest.fixture
async def recorded(sim: Simulator, tmp_path: Path) -> tuple[Path, dict[str, float]]:
    async with RunningProxy(proxy_config(sim.url, tmp_path)) as p:
        measured = await agent(p.url)
        assert p.flush(10)
    return tmp_path / "llmtap.duckdb", measured


def read_sessions(db: Path, **kwargs: Any) -> list[timeline.Session]:
    source = FileSource(duckdb.connect(str(db), read_only=True))
    try:
        return timeline.sessions(source.query, **kwargs)
    finally:
        source.close()


def cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


async def test_spans_are_the_rows_own_times(recorded: tuple[Path, dict[str, float]]) -> None:
    db, measured = recorded
    [s] = read_sessions(db)
    assert s.key == SESSION and not s.inferred and s.tool == "claude-code"
    assert (s.requests, s.turns) == (3, 2)
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("SELECT id, epoch(started_at), ttft_ms, e2e_ms FROM requests ORDER BY started_at").fetchall()
    block_end = con.execute("SELECT tool_calls[1].ended_ms FROM requests ORDER BY started_at LIMIT 1").fetchone()[0]
    con.close()
    model = [sp for sp in s.spans if sp.kind == "model"]
    assert [(sp.request_id, sp.part) for sp in model] == [(r[0], part) for r in rows for part in ("wait", "generating")]
    for (_rid, t0, ttft, e2e), (wait, gen) in zip(rows, zip(model[::2], model[1::2])):
        assert wait.start_s == pytest.approx(t0, abs=1e-5) and wait.seconds == pytest.approx(ttft / 1000, abs=1e-5)
        assert gen.end_s == pytest.approx(t0 + e2e / 1000, abs=1e-5)
    [tool] = [sp for sp in s.spans if sp.kind == "tool"]
    [you] = [sp for sp in s.spans if sp.kind == "you"]
    assert tool.part == "lookup" and tool.request_id == rows[0][0]
    # the tool runs from its own block's end (#39: the agent starts it there), at or before the response's end
    assert tool.start_s == pytest.approx(rows[0][1] + block_end / 1000, abs=1e-5)
    assert tool.start_s <= rows[0][1] + rows[0][3] / 1000
    assert tool.end_s == pytest.approx(rows[1][1], abs=1e-5)
    assert you.request_id == rows[1][0] and you.end_s == pytest.approx(rows[2][1], abs=1e-5)
    # what the client measured, give or take the way between it and the proxy
    assert TOOL_S <= tool.seconds and abs(tool.seconds - measured["tool"]) < 0.05, (tool.seconds, measured)
    assert YOU_S <= you.seconds and abs(you.seconds - measured["you"]) < 0.05, (you.seconds, measured)
    t = s.totals
    # the part of the tool span the response was still streaming goes to the model: the total is as before
    assert t.tools_s["lookup"] == pytest.approx(tool.end_s - (rows[0][1] + rows[0][3] / 1000), abs=1e-5)
    assert t.you_s == pytest.approx(you.seconds, abs=1e-5)
    assert t.model_s + t.tool_s + t.you_s + t.other_s == pytest.approx(t.wall_s, abs=1e-5)
    assert t.other_s == pytest.approx(0, abs=1e-5)


async def test_the_commands_show_the_same_session(recorded: tuple[Path, dict[str, float]]) -> None:
    db, _ = recorded
    [s] = read_sessions(db)
    [listed] = json.loads(cli("sessions", "--db", str(db), "--format", "json"))
    shown = json.loads(cli("session", SESSION[:8], "--db", str(db), "--format", "json"))
    assert listed["session"] == shown["session"] == SESSION
    assert listed["totals"] == shown["totals"]
    assert shown["totals"]["tools_s"]["lookup"] == pytest.approx(s.totals.tools_s["lookup"], abs=1e-3)
    assert [(sp["kind"], sp["part"]) for sp in shown["spans"]] == [(sp.kind, sp.part) for sp in s.spans]
    table = cli("sessions", "--db", str(db))
    assert SESSION[:13] in table and "lookup" in table
    gantt = cli("session", SESSION, "--db", str(db))
    assert gantt.count("|") == 2 * len(s.spans) and "Longest tool runs: lookup" in gantt
    assert "model  wait" in gantt and "first token" not in gantt  # the JSON's and the web UI's name


async def test_a_key_pasted_from_sessions_finds_its_session(sim: Simulator, tmp_path: Path) -> None:
    """`llmtap sessions` prints `5e551011-aaaa…` (and `~` before an inferred one's key): pasted back as
    printed, or the inferred one without its `~`, `llmtap session` finds it."""
    async with RunningProxy(proxy_config(sim.url, tmp_path)) as p:
        await agent(p.url)
        await agent(p.url, session=None)  # no session id: inferred, by tool and key
        assert p.flush(10)
    db = str(tmp_path / "llmtap.duckdb")
    listed = cli("sessions", "--db", db).splitlines()
    named = next(line.split()[0] for line in listed if line.startswith("5e55"))
    inferred = next(line.split()[0] for line in listed if line.startswith("~") and not line.startswith("~ "))
    assert named == SESSION[:13] + "…", listed
    for key, expected in ((named, SESSION), (named + " !", SESSION), (inferred, inferred), (inferred[1:], inferred)):
        assert json.loads(cli("session", key, "--db", db, "--format", "json"))["session"] == expected, key


# -- parallel calls, overlaps, open spans, inferred sessions --------------------------------------

def row(rid: str, t0: float, e2e: float, ttft: float | None = None, session: str | None = "s") -> dict[str, Any]:
    """A generation's row as `timeline.ROWS_SQL` selects it."""
    return {"id": rid, "t0": t0, "e2e_ms": e2e * 1000, "ttft_ms": None if ttft is None else ttft * 1000,
            "session_id": session, "tool": "claude-code", "key_fingerprint": "k:1", "request_model": "m",
            "input_tokens": 10, "output_tokens": 5, "cost_usd": None, "tpot_ms": 5.0, "outcome": "ok"}


def test_parallel_calls_share_one_span_named_for_both() -> None:
    s = timeline.timeline([row("a", 0, 1, 0.5), row("b", 3, 1, 0.5)], {"a": [("Bash", 2.5), ("Read", 3)]})
    [tool] = [sp for sp in s.spans if sp.kind == "tool"]
    assert (tool.part, tool.start_s, tool.end_s) == ("Bash+Read", 1, 3)
    assert s.totals.tools_s == {"Bash+Read": 2}


def test_a_subagent_running_beside_counts_wall_time_once() -> None:
    # the main agent's Task tool runs 1 → 9 while a subagent's two requests generate inside it
    s = timeline.timeline([row("main", 0, 1, 0.5), row("sub1", 2, 2, 1), row("sub2", 5, 2, 1), row("main2", 9, 1, 0.5)],
                          {"main": [("Task", 9)]})
    t = s.totals
    assert t.wall_s == 10
    assert t.model_s == pytest.approx(1 + 2 + 2 + 1) and t.tools_s == {"Task": pytest.approx(8 - 4)}  # the rest
    assert t.model_s + t.tool_s + t.you_s + t.other_s == pytest.approx(t.wall_s)


def test_a_session_that_stops_mid_tool_shows_an_open_span() -> None:
    s = timeline.timeline([row("a", 0, 1, 0.5), row("b", 4, 1, 0.5)], {"b": [("Bash", None)]})
    [tool] = [sp for sp in s.spans if sp.kind == "tool"]
    assert tool.end_s is None and tool.start_s == 5
    [you] = [sp for sp in s.spans if sp.kind == "you"]
    assert (you.start_s, you.end_s) == (1, 4)
    from analysis.session_report import render_session

    assert "its result never came" in render_session(s, "table")


def table_query(rows: list[dict[str, Any]]) -> timeline.Query:
    """`sessions`' query over a bare `requests` table of these rows (as `row` makes them)."""
    con = duckdb.connect()
    con.execute("CREATE TABLE requests (id VARCHAR, started_at TIMESTAMPTZ, kind VARCHAR, e2e_ms DOUBLE, ttft_ms DOUBLE,"
                " session_id VARCHAR, tool VARCHAR, key_fingerprint VARCHAR, request_model VARCHAR,"
                " input_tokens BIGINT, output_tokens BIGINT, tpot_ms DOUBLE, outcome VARCHAR)")
    con.executemany("INSERT INTO requests VALUES (?, make_timestamptz((? * 1e6)::BIGINT), 'generation', ?, ?, ?, ?, ?, ?,"
                    " ?, ?, ?, ?)", [[r["id"], r["t0"], r["e2e_ms"], r["ttft_ms"], r["session_id"], r["tool"],
                                      r["key_fingerprint"], r["request_model"], r["input_tokens"], r["output_tokens"],
                                      r["tpot_ms"], r["outcome"]] for r in rows])

    def query(sql: str) -> tuple[list[str], list[str], list[tuple[Any, ...]]]:
        cur = con.execute(sql)
        return [d[0] for d in cur.description], [str(d[1]) for d in cur.description], cur.fetchall()
    return query


def test_a_long_gap_splits_a_session_and_a_tool_without_ids_is_inferred() -> None:
    rows = [row("a", 0, 1, session=None), row("b", 10, 1, session=None), row("c", 4000, 1, session=None)]
    first, second = timeline.sessions(table_query(rows))
    assert [first.requests, second.requests] == [2, 1]
    assert first.inferred and first.key == "~a" and second.key == "~c"


def _groups_by_definition(rows: list[dict[str, Any]], gap_s: float) -> list[list[dict[str, Any]]]:
    """The module docstring's grouping, row by row (the reference of GROUPED_SQL)."""
    by: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault((r["session_id"],) if r["session_id"] else ("~", r["tool"], r["key_fingerprint"]), []).append(r)
    groups = []
    for members in by.values():
        part: list[dict[str, Any]] = []
        end = None
        for r in members:
            if end is not None and r["t0"] - end > gap_s:
                groups.append(part)
                part = []
            part.append(r)
            end = max(end or r["t0"], r["t0"] + r["e2e_ms"] / 1000)
        groups.append(part)
    return groups


def test_the_newest_sessions_are_those_of_all_and_the_groups_are_as_defined() -> None:
    """`newest` (the web UI's page) gives what `sessions` gives for its newest, with the same flags and
    total, and `matching` what `find` finds among them; all group as the definition does (gaps, ids empty or none, one id prefix twice)."""
    import random

    from analysis.session_report import session_json

    rng = random.Random(30)
    rows = []
    for n in range(900):
        t0 = round(rng.uniform(0, 6 * 3600), 3)
        session = rng.choice([f"s{i}" for i in range(40)] + ["", None, None])
        r = row(f"{'x' * 12 if n % 50 == 0 else ''}{n:04d}", t0, rng.uniform(0.1, 30), rng.uniform(0.05, 0.1), session)
        r |= {"tool": rng.choice(("t1", "t2", None)), "key_fingerprint": rng.choice(("k1", "k2")),
              "request_model": rng.choice(("m1", "m2", None)), "outcome": "ok" if rng.random() > 0.1 else "http_error",
              "tpot_ms": rng.uniform(5, 6) * (10 if session in ("s3", "s7") else 1), "input_tokens": rng.choice((0, 100))}
        rows.append(r)
    rows.sort(key=lambda r: (r["t0"], r["id"]))
    query = table_query(rows)
    for gap_s in (timeline.GAP_S, 120.0):
        every = timeline.sessions(query, gap_s=gap_s)
        want = sorted(_groups_by_definition(rows, gap_s), key=lambda g: g[0]["t0"])
        assert [[r["id"] for r in g] for g in want] == [[sp.request_id for sp in s.spans if sp.part == "wait"]
                                                        for s in every]
        assert any(s.slow for s in every) and any("/" in s.key for s in every)
        reference = [timeline.Session(**{**s.__dict__, "slow": None}) for s in every]
        _slow_by_definition(reference, rows)  # the flags from SQL's medians are the definition's
        assert [s.slow for s in every] == [s.slow for s in reference]
        assert timeline.slow_sessions(query, gap_s=gap_s) == [
            {"session": s.key, "tool": s.tool, "why": s.slow} for s in every if s.slow]
        for count in (0, 1, 7, 40, len(every) + 5):
            total, page = timeline.newest(query, gap_s=gap_s, count=count)
            assert total == len(every)
            assert [session_json(s, spans=True) for s in page] == [session_json(s, spans=True)
                                                                   for s in every[max(0, len(every) - count):] if count]
        for key in {s.key for s in every[::7]} | {"s1", "~", "s2/", "nothing"}:  # a key, a prefix, none
            assert [session_json(s, spans=True) for s in timeline.matching(query, key, gap_s=gap_s)] == \
                [session_json(s, spans=True) for s in timeline.find(every, key)]


async def slow_among_peers(sim: Simulator, tmp_path: Path) -> str:
    """Three sessions on one model at the upstream's 20 ms a token, one at 300 ms (15x: however busy the
    machine, a loaded loop's stalls neither lift a 20 ms session to 3x its peers nor bring the slow one
    within it); the database."""
    async with RunningProxy(proxy_config(sim.url, tmp_path)) as p:
        async with aiohttp.ClientSession() as s:
            async def one(session: str, itl: str) -> None:
                headers = {**FAST, "x-sim-itl-ms": itl, "x-sim-tokens": "6", "x-claude-code-session-id": session,
                           "user-agent": "claude-cli/2.1.197 (external, cli)"}
                async with s.post(p.url + "/v1/messages", json=claude_body([{"role": "user", "content": "hi"}]),
                                  headers=headers) as r:
                    await r.read()
            await asyncio.gather(one("ok-1", "20"), one("ok-2", "20"), one("ok-3", "20"), one("crawl-1", "300"))
        assert p.flush(10)
    return str(tmp_path / "llmtap.duckdb")


async def test_sessions_flags_one_slow_among_concurrent_peers(sim: Simulator, tmp_path: Path) -> None:
    db = await slow_among_peers(sim, tmp_path)
    found = {s.key: s for s in read_sessions(Path(db))}
    assert found["crawl-1"].slow is not None and "TPOT" in found["crawl-1"].slow
    assert all(found[k].slow is None for k in ("ok-1", "ok-2", "ok-3"))
    assert "crawl-1 is slow" in cli("sessions", "--db", db)
    paged = cli("sessions", "--db", db, "--limit", "2")  # the newest two, said so
    assert "The newest 2 of 4 sessions in this window" in paged and paged.count("claude-code") == 2
    assert "no sessions in this window" in cli("sessions", "--db", db, "--until", "2026-01-01")


def test_peers_are_the_sessions_on_the_model_within_the_hour() -> None:
    rows = [row(f"{k}{i}", t0, 1, 0.1, session=k) | {"tpot_ms": tpot}
            for k, t0, tpot in (("a", 0, 5), ("b", 10, 5), ("c", 20, 6), ("slow", 30, 40), ("far", 9000, 5))
            for i in range(2)]
    found = [timeline.timeline([r for r in rows if r["session_id"] == k], {}) for k in ("a", "b", "c", "slow", "far")]
    timeline.flag_slow(found, rows)
    assert [s.key for s in found if s.slow] == ["slow"] and "TPOT 8.0x the median of 3" in found[3].slow
    rows = [r for r in rows if r["session_id"] in ("a", "slow", "far")]  # one peer within the hour: no verdict
    found = [timeline.timeline([r for r in rows if r["session_id"] == k], {}) for k in ("a", "slow", "far")]
    timeline.flag_slow(found, rows)
    assert not any(s.slow for s in found)


async def test_report_by_tool_name_gives_each_tools_run_times(recorded: tuple[Path, dict[str, float]]) -> None:
    db, measured = recorded
    [s] = read_sessions(db)
    [tool] = [sp for sp in s.spans if sp.kind == "tool"]
    [group] = json.loads(cli("report", "--db", str(db), "--by", "tool_name", "--format", "json"))["groups"]
    assert group["tool_name"] == "lookup" and (group["runs"], group["open"]) == (1, 0)
    assert group["p50_s"] == group["p95_s"] == group["max_s"] == pytest.approx(tool.seconds, abs=1e-3)
    assert "lookup" in cli("report", "--db", str(db), "--by", "tool_name")


async def test_report_by_tool_name_counts_each_call_and_those_never_answered(sim: Simulator, tmp_path: Path) -> None:
    """A call answered, then a call whose result never comes: one run, one open."""
    async with RunningProxy(proxy_config(sim.url, tmp_path)) as p, aiohttp.ClientSession() as s:
        history: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
        calls, _ = await turn(s, p.url, history, tool=True)
        history += [{"role": "assistant", "content": calls},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0]["id"]}]}]
        await turn(s, p.url, history, tool=True)  # asks again; its result never comes
        assert p.flush(10)
    db = str(tmp_path / "llmtap.duckdb")
    [group] = json.loads(cli("report", "--db", db, "--by", "tool_name", "--format", "json"))["groups"]
    assert (group["tool_name"], group["runs"], group["open"]) == ("lookup", 1, 1)
    [session] = read_sessions(tmp_path / "llmtap.duckdb")
    spans = [sp for sp in session.spans if sp.kind == "tool"]
    assert [sp.end_s is None for sp in spans] == [False, True]
    assert group["p50_s"] == pytest.approx(spans[0].seconds, abs=1e-3)


async def gemini_cli_turns(url: str, rounds: int) -> list[float]:
    """Gemini CLI's shape: each answer a `functionCall` without an id, each result a `functionResponse` with
    the id the CLI makes up (`lookup_<ms>_0`), the whole history sent each time; the last answer is text.
    When each request was sent (monotonic)."""
    path = "/v1beta/models/gemini-x:streamGenerateContent?alt=sse"
    headers = {**FAST, "x-goog-api-key": "AIza-test-38", "user-agent": "GeminiCLI/0.61.0/gemini-x (linux; x64)"}
    contents: list[dict[str, Any]] = [{"role": "user", "parts": [{"text": "list the files " * 20}]}]
    sent = []
    async with aiohttp.ClientSession() as s:
        for n in range(rounds + 1):
            sent.append(time.monotonic())
            tool = {"x-sim-tool-call": "1"} if n < rounds else {}
            body = {"contents": contents, "tools": [{"functionDeclarations": [{"name": "lookup"}]}]}  # as the CLI
            async with s.post(url + path, json=body, headers={**headers, **tool}) as r:
                assert r.status == 200
                await r.read()
            if n < rounds:
                await asyncio.sleep(0.05)  # the tool runs
                made_up = f"lookup_{int(time.time() * 1000)}_0"
                contents += [{"role": "model", "parts": [{"functionCall": {"name": "lookup", "args": {}}}]},
                             {"role": "user", "parts": [{"functionResponse": {"id": made_up, "name": "lookup",
                                                                              "response": {"output": "ok"}}}]}]
    return sent


async def test_gemini_cli_tool_runs_close_by_name_and_order(sim: Simulator, tmp_path: Path) -> None:
    """#41: a call without an id pairs with the result whose made-up id is none of the calls', by name and
    order in the session: two rounds of `lookup` close two spans, each at the request that carried its result."""
    async with RunningProxy(proxy_config(sim.url, tmp_path)) as p:
        await gemini_cli_turns(p.url, rounds=2)
        assert p.flush(10)
    db = tmp_path / "llmtap.duckdb"
    [s] = read_sessions(db)
    con = duckdb.connect(str(db), read_only=True)
    starts = [r[0] for r in con.execute("SELECT epoch(started_at) FROM requests ORDER BY started_at").fetchall()]
    con.close()
    tools = [sp for sp in s.spans if sp.kind == "tool"]
    assert [sp.end_s for sp in tools] == [pytest.approx(starts[1], abs=1e-5), pytest.approx(starts[2], abs=1e-5)]
    [group] = json.loads(cli("report", "--db", str(db), "--by", "tool_name", "--format", "json"))["groups"]
    assert (group["tool_name"], group["runs"], group["open"]) == ("lookup", 2, 0)


def test_a_tool_span_starts_where_its_own_block_ended() -> None:
    """#39: the agent starts a tool when its block closes, while the response still streams."""
    s = timeline.timeline([row("a", 0, 1, 0.5), row("b", 3, 1, 0.5)], {"a": [("Bash", 3, 0.6), ("Read", 3, 0.9)]})
    [tool] = [sp for sp in s.spans if sp.kind == "tool"]
    assert (tool.part, tool.start_s, tool.end_s) == ("Bash+Read", 0.6, 3)
    assert s.totals.tools_s == {"Bash+Read": 2}  # the streaming stays the model's


async def test_report_by_tool_name_counts_a_parallel_group_once(sim: Simulator, tmp_path: Path) -> None:
    """#39: `Bash` and `Read` asked for together, their results back together: the wire cannot tell the
    Read's own run from the Bash's, so neither is given the group's time; the group's wall counts once."""
    async with RunningProxy(proxy_config(sim.url, tmp_path)) as p, aiohttp.ClientSession() as s:
        history: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
        headers = {**FAST, "x-claude-code-session-id": SESSION, "x-sim-tool-call": "1", "x-sim-tool-name": "Bash,Read"}
        async with s.post(p.url + "/v1/messages", json=claude_body(history), headers=headers) as r:
            body = await r.read()
        calls = [orjson.loads(line[6:])["content_block"] for line in body.split(b"\n") if line.startswith(b"data: ")
                 and orjson.loads(line[6:]).get("type") == "content_block_start"
                 and orjson.loads(line[6:])["content_block"]["type"] == "tool_use"]
        assert [c["name"] for c in calls] == ["Bash", "Read"]
        await asyncio.sleep(TOOL_S)
        history += [{"role": "assistant", "content": calls},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": c["id"], "content": "ok"}
                                                 for c in calls]}]
        await turn(s, p.url, history, tool=False)
        assert p.flush(10)
    db = tmp_path / "llmtap.duckdb"
    [session] = read_sessions(db)
    [span] = [sp for sp in session.spans if sp.kind == "tool"]
    groups = {g["tool_name"]: g for g in json.loads(cli("report", "--db", str(db), "--by", "tool_name",
                                                          "--format", "json"))["groups"]}
    assert set(groups) == {"Bash+Read", "Bash", "Read"}
    assert (groups["Bash+Read"]["runs"], groups["Bash+Read"]["open"]) == (1, 0)
    assert groups["Bash+Read"]["total_s"] == pytest.approx(span.seconds, abs=1e-3)
    for name in ("Bash", "Read"):  # each call counted, its own run not known from the wire
        assert (groups[name]["runs"], groups[name]["in_groups"], groups[name]["total_s"]) == (0, 1, 0)
    assert sum(g["total_s"] for g in groups.values()) == pytest.approx(span.seconds, abs=1e-3)
    assert "Bash+Read" in cli("report", "--db", str(db), "--by", "tool_name")


async def test_the_html_report_draws_the_session_timeline(recorded: tuple[Path, dict[str, float]], tmp_path: Path) -> None:
    db, _ = recorded
    [s] = read_sessions(db)
    page = tmp_path / "report.html"
    cli("report", "--db", str(db), "--html", str(page))
    text = page.read_text()
    panel = text[text.index('<section class="panel sessions">'):]
    panel = panel[:panel.index("</section>")]
    assert SESSION[:20] in panel and "lookup" in panel
    assert panel.count('<div class="gantt">') == len(s.spans)


async def test_errors_shows_a_slow_session_as_a_finding(sim: Simulator, tmp_path: Path) -> None:
    db = await slow_among_peers(sim, tmp_path)
    found = json.loads(cli("errors", "--db", db, "--format", "json"))["slow_sessions"]
    assert [f["session"] for f in found] == ["crawl-1"] and found[0]["tool"] == "claude-code"
    assert "slow session crawl-1 (claude-code): TPOT" in cli("errors", "--db", db)


def _slow_by_definition(found: list[timeline.Session], rows: list[dict[str, Any]]) -> None:
    """flag_slow as its docstring says it, every peer list anew (quadratic): the reference."""
    import statistics
    from collections import defaultdict

    of = {span.request_id: s for s in found for span in s.spans if span.kind == "model"}
    cells: dict = defaultdict(lambda: defaultdict(list))
    for row in rows:
        s = of.get(row["id"])
        if s is None or row["outcome"] != "ok" or not row["request_model"]:
            continue
        cell = cells[(s.key, row["request_model"])]
        cell["t0"].append(row["t0"])
        if row["tpot_ms"] is not None:
            cell["TPOT"].append(row["tpot_ms"])
        if row["ttft_ms"] is not None and row["input_tokens"]:
            cell["TTFT per input token"].append(row["ttft_ms"] / row["input_tokens"])
    at = {k: statistics.median(c["t0"]) for k, c in cells.items()}
    by_key = {s.key: s for s in found}
    for (key, model), cell in cells.items():
        for metric in ("TPOT", "TTFT per input token"):
            peers = [statistics.median(c[metric]) for (k, m), c in cells.items()
                     if m == model and k != key and c[metric] and abs(at[(k, m)] - at[(key, model)]) <= timeline.PEER_WINDOW_S]
            if not cell[metric] or len(peers) < 2:
                continue
            mine, typical = statistics.median(cell[metric]), statistics.median(peers)
            if typical > 0 and mine >= timeline.SLOW_FACTOR * typical and by_key[key].slow is None:
                by_key[key].slow = (f"{metric} {mine / typical:.1f}x the median of {len(peers)} other sessions"
                                    f" on {model} within the hour")


def test_slow_sessions_are_flagged_as_defined_however_many() -> None:
    """The sliding window of flag_slow finds what the definition does, on sessions of two models
    over a few hours, some slow, some with ties and without a metric."""
    import random

    rng = random.Random(29)
    rows, found = [], []
    for n in range(400):
        t0 = rng.uniform(0, 4 * 3600)
        model = rng.choice(("a", "b"))
        slow = rng.random() < 0.08
        key = f"s{n}"
        spans = []
        for j in range(rng.randint(1, 4)):
            rid = f"{key}-{j}"
            spans.append(timeline.Span("model", "wait", t0 + j, t0 + j + 0.5, rid, model))
            rows.append({"id": rid, "t0": t0 + j, "outcome": "ok" if rng.random() > 0.05 else "http_error",
                         "request_model": model if rng.random() > 0.05 else None,
                         "tpot_ms": None if rng.random() < 0.1 else round(rng.uniform(10, 12) * (4 if slow else 1)),
                         "ttft_ms": rng.uniform(200, 300) * (4 if slow and j % 2 else 1),
                         "input_tokens": rng.choice((0, 1000, 2000))})
        found.append(timeline.Session(key, key, False, "t", t0, t0 + 5, len(spans), 1, None, None, None, [model],
                                      spans, timeline.Totals()))
    reference = [timeline.Session(**{**s.__dict__}) for s in found]
    timeline.flag_slow(found, rows)
    _slow_by_definition(reference, rows)
    assert [s.slow for s in found] == [s.slow for s in reference]
    assert sum(s.slow is not None for s in found) > 10


def _totals_by_definition(spans: list[timeline.Span], start: float, end: float) -> timeline.Totals:
    """`totals` as its docstring says it, every span looked at for every stretch between edges: the reference."""
    from collections import defaultdict

    edges = sorted({start, end, *(s.start_s for s in spans), *(s.end_s for s in spans if s.end_s is not None)})
    closed = [s for s in spans if s.end_s is not None]
    out = timeline.Totals(wall_s=end - start)
    tools: dict[str, float] = defaultdict(float)
    for a, b in zip(edges, edges[1:]):
        if b <= start or a >= end:
            continue
        active = [s for s in closed if s.start_s <= a and s.end_s >= b]
        if not active:
            out.other_s += b - a
            continue
        top = min(active, key=lambda s: (timeline.PRIORITY.index(s.part) if s.kind != "tool" else 2, s.start_s))
        if top.part == "generating":
            out.generating_s += b - a
        elif top.part == "wait":
            out.wait_s += b - a
        elif top.kind == "tool":
            tools[top.part] += b - a
        else:
            out.you_s += b - a
    out.tools_s = dict(sorted(tools.items(), key=lambda kv: -kv[1]))
    return out


def test_the_totals_sweep_gives_the_definitions_figures_bit_for_bit() -> None:
    """Overlapping model, tool (some open, some starting together) and you spans, ties and empty spans."""
    import random

    rng = random.Random(38)
    for _ in range(200):
        spans = []
        for i in range(rng.randint(1, 40)):
            start = round(rng.uniform(0, 100), rng.choice((0, 1, 3)))
            end = None if rng.random() < 0.1 else start + round(rng.choice((0, rng.uniform(0, 30))), 2)
            kind, part = rng.choice((("model", "wait"), ("model", "generating"), ("you", "you"), ("tool", "Bash"),
                                     ("tool", "Read"), ("tool", "Bash+Read")))
            spans.append(timeline.Span(kind, part, start, end if end is not None or kind == "tool" else start, str(i)))
        start, end = rng.uniform(-5, 20), rng.uniform(50, 140)
        assert timeline.totals(spans, start, end) == _totals_by_definition(spans, start, end)


def test_the_top_tools_are_told_apart() -> None:
    from analysis.session_report import top_tools

    assert top_tools(timeline.Totals(wall_s=10, tools_s={"Bash": 4.0, "Bash+Read": 1.4})) == "Bash 40%, Bash+Read 14%"
