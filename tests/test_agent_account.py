"""The agent's own account joined to the wire (analysis/agent_account.py), through the real proxy.

A client plays Claude Code against the simulated upstream and, as Claude Code does, exports its own
events to llmtap's OTLP receiver: the person approves the tool call after APPROVE_S, the tool runs RUN_S,
and the agent reports both (`tool_decision` by `user_temporary`, `tool_result` with its `duration_ms`),
each API request it made, and one that never reached llmtap. Then the same with two calls of one tool in
one response reported without call ids (as Gemini CLI reports them): joined by name and order in time.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import aiohttp
import duckdb
import orjson
import pytest
from click.testing import CliRunner

from analysis import timeline
from analysis.agent_account import create_agent_views
from analysis.source import FileSource
from analysis.web.api import endpoint
from analysis.views import create_views
from proxy.cli import main
from proxy.settings.client_key import telemetry_token
from proxy.simulator.app import Simulator

from .cli_traffic import claude_tools
from .conftest import proxy_config
from .serving import RunningProxy

SESSION = "5e551011-aaaa-4bbb-8ccc-000000000039"
APPROVE_S, RUN_S = 0.4, 0.25
FAST = {"x-sim-ttft-ms": "30", "x-sim-itl-ms": "3", "x-sim-tokens": "6"}


def event(name: str, at_ns: int, **attrs: Any) -> dict[str, Any]:
    pairs = [{"key": k, "value": {"intValue": str(v)} if isinstance(v, int) else {"stringValue": v}}
             for k, v in {"session.id": SESSION, **attrs}.items()]
    return {"timeUnixNano": str(at_ns), "body": {"stringValue": name}, "attributes": pairs}


async def export(s: aiohttp.ClientSession, url: str, records: list[dict[str, Any]], source: str = "claude-code") -> None:
    body = {"resourceLogs": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": source}}]},
                              "scopeLogs": [{"logRecords": records}]}]}
    async with s.post(url + "/_llmtap/otlp/v1/logs", data=orjson.dumps(body), headers={
            "Content-Type": "application/json", "Authorization": f"Bearer {telemetry_token()}"}) as r:
        assert r.status == 200, await r.text()


async def turn(s: aiohttp.ClientSession, url: str, messages: list[dict[str, Any]], tools: str | None
               ) -> tuple[list[dict[str, Any]], int, int]:
    """One request; its tool_use blocks, and when it was sent and its last byte read (time_ns)."""
    headers = {**FAST, "user-agent": "claude-cli/2.1.197 (external, cli)", "x-claude-code-session-id": SESSION}
    if tools:
        headers.update({"x-sim-tool-call": "1", "x-sim-tool-name": tools})
    sent = time.time_ns()
    async with s.post(url + "/v1/messages", headers=headers,
                      json={"model": "claude-x", "max_tokens": 64, "stream": True, "messages": messages,
                            "tools": claude_tools("Bash", "Read", "run_shell_command")}) as r:
        assert r.status == 200
        body = await r.read()
    calls = [e["content_block"] for e in (orjson.loads(line[6:]) for line in body.split(b"\n") if line.startswith(b"data: "))
             if e.get("type") == "content_block_start" and e["content_block"]["type"] == "tool_use"]
    return calls, sent, time.time_ns()


async def tool_turns(s: aiohttp.ClientSession, url: str, tools: str) -> tuple[list[dict[str, Any]], int, int]:
    """A prompt that gets `tools` called, then the request with their results; when each was sent and ended."""
    history: list[dict[str, Any]] = [{"role": "user", "content": "run the check"}]
    calls, sent, ended = await turn(s, url, history, tools)
    return calls, sent, ended


async def answer(s: aiohttp.ClientSession, url: str, calls: list[dict[str, Any]]) -> tuple[int, int]:
    history = [{"role": "user", "content": "run the check"}, {"role": "assistant", "content": calls},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": c["id"], "content": "ok"}
                                            for c in calls]}]
    _, sent, ended = await turn(s, url, history, None)
    return sent, ended


def views(db: Path, sql: str) -> list[dict[str, Any]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        create_views(con)
        assert create_agent_views(con)
        cur = con.execute(sql)
        return [dict(zip([d[0] for d in cur.description], row)) for row in cur.fetchall()]
    finally:
        con.close()


async def test_an_approval_the_tools_run_and_the_agents_own_time(sim: Simulator, tmp_path: Path) -> None:
    async with RunningProxy(proxy_config(sim.url, tmp_path)) as p, aiohttp.ClientSession() as s:
        lost = time.time_ns() - 100_000_000  # 100 ms ago, a request the agent timed that never reached llmtap
        [call], sent1, ended1 = await tool_turns(s, p.url, "Bash")
        await asyncio.sleep(APPROVE_S)  # the person reads the prompt
        decided = time.time_ns()
        await asyncio.sleep(RUN_S)  # the tool runs
        ran = time.time_ns()
        sent2, ended2 = await answer(s, p.url, [call])
        await export(s, p.url, [
            event("claude_code.api_error", lost + 20_000_000, duration_ms=20, attempt=1, status_code=503),
            event("claude_code.api_request", ended1 + 5_000_000, duration_ms=(ended1 - sent1) // 1_000_000 + 5),
            event("claude_code.tool_decision", decided, tool_use_id=call["id"], tool_name="Bash", decision="accept",
                  source="user_temporary"),
            event("claude_code.tool_result", ran, tool_use_id=call["id"], tool_name="Bash",
                  duration_ms=(ran - decided) // 1_000_000, success="true"),
            event("claude_code.api_request", ended2 + 5_000_000, duration_ms=(ended2 - sent2) // 1_000_000 + 5)])
        assert p.flush(10)
    db = tmp_path / "llmtap.duckdb"
    [run] = views(db, "SELECT * FROM tool_run_accounts")
    assert (run["call_id"], run["name"], run["accounts"], run["decision_source"]) == (
        call["id"], "Bash", "wire+agent", "user_temporary")
    assert run["approval_ms"] == pytest.approx(APPROVE_S * 1000, abs=60)
    assert run["tool_ms"] == (ran - decided) // 1_000_000
    assert run["approval_ms"] + run["tool_ms"] + run["agent_ms"] == pytest.approx(run["span_ms"])
    assert 0 <= run["agent_ms"] < 60  # this agent does nothing of its own around the tool
    api = views(db, "SELECT * FROM api_request_accounts ORDER BY event_at")
    assert [(a["event_name"], a["never_reached_llmtap"], a["status_code"]) for a in api] == [
        ("claude_code.api_error", True, 503), ("claude_code.api_request", False, None),
        ("claude_code.api_request", False, None)]
    for a in api[1:]:
        assert a["measure"] == "e2e" and a["client_ms"] == pytest.approx(a["agent_ms"] - a["wire_ms"])
        assert 0 <= a["client_ms"] < 60


async def test_calls_without_ids_join_by_name_and_order(sim: Simulator, tmp_path: Path) -> None:
    """Two calls of one tool in one response; the agent reports each without an id, in the order they ended
    (the first ran 100 ms, the second 250 ms): the first wire call gets the first report."""
    async with RunningProxy(proxy_config(sim.url, tmp_path)) as p, aiohttp.ClientSession() as s:
        calls, _, ended = await tool_turns(s, p.url, "run_shell_command,run_shell_command")
        await asyncio.sleep(0.1)
        first = time.time_ns()
        await asyncio.sleep(0.15)
        second = time.time_ns()
        await answer(s, p.url, calls)
        await export(s, p.url, [event("gemini_cli.tool_call", at, function_name="run_shell_command", duration_ms=ms,
                                      decision="accept", success="true")
                                for at, ms in ((first, 100), (second, 250))], source="gemini-cli")
        assert p.flush(10)
    runs = views(tmp_path / "llmtap.duckdb", "SELECT * FROM tool_run_accounts ORDER BY position")
    assert [(r["position"], r["tool_ms"], r["accounts"], r["approval_ms"]) for r in runs] == [
        (1, 100.0, "wire+agent", None), (2, 250.0, "wire+agent", None)]
    assert len(calls) == 2 and ended < first


def test_a_database_without_agent_events_has_the_views_empty() -> None:
    """One recorded before m010 (or an export): the accounts are there to LEFT JOIN, and say `wire`."""
    from proxy.record.migrations import MIGRATIONS, migrate

    con = duckdb.connect()
    migrate(con, [m for m in MIGRATIONS if m.__name__ < "m010"])
    con.execute("INSERT INTO requests (id, started_at, kind, session_id, e2e_ms, tool_calls) VALUES "
                "('r1', now(), 'generation', 's', 50, [{'id': 'c1', 'name': 'Bash', 'ended_ms': 40.0}])")
    create_views(con)
    assert create_agent_views(con) is False
    assert con.execute("SELECT call_id, accounts, approval_ms, tool_ms FROM tool_run_accounts").fetchall() == [
        ("c1", "wire", None, None)]
    assert con.execute("SELECT count(*) FROM api_request_accounts").fetchall() == [(0,)]


async def test_claude_codes_spans_time_the_approval_and_the_run_exactly(sim: Simulator, tmp_path: Path) -> None:
    """With its beta traces, the wait for the person is its `tool.blocked_on_user` span and the run its
    `tool.execution` span (children of the `claude_code.tool` span that names the call)."""
    async with RunningProxy(proxy_config(sim.url, tmp_path)) as p, aiohttp.ClientSession() as s:
        [call], _, ended = await tool_turns(s, p.url, "Bash")
        shown = time.time_ns() + 30_000_000  # the prompt is up 30 ms after the response's end
        await asyncio.sleep(APPROVE_S + RUN_S + 0.1)
        await answer(s, p.url, [call])
        await export(s, p.url, [
            event("claude_code.tool_decision", shown + 400_000_000, tool_use_id=call["id"], tool_name="Bash",
                  decision="accept", source="user_permanent")])
        spans = [("claude_code.tool", "aa" * 8, "", shown, shown + 700_000_000, {"tool_use_id": call["id"]}),
                 ("claude_code.tool.blocked_on_user", "bb" * 8, "aa" * 8, shown, shown + 400_000_000, {}),
                 ("claude_code.tool.execution", "cc" * 8, "aa" * 8, shown + 410_000_000, shown + 660_000_000,
                  {"tool_use_id": call["id"]})]
        body = {"resourceSpans": [{"resource": {"attributes": [
            {"key": "service.name", "value": {"stringValue": "claude-code"}}]}, "scopeSpans": [{"spans": [
                {"traceId": "ee" * 16, "spanId": sid, "parentSpanId": parent, "name": name, "kind": 1,
                 "startTimeUnixNano": str(start), "endTimeUnixNano": str(end),
                 "attributes": [{"key": k, "value": {"stringValue": v}}
                                for k, v in {"session.id": SESSION, **attrs}.items()]}
                for name, sid, parent, start, end, attrs in spans]}]}]}
        async with s.post(p.url + "/_llmtap/otlp/v1/traces", data=orjson.dumps(body), headers={
                "Content-Type": "application/json", "Authorization": f"Bearer {telemetry_token()}"}) as r:
            assert r.status == 200
        assert p.flush(10)
    [run] = views(tmp_path / "llmtap.duckdb", "SELECT * FROM tool_run_accounts")
    assert (run["approval_ms"], run["tool_ms"], run["decision_source"]) == (400.0, 250.0, "user_permanent")
    assert run["agent_ms"] == pytest.approx(run["span_ms"] - 650) and ended < shown


AGENT_S = 0.15  # the agent's own work between the person's decision and the tool's start
BASH_S, READ_S = 0.3, 0.02  # a parallel group's two runs, started together


async def test_the_session_splits_each_tool_span_by_the_agents_account(sim: Simulator, tmp_path: Path) -> None:
    """`llmtap session`: the approval is the person's, the tool's run is the duration the agent stated,
    the rest the agent's own; a parallel group's calls each run their own, its wall counted once; a request
    the agent gave up on shows as it saw it; the totals still make the wall."""
    async with RunningProxy(proxy_config(sim.url, tmp_path)) as p, aiohttp.ClientSession() as s:
        [call], sent1, ended1 = await tool_turns(s, p.url, "Bash")
        await asyncio.sleep(APPROVE_S)
        decided = time.time_ns()
        await asyncio.sleep(AGENT_S)
        began = time.time_ns()
        await asyncio.sleep(RUN_S)
        ran = time.time_ns()
        await answer(s, p.url, [call])
        await asyncio.sleep(0.1)
        lost = time.time_ns()  # a request that never reached llmtap: 40 ms, given up
        await asyncio.sleep(0.1)
        pair, _, _ = await tool_turns(s, p.url, "Bash,Read")
        started = time.time_ns()
        await asyncio.sleep(READ_S)
        read = time.time_ns()
        await asyncio.sleep(BASH_S - READ_S)
        bashed = time.time_ns()
        await answer(s, p.url, pair)
        ms = lambda a, b: (b - a) // 1_000_000  # noqa: E731
        await export(s, p.url, [
            event("claude_code.api_request", ended1 + 5_000_000, duration_ms=ms(sent1, ended1) + 5),
            event("claude_code.tool_decision", decided, tool_use_id=call["id"], tool_name="Bash", decision="accept",
                  source="user_temporary"),
            event("claude_code.tool_result", ran, tool_use_id=call["id"], tool_name="Bash", duration_ms=ms(began, ran)),
            event("claude_code.api_error", lost + 40_000_000, duration_ms=40, attempt=1, status_code=503),
            *(event("claude_code.tool_decision", started, tool_use_id=c["id"], tool_name=c["name"], decision="accept",
                    source="config") for c in pair),
            event("claude_code.tool_result", read, tool_use_id=pair[1]["id"], tool_name="Read", duration_ms=ms(started, read)),
            event("claude_code.tool_result", bashed, tool_use_id=pair[0]["id"], tool_name="Bash",
                  duration_ms=ms(started, bashed))])
        assert p.flush(10)
    db = tmp_path / "llmtap.duckdb"
    source = FileSource(duckdb.connect(str(db), read_only=True))
    try:
        [session] = timeline.matching(source.query, SESSION)
        by_tool = {g["tool_name"]: g for g in timeline.tool_names(source.query)}
        page = endpoint(f"request/{session.spans[0].request_id}")
        assert page is not None
        status, body = page(source.query, {})
        _, _, [(stated_client_ms,)] = source.query("SELECT sum(client_ms) FROM api_request_accounts"
                                                   " WHERE measure = 'e2e' AND NOT never_reached_llmtap")
    finally:
        source.close()
    assert session.accounts == "wire + agent"
    first = [sp for sp in session.spans if sp.request_id == session.spans[0].request_id and sp.kind != "model"]
    assert [(sp.kind, sp.part) for sp in first] == [("you", "approving"), ("agent", "agent"), ("tool", "Bash"),
                                                   ("agent", "agent")]
    approving, before, bash, after = first
    assert approving.seconds == pytest.approx(APPROVE_S, abs=0.03)  # from the block's end to the decision
    assert bash.seconds == pytest.approx(ms(began, ran) / 1000, abs=1e-6) and bash.end_s == pytest.approx(ran / 1e9)
    assert before.seconds == pytest.approx(AGENT_S, abs=0.03) and after.seconds < 0.03
    [group] = [sp for sp in session.spans if sp.kind == "tool" and sp.part == "Bash+Read"]
    assert group.seconds == pytest.approx(ms(started, bashed) / 1000, abs=1e-3)  # the group's wall once (ms)
    [request] = [sp for sp in session.spans if sp.part == "request"]
    assert request.kind == "agent" and request.seconds == pytest.approx(0.04)
    t = session.totals
    assert t.model_s + t.tool_s + t.agent_s + t.you_s + t.other_s == pytest.approx(t.wall_s, abs=1e-6)
    assert t.approving_s == pytest.approx(approving.seconds, abs=0.01)  # less the response's tail after the block
    assert t.tools_s["Bash"] == pytest.approx(bash.seconds, abs=1e-6)
    # the agent's duration less llmtap's E2E, summed: at least the 5 ms this agent adds (its own wall
    # around the request holds llmtap's), more on a busy machine, and the view's figure exactly
    assert session.client_ms["e2e"] == pytest.approx(stated_client_ms) and session.client_ms["e2e"] >= 4
    # each call its own run: Bash twice (250 ms, 300 ms), Read once (20 ms); the group not as one
    assert (by_tool["Bash"]["runs"], by_tool["Read"]["runs"], by_tool["Bash"]["in_groups"]) == (2, 1, 0)
    assert by_tool["Read"]["total_s"] == pytest.approx(ms(started, read) / 1000) and "Bash+Read" not in by_tool
    shown = CliRunner().invoke(main, ["session", SESSION, "--db", str(db)]).output
    assert "accounts: wire + agent" in shown and "approving" in shown and "agent  not at llmtap" in shown, shown
    assert "The agent's own client-side time" in shown, shown
    listed = CliRunner().invoke(main, ["sessions", "--db", str(db)]).output
    assert re.search(r"tools \(top 3\) +agent +you", listed) and f"{SESSION[:13]}… +" in listed and "+ wire + agent: built from the agent's own account too" in listed, listed
    # the web UI's request page: the agent's account of the request that asked for Bash
    [account] = orjson.loads(body)["agent"]
    assert status == 200 and (account["measure"], account["agent_ms"]) == ("e2e", ms(sent1, ended1) + 5)
    assert account["client_ms"] == pytest.approx(account["agent_ms"] - account["wire_ms"])
