"""POST /v1/responses: the OpenAI Responses API (SSE, JSON; the WebSocket reuses `produce`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from proxy.simulator import stated
from proxy.simulator.emit import Emitter, Event, sse_named
from proxy.simulator.exchange import Exchange, ToolCall, open_exchange
from proxy.simulator.respond import respond_json, respond_stream
from proxy.simulator.tokens import expected_reasoning, expected_text, reasoning_piece, text_piece

FAILURE = {"code": "server_error", "message": "The server had an error while processing your request (simulated)"}


def usage(ex: Exchange) -> dict[str, Any]:
    return {
        "input_tokens": ex.prompt_tokens,
        "input_tokens_details": {"cached_tokens": ex.cached_tokens},
        "output_tokens": ex.output_tokens,
        "output_tokens_details": {"reasoning_tokens": ex.reasoning},
        "total_tokens": ex.prompt_tokens + ex.output_tokens,
    }


def _status(ex: Exchange) -> str:
    return "incomplete" if ex.truncated else "completed"


def reasoning_item(ex: Exchange) -> Event:
    summary = [{"type": "summary_text", "text": expected_reasoning(ex.reasoning)}]
    return {"id": "rs_" + ex.suffix, "type": "reasoning", "summary": summary}


def output_part(ex: Exchange) -> Event:
    return {"type": "output_text", "text": expected_text(ex.output), "annotations": [], "logprobs": []}


def message_item(ex: Exchange, done: bool = True) -> Event:
    content = [output_part(ex)] if done else []
    status = _status(ex) if done else "in_progress"
    return {"id": "msg_" + ex.suffix, "type": "message", "status": status, "role": "assistant", "content": content}


def function_item(ex: Exchange, call: ToolCall, done: bool = True) -> Event:
    return {
        "id": "fc_" + call.suffix,
        "type": "function_call",
        "status": _status(ex) if done else "in_progress",
        "arguments": call.arguments if done else "",
        "call_id": "call_" + call.suffix,
        "name": call.name,
    }


def output_items(ex: Exchange) -> list[Event]:
    items = [reasoning_item(ex)] if ex.reasoning else []
    if ex.tool_call:
        items += [function_item(ex, call) for call in ex.calls]
    else:
        items.append(message_item(ex))
    return items


def response(ex: Exchange, status: str, output: list[Event], with_usage: bool = False) -> Event:
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": "resp_" + ex.suffix,
        "object": "response",
        "created_at": ex.created,
        "status": status,
        "model": ex.model,
        "output": output,
        "usage": usage(ex) if with_usage else None,
        "error": None,
        "incomplete_details": incomplete,
        "instructions": ex.body.get("instructions"),
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "metadata": {},
    }


def final_response(ex: Exchange) -> Event:
    return response(ex, _status(ex), output_items(ex), with_usage=True)


def ev(type_: str, **fields: Any) -> Event:
    return {"type": type_, **fields}


class Numbered:
    """Frames events with `frame`, numbering them as they are written.

    Numbering at write time keeps sequence_number gapless when an injected
    error replaces a delta that was already built.
    """

    def __init__(self, frame: Callable[[Event], bytes]) -> None:
        self._frame = frame
        self._next = 0

    def __call__(self, event: Event) -> bytes:
        numbered = {"type": event["type"], "sequence_number": self._next, **event}
        self._next += 1
        return self._frame(numbered)


async def produce(em: Emitter, ex: Exchange) -> None:
    failed = response(ex, "failed", []) | {"error": FAILURE}
    em.error_events = lambda: [ev("response.failed", response=failed)]
    await em.event(ev("response.created", response=response(ex, "in_progress", [])))
    await em.event(ev("response.in_progress", response=response(ex, "in_progress", [])))
    index = 0
    if ex.reasoning:
        await _reasoning(em, ex, index)
        index += 1
    if ex.tool_call:
        for n, call in enumerate(ex.calls):
            await _function_call(em, ex, call, index + n)
    else:
        await _message(em, ex, index)
    await em.checkpoint()
    if ex.websocket and ex.config.state_processing:
        await em.raw(stated.timing_frame(ex, em.first_at))
    await em.event(ev(f"response.{_status(ex)}", response=final_response(ex)))


async def _reasoning(em: Emitter, ex: Exchange, index: int) -> None:
    item_id = "rs_" + ex.suffix
    where = {"item_id": item_id, "output_index": index, "summary_index": 0}
    text = expected_reasoning(ex.reasoning)
    await em.event(ev("response.output_item.added", output_index=index, item=reasoning_item(ex) | {"summary": []}))
    await em.event(ev("response.reasoning_summary_part.added", **where, part={"type": "summary_text", "text": ""}))
    for i in range(ex.reasoning):
        await em.delta(ev("response.reasoning_summary_text.delta", **where, delta=reasoning_piece(i)))
    await em.event(ev("response.reasoning_summary_text.done", **where, text=text))
    await em.event(ev("response.reasoning_summary_part.done", **where, part={"type": "summary_text", "text": text}))
    await em.event(ev("response.output_item.done", output_index=index, item=reasoning_item(ex)))


async def _message(em: Emitter, ex: Exchange, index: int) -> None:
    where = {"item_id": "msg_" + ex.suffix, "output_index": index, "content_index": 0}
    part = output_part(ex)
    await em.event(ev("response.output_item.added", output_index=index, item=message_item(ex, done=False)))
    await em.event(ev("response.content_part.added", **where, part=part | {"text": ""}))
    for i in range(ex.output):
        await em.delta(ev("response.output_text.delta", **where, delta=text_piece(i), logprobs=[]))
    await em.event(ev("response.output_text.done", **where, text=part["text"], logprobs=[]))
    await em.event(ev("response.content_part.done", **where, part=part))
    await em.event(ev("response.output_item.done", output_index=index, item=message_item(ex)))


async def _function_call(em: Emitter, ex: Exchange, call: ToolCall, index: int) -> None:
    where = {"item_id": "fc_" + call.suffix, "output_index": index}
    await em.event(ev("response.output_item.added", output_index=index, item=function_item(ex, call, done=False)))
    for piece in call.pieces:
        await em.delta(ev("response.function_call_arguments.delta", **where, delta=piece))
    await em.event(ev("response.function_call_arguments.done", **where, name=call.name, arguments=call.arguments))
    await em.event(ev("response.output_item.done", output_index=index, item=function_item(ex, call)))


def plan(ex: Exchange) -> None:
    body = ex.body
    ex.plan(model=body.get("model"), max_tokens=body.get("max_output_tokens"), stream=body.get("stream"))


async def handle(request: web.Request) -> web.StreamResponse:
    ex = await open_exchange(request, "openai")
    plan(ex)
    if not ex.stream:
        return await respond_json(request, ex, final_response)
    return await respond_stream(request, ex, produce, Numbered(sse_named))
