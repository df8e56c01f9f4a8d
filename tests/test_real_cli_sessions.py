"""Where a session's time went, with the real CLIs running real tools (#29).

The simulator plays the model with its agent script: its first answer to a prompt calls the CLI's own
shell tool with a command that writes its own start and end times to a file and sleeps between them;
once the result comes back, its answer is text. Claude Code runs `Bash` (`-p --allowedTools Bash`),
Codex `exec_command` (`exec --dangerously-bypass-approvals-and-sandbox`), Cline `run_commands` (its
CLI asks no approval for it). The recorded tool span must hold the command's own run, and what it
holds beyond that is the CLI's own time around a tool (printed; the closing note of #29 gives it).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import duckdb
import pytest

from analysis import timeline
from analysis.source import FileSource
from .serving import RunningProxy
from proxy.simulator.app import Simulator
from proxy.simulator.config import SimConfig

from .conftest import proxy_config
from .test_real_clis import CLAUDE_QUIET, CODEX_CONFIG, base_env, clis, run_cli  # noqa: F401  (clis: a fixture)

pytestmark = [pytest.mark.real_cli, pytest.mark.timeout(900)]

SLEEP_S = 1.0
CLOCK_SLACK_S = 0.005  # the command's `date` and the proxy's clock are the machine's one clock


def command(marks: Path, sleep_s: float = SLEEP_S) -> str:
    return f"date +%s.%N >> {marks}; sleep {sleep_s}; date +%s.%N >> {marks}"


def scripted(tool: str, args: dict[str, Any]) -> SimConfig:
    return SimConfig(ttft_ms=40, itl_ms=4, tokens=8, prefill_us_per_token=0, tool_call=True, tool_name=tool,
                     tool_args=json.dumps(args), tool_script=True)


def read_sessions(db: Path) -> list[timeline.Session]:
    source = FileSource(duckdb.connect(str(db), read_only=True))
    try:
        return timeline.sessions(source.query)
    finally:
        source.close()


def check_tool_span(db: Path, marks: Path, name: str, calls: int = 1) -> dict[str, float]:
    """The session's one tool span holds the command's own run; the CLI's own time before and after."""
    [session] = read_sessions(db)
    [span] = [s for s in session.spans if s.kind == "tool"]
    assert span.part == name and span.calls == (name,) * calls and span.end_s is not None, span
    times = [float(t) for t in marks.read_text().split()]
    began, ended = min(times[::2]), max(times[1::2])
    assert span.start_s - CLOCK_SLACK_S <= began and ended <= span.end_s + CLOCK_SLACK_S, (span, began, ended)
    assert ended - began >= SLEEP_S
    figures = {"span_s": span.seconds, "command_s": ended - began, "before_s": began - span.start_s,
               "after_s": span.end_s - ended}
    print(f"\n{name}: tool span {figures['span_s']:.3f} s, command {figures['command_s']:.3f} s, the CLI's own "
          f"time {figures['before_s'] * 1000:.0f} ms before and {figures['after_s'] * 1000:.0f} ms after")
    model = [s for s in session.spans if s.kind == "model"]
    assert {s.request_id for s in model} == _generations(db) and session.turns == 1
    return figures


def _generations(db: Path) -> set[str]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return {r[0] for r in con.execute("SELECT id FROM requests WHERE kind = 'generation'").fetchall()}
    finally:
        con.close()


async def claude(clis: Path, tmp_path: Path, cfg: SimConfig, tools: str = "Bash") -> None:
    """`claude -p` allowed `tools`, through the real proxy to the scripted simulator, to its end."""
    async with Simulator(cfg) as sim, RunningProxy(proxy_config(sim.url, tmp_path)) as p:
        env = base_env(tmp_path / "home", ANTHROPIC_BASE_URL=p.url, **CLAUDE_QUIET)
        code, out, err = await run_cli([str(clis / "node_modules/.bin/claude"), "-p", "run the check",
                                        "--allowedTools", tools], env, tmp_path)
        assert code == 0, out + err
        assert p.flush(10)


async def test_claude_code_bash(clis: Path, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    await claude(clis, tmp_path, scripted("Bash", {"command": command(marks), "description": "Sleep a while"}))
    check_tool_span(tmp_path / "llmtap.duckdb", marks, "Bash")


async def test_claude_code_two_bash_calls_at_once_are_one_span(clis: Path, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    await claude(clis, tmp_path, scripted("Bash,Bash", {"command": command(marks), "description": "Sleep a while"}))
    assert len(marks.read_text().split()) == 4  # both ran
    check_tool_span(tmp_path / "llmtap.duckdb", marks, "Bash", calls=2)


async def test_claude_code_stopped_mid_tool_leaves_an_open_span(clis: Path, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    cfg = scripted("Bash", {"command": command(marks, sleep_s=60), "description": "Sleep a long while"})
    async with Simulator(cfg) as sim, RunningProxy(proxy_config(sim.url, tmp_path)) as p:
        env = base_env(tmp_path / "home", ANTHROPIC_BASE_URL=p.url, **CLAUDE_QUIET)
        proc = await asyncio.create_subprocess_exec(
            str(clis / "node_modules/.bin/claude"), "-p", "run the check", "--allowedTools", "Bash", env=env,
            cwd=tmp_path, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + 60
            while not marks.exists() or not marks.read_text().strip():  # the tool has started
                assert time.monotonic() < deadline and proc.returncode is None, "the tool never started"
                await asyncio.sleep(0.05)
        finally:
            import os
            import signal

            os.killpg(proc.pid, signal.SIGKILL)  # the CLI and its shell: the result never comes
            await proc.wait()
        assert p.flush(10)
    [session] = read_sessions(tmp_path / "llmtap.duckdb")
    [span] = [s for s in session.spans if s.kind == "tool"]
    assert span.part == "Bash" and span.end_s is None


async def test_claude_code_subagents_running_beside_count_wall_time_once(clis: Path, tmp_path: Path) -> None:
    """The model calls `Agent` and `Bash` together: the subagent (Claude Code's `Agent` tool) makes its
    own requests in the same session while the main agent waits on its tools, and the subagent's
    answer does the same in turn, a few levels deep. Its requests and tools overlap the main agent's
    tool span: the spans add up to more than the wall time, the totals to exactly it."""
    marks = tmp_path / "marks"
    cfg = scripted("Agent,Bash", {"Agent": {"description": "Run the check", "prompt": "run the check",
                                            "subagent_type": "general-purpose"},
                                  "Bash": {"command": command(marks), "description": "Sleep a while"}})
    await claude(clis, tmp_path, cfg, tools="Bash,Agent")
    [session] = read_sessions(tmp_path / "llmtap.duckdb")
    t = session.totals
    agents = [s for s in session.spans if s.kind == "tool" and "Agent" in s.calls]
    assert agents and all(s.end_s is not None for s in session.spans)
    assert sum(s.seconds for s in session.spans if s.kind != "you") > 1.5 * t.wall_s  # they overlap
    assert t.model_s + t.tool_s + t.you_s + t.other_s == pytest.approx(t.wall_s, abs=1e-6)
    times = [float(x) for x in marks.read_text().split()]
    assert session.start_s <= min(times) and max(times) <= session.end_s
    print(f"\nsubagents: {session.requests} requests, {len(agents)} Agent spans, wall {t.wall_s:.2f} s, "
          f"spans {sum(s.seconds for s in session.spans if s.kind != 'you'):.2f} s")


async def test_codex_exec_command(clis: Path, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    cfg = scripted("exec_command", {"cmd": command(marks)})
    async with Simulator(cfg) as sim, RunningProxy(proxy_config(sim.url, tmp_path)) as p:
        codex_home = tmp_path / "home" / ".codex"
        codex_home.mkdir(parents=True)
        (codex_home / "config.toml").write_text(
            'model_provider = "tap"\n' + CODEX_CONFIG + f'[model_providers.tap]\nname = "llmtap"\n'
            f'base_url = "{p.url}/v1"\nenv_key = "TAP_API_KEY"\nwire_api = "responses"\n')
        env = base_env(tmp_path / "home", CODEX_HOME=str(codex_home), TAP_API_KEY="sk-test")
        code, out, err = await run_cli([str(clis / "node_modules/.bin/codex"), "exec", "--skip-git-repo-check",
                                        "--dangerously-bypass-approvals-and-sandbox", "run the check"], env, tmp_path)
        assert code == 0, out + err
        assert p.flush(10)
    check_tool_span(tmp_path / "llmtap.duckdb", marks, "exec_command")


async def test_cline_run_commands(clis: Path, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    cfg = scripted("run_commands", {"commands": [command(marks)]})
    async with Simulator(cfg) as sim, RunningProxy(proxy_config(sim.url, tmp_path)) as p:
        data = tmp_path / "cline-data"
        (data / "settings").mkdir(parents=True)
        provider = {"provider": "openai-compatible", "apiKey": "sk-test", "model": "m", "baseUrl": p.url + "/v1"}
        (data / "settings" / "providers.json").write_text(json.dumps({
            "version": 1, "lastUsedProvider": "openai-compatible", "modes": {},
            "providers": {"openai-compatible": {"settings": provider, "updatedAt": "2026-01-01T00:00:00.000Z",
                                                "tokenSource": "manual"}}}))
        settings = tmp_path / "global-settings.json"
        settings.write_text('{"telemetryOptOut": true, "autoUpdateEnabled": false}')
        env = base_env(tmp_path / "home", CLINE_NO_AUTO_UPDATE="1", E2E_TEST="true",
                       CLINE_GLOBAL_SETTINGS_PATH=str(settings))
        code, out, err = await run_cli([str(clis / "node_modules/.bin/cline"), "--data-dir", str(data), "-P",
                                        "openai-compatible", "please run the check now"], env, tmp_path)
        assert code == 0, out + err
        assert p.flush(10)
    [session] = read_sessions(tmp_path / "llmtap.duckdb")
    assert session.inferred and session.tool == "cline"  # Cline sends no session id
    check_tool_span(tmp_path / "llmtap.duckdb", marks, "run_commands")
