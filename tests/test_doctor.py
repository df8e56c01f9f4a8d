"""`llmtap doctor`: real processes checking real listeners, files and upstreams on loopback."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import aiohttp

from proxy.common import paths
from proxy.meter.fingerprint import key_fingerprint
from proxy.serve.server import write_state
from .serving import RunningProxy
from proxy.simulator.app import Simulator

from .conftest import proxy_config
from .test_run import clean_env, llmtap
from .upstreams import Script, ScriptedUpstream


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_environment_problems_fail_with_their_fix_and_keys_stay_secret(sim: Simulator, tmp_path: Path) -> None:
    dead = closed_port()
    key = "sk-secret-value-123"
    env = {**clean_env(tmp_path), "OPENAI_API_KEY": key + "\n", "ANTHROPIC_API_KEY": "sk-proj-abcdef",
           "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{dead}/v1", "OPENAI_BASE_URL": f"http://127.0.0.1:{dead}",
           "HTTPS_PROXY": f"http://user:pw@127.0.0.1:{dead}"}
    code, out, err = await llmtap("doctor", "--upstream", sim.url, "--port", str(closed_port()),
                                  "--db", str(tmp_path / "x.duckdb"), env=env)
    assert code == 1, err
    fp = key_fingerprint({"authorization": f"Bearer {key}"})  # what the proxy records for this key
    lines = out.splitlines()
    assert f"FAIL  HTTPS_PROXY=http://***@127.0.0.1:{dead}: nothing listens on 127.0.0.1:{dead}, so every request " \
           "through it fails" in lines
    assert "      fix: unset HTTPS_PROXY (and https_proxy), or start the proxy it names" in lines
    assert f"FAIL  OPENAI_API_KEY (20 chars, {fp}): has a trailing newline: the header the client sends is " \
           "invalid, or the key is wrong" in lines
    assert "FAIL  ANTHROPIC_API_KEY (14 chars, " in out and "looks like an OpenAI key" in out
    assert f"FAIL  ANTHROPIC_BASE_URL=http://127.0.0.1:{dead}/v1: ends in /v1" in out
    assert f"      fix: set it to http://127.0.0.1:{dead}" in lines
    assert f"FAIL  OPENAI_BASE_URL=http://127.0.0.1:{dead}: lacks /v1" in out
    assert f"      fix: set it to http://127.0.0.1:{dead}/v1" in lines
    assert key not in out and "sk-proj-abcdef" not in out and "pw" not in out
    assert lines[-1] == "5 FAIL, 0 WARN, 6 OK"


async def test_all_ok_with_a_running_proxy(sim: Simulator, tmp_path: Path) -> None:
    async with RunningProxy(proxy_config(sim.url, tmp_path)) as proxy:
        write_state(proxy)
        db = proxy.config.db_path
        env = {**clean_env(tmp_path), "OPENAI_API_KEY": "sk-test", "ANTHROPIC_BASE_URL": proxy.url,
               "OPENAI_BASE_URL": proxy.url + "/v1"}
        code, out, err = await llmtap("doctor", "--port", str(proxy.port), "--db", str(db), env=env)
    assert code == 0, out + err
    pid, port, sim_port = os.getpid(), proxy.port, sim.port
    assert out == f"""\
OK    HTTP proxy variables: none set
OK    OPENAI_API_KEY (7 chars, {key_fingerprint({"x-api-key": "sk-test"})}): well formed
OK    ANTHROPIC_BASE_URL=http://127.0.0.1:{port}: goes through the running llmtap serve
OK    OPENAI_BASE_URL=http://127.0.0.1:{port}/v1: goes through the running llmtap serve
OK    llmtap serve: running at http://127.0.0.1:{port} (pid {pid}), recording to {db}
OK    fast paths: body_pipe, arrival, headers_later, conn_timing, kernel_stamps on in the running llmtap serve (aiohttp {aiohttp.__version__})
OK    port {port} on 127.0.0.1: used by the running llmtap serve
OK    database {db}: held by the running llmtap serve (pid {pid}); llmtap sql/report query it through it
OK    upstream http://127.0.0.1:{sim_port}: TCP: connected to 127.0.0.1:{sim_port}
OK    upstream http://127.0.0.1:{sim_port}: GET /v1/models with OPENAI_API_KEY: 200 (key accepted)
0 FAIL, 0 WARN, 10 OK
"""


async def test_the_running_proxys_port_and_database_are_checked_not_the_defaults(sim: Simulator,
                                                                                  tmp_path: Path) -> None:
    async with RunningProxy(proxy_config(sim.url, tmp_path, db=str(tmp_path / "elsewhere.duckdb"))) as proxy:
        write_state(proxy)
        code, out, err = await llmtap("doctor", "--upstream", sim.url, env=clean_env(tmp_path))
    assert f"OK    port {proxy.port} on 127.0.0.1: used by the running llmtap serve" in out.splitlines(), out + err
    assert f"OK    database {tmp_path / 'elsewhere.duckdb'}: held by the running llmtap serve" in out
    assert "port 8787" not in out


async def test_port_in_use_and_database_locked_by_others(sim: Simulator, tmp_path: Path) -> None:
    async with RunningProxy(proxy_config(sim.url, tmp_path)) as proxy:  # no state file: not "ours"
        db = proxy.config.db_path
        code, out, err = await llmtap("doctor", "--upstream", sim.url, "--port", str(sim.port), "--db", str(db),
                                      env=clean_env(tmp_path))
    assert code == 1, err
    assert f"FAIL  port {sim.port} on 127.0.0.1: in use by another process" in out
    assert f"      fix: stop it, or use another port: llmtap serve --port {sim.port + 1}, then" in out
    assert f"FAIL  database {db}: locked by another process" in out
    assert "OK    llmtap serve: not running" in out


async def test_upstream_tls_tcp_and_refused_key(sim: Simulator, tmp_path: Path) -> None:
    dead = closed_port()
    refusing = Script(status=401, headers=[("Content-Type", "application/json")],
                      chunks=[b'{"error": {"message": "Incorrect API key provided"}}'])
    async with ScriptedUpstream(refusing) as scripted:
        env = {**clean_env(tmp_path), "OPENAI_API_KEY": "sk-wrong"}
        code, out, err = await llmtap(
            "doctor", "--timeout", "3", "--port", str(closed_port()), "--db", str(tmp_path / "d.duckdb"),
            "--upstream", f"https://127.0.0.1:{sim.port}", "--upstream", f"http://127.0.0.1:{dead}",
            "--upstream", scripted.url, env=env)
    assert code == 1, err
    assert f"FAIL  upstream https://127.0.0.1:{sim.port}: TLS: handshake failed" in out
    assert f"FAIL  upstream http://127.0.0.1:{dead}: TCP: cannot connect to 127.0.0.1:{dead}: Connection refused" in out
    assert f"FAIL  upstream {scripted.url}: GET /v1/models with OPENAI_API_KEY: 401: the key was refused" in out
    assert [r.path_qs for r in scripted.received] == ["/v1/models"]
    assert ("Authorization", "Bearer sk-wrong") in scripted.received[0].headers


async def test_tool_settings_that_win_over_the_environment_are_checked(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".claude").mkdir(parents=True)
    (home / ".claude" / "settings.json").write_text(json.dumps({"env": {"ANTHROPIC_BASE_URL": "http://127.0.0.1:8787/v1"}}))
    (home / ".codex").mkdir()
    (home / ".codex" / "config.toml").write_text(
        'model_provider = "tap"\n[model_providers.tap]\nbase_url = "http://127.0.0.1:8787"\n')
    code, out, err = await llmtap("doctor", "--port", str(closed_port()), "--db", str(tmp_path / "d.duckdb"),
                                  env=clean_env(home))
    assert code == 1, err
    assert f"FAIL  {home}/.claude/settings.json env.ANTHROPIC_BASE_URL=http://127.0.0.1:8787/v1: ends in /v1" in out
    assert f"FAIL  {home}/.codex/config.toml [model_providers.tap] base_url=http://127.0.0.1:8787: lacks /v1" in out
    assert "WARN  upstream: none configured" in out


async def test_proxy_variable_pointing_at_llmtap_and_a_stale_state_file(sim: Simulator, tmp_path: Path) -> None:
    async with RunningProxy(proxy_config(sim.url, tmp_path)) as proxy:
        write_state(proxy)
        env = {**clean_env(tmp_path), "HTTP_PROXY": proxy.url}
        code, out, err = await llmtap("doctor", "--port", str(proxy.port), "--db", str(proxy.config.db_path), env=env)
    assert code == 1, err
    assert f"FAIL  HTTP_PROXY={proxy.url}: points at llmtap, which is a reverse proxy" in out
    assert "WARN  NO_PROXY: does not cover 127.0.0.1 and localhost" in out
    code, out, err = await llmtap("doctor", "--port", str(closed_port()), "--db", str(tmp_path / "d.duckdb"),
                                  env=clean_env(tmp_path))
    assert f"WARN  llmtap serve: {paths.state_dir() / f'{proxy.port}.json'} names pid {os.getpid()} on port {proxy.port}, but no llmtap " \
           "answers there" in out
    assert code == 0, out


async def test_the_agents_settings_files_are_checked(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".gemini").mkdir(parents=True)
    (home / ".gemini" / ".env").write_text("GOOGLE_GEMINI_BASE_URL=http://127.0.0.1:8787/v1beta\n")
    (home / ".qwen").mkdir()
    (home / ".qwen" / ".env").write_text("export OPENAI_BASE_URL='http://127.0.0.1:8787'\n")
    (home / ".config" / "opencode").mkdir(parents=True)
    (home / ".config" / "opencode" / "opencode.json").write_text(
        json.dumps({"provider": {"anthropic": {"options": {"baseURL": "http://127.0.0.1:8787/v1/messages"}}}}))
    (home / ".aider.conf.yml").write_text('openai-api-base: "https://api.example.com/v1"\n')
    env = {k: v for k, v in clean_env(home).items() if k != "XDG_CONFIG_HOME"}
    code, out, err = await llmtap("doctor", "--port", str(closed_port()), "--db", str(tmp_path / "d.duckdb"), env=env)
    assert code == 1, err
    assert f"FAIL  {home}/.gemini/.env GOOGLE_GEMINI_BASE_URL=http://127.0.0.1:8787/v1beta: ends in /v1beta" in out
    assert f"FAIL  {home}/.gemini/settings.json security.auth.selectedType: not set: Gemini CLI exits 41" in out
    assert f"FAIL  {home}/.qwen/.env OPENAI_BASE_URL=http://127.0.0.1:8787: lacks /v1" in out
    assert (f"FAIL  {home}/.config/opencode/opencode.json provider.anthropic.options.baseURL="
            "http://127.0.0.1:8787/v1/messages: is a full endpoint") in out
    assert f"WARN  {home}/.aider.conf.yml openai-api-base=https://api.example.com/v1: goes to api.example.com" in out
