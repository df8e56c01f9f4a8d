"""Agent sessions: `llmtap report --by session` and `llmtap top` count the same requests the same way."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import duckdb
import pytest
from click.testing import CliRunner

from analysis.top.feed import backfill, ticks
from proxy.observe.live import LiveFeed
from analysis.top.model import TopModel, quantile
from proxy.cli import main
from .serving import RunningProxy
from proxy.simulator.app import Simulator

from .cli_traffic import claude_tools
from .conftest import proxy_config
from .waiting import wait_until

CLAUDE, CODEX, METADATA = "11111111-aaaa-4bbb-8ccc-000000000001", "codex-session-2", "22222222-dddd-4eee-8fff-000000000003"
SIM = {"x-sim-ttft-ms": "60", "x-sim-itl-ms": "5", "x-sim-tokens": "12", "x-sim-cache-read-tokens": "800"}


async def claude(s: aiohttp.ClientSession, base: str, *, header: str | None = None,
                 metadata: str | None = None, status: str | None = None) -> None:
    body: dict[str, Any] = {"model": "sim-claude", "max_tokens": 64, "stream": True,
                            "messages": [{"role": "user", "content": "hello " * 40}], "tools": claude_tools()}
    headers = {**SIM, "user-agent": "claude-cli/2.1.0 (external, cli)"}
    if header:
        headers["x-claude-code-session-id"] = header
    if metadata:
        body["metadata"] = {"user_id": json.dumps({"device_id": "d", "session_id": metadata})}
    if status:
        headers["x-sim-status"] = status
    async with s.post(base + "/v1/messages", json=body, headers=headers) as r:
        await r.read()


async def codex(s: aiohttp.ClientSession, base: str) -> None:
    body = {"model": "sim-gpt", "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "hi " * 30}]}
    headers = {**SIM, "originator": "codex_exec", "user-agent": "codex_exec/0.171.0", "session_id": CODEX}
    async with s.post(base + "/v1/chat/completions", json=body, headers=headers) as r:
        await r.read()


async def agents(base: str) -> None:
    """Three sessions, each identified its own way, and one request with none."""
    async with aiohttp.ClientSession() as s:
        async def claude_code() -> None:
            for status in (None, "429", None):
                await claude(s, base, header=CLAUDE, status=status)

        async def sdk_app() -> None:
            await claude(s, base, metadata=METADATA)
            await asyncio.sleep(0.3)  # a pause inside the session, not a wait: its wall time spans it
            await claude(s, base, metadata=METADATA)

        await asyncio.gather(claude_code(), sdk_app(), codex(s, base), codex(s, base), claude(s, base))


@pytest.fixture
async def recorded(sim: Simulator, tmp_path: Path) -> tuple[Path, TopModel]:
    """The database after the traffic, and a TopModel fed by the live feed during it."""
    model = TopModel(window_s=600)
    async with RunningProxy(proxy_config(sim.url, tmp_path)) as p:
        async with aiohttp.ClientSession() as s:
            async def watch() -> None:
                async for tick in ticks(s, p.admin):
                    model.apply(tick)

            watcher = asyncio.create_task(watch())
            await wait_until(lambda: any(isinstance(x, LiveFeed) for x in p.state.recorder.observers), 5,
                             "the live feed subscribed")
            await agents(p.url)
            await wait_until(lambda: model.finished_total >= 8, 5, "the 8 requests on the live feed")
            watcher.cancel()
    return tmp_path / "llmtap.duckdb", model


def db_rows(db: Path) -> list[dict[str, Any]]:
    con = duckdb.connect(str(db), read_only=True)
    cursor = con.execute("SELECT *, epoch(started_at) AS started FROM requests")
    names = [d[0] for d in cursor.description]
    out = [dict(zip(names, r)) for r in cursor.fetchall()]
    con.close()
    return out


def expected(rows: list[dict[str, Any]], session: str) -> dict[str, Any]:
    mine = [r for r in rows if r["session_id"] == session]
    ok_ttft = [r["ttft_ms"] for r in mine if r["outcome"] == "ok" and r["stream"] and r["ttft_ms"] is not None]
    return {
        "requests": len(mine),
        "ttft_total_ms": sum(r["ttft_ms"] for r in mine if r["ttft_ms"] is not None),
        "ttft_p95_ms": quantile(ok_ttft, 0.95),
        "input_tokens": sum(r["input_tokens"] or 0 for r in mine),
        "output_tokens": sum(r["output_tokens"] or 0 for r in mine),
        "cache_read_share": sum(r["cache_read_tokens"] or 0 for r in mine) / sum(r["input_tokens"] or 0 for r in mine),
        "wall_s": max(r["started"] + r["e2e_ms"] / 1000 for r in mine) - min(r["started"] for r in mine),
    }


def report(db: Path, fmt: str) -> str:
    result = CliRunner().invoke(main, ["report", "--db", str(db), "--by", "session", "--format", fmt])
    assert result.exit_code == 0, result.output
    return result.output


async def test_report_by_session_has_one_line_per_session_with_its_cost(recorded: tuple[Path, TopModel]) -> None:
    db, _ = recorded
    rows = db_rows(db)
    assert {r["session_id"] for r in rows} == {CLAUDE, CODEX, METADATA, None}
    groups = {g["session"]: g for g in json.loads(report(db, "json"))["groups"]}
    assert set(groups) == {CLAUDE, CODEX, METADATA, None}
    for session in (CLAUDE, CODEX, METADATA):
        want, got = expected(rows, session), groups[session]
        for key in ("requests", "input_tokens", "output_tokens"):
            assert got[key] == want[key], (session, key)
        for key, tolerance in (("ttft_total_ms", 0.2), ("ttft_p95_ms", 0.2), ("cache_read_share", 1e-3),
                               ("wall_s", 2e-3)):
            assert got[key] == pytest.approx(want[key], abs=tolerance), (session, key)
    assert groups[METADATA]["wall_s"] > 0.3 and groups[CLAUDE]["requests"] == 3 and groups[CLAUDE]["errors"] == 1
    table = report(db, "table")
    blocks = table.split("\n\n")
    third = blocks[3].splitlines()  # the session block: reqs, TTFT total, wall (p95 is in the first)
    assert third[1].split() == ["session", "reqs", "total", "wall"]
    assert len(third) == 3 + 4 + 2 and third[-1].split()[0] == "total"  # a rule, then the total row
    assert all(len(line) <= 80 for line in table.splitlines())
    csv_header = report(db, "csv").splitlines()[0].split(",")
    assert csv_header[-2:] == ["ttft_total_ms", "wall_s"] and "ttft_p95_ms" in csv_header


async def test_top_and_report_agree_on_sessions(recorded: tuple[Path, TopModel]) -> None:
    db, model = recorded
    groups = {g["session"]: g for g in json.loads(report(db, "json"))["groups"]}
    lines = {s.session_id: s for s in model.session_stats()}
    assert set(lines) == {CLAUDE, CODEX, METADATA}  # requests without a session are not a session line
    for session, line in lines.items():
        g = groups[session]
        assert (line.requests, line.input_tokens, line.output_tokens, line.live) == (
            g["requests"], g["input_tokens"], g["output_tokens"], 0)
        assert line.tool == ("codex" if session == CODEX else "claude-code")
        assert line.ttft_total_ms == pytest.approx(g["ttft_total_ms"], abs=0.2)
        assert line.ttft_p95_ms == pytest.approx(g["ttft_p95_ms"], abs=0.2)
        assert line.cache_read_share == pytest.approx(g["cache_read_share"], abs=1e-3)
        assert line.wall_s == pytest.approx(g["wall_s"], abs=0.01)


async def test_backfill_reads_the_same_rows_from_a_running_proxy(sim: Simulator, tmp_path: Path) -> None:
    async with RunningProxy(proxy_config(sim.url, tmp_path)) as p:
        await agents(p.url)
        assert p.flush(10)
        async with aiohttp.ClientSession() as s:
            rows = await backfill(s, p.admin, 60)
            old = await backfill(s, p.admin, 0.001)
    assert len(rows) == 8 and old == []
    model = TopModel(window_s=60)
    model.add_finished(rows)
    model.add_finished(rows)  # a row the feed also sent is counted once
    assert model.finished_total == 8
    assert {s.session_id: s.requests for s in model.session_stats()} == {CLAUDE: 3, CODEX: 2, METADATA: 2}
