"""Tool calls and results on every row, ids and names only (#29): the calls a response asked for,
with when each call's block ended, and the results a request carries that are new since the model
last spoke. Through the real proxy, with the simulated upstream asked for a tool call."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from .serving import RunningProxy
from proxy.simulator.app import Simulator

from .conftest import proxy_config, rows
from .upstreams import Script, ScriptedUpstream

PROMPT = "x" * 200
GEMINI = "/v1beta/models/gemini-x:generateContent"
GEMINI_STREAM = "/v1beta/models/gemini-x:streamGenerateContent?alt=sse"
TOOL = {"x-sim-tool-call": "1", "x-sim-tokens": "6", "x-sim-ttft-ms": "30", "x-sim-itl-ms": "5"}

# path, body, the call id's prefix the simulator gives
CALLS = [
    ("/v1/messages", {"model": "c", "max_tokens": 50, "messages": [{"role": "user", "content": PROMPT}]}, "toolu_"),
    ("/v1/chat/completions", {"model": "g", "messages": [{"role": "user", "content": PROMPT}]}, "call_"),
    ("/v1/responses", {"model": "g", "input": PROMPT}, "call_"),
]


async def post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> bytes:
    async with aiohttp.ClientSession() as s, s.post(url, json=body, headers=headers or {}) as r:
        assert r.status == 200, await r.text()
        return await r.read()


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize(("path", "body", "prefix"), CALLS, ids=[c[0] for c in CALLS])
async def test_a_tool_call_is_recorded_with_its_id_name_and_end(
        proxy: RunningProxy, path: str, body: dict[str, Any], prefix: str, stream: bool) -> None:
    answer = await post(proxy.url + path, {**body, "stream": stream}, TOOL)
    row = rows(proxy)[0]
    [call] = row["tool_calls"]
    assert call["name"] == "lookup" and call["id"].startswith(prefix), call
    assert call["id"].encode() in answer  # the id the client got
    if stream:  # the block ended with or after its last argument fragment, before the response ended
        assert row["last_token_ms"] <= call["ended_ms"] <= row["e2e_ms"], (call, row["last_token_ms"], row["e2e_ms"])
    else:  # a whole body's calls end with it
        assert call["ended_ms"] == pytest.approx(row["e2e_ms"])
    assert row["tool_results"] is None


@pytest.mark.parametrize("path", [GEMINI, GEMINI_STREAM])
async def test_gemini_function_calls_come_whole(proxy: RunningProxy, path: str) -> None:
    await post(proxy.url + path, {"contents": [{"role": "user", "parts": [{"text": PROMPT}]}]}, TOOL)
    row = rows(proxy)[0]
    [call] = row["tool_calls"]
    assert call["name"] == "lookup" and call["id"] is None  # Gemini's calls need not have an id
    assert call["ended_ms"] == pytest.approx(row["last_token_ms"] if "alt=sse" in path else row["e2e_ms"])


async def test_a_text_answer_has_no_tool_calls(proxy: RunningProxy) -> None:
    await post(proxy.url + "/v1/messages", {**CALLS[0][1], "stream": True}, {"x-sim-tokens": "3"})
    assert rows(proxy)[0]["tool_calls"] is None


async def test_calls_over_the_responses_websocket(sim: Simulator, tmp_path: Path) -> None:
    async with RunningProxy(proxy_config(sim.url, tmp_path)) as p:
        async with aiohttp.ClientSession() as s, s.ws_connect(p.url + "/v1/responses", headers=TOOL) as ws:
            await ws.send_str(orjson.dumps({"type": "response.create", "model": "g", "input": PROMPT}).decode())
            async for message in ws:
                if orjson.loads(message.data)["type"] == "response.completed":
                    break
        row = rows(p)[0]
    [call] = row["tool_calls"]
    assert call["name"] == "lookup" and call["id"].startswith("call_")
    assert row["last_token_ms"] <= call["ended_ms"] <= row["e2e_ms"]


# -- results: what the next request carries -------------------------------------------------------

ANTHROPIC_HISTORY = {"model": "c", "max_tokens": 50, "messages": [
    {"role": "user", "content": "list the files"},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_old", "name": "Glob", "input": {}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_old", "content": "a.py"}]},
    {"role": "assistant", "content": [
        {"type": "text", "text": "reading both"},
        {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "sleep 1"}},
        {"type": "tool_use", "id": "toolu_2", "name": "Read", "input": {"file_path": "a.py"}}]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "secret output"},
        {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "print()"}]}]},
    {"role": "system", "content": "Claude Code puts system messages in messages, sometimes last"},
]}
CHAT_HISTORY = {"model": "g", "messages": [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "execute_command", "arguments": "{}"}},
        {"id": "call_b", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "call_a", "content": "secret output"},
    {"role": "tool", "tool_call_id": "call_b", "content": "x"},
]}
RESPONSES_HISTORY = {"model": "g", "input": [  # Codex's shape: the whole history, calls as items of their own
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "run it"}]},
    {"type": "function_call", "call_id": "call_old", "name": "exec_command", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "call_old", "output": "old"},
    {"type": "reasoning", "summary": [], "encrypted_content": "e"},
    {"type": "function_call", "call_id": "call_1", "name": "exec_command", "arguments": "{\"cmd\": \"sleep 1\"}"},
    {"type": "function_call_output", "call_id": "call_1", "output": "secret output"},
    {"type": "custom_tool_call", "call_id": "call_2", "name": "apply_patch", "input": "*** Begin Patch"},
    {"type": "custom_tool_call_output", "call_id": "call_2", "output": "done"},
]}
GEMINI_HISTORY = {"contents": [
    {"role": "user", "parts": [{"text": "weather?"}]},
    {"role": "model", "parts": [{"functionCall": {"name": "get_weather", "args": {"city": "Oslo"}}}]},
    {"role": "user", "parts": [{"functionResponse": {"name": "get_weather", "response": {"t": "secret"}}}]},
]}
RESULTS = [
    ("/v1/messages", ANTHROPIC_HISTORY, [("toolu_1", "Bash"), ("toolu_2", "Read")]),
    ("/v1/chat/completions", CHAT_HISTORY, [("call_a", "execute_command"), ("call_b", "read_file")]),
    ("/v1/responses", RESPONSES_HISTORY, [("call_1", "exec_command"), ("call_2", "apply_patch")]),
    (GEMINI, GEMINI_HISTORY, [(None, "get_weather")]),
]


@pytest.mark.parametrize(("path", "body", "expected"), RESULTS, ids=[r[0] for r in RESULTS])
async def test_a_request_carries_the_results_new_since_the_model_spoke(
        proxy: RunningProxy, path: str, body: dict[str, Any], expected: list[tuple[str | None, str]]) -> None:
    await post(proxy.url + path, body, {"x-sim-tokens": "3"})
    row = rows(proxy)[0]
    assert [(r["id"], r["name"]) for r in row["tool_results"]] == expected
    assert row["request_parse_error"] is None
    stored = orjson.dumps(rows(proxy, "SELECT * FROM requests")).decode()
    assert "secret" not in stored and "sleep 1" not in stored  # ids and names only, never content


async def test_a_first_prompt_carries_no_results(proxy: RunningProxy) -> None:
    await post(proxy.url + "/v1/messages", CALLS[0][1], {"x-sim-tokens": "3"})
    assert rows(proxy)[0]["tool_results"] is None


async def test_a_malformed_history_costs_the_column_not_the_row(proxy: RunningProxy) -> None:
    body = {"model": "g", "messages": [{"role": "assistant", "tool_calls": [{"id": 5, "function": {"name": []}}]},
                                       {"role": "tool", "tool_call_id": {"x": 1}}]}
    await post(proxy.url + "/v1/chat/completions", body, {"x-sim-tokens": "3"})
    row = rows(proxy)[0]
    assert row["tool_results"] is None and row["outcome"] == "ok"
    assert row["request_parse_error"].startswith("tool results:") and row["request_model"] == "g"


async def test_a_tool_name_no_utf8_can_hold_costs_the_column_not_the_row(tmp_path: Path) -> None:
    """An upstream's JSON escaping a lone surrogate (`\\ud800`) in a call's name: no UTF-8 column could
    hold it (the store would refuse the row). The body is relayed as sent; the row stays, without the
    calls, and says why."""
    body = (b'{"id":"msg_1","type":"message","role":"assistant","model":"c","content":[{"type":"tool_use",'
            b'"id":"toolu_\\ud800","name":"Ba\\udc80sh","input":{}}],"stop_reason":"tool_use",'
            b'"usage":{"input_tokens":3,"output_tokens":2}}')
    script = Script(headers=[("Content-Type", "application/json")], chunks=[body])
    async with ScriptedUpstream(script) as up, RunningProxy(proxy_config(up.url, tmp_path)) as p:
        assert await post(p.url + "/v1/messages", CALLS[0][1]) == body  # relayed as sent
        [row] = rows(p)
    assert row["tool_calls"] is None and row["outcome"] == "ok" and row["output_tokens"] is None
    assert row["parse_error"].startswith("anthropic body: JSONDecodeError")
