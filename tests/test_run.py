"""`llmtap run -- COMMAND`: real `llmtap` processes, real SDK clients, the real proxy and simulator."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import duckdb

from proxy.serve.server import write_state
from .serving import RunningProxy
from proxy.simulator.app import Simulator
from proxy.simulator.tokens import expected_text
from proxy.tools.endpoint import base_urls
from proxy.tools.run import child_env, tool_arguments

from .conftest import proxy_config, rows

TEXT = expected_text(8)  # the `sim` fixture answers 8 tokens
SDK_CALLS = """
import sys, urllib.request, openai, anthropic
o = openai.OpenAI(api_key="sk-test", max_retries=0)
stream = o.chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "hi"}], stream=True,
                                   stream_options={"include_usage": True})
print("".join(c.choices[0].delta.content or "" for c in stream if c.choices))
a = anthropic.Anthropic(api_key="sk-test", max_retries=0)
with a.messages.stream(model="claude-x", max_tokens=50, messages=[{"role": "user", "content": "hi"}]) as s:
    print(s.get_final_text())
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""


def clean_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.upper().endswith(("_PROXY", "_API_KEY", "_BASE_URL", "_API_BASE", "_AUTH_TOKEN"))}
    env["HOME"] = str(home)
    return env


async def llmtap(*args: str, env: dict[str, str], timeout: float = 60) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", *args, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_run_starts_its_own_proxy_tags_rows_and_keeps_the_exit_code(sim: Simulator, tmp_path: Path) -> None:
    db = tmp_path / "run.duckdb"
    code, out, err = await llmtap("run", "--upstream", sim.url, "--db", str(db), "--port", "0", "--tag", "mine",
                                  "--", sys.executable, "-c", SDK_CALLS, "3", env=clean_env(tmp_path))
    assert code == 3, err
    assert out.splitlines() == [TEXT, TEXT]
    assert "llmtap run: tag mine: 2 requests (anthropic-python, openai-python), 0 errors" in err
    assert "  TTFT p50 " in err and "tokens in 2, out 16" in err
    assert "  cost unknown (2 of unknown models not priced; `llmtap prices MODEL`)" in err  # gpt-x, claude-x
    con = duckdb.connect(str(db), read_only=True)
    found = con.execute("SELECT path, tag, tool, output_tokens, ttft_ms > 0 FROM requests ORDER BY path").fetchall()
    con.close()
    assert found == [("/v1/chat/completions", "mine", "openai-python", 8, True),
                     ("/v1/messages", "mine", "anthropic-python", 8, True)]


async def test_run_uses_the_running_proxy_through_a_tagged_base_url(sim: Simulator, tmp_path: Path) -> None:
    probe = "import os, urllib.request; urllib.request.urlopen(urllib.request.Request(os.environ['ANTHROPIC_BASE_URL'], method='HEAD'))"
    script = SDK_CALLS.replace("import sys,", probe + "\nimport sys,")
    async with RunningProxy(proxy_config(sim.url, tmp_path)) as proxy:
        write_state(proxy)
        code, out, err = await llmtap("run", "--tag", "shared", "--", sys.executable, "-c", script,
                                      env=clean_env(tmp_path))
        found = rows(proxy, "SELECT method, path, tag FROM requests ORDER BY started_at")
    assert code == 0, err
    assert out.splitlines() == [TEXT, TEXT]
    assert f"ANTHROPIC_BASE_URL={proxy.url}/_tag/shared OPENAI_BASE_URL={proxy.url}/_tag/shared/v1" in err
    assert "llmtap run: tag shared: 3 requests (anthropic-python, openai-python, python-urllib), 0 errors" in err
    assert " over 2 generations; " in err  # the HEAD probe has no first token
    assert found == [{"method": "HEAD", "path": "/", "tag": "shared"},
                     {"method": "POST", "path": "/v1/chat/completions", "tag": "shared"},
                     {"method": "POST", "path": "/v1/messages", "tag": "shared"}]
    assert [r[1] for r in sim.requests] == ["/", "/v1/chat/completions", "/v1/messages"]


async def test_run_summarizes_errors(sim: Simulator, tmp_path: Path) -> None:
    script = ("import os, urllib.request, urllib.error\n"
              "req = urllib.request.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions', method='POST',\n"
              "    data=b'{\"model\": \"m\", \"messages\": []}', headers={'x-sim-status': '503', 'content-type': 'application/json'})\n"
              "try:\n    urllib.request.urlopen(req)\nexcept urllib.error.HTTPError as e:\n    raise SystemExit(e.code // 100)\n")
    async with RunningProxy(proxy_config(sim.url, tmp_path)) as proxy:
        write_state(proxy)
        code, out, err = await llmtap("run", "--tag", "bad", "--", sys.executable, "-c", script, env=clean_env(tmp_path))
    assert code == 5, err
    assert "llmtap run: tag bad: 1 request (python-urllib), 1 error" in err
    assert "  1 x 503 " in err and "/v1/chat/completions" in err
    assert "  cost - (no generation reported tokens)" in err and "$0.0000" not in err  # never 0 for unknown


async def test_run_prints_an_unknown_models_cost_as_unknown(sim: Simulator, tmp_path: Path) -> None:
    one = SDK_CALLS.split("a = anthropic")[0]  # gpt-x: never priced (test_prices.py holds that)
    both = SDK_CALLS.replace('model="gpt-x"', 'model="gpt-4.1-mini"')  # a priced model beside claude-x
    code, out, err = await llmtap("run", "--upstream", sim.url, "--db", str(tmp_path / "one.duckdb"), "--port", "0",
                                  "--tag", "new", "--", sys.executable, "-c", one, env=clean_env(tmp_path))
    assert code == 0, err
    assert "llmtap run: tag new: 1 request (openai-python), 0 errors" in err
    assert "  cost unknown (1 of unknown models not priced; `llmtap prices MODEL`)" in err and "$0.0000" not in err
    code, out, err = await llmtap("run", "--upstream", sim.url, "--db", str(tmp_path / "both.duckdb"), "--port", "0",
                                  "--tag", "both", "--", sys.executable, "-c", both, env=clean_env(tmp_path))
    assert code == 0, err
    assert "  cost <$0.0001 at list price (genai-prices " in err  # 1 + 8 tokens of gpt-4.1-mini
    assert "; 1 of unknown models not priced, so at least that" in err and "$0.0000" not in err


async def test_untagged_requests_during_the_run_are_reported_as_such(sim: Simulator, tmp_path: Path) -> None:
    async with RunningProxy(proxy_config(sim.url, tmp_path)) as proxy:
        write_state(proxy)
        plain = proxy.url + "/v1/models"  # like a tool that ignores the base-URL variables
        script = f"import urllib.request; urllib.request.urlopen({plain!r}).read()"
        code, out, err = await llmtap("run", "--tag", "t", "--", sys.executable, "-c", script, env=clean_env(tmp_path))
    assert code == 0, err
    assert "llmtap run: no request carried the tag t" in err
    assert "untagged requests that arrived meanwhile (perhaps not all this command's): 1 request (python-urllib)" in err


async def test_no_upstream_is_an_error_with_examples(tmp_path: Path) -> None:
    code, out, err = await llmtap("run", "--", "true", env=clean_env(tmp_path))
    assert code == 1
    assert "no running `llmtap serve` and no upstream configured" in err
    assert 'llmtap run --upstream https://api.anthropic.com -- claude -p "say hi"' in err


async def test_exit_codes_of_missing_commands_and_signals(sim: Simulator, tmp_path: Path) -> None:
    async with RunningProxy(proxy_config(sim.url, tmp_path)) as proxy:
        write_state(proxy)
        env = clean_env(tmp_path)
        code, _, err = await llmtap("run", "--", "/nonexistent/tool", env=env)
        assert code == 127 and "command not found: /nonexistent/tool" in err
        code, _, err = await llmtap("run", "--", sys.executable, "-c",
                                    "import os, signal; os.kill(os.getpid(), signal.SIGTERM)", env=env)
        assert code == 128 + 15, err
        code, _, err = await llmtap("run", "--tag", "bad tag", "--", "true", env=env)
        assert code == 1 and "must be 1-100 characters" in err


def test_claude_and_codex_get_their_base_url_as_arguments(tmp_path: Path) -> None:
    urls = base_urls("http://127.0.0.1:8787", ["/"], "t1")
    env = {"HOME": str(tmp_path)}
    argv, _ = tool_arguments(["/opt/bin/claude", "-p", "hi"], urls, env)
    assert argv[:3] == ["/opt/bin/claude", "--settings", json.dumps({"env": {"ANTHROPIC_BASE_URL": urls.anthropic}})]
    assert argv[3:] == ["-p", "hi"] and urls.anthropic == "http://127.0.0.1:8787/_tag/t1"
    argv, _ = tool_arguments(["codex", "exec", "hi"], urls, env)
    assert argv == ["codex", "-c", 'openai_base_url="http://127.0.0.1:8787/_tag/t1/v1"', "exec", "hi"]
    (tmp_path / ".codex").mkdir()
    (tmp_path / ".codex" / "config.toml").write_text(
        'model_provider = "my.tap"\n[model_providers."my.tap"]\nbase_url = "http://x/v1"\n')
    argv, _ = tool_arguments(["codex", "exec", "hi"], urls, env)
    assert argv[1:3] == ["-c", 'model_providers."my.tap".base_url="http://127.0.0.1:8787/_tag/t1/v1"']
    argv, notes = tool_arguments(["python", "x.py"], urls, env)
    assert argv == ["python", "x.py"] and notes == []


def test_child_env_sets_base_urls_and_keeps_loopback_off_proxies() -> None:
    urls = base_urls("http://127.0.0.1:9", ["/anthropic", "/openai"])
    env = child_env({"NO_PROXY": "corp.example", "PATH": "/bin"}, urls)
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9/anthropic"
    assert env["OPENAI_BASE_URL"] == env["OPENAI_API_BASE"] == "http://127.0.0.1:9/openai/v1"
    assert env["NO_PROXY"] == "corp.example,127.0.0.1,localhost,::1" and env["no_proxy"] == "127.0.0.1,localhost,::1"


def test_the_agents_get_their_base_urls(tmp_path: Path) -> None:
    """Gemini CLI reads GOOGLE_GEMINI_BASE_URL (no /v1beta); aider AIDER_OPENAI_API_BASE (wins over its
    .aider.conf.yml); opencode OPENCODE_CONFIG_CONTENT for anthropic, openai and the providers its files name."""
    from proxy.tools.run import tool_env

    urls = base_urls("http://127.0.0.1:8787", ["/"], "t1")
    assert child_env({}, urls)["GOOGLE_GEMINI_BASE_URL"] == "http://127.0.0.1:8787/_tag/t1"
    env = {"HOME": str(tmp_path / "home")}
    assert tool_env(["aider", "--message", "hi"], urls, env, tmp_path) == {
        "AIDER_OPENAI_API_BASE": "http://127.0.0.1:8787/_tag/t1/v1"}
    assert tool_env(["/usr/bin/gemini", "-p", "hi"], urls, env, tmp_path) == {}
    (tmp_path / "opencode.json").write_text(json.dumps({"provider": {"mine": {"npm": "@ai-sdk/openai-compatible"}}}))
    content = json.loads(tool_env(["opencode", "run", "hi"], urls, env, tmp_path / "sub")["OPENCODE_CONFIG_CONTENT"])
    assert content == {"provider": {
        "anthropic": {"options": {"baseURL": "http://127.0.0.1:8787/_tag/t1/v1"}},
        "mine": {"options": {"baseURL": "http://127.0.0.1:8787/_tag/t1/v1"}},
        "openai": {"options": {"baseURL": "http://127.0.0.1:8787/_tag/t1/v1"}}}}
