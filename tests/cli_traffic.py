"""What the real CLIs send around their generations, as plain aiohttp calls (tests/../real-clis.md).

Claude Code: `HEAD /` (User-Agent Bun), `POST /v1/messages/count_tokens?beta=true`, then the streamed
`POST /v1/messages?beta=true`, which declares its `tools` (every main request does: one without
them is a side request, such as the interactive UI's title request). Codex on its built-in provider: a WebSocket on `/v1/responses` with a
prewarm (`"generate": false`) before the turn, and `x-codex-turn-metadata` on the handshake.
Cline and the SDKs: `GET /v1/models`, Chat Completions with `include_usage`.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

CLAUDE_HEADERS = {"x-api-key": "sk-ant-test", "anthropic-version": "2023-06-01",
                  "User-Agent": "claude-cli/2.1.197 (external, sdk-cli)", "x-app": "cli",
                  "X-Claude-Code-Session-Id": "3f0e0f6a-9a53-4a51-9a5d-1c2b3c4d5e6f"}
CODEX_HEADERS = {"Authorization": "Bearer sk-test", "originator": "codex_exec",
                 "User-Agent": "codex_exec/0.171.0 (Debian 12; x86_64)",
                 "OpenAI-Beta": "responses_websockets=2026-02-06",
                 "x-codex-turn-metadata": orjson.dumps({"request_kind": "turn", "turn_id": "t1"}).decode()}
MESSAGES = [{"role": "user", "content": "say hi " * 40}]


def claude_tools(*names: str) -> list[dict[str, Any]]:
    """The `tools` a Claude Code main request declares (Anthropic's shape): Bash and Read, or `names`."""
    return [{"name": name, "description": f"The {name} tool.",
             "input_schema": {"type": "object", "properties": {}, "additionalProperties": True}}
            for name in names or ("Bash", "Read")]


async def claude_code_prompt(s: aiohttp.ClientSession, base: str, model: str = "claude-sonnet-4-5") -> None:
    """One `claude -p` prompt: the warm-up HEAD, a token count, the streamed turn."""
    async with s.head(base + "/", headers={"User-Agent": "Bun/1.2.19"}) as r:
        await r.read()
    async with s.post(base + "/v1/messages/count_tokens?beta=true", headers=CLAUDE_HEADERS,
                      json={"model": model, "messages": MESSAGES}) as r:
        assert r.status == 200, await r.text()
        await r.read()
    async with s.post(base + "/v1/messages?beta=true", headers=CLAUDE_HEADERS,
                      json={"model": model, "max_tokens": 1000, "stream": True, "messages": MESSAGES,
                            "tools": claude_tools()}) as r:
        assert r.status == 200, await r.text()
        await r.read()


async def _until_completed(ws: aiohttp.ClientWebSocketResponse) -> list[dict[str, Any]]:
    events = []
    while not events or events[-1]["type"] not in ("response.completed", "response.failed", "error"):
        events.append(await ws.receive_json(timeout=10))
    return events


async def codex_websocket_turn(s: aiohttp.ClientSession, base: str, model: str = "gpt-5-codex",
                               turns: int = 1) -> list[list[dict[str, Any]]]:
    """Codex's built-in provider: one WebSocket, a prewarm, then `turns` turns; every response's events."""
    answers = []
    async with s.ws_connect(base + "/v1/responses", headers=CODEX_HEADERS) as ws:
        await ws.send_str(orjson.dumps({"type": "response.create", "model": model, "input": [],
                                        "generate": False}).decode())
        answers.append(await _until_completed(ws))
        for _ in range(turns):
            await ws.send_str(orjson.dumps({"type": "response.create", "model": model,
                                            "input": [{"role": "user", "content": "say hi"}]}).decode())
            answers.append(await _until_completed(ws))
    return answers


async def models_list(s: aiohttp.ClientSession, base: str) -> None:
    async with s.get(base + "/v1/models", headers={"Authorization": "Bearer sk-test"}) as r:
        assert r.status == 200, await r.text()
        await r.read()


async def chat_stream(s: aiohttp.ClientSession, base: str, model: str = "gpt-5-mini") -> None:
    """Cline's openai-compatible call: a stream whose last chunk (usage) has empty `choices`."""
    body = {"model": model, "stream": True, "stream_options": {"include_usage": True}, "messages": MESSAGES}
    async with s.post(base + "/v1/chat/completions", headers={"Authorization": "Bearer sk-test",
                                                              "User-Agent": "ai-sdk/openai-compatible"},
                      json=body) as r:
        assert r.status == 200, await r.text()
        await r.read()


async def daily_mix(base: str, rounds: int = 3) -> None:
    """`rounds` of each: a Claude Code prompt, a Codex WebSocket turn, a Cline stream and a models list."""
    async with aiohttp.ClientSession() as s:
        for _ in range(rounds):
            await claude_code_prompt(s, base)
            await codex_websocket_turn(s, base)
            await chat_stream(s, base)
            await models_list(s, base)
