"""POST /v1/messages and /v1/messages/count_tokens: the Anthropic Messages API."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from proxy.simulator.emit import Emitter, Event, sse_named
from proxy.simulator.exchange import Exchange, ToolCall, open_exchange
from proxy.simulator.respond import json_response, respond_json, respond_stream
from proxy.simulator.tokens import expected_reasoning, expected_text, reasoning_piece, text_piece

SIGNATURE = "c2ltdWxhdGVkLXNpZ25hdHVyZQ=="


def usage(ex: Exchange, output_tokens: int) -> dict[str, Any]:
    """input_tokens excludes cache reads: total input = the three input fields summed."""
    return {
        "input_tokens": ex.input_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": ex.cached_tokens,
        "output_tokens": output_tokens,
    }


def stop_reason(ex: Exchange) -> str:
    if ex.truncated:
        return "max_tokens"
    return "tool_use" if ex.tool_call else "end_turn"


def _tool_block(call: ToolCall, input_: Any) -> Event:
    return {"type": "tool_use", "id": "toolu_" + call.suffix, "name": call.name, "input": input_}


def _message(ex: Exchange, content: list[Event], stop: str | None, output_tokens: int) -> Event:
    return {
        "id": "msg_" + ex.suffix,
        "type": "message",
        "role": "assistant",
        "model": ex.model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": usage(ex, output_tokens),
    }


def message(ex: Exchange) -> Event:
    content: list[Event] = []
    if ex.reasoning:
        content.append({"type": "thinking", "thinking": expected_reasoning(ex.reasoning), "signature": SIGNATURE})
    if ex.tool_call:
        content += [_tool_block(call, orjson.loads(call.arguments) if call.arguments else {}) for call in ex.calls]
    else:
        content.append({"type": "text", "text": expected_text(ex.output)})
    return _message(ex, content, stop_reason(ex), ex.output_tokens)


def _delta(index: int, delta: Event) -> Event:
    return {"type": "content_block_delta", "index": index, "delta": delta}


async def _block(em: Emitter, index: int, block: Event, deltas: list[Event]) -> None:
    await em.event({"type": "content_block_start", "index": index, "content_block": block})
    for delta in deltas:
        await em.delta(_delta(index, delta))


async def produce(em: Emitter, ex: Exchange) -> None:
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    em.error_events = lambda: [error | {"request_id": ex.request_id}]
    await em.event({"type": "message_start", "message": _message(ex, [], None, 1)})
    await em.event({"type": "ping"})
    index = 0
    if ex.reasoning:
        thinking = [{"type": "thinking_delta", "thinking": reasoning_piece(i)} for i in range(ex.reasoning)]
        await _block(em, index, {"type": "thinking", "thinking": "", "signature": ""}, thinking)
        await em.event(_delta(index, {"type": "signature_delta", "signature": SIGNATURE}))
        await em.event({"type": "content_block_stop", "index": index})
        index += 1
    if ex.tool_call:
        for n, call in enumerate(ex.calls):
            if n:
                await em.event({"type": "content_block_stop", "index": index})
                index += 1
            args = [{"type": "input_json_delta", "partial_json": piece} for piece in call.pieces]
            await _block(em, index, _tool_block(call, {}), args)
    else:
        text = [{"type": "text_delta", "text": text_piece(i)} for i in range(ex.output)]
        await _block(em, index, {"type": "text", "text": ""}, text)
    await em.event({"type": "content_block_stop", "index": index})
    await em.checkpoint()
    delta = {"stop_reason": stop_reason(ex), "stop_sequence": None}
    await em.event({"type": "message_delta", "delta": delta, "usage": usage(ex, ex.output_tokens)})
    await em.event({"type": "message_stop"})


async def handle(request: web.Request) -> web.StreamResponse:
    ex = await open_exchange(request, "anthropic")
    body = ex.body
    ex.plan(model=body.get("model"), max_tokens=body.get("max_tokens"), stream=body.get("stream"))
    if not ex.stream:
        return await respond_json(request, ex, message)
    return await respond_stream(request, ex, produce, sse_named)


async def count_tokens(request: web.Request) -> web.Response:
    ex = await open_exchange(request, "anthropic", limited=False)
    return json_response("anthropic", 200, {"input_tokens": ex.input_tokens}, request_id=ex.request_id, gzip=ex.gzip)
