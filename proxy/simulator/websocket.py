"""GET /v1/responses with Upgrade: websocket (Codex's WebSocket transport).

Each text frame {"type": "response.create", ...POST body fields...} gets the
same events as the SSE stream, one JSON object per text frame. The x-sim-*
headers of the handshake apply to every response on the connection.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import orjson
from aiohttp import WSMsgType, web

from proxy.simulator.config import SimConfig
from proxy.simulator.emit import Emitter, Stopped
from proxy.simulator.exchange import Exchange, SimError, effective_config, new_request_id
from proxy.simulator.openai_responses import Numbered, plan, produce
from proxy.simulator.respond import abort, id_headers
from proxy.simulator.state import STATE, SimState


def _error_frame(message: str) -> str:
    event = {"type": "error", "sequence_number": 0, "code": "invalid_request_error", "message": message, "param": None}
    return orjson.dumps(event).decode()


def _request_body(data: str) -> dict[str, Any] | str:
    """The response.create fields, or why the frame is not one."""
    try:
        message = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        return f"malformed JSON frame: {exc}"
    if not isinstance(message, dict) or message.get("type") != "response.create":
        return 'expected a {"type": "response.create", ...} frame'
    nested = message.get("response")
    return {**message, **nested} if isinstance(nested, dict) else message


async def _respond(request: web.Request, ws: web.WebSocketResponse, config: SimConfig, body: dict[str, Any]) -> bool:
    """Stream one response; False when the connection was dropped."""
    state: SimState = request.app[STATE]
    if body.get("generate") is False:  # Codex's prewarm: the real API answers it without output
        config = dataclasses.replace(config, tokens=0, reasoning_tokens=0, tool_call=False, ttft_ms=0)
    ex = Exchange("openai", config, body, asyncio.get_running_loop().time(), websocket=True)
    plan(ex)
    if config.headers_delay_ms:  # a slower channel: the response's first frame waits (its tokens too)
        await asyncio.sleep(config.headers_delay_ms / 1000)
        ex.began = time.perf_counter()

    async def send(data: bytes) -> None:
        await ws.send_str(data.decode())

    emitter = Emitter(
        send,
        Numbered(orjson.dumps),
        ex.clock(state),
        lambda: abort(request),
        total_deltas=ex.output_tokens,
        stream_error=config.stream_error,
        disconnect_after=config.disconnect_after,
    )
    with state.generating():
        try:
            await produce(emitter, ex)
        except Stopped:
            return not emitter.aborted
        except ConnectionError:
            return False
    return True


async def handle(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    ws = web.WebSocketResponse()
    if not ws.can_prepare(request).ok:
        raise SimError("openai", 426, "GET /v1/responses expects a WebSocket upgrade")
    config = effective_config("openai", state, request.headers)
    if config.error_status is not None:
        raise SimError("openai", config.error_status)
    ws.headers.update(id_headers("openai", new_request_id()))
    if config.headers_delay_ms:
        await asyncio.sleep(config.headers_delay_ms / 1000)
    await ws.prepare(request)
    state.websockets.add(ws)
    try:
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                continue
            body = _request_body(msg.data)
            if isinstance(body, str):
                await ws.send_str(_error_frame(body))
            elif not await _respond(request, ws, config, body):
                break
    finally:
        state.websockets.discard(ws)
    return ws
