"""Acceptance with the real CLIs: Claude Code, Codex and Cline, each through the real proxy to the simulator.

The CLIs come from npm, pinned to the versions of shared/reference/real-clis.md,
installed once into $LLMTAP_CLI_CACHE (default ~/.cache/llmtap-test-clis) and
reused. Without node and npm, or when npm cannot reach its registry, the tests
are skipped with the reason. They run as real-clis.md shows: a scratch HOME,
an env -i style environment, stdin from /dev/null, `timeout -k 5 60`.
Deselect them with `-m "not real_cli"`.
"""

from __future__ import annotations

import asyncio
import base64
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from proxy.settings.config import ServeConfig
from proxy.serve.server import write_state
from .serving import RunningProxy
from proxy.simulator.app import Simulator
from proxy.simulator.tokens import count_input_tokens, expected_text
from proxy.tools.cli import setup

from .conftest import rows

pytestmark = [pytest.mark.real_cli, pytest.mark.timeout(900)]

PACKAGES = {"@anthropic-ai/claude-code": "2.1.197", "@openai/codex": "0.171.0", "cline": "3.0.65"}
TEXT = expected_text(8)  # the `sim` fixture answers 8 text tokens
NETWORK_ERRORS = re.compile(r"ENOTFOUND|EAI_AGAIN|ETIMEDOUT|ECONNREFUSED|ECONNRESET|ENETUNREACH|network", re.I)


def cache_dir() -> Path:
    return Path(os.environ.get("LLMTAP_CLI_CACHE") or Path.home() / ".cache" / "llmtap-test-clis")


def _installed(prefix: Path, packages: dict[str, str], bins: tuple[str, ...]) -> bool:
    for package, version in packages.items():
        try:
            if json.loads((prefix / "node_modules" / package / "package.json").read_text())["version"] != version:
                return False
        except (OSError, ValueError, KeyError):
            return False
    return all((prefix / "node_modules" / ".bin" / name).exists() for name in bins)


def npm_installed(prefix: Path, packages: dict[str, str], bins: tuple[str, ...]) -> Path:
    """`packages` at their versions in the npm prefix `prefix`, installed on first use under a lock
    (skips without node and npm, or when npm cannot reach its registry)."""
    npm = shutil.which("npm")
    if not npm or not shutil.which("node"):
        pytest.skip("node and npm are needed to install the real CLIs")
    prefix.mkdir(parents=True, exist_ok=True)
    with open(prefix / ".llmtap-install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _installed(prefix, packages, bins):
            started = time.monotonic()
            specs = [f"{package}@{version}" for package, version in packages.items()]
            try:
                proc = subprocess.run([npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
                                       "--save-exact", *specs], capture_output=True, text=True, timeout=900)
            except subprocess.TimeoutExpired:
                pytest.skip("npm install of the real CLIs took over 900 s (no network?)")
            output = (proc.stderr + proc.stdout).strip().splitlines()
            tail = " | ".join(output[-3:])
            network = [line for line in output if NETWORK_ERRORS.search(line)]
            if proc.returncode != 0 and network:
                pytest.skip(f"npm cannot reach its registry: {' | '.join(network[:2])}")
            assert proc.returncode == 0 and _installed(prefix, packages, bins), f"npm install failed: {tail}"
            print(f"installed {', '.join(specs)} into {prefix} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return prefix


@pytest.fixture(scope="module")
def clis() -> Path:
    """The npm prefix holding the three CLIs (installed on first use, under a lock)."""
    return npm_installed(cache_dir(), PACKAGES, ("claude", "codex", "cline"))


def base_env(home: Path, **extra: str) -> dict[str, str]:
    """env -i style: only what the CLI needs."""
    home.mkdir(parents=True, exist_ok=True)
    return {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8", "TERM": "dumb", **extra}


CLAUDE_QUIET = {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
                "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1", "ANTHROPIC_API_KEY": "sk-test"}


async def run_cli(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        "timeout", "-k", "5", "60", *argv, env=env, cwd=cwd, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


async def llmtap_run(args: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str, str]:
    """`llmtap run ARGS` as its own process, with the CLI's env -i style environment."""
    child_env = {**env, "LLMTAP_HOME": os.environ["LLMTAP_HOME"], "LLMTAP_CONFIG": os.environ["LLMTAP_CONFIG"]}
    if os.environ.get("PYTHONPATH"):
        child_env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return await run_cli([sys.executable, "-m", "proxy", "run", *args], child_env, cwd)


def write_setup(*args: str, env: dict[str, str], telemetry: bool = False) -> None:
    """`llmtap setup ... --write`; without the tool's own telemetry unless asked (tests/test_otlp_ingest.py's)."""
    result = CliRunner().invoke(setup, [*args, "--write", *(() if telemetry else ("--no-telemetry",))], env=env)
    assert result.exit_code == 0, result.output


def generation(row: dict[str, Any], tool: str, dialect: str) -> None:
    """A streamed generation, measured: tool and dialect detected, tokens from usage, TTFT present."""
    assert row["tool"] == tool, row
    assert row["dialect"] == dialect, row
    assert row["outcome"] == "ok" and row["stream"] is True, row
    assert row["tokens_source"] == "usage" and row["output_tokens"] == 8 and row["input_tokens"] > 0, row
    assert row["ttft_ms"] is not None and 0 < row["ttft_ms"] <= row["e2e_ms"], row


def sim_input_tokens(sim: Simulator, path_qs: str) -> list[int]:
    return [count_input_tokens(orjson.loads(body)) for method, p, _, body in sim.requests
            if p == path_qs and method == "POST"]


async def test_claude_code(clis: Path, sim: Simulator, proxy: RunningProxy, tmp_path: Path) -> None:
    claude = str(clis / "node_modules" / ".bin" / "claude")
    env = base_env(tmp_path / "home", ANTHROPIC_BASE_URL=proxy.url, **CLAUDE_QUIET)
    code, out, err = await run_cli([claude, "-p", "say hi"], env, tmp_path)
    assert code == 0, err
    assert TEXT in out
    found = rows(proxy)
    assert [(r["method"], r["path"], r["status"], r["tool"]) for r in found] == [
        ("HEAD", "/", 200, "claude-code"), ("POST", "/v1/messages", 200, "claude-code")]
    assert found[0]["user_agent"].startswith("Bun/")
    generation(found[1], "claude-code", "anthropic")
    assert found[1]["user_agent"].startswith("claude-cli/2.1.197")
    assert found[1]["session_id"] and found[1]["key_fingerprint"]
    assert found[1]["project"] == tmp_path.name  # from its system prompt's working directory
    assert [r[1] for r in sim.requests] == ["/", "/v1/messages?beta=true"]
    assert [found[1]["input_tokens"]] == sim_input_tokens(sim, "/v1/messages?beta=true")

    code, out, err = await run_cli([claude, "-p", "/context"], env, tmp_path)  # counts tokens upstream
    assert code == 0, err
    counted = rows(proxy, "SELECT * FROM requests WHERE path = '/v1/messages/count_tokens'")
    assert counted and all(r["status"] == 200 and r["tool"] == "claude-code" for r in counted)
    assert len(counted) == sum(r[1] == "/v1/messages/count_tokens?beta=true" for r in sim.requests)


async def test_claude_code_set_up_by_llmtap_and_run_through_it(clis: Path, sim: Simulator, proxy: RunningProxy,
                                                               tmp_path: Path) -> None:
    claude = str(clis / "node_modules" / ".bin" / "claude")
    env = base_env(tmp_path / "home", **CLAUDE_QUIET)
    write_setup("claude-code", "--base-url", proxy.url, env=env)
    code, out, err = await run_cli([claude, "-p", "say hi"], env, tmp_path)
    assert code == 0 and TEXT in out, err
    write_state(proxy)
    code, out, err = await llmtap_run(["--tag", "cc", "--", claude, "-p", "say hi"], env, tmp_path)
    assert code == 0 and TEXT in out, err
    assert "llmtap run: tag cc: 2 requests (claude-code), 0 errors" in err
    found = rows(proxy, "SELECT method, path, tag FROM requests ORDER BY started_at")
    assert found == [{"method": "HEAD", "path": "/", "tag": None}, {"method": "POST", "path": "/v1/messages", "tag": None},
                     {"method": "HEAD", "path": "/", "tag": "cc"}, {"method": "POST", "path": "/v1/messages", "tag": "cc"}]


CODEX_CONFIG = """\
model = "gpt-5"
[analytics]
enabled = false          # otherwise it exports metrics to the vendor
[features]
plugins = false          # otherwise it syncs plugins from the vendor and GitHub
"""


async def test_codex_custom_provider(clis: Path, sim: Simulator, proxy: RunningProxy, tmp_path: Path) -> None:
    codex = str(clis / "node_modules" / ".bin" / "codex")
    codex_home = tmp_path / "home" / ".codex"
    codex_home.mkdir(parents=True)
    (codex_home / "config.toml").write_text(CODEX_CONFIG)
    env = base_env(tmp_path / "home", CODEX_HOME=str(codex_home), TAP_API_KEY="sk-test")
    write_setup("codex", "--base-url", proxy.url, "--env-key", "TAP_API_KEY", env=env)
    assert (codex_home / "config.toml").read_text().startswith('model = "gpt-5"\nmodel_provider = "llmtap"\n\n[analytics]')
    code, out, err = await run_cli([codex, "exec", "--skip-git-repo-check", "say hi"], env, tmp_path)
    assert code == 0, err
    assert out.strip() == TEXT
    [row] = rows(proxy)
    assert (row["method"], row["path"], row["status"], row["request_model"]) == ("POST", "/v1/responses", 200, "gpt-5")
    generation(row, "codex", "openai_responses")
    assert row["user_agent"].startswith("codex_exec/0.171.0") and row["session_id"]
    assert row["project"] == tmp_path.name  # from its environment_context's <cwd>
    assert [row["input_tokens"]] == sim_input_tokens(sim, "/v1/responses")

    write_state(proxy)
    code, out, err = await llmtap_run(["--tag", "cx", "--", codex, "exec", "--skip-git-repo-check", "say hi"],
                                      env, tmp_path)
    assert code == 0 and out.strip() == TEXT, err
    assert f'codex gets -c model_providers.llmtap.base_url="{proxy.url}/_tag/cx/v1"' in err
    assert rows(proxy, "SELECT path, tag FROM requests WHERE tag = 'cx'") == [{"path": "/v1/responses", "tag": "cx"}]


async def test_codex_built_in_provider_over_websocket(clis: Path, sim: Simulator, proxy: RunningProxy,
                                                      tmp_path: Path) -> None:
    codex = str(clis / "node_modules" / ".bin" / "codex")
    codex_home = tmp_path / "home" / ".codex"
    codex_home.mkdir(parents=True)
    (codex_home / "config.toml").write_text(f'openai_base_url = "{proxy.url}/v1"\n' + CODEX_CONFIG)
    env = base_env(tmp_path / "home", CODEX_HOME=str(codex_home), OPENAI_API_KEY="sk-test")
    code, out, err = await run_cli([codex, "exec", "--skip-git-repo-check", "say hi"], env, tmp_path)
    assert code == 0, err
    assert out.strip() == TEXT
    found = rows(proxy)
    # one WebSocket: a prewarm response.create ("generate": false), then the turn; one row per response
    assert [(r["method"], r["path"], r["status"]) for r in found] == [("GET", "/v1/responses", 101)] * 2
    generation(found[1], "codex", "openai_responses")
    prewarm = found[0]  # "generate": false: the upstream answers without output
    assert (prewarm["tool"], prewarm["dialect"], prewarm["outcome"], prewarm["output_tokens"]) == ("codex", "openai_responses", "ok", 0)
    assert found[0]["message_count"] == 1 and found[1]["message_count"] > 1
    assert [(m, p) for m, p, _, _ in sim.requests] == [("GET", "/v1/responses")]
    assert sim.requests[0][2]["openai-beta"].startswith("responses_websockets=")


def _jwt(claims: dict[str, Any]) -> str:
    part = lambda d: base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()  # noqa: E731
    return f"{part({'alg': 'RS256', 'typ': 'JWT'})}.{part(claims)}.bm90LXNpZ25lZA"


async def test_codex_on_a_chatgpt_login_set_up_by_llmtap(clis: Path, sim: Simulator, tmp_path: Path) -> None:
    """A ChatGPT login (auth.json as `codex login` writes it, tokens that need no refresh): setup writes
    only openai_base_url, Codex keeps its login and reaches the ChatGPT backend through the /chatgpt route."""
    codex = str(clis / "node_modules" / ".bin" / "codex")
    codex_home = tmp_path / "home" / ".codex"
    codex_home.mkdir(parents=True)
    account = "6f1c0a7e-0000-4000-8000-000000000001"
    claims = {"exp": 4102444800, "https://api.openai.com/auth": {"chatgpt_account_id": account,
                                                                 "chatgpt_plan_type": "plus"}}
    access = _jwt(claims)
    (codex_home / "auth.json").write_text(json.dumps({
        "auth_mode": "chatgpt", "OPENAI_API_KEY": None, "last_refresh": "2026-11-30T12:00:00Z",
        "tokens": {"id_token": _jwt({**claims, "email": "dev@example.com"}), "access_token": access,
                   "refresh_token": "rt-not-real", "account_id": account}}))
    (codex_home / "config.toml").write_text(CODEX_CONFIG)
    env = base_env(tmp_path / "home", CODEX_HOME=str(codex_home))
    config = ServeConfig(port=0, upstream=sim.url, routes={"/chatgpt": sim.url + "/backend-api/codex"},
                         db=str(tmp_path / "llmtap.duckdb"), quiet=True, flush_interval_s=0.2)
    async with RunningProxy(config) as proxy:
        write_setup("codex", "--base-url", proxy.url, env=env)
        assert (codex_home / "config.toml").read_text() == (
            f'model = "gpt-5"\nopenai_base_url = "{proxy.url}/chatgpt"\n\n' + CODEX_CONFIG.split("\n", 1)[1])
        code, out, err = await run_cli([codex, "exec", "--skip-git-repo-check", "say hi"], env, tmp_path)
        assert code == 0, err
        assert out.strip() == TEXT
        found = rows(proxy, "SELECT * FROM requests WHERE path = '/chatgpt/responses' ORDER BY started_at")
        stored = repr(rows(proxy)) + repr(rows(proxy, "SELECT * FROM chunks"))
    assert [(r["method"], r["route"], r["status"], r["kind"]) for r in found] == [
        ("GET", "/chatgpt", 101, "prewarm"), ("GET", "/chatgpt", 101, "generation")]
    generation(found[1], "codex", "openai_responses")
    [(_, path, headers, _)] = [r for r in sim.requests if r[1] == "/backend-api/codex/responses"]
    assert headers["authorization"] == f"Bearer {access}" and headers["chatgpt-account-id"] == account
    assert headers["openai-beta"].startswith("responses_websockets=")
    assert access not in stored


CLINE_RUNS = (("openai-compatible", "m", "POST", "/v1/chat/completions", "openai_chat"),
              ("anthropic", "claude-sonnet-4-5", "POST", "/v1/messages", "anthropic"),
              ("openai-native", "gpt-5", "POST", "/v1/responses", "openai_responses"))


async def test_cline_each_provider(clis: Path, sim: Simulator, proxy: RunningProxy, tmp_path: Path) -> None:
    cline = str(clis / "node_modules" / ".bin" / "cline")
    data = tmp_path / "cline-data"
    settings = tmp_path / "global-settings.json"
    settings.write_text('{"telemetryOptOut": true, "autoUpdateEnabled": false}')
    env = base_env(tmp_path / "home", CLINE_NO_AUTO_UPDATE="1", E2E_TEST="true",
                   CLINE_GLOBAL_SETTINGS_PATH=str(settings))
    write_setup("cline", "--base-url", proxy.url, "--data-dir", str(data), env=env)
    for provider, model, method, path, dialect in CLINE_RUNS:
        code, out, err = await run_cli([cline, "auth", "-p", provider, "-k", "sk-test", "-m", model,
                                        "--data-dir", str(data)], env, tmp_path)
        assert code == 0, out + err
        code, out, err = await run_cli([cline, "--data-dir", str(data), "-P", provider, "say hi"], env, tmp_path)
        assert code == 0, out + err
        assert TEXT in out
        row = rows(proxy)[-1]
        assert (row["method"], row["path"], row["status"], row["request_model"]) == (method, path, 200, model)
        generation(row, "cline", dialect)
        assert row["user_agent"].startswith("ai-sdk/")
        assert row["project"] == tmp_path.name, provider  # its system prompt's Current Working Directory
        assert [row["input_tokens"]] == sim_input_tokens(sim, path)[-1:]
    assert len(rows(proxy)) == 3
    providers = json.loads((data / "settings" / "providers.json").read_text())["providers"]
    assert {p: providers[p]["settings"]["baseUrl"] for p, *_ in CLINE_RUNS} == {p: proxy.url + "/v1" for p, *_ in CLINE_RUNS}
