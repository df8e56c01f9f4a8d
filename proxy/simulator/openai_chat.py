"""POST /v1/chat/completions: OpenAI Chat Completions, streaming or not.

A side request that declares no tools and asks for a title (opencode's first request: a system prompt
"You are a title generator", then "Generate a title for this conversation:") is answered with text even
where the config asks for tool calls, as the real models do.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from aiohttp import web

from proxy.simulator.emit import Emitter, Event, sse_data
from proxy.simulator.errors import openai_error
from proxy.simulator.exchange import Exchange, ToolCall, open_exchange
from proxy.simulator.respond import respond_json, respond_stream
from proxy.simulator.tokens import expected_reasoning, expected_text, reasoning_piece, text_piece

STREAM_ERROR = openai_error(500, "The server had an error while processing your request (simulated)")


def usage(ex: Exchange) -> dict[str, Any]:
    return {
        "prompt_tokens": ex.prompt_tokens,
        "completion_tokens": ex.output_tokens,
        "total_tokens": ex.prompt_tokens + ex.output_tokens,
        "prompt_tokens_details": {"cached_tokens": ex.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": ex.reasoning},
    }


def finish_reason(ex: Exchange) -> str:
    if ex.truncated:
        return "length"
    return "tool_calls" if ex.tool_call else "stop"


def _tool_call_id(call: ToolCall) -> str:
    return "call_" + call.suffix


def _include_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


async def produce(em: Emitter, ex: Exchange) -> None:
    include_usage = _include_usage(ex.body)
    header: dict[str, Any] = {"id": "chatcmpl-" + ex.suffix, "object": "chat.completion.chunk"}
    header |= {"created": ex.created, "model": ex.model}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> Event:
        event = header | {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        if include_usage:
            event["usage"] = None
        return event

    em.error_events = lambda: [STREAM_ERROR]
    await em.event(chunk({"role": "assistant", "content": ""}))
    for i in range(ex.reasoning):
        await em.delta(chunk({"reasoning_content": reasoning_piece(i)}))
    if ex.tool_call:
        for n, tool in enumerate(ex.calls):
            # The id/name fragment goes out just before the first arguments fragment.
            call = {"index": n, "id": _tool_call_id(tool), "type": "function"}
            lead: Event | None = chunk({"tool_calls": [call | {"function": {"name": tool.name, "arguments": ""}}]})
            for piece in tool.pieces:
                await em.delta(chunk({"tool_calls": [{"index": n, "function": {"arguments": piece}}]}), lead)
                lead = None
            if lead is not None:  # no argument tokens at all
                await em.checkpoint()
                await em.event(lead)
    else:
        for i in range(ex.output):
            await em.delta(chunk({"content": text_piece(i)}))
    await em.checkpoint()
    await em.event(chunk({}, finish_reason(ex)))
    if include_usage:
        await em.event(header | {"choices": [], "usage": usage(ex)})
    await em.raw(b"data: [DONE]\n\n")


def completion(ex: Exchange) -> Event:
    message: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None}
    if ex.reasoning:
        message["reasoning_content"] = expected_reasoning(ex.reasoning)
    if ex.tool_call:
        message["tool_calls"] = [{"id": _tool_call_id(call), "type": "function",
                                  "function": {"name": call.name, "arguments": call.arguments}} for call in ex.calls]
    else:
        message["content"] = expected_text(ex.output)
    choice = {"index": 0, "message": message, "finish_reason": finish_reason(ex), "logprobs": None}
    return {
        "id": "chatcmpl-" + ex.suffix,
        "object": "chat.completion",
        "created": ex.created,
        "model": ex.model,
        "choices": [choice],
        "usage": usage(ex),
    }


def title_request(body: dict[str, Any]) -> bool:
    """No tools, and a message of the first three asks for a title."""
    if body.get("tools"):
        return False
    messages = body.get("messages")
    for message in messages[:3] if isinstance(messages, list) else ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str) and ("title generator" in content or "Generate a title" in content):
            return True
    return False


async def handle(request: web.Request) -> web.StreamResponse:
    ex = await open_exchange(request, "openai")
    body = ex.body
    if ex.config.tool_call and title_request(body):
        ex.config = replace(ex.config, tool_call=False)
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    ex.plan(model=body.get("model"), max_tokens=max_tokens, stream=body.get("stream"))
    if not ex.stream:
        return await respond_json(request, ex, completion)
    return await respond_stream(request, ex, produce, sse_data)
