"""Acceptance with Gemini CLI, opencode, Qwen Code and aider, each through the real proxy to the simulator (#41).

The npm CLIs are installed pinned into $LLMTAP_CLI_CACHE/agents, aider from PyPI into its own venv
($LLMTAP_CLI_CACHE/aider-venv), once, under a lock (tests/test_real_clis.py's helper). They run as
shared/reference/real-clis.md shows: a scratch HOME, an env -i style environment, stdin from /dev/null.
The simulator plays the model with its agent script: the first answer calls the CLI's own shell tool with
a command that writes its start and end times and sleeps between them; once the result is back, text.
Each CLI runs three times through one proxy, three sessions: given llmtap's base URL itself, then with none
of its own, set up by `llmtap setup --write`, then that again under `llmtap run` (tagged).
"""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import pytest

from proxy.serve.server import write_state
from proxy.simulator.app import Simulator
from proxy.simulator.config import SimConfig

from .conftest import proxy_config, rows
from .serving import RunningProxy
from .test_real_cli_sessions import CLOCK_SLACK_S, SLEEP_S, command, read_sessions, scripted
from .test_real_clis import base_env, cache_dir, llmtap_run, npm_installed, run_cli, write_setup

pytestmark = [pytest.mark.real_cli, pytest.mark.timeout(900)]

AGENTS = {"@google/gemini-cli": "0.61.0", "opencode-ai": "1.18.33", "@qwen-code/qwen-code": "0.24.4"}
AIDER = "aider-chat==0.86.*"
GEMINI_SETTINGS = {"security": {"auth": {"selectedType": "gemini-api-key"}}, "privacy": {"usageStatisticsEnabled": False},
                   "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False}}
QWEN_SETTINGS = {"security": {"auth": {"selectedType": "openai"}}, "telemetry": {"enabled": False},
                 "privacy": {"usageStatisticsEnabled": False}}
OPENCODE_QUIET = {"OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1",
                  "OPENCODE_DISABLE_LSP_DOWNLOAD": "1", "OPENCODE_DISABLE_SHARE": "1"}
AIDER_ARGS = ["--yes-always", "--model", "openai/m", "--openai-api-key", "sk-test", "--no-git", "--no-check-update",
              "--analytics-disable", "--no-show-model-warnings"]


@pytest.fixture(scope="module")
def agents() -> Path:
    return npm_installed(cache_dir() / "agents", AGENTS, ("gemini", "opencode", "qwen"))


@pytest.fixture(scope="module")
def aider() -> Path:
    """aider in its own venv (its pins clash with llmtap's), installed on first use under a lock."""
    venv = cache_dir() / "aider-venv"
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / ".llmtap-aider.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / "bin" / "aider").exists():
            uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
            steps = ([[uv, "venv", str(venv)], [uv, "pip", "install", "--python", str(venv / "bin" / "python"), AIDER]]
                     if Path(uv).exists() else
                     [[sys.executable, "-m", "venv", str(venv)], [str(venv / "bin" / "pip"), "install", "-q", AIDER]])
            for step in steps:
                proc = subprocess.run(step, capture_output=True, text=True, timeout=900)
                if proc.returncode != 0:
                    pytest.skip(f"cannot install {AIDER}: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
    return venv / "bin" / "aider"


def gemini(agents: Path, home: Path, base: str | None) -> tuple[list[str], dict[str, str]]:
    (home / ".gemini").mkdir(parents=True, exist_ok=True)
    if not (home / ".gemini" / "settings.json").exists():
        (home / ".gemini" / "settings.json").write_text(json.dumps(GEMINI_SETTINGS))
    env = base_env(home, GEMINI_API_KEY="sk-test", GEMINI_CLI_TRUST_WORKSPACE="true",
                   **({"GOOGLE_GEMINI_BASE_URL": base} if base else {}))
    return [str(agents / "node_modules/.bin/gemini"), "-p", "run the check", "--yolo", "-m", "gemini-2.5-pro"], env


def opencode(agents: Path, home: Path, base: str | None, cwd: Path, provider: str = "fake"
             ) -> tuple[list[str], dict[str, str]]:
    options = {"apiKey": "sk-test", **({"baseURL": base + "/v1"} if base else {})}
    if provider == "fake":
        config: dict[str, Any] = {"fake": {"npm": "@ai-sdk/openai-compatible", "name": "x", "options": options,
                                           "models": {"m": {"name": "m", "tool_call": True}}}}
        model = "fake/m"
    else:
        config = {"anthropic": {"options": options, "models": {"claude-sonnet-4-5": {"name": "c", "tool_call": True}}}}
        model = "anthropic/claude-sonnet-4-5"
    (cwd / "opencode.json").write_text(json.dumps({
        "provider": config, "model": model, "small_model": model, "permission": {"bash": "allow", "edit": "allow"},
        "autoupdate": False, "share": "disabled"}))
    return [str(agents / "node_modules/.bin/opencode"), "run", "run the check"], base_env(home, **OPENCODE_QUIET)


def qwen(agents: Path, home: Path, base: str | None) -> tuple[list[str], dict[str, str]]:
    (home / ".qwen").mkdir(parents=True, exist_ok=True)
    if not (home / ".qwen" / "settings.json").exists():
        (home / ".qwen" / "settings.json").write_text(json.dumps(QWEN_SETTINGS))
    env = base_env(home, OPENAI_API_KEY="sk-test", OPENAI_MODEL="qwen3-coder-plus",
                   **({"OPENAI_BASE_URL": base + "/v1"} if base else {}))
    return [str(agents / "node_modules/.bin/qwen"), "-p", "run the check", "--yolo"], env


def aider_cmd(aider: Path, home: Path, base: str | None) -> tuple[list[str], dict[str, str]]:
    env = base_env(home, LITELLM_LOCAL_MODEL_COST_MAP="True")
    env["PATH"] = f"{aider.parent}:{env['PATH']}"
    return [str(aider), "--message", "say hi", *AIDER_ARGS, *(["--openai-api-base", base + "/v1"] if base else [])], env


async def ran(argv: list[str], env: dict[str, str], cwd: Path) -> str:
    code, out, err = await run_cli(argv, env, cwd)
    assert code == 0, out + err
    return out


def db_rows(db: Path, sql: str = "SELECT * FROM requests ORDER BY started_at") -> list[dict[str, Any]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        cursor = con.execute(sql)
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, r)) for r in cursor.fetchall()]
    finally:
        con.close()


def check_runs(db: Path, tool: str, runs: int = 3, usage: bool = True) -> list[dict[str, Any]]:
    """The name, the tokens the simulator reported, and one session per run, each of one turn (`usage`
    False: the client streams without asking for usage, so output tokens are estimated from the text)."""
    found = db_rows(db)
    generations = [r for r in found if r["kind"] == "generation"]
    assert generations and all(r["tool"] == tool and r["outcome"] == "ok" for r in found), found
    if usage:
        assert all(r["tokens_source"] == "usage" and r["output_tokens"] == 8 and r["input_tokens"] > 0
                   for r in generations), generations
    else:
        assert all(r["tokens_source"] == "estimated" and r["output_tokens"] > 0 for r in generations), generations
    sessions = read_sessions(db)
    assert len(sessions) == runs and len({r["session_id"] for r in found}) == runs, (sessions, found)
    assert all(s.turns == 1 for s in sessions), sessions  # side requests are no turns
    return found


def check_span(db: Path, marks: Path, name: str) -> None:
    """Each session's tool span closes and holds its command's own run."""
    times = [float(t) for t in marks.read_text().split()]
    for session, (began, ended) in zip(read_sessions(db), zip(times[::2], times[1::2]), strict=True):
        [span] = [s for s in session.spans if s.kind == "tool"]
        assert span.part == name and span.end_s is not None, span
        assert span.start_s - CLOCK_SLACK_S <= began and ended <= span.end_s + CLOCK_SLACK_S, (span, began, ended)
        assert ended - began >= SLEEP_S
        print(f"\n{name}: tool span {span.seconds:.3f} s, command {ended - began:.3f} s")


async def three_runs(tmp_path: Path, cfg: SimConfig, tool: str, make: Any) -> Path:
    """The CLI three times through one proxy (`make(base_url, home, cwd)` gives its argv and env): given
    llmtap's base URL itself; with none of its own, set up by `llmtap setup TOOL --write`; and that again
    under `llmtap run`, which sets it too, tagged. The database they went to."""
    cwd = tmp_path / "work"
    cwd.mkdir()
    async with Simulator(cfg) as sim, RunningProxy(proxy_config(sim.url, tmp_path)) as p:
        await ran(*make(p.url, tmp_path / "home", cwd), cwd)
        argv, env = make(None, tmp_path / "home-set-up", cwd)
        write_setup(tool, "--base-url", p.url, env=env)
        await ran(argv, env, cwd)
        write_state(p)
        code, out, err = await llmtap_run(["--tag", "tap", "--", *argv], env, cwd)
        assert code == 0, out + err
        assert p.flush(10)
        assert [r["tool"] for r in rows(p, "SELECT DISTINCT tool FROM requests WHERE tag = 'tap'")] == [tool], err
    return tmp_path / "llmtap.duckdb"


async def test_gemini_cli(agents: Path, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    cfg = scripted("run_shell_command", {"command": command(marks), "description": "Sleep a while"})
    db = await three_runs(tmp_path, cfg, "gemini-cli", lambda url, home, cwd: gemini(agents, home, url))
    found = check_runs(db, "gemini-cli")
    assert {(r["tool_version"], r["tool_mode"], r["project"]) for r in found} == {("0.61.0", "tui", "work")}
    assert all(r["session_id"].startswith("~") for r in found)  # inferred: it sends none
    calls = [c for r in found for c in r["tool_calls"] or ()]
    assert [c["id"] for c in calls] == [None] * 3
    check_span(db, marks, "run_shell_command")


async def test_opencode(agents: Path, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    cfg = scripted("bash", {"command": command(marks), "description": "Sleep a while"})
    db = await three_runs(tmp_path, cfg, "opencode", lambda url, home, cwd: opencode(
        agents, home, url, cwd, provider="fake" if url else "anthropic"))
    found = check_runs(db, "opencode")
    assert {(r["tool_version"], r["project"]) for r in found if r["kind"] == "generation"} == {("1.18.33", "work")}
    assert all(r["session_id"].startswith("ses_") for r in found)  # its x-session-id
    titles = [r for r in found if r["kind"] == "side"]  # the tool-less title request (the first answered with text)
    assert len(titles) == 3 and not titles[0]["tool_calls"], titles
    check_span(db, marks, "bash")


async def test_qwen_code(agents: Path, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    cfg = scripted("run_shell_command", {"command": command(marks), "description": "Sleep a while"})
    db = await three_runs(tmp_path, cfg, "qwen-code", lambda url, home, cwd: qwen(agents, home, url))
    found = check_runs(db, "qwen-code")
    assert {(r["tool_version"], r["project"]) for r in found} == {("0.24.4", "work")}
    assert all(r["session_id"].startswith("~") for r in found)
    check_span(db, marks, "run_shell_command")


async def test_aider(aider: Path, tmp_path: Path) -> None:
    """aider declares no tools (it suggests shell commands in text, and --yes-always declines them): no
    tool span to check; its name comes from its system prompt."""
    cfg = SimConfig(ttft_ms=20, itl_ms=2, tokens=8, prefill_us_per_token=0)
    db = await three_runs(tmp_path, cfg, "aider", lambda url, home, cwd: aider_cmd(aider, home, url))
    found = check_runs(db, "aider", usage=False)  # it streams without stream_options.include_usage
    assert all(r["session_id"].startswith("~") and r["user_agent"].startswith("OpenAI/Python") for r in found)
