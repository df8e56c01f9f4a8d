"""POST /v1beta/models/{model}:streamGenerateContent and :generateContent (Gemini).

A `functionCall` carries no `id` (the API's is optional: Gemini CLI then makes one up for its
functionResponse). Gemini does not stream function calls: with tool_call the whole functionCall
part arrives in one chunk when its last token is due, so for tool calls
there is one delta for `tokens` candidate tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import orjson
from aiohttp import web

from proxy.simulator.emit import Emitter, Event, JsonArrayFramer, sse_data
from proxy.simulator.errors import gemini_error
from proxy.simulator.exchange import Exchange, SimError, ToolCall, open_exchange
from proxy.simulator.respond import respond_json, respond_stream
from proxy.simulator.tokens import expected_reasoning, expected_text, reasoning_piece, text_piece

STREAM_ERROR = gemini_error(503, "The model is overloaded. Please try again later. (simulated)")


def usage_metadata(ex: Exchange) -> dict[str, int]:
    """promptTokenCount includes the cached tokens; candidates exclude thoughts."""
    return {
        "promptTokenCount": ex.prompt_tokens,
        "candidatesTokenCount": ex.output,
        "thoughtsTokenCount": ex.reasoning,
        "cachedContentTokenCount": ex.cached_tokens,
        "totalTokenCount": ex.prompt_tokens + ex.output_tokens,
    }


def _finish(ex: Exchange) -> str:
    return "MAX_TOKENS" if ex.truncated else "STOP"


def _function_call(call: ToolCall) -> Event:
    return {"functionCall": {"name": call.name, "args": orjson.loads(call.arguments or "{}")}}


def _chunk(ex: Exchange, parts: list[Event], last: bool = False) -> Event:
    candidate: Event = {"content": {"parts": parts, "role": "model"}, "index": 0}
    chunk: Event = {"candidates": [candidate], "modelVersion": ex.model, "responseId": ex.suffix}
    if last:
        candidate["finishReason"] = _finish(ex)
        chunk["usageMetadata"] = usage_metadata(ex)
    return chunk


def generated(ex: Exchange) -> Event:
    parts: list[Event] = []
    if ex.reasoning:
        parts.append({"text": expected_reasoning(ex.reasoning), "thought": True})
    parts += [_function_call(c) for c in ex.calls] if ex.tool_call else [{"text": expected_text(ex.output)}]
    return _chunk(ex, parts, last=True)


def _deltas(ex: Exchange) -> list[tuple[Event, int]]:
    """(part, tokens it carries) for each streamed chunk."""
    deltas = [({"text": reasoning_piece(i), "thought": True}, 1) for i in range(ex.reasoning)]
    if ex.tool_call:
        deltas += [(_function_call(c), ex.output) for c in ex.calls]
    else:
        deltas += [({"text": text_piece(i)}, 1) for i in range(ex.output)]
    return deltas


async def produce(em: Emitter, ex: Exchange, tail: Callable[[], bytes] | None = None) -> None:
    """The last delta carries finishReason and usageMetadata."""
    em.error_events = lambda: [STREAM_ERROR]
    deltas = _deltas(ex)
    for i, (part, tokens) in enumerate(deltas):
        await em.delta(_chunk(ex, [part], last=i == len(deltas) - 1), tokens=tokens)
    await em.checkpoint()
    if not deltas:
        await em.event(_chunk(ex, [{"text": ""}], last=True))
    if tail is not None:
        await em.raw(tail())


async def handle(request: web.Request) -> web.StreamResponse:
    model, _, action = request.match_info["target"].rpartition(":")
    if action not in ("streamGenerateContent", "generateContent") or not model:
        raise SimError("gemini", 404, f"unknown model action: {request.match_info['target']}")
    ex = await open_exchange(request, "gemini")
    config = ex.body.get("generationConfig")
    max_tokens = config.get("maxOutputTokens") if isinstance(config, dict) else None
    ex.plan(model=model, max_tokens=max_tokens, stream=action == "streamGenerateContent")
    if not ex.stream:
        return await respond_json(request, ex, generated)
    deltas = ex.reasoning + (len(ex.calls) if ex.tool_call else ex.output)
    if request.query.get("alt") == "sse":
        return await respond_stream(request, ex, produce, sse_data, total_deltas=deltas)
    framer = JsonArrayFramer()
    produce_array = partial(produce, tail=framer.close)
    return await respond_stream(
        request, ex, produce_array, framer, content_type="application/json; charset=utf-8", total_deltas=deltas
    )
