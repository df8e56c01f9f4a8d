"""Sessions, side requests and projects of the agents that send no session id, through the real proxy (#41).

The requests have the shapes Gemini CLI 0.61, Qwen Code 0.24 and aider 0.86 sent (captured from them,
trimmed): the proxy infers a session from the history (proxy/meter/conversations.py), marks the side
requests `side`, and reads the project from the CLIs' context blocks.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from .conftest import rows
from .serving import RunningProxy

GEMINI_UA = {"User-Agent": "GeminiCLI-tui/0.61.0/gemini-2.5-pro (linux; x64; terminal)", "x-goog-api-key": "k1"}
GEMINI_PATH = "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
CONTEXT = {"role": "user", "parts": [
    {"text": "<session_context>\nThis is the Gemini CLI. We are setting up the context for our chat.\n"
             "- **Workspace Directories:**\n  - /home/me/src/shop\n- **Directory Structure:**\n</session_context>"},
    {"text": "run the check"}]}
CALL = {"role": "model", "parts": [{"functionCall": {"id": "run_shell_command_1796465322311_0", "name": "run_shell_command",
                                                    "args": {"command": "sleep 1"}}}]}
RESULT = {"role": "user", "parts": [{"functionResponse": {"id": "run_shell_command_1796465322311_0",
                                                         "name": "run_shell_command", "response": {"output": "ok"}}}]}
TOOLS = [{"functionDeclarations": [{"name": "run_shell_command", "parameters": {"type": "object"}}]}]
QWEN_UA = {"User-Agent": "QwenCode/0.24.4 (linux; x64)", "Authorization": "Bearer k2"}
QWEN_FIRST = {"role": "user", "content": [
    {"type": "text", "text": "<system-reminder>\nThis is the Qwen Code. We are setting up the context for our chat.\n"
                             "I'm currently working in the directory: /home/me/src/api\n</system-reminder>"},
    {"type": "text", "text": "run the check"}]}
AIDER_MESSAGES = [{"role": "system", "content": "Act as an expert software developer.\nTake requests for changes."},
                  {"role": "user", "content": "say hi"}]


def gemini(contents: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"contents": contents, "tools": TOOLS, **extra}


async def post(session: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str]) -> int:
    async with session.post(url, json=body, headers=headers) as r:
        await r.read()
        return r.status


async def test_gemini_runs_are_sessions_and_its_checks_are_side_requests(proxy: RunningProxy) -> None:
    json_check = {"contents": [CONTEXT, CALL, RESULT, {"role": "user", "parts": [{"text": "who speaks next?"}]}],
                  "generationConfig": {"responseMimeType": "application/json"}}
    async with aiohttp.ClientSession() as s:
        url = proxy.url + GEMINI_PATH
        for _ in range(2):  # two `gemini -p` runs of the same prompt
            assert await post(s, url, gemini([CONTEXT]), GEMINI_UA) == 200
            assert await post(s, url, gemini([CONTEXT, CALL, RESULT]), GEMINI_UA) == 200
            assert await post(s, proxy.url + "/v1beta/models/gemini-2.5-flash:generateContent", json_check,
                              GEMINI_UA) == 200
    found = rows(proxy)
    assert [r["kind"] for r in found] == ["generation", "generation", "side"] * 2
    assert {(r["tool"], r["tool_version"], r["tool_mode"], r["project"]) for r in found} == {
        ("gemini-cli", "0.61.0", "tui", "shop")}
    sessions = [r["session_id"] for r in found]
    assert sessions[0] == sessions[1] == sessions[2] != sessions[3] == sessions[4] == sessions[5], sessions
    assert all(s.startswith("~") and len(s) == 13 for s in sessions)


async def test_a_retry_after_a_failure_stays_in_its_session(proxy: RunningProxy) -> None:
    async with aiohttp.ClientSession() as s:
        url = proxy.url + "/v1/chat/completions"
        body, ua = {"model": "m", "messages": AIDER_MESSAGES}, {"User-Agent": "OpenAI/Python 2.20.0"}
        assert await post(s, url, body, {**ua, "Authorization": "Bearer k3", "x-sim-status": "503"}) == 503
        assert await post(s, url, body, {**ua, "Authorization": "Bearer k3"}) == 200  # its retry
        assert await post(s, url, body, {**ua, "Authorization": "Bearer k3"}) == 200  # the next `aider --message` run
        assert await post(s, url, body, {**ua, "Authorization": "Bearer k4"}) == 200  # another key: another stream
    found = rows(proxy)
    assert {r["tool"] for r in found} == {"aider"} and {r["tool_version"] for r in found} == {None}
    first, retry, again, other = (r["session_id"] for r in found)
    assert first == retry and len({first, again, other}) == 3


async def test_qwen_code_project_and_its_tool_less_request(proxy: RunningProxy) -> None:
    tools = [{"type": "function", "function": {"name": "run_shell_command", "parameters": {"type": "object"}}}]
    system = {"role": "system", "content": "You are Qwen Code, a non-interactive CLI agent"}
    async with aiohttp.ClientSession() as s:
        url = proxy.url + "/v1/chat/completions"
        assert await post(s, url, {"model": "q", "messages": [system, QWEN_FIRST], "tools": tools}, QWEN_UA) == 200
        assert await post(s, url, {"model": "q", "messages": [system, QWEN_FIRST]}, QWEN_UA) == 200
    turn, side = rows(proxy)
    assert (turn["tool"], turn["tool_version"], turn["kind"], turn["project"]) == ("qwen-code", "0.24.4", "generation", "api")
    assert side["kind"] == "side" and side["session_id"] == turn["session_id"]


async def test_a_side_requests_tokens_are_still_counted(proxy: RunningProxy) -> None:
    """A side request is no turn, but its tokens are spent: the GenAI metrics count them."""
    from proxy.observe.metrics import PrometheusMetrics
    from proxy.record.recorder import on_rows

    from .test_metrics import lbl, samples, value

    metrics = PrometheusMetrics(store_stats=proxy.store.stats, loop_lag=proxy.state.loop_lag.summary)
    proxy.state.recorder.observe(on_rows(metrics.observe))
    async with aiohttp.ClientSession() as s:  # a tool-less request: the simulator answers 8 text tokens
        assert await post(s, proxy.url + "/v1/chat/completions", {"model": "q", "messages": [QWEN_FIRST]},
                          {**QWEN_UA, "x-sim-tokens": "8"}) == 200
    [row] = rows(proxy)
    assert row["kind"] == "side"
    found = samples(metrics.render()[0].decode())
    assert value(found, "gen_ai_client_inference_usage_output_tokens_total", **lbl("/", "q", "qwen-code", "2xx"),
                 gen_ai_token_modality="unknown") == 8


async def test_claude_codes_tool_less_requests_are_side_requests(proxy: RunningProxy) -> None:
    """Claude Code declares its tools on every turn; interactive Claude Code also asks for a title and
    checks its quota without them (#43): those are side requests, in the turn's session."""
    from .cli_traffic import CLAUDE_HEADERS, claude_code_prompt

    title = {"model": "claude-haiku-4-5", "max_tokens": 512, "stream": True, "messages": [{"role": "user", "content": "say hi"}],
             "system": [{"type": "text", "text": "Generate a concise, sentence-case title (3-7 words) for this "
                                                 "coding session. Return JSON with a single \"title\" field."}]}
    quota = {"model": "claude-haiku-4-5", "max_tokens": 1, "messages": [{"role": "user", "content": "quota"}]}
    async with aiohttp.ClientSession() as s:
        await claude_code_prompt(s, proxy.url)  # `claude -p`: its turn declares tools
        for body in (title, quota):
            assert await post(s, proxy.url + "/v1/messages?beta=true", body, CLAUDE_HEADERS) == 200
    found = [r for r in rows(proxy) if r["method"] == "POST"]
    assert [(r["tool"], r["request_model"], r["kind"]) for r in found] == [
        ("claude-code", "claude-sonnet-4-5", "token_count"), ("claude-code", "claude-sonnet-4-5", "generation"),
        ("claude-code", "claude-haiku-4-5", "side"), ("claude-code", "claude-haiku-4-5", "side")]
    assert len({r["session_id"] for r in found}) == 1
