"""Sending a simulated answer over HTTP: a JSON body, an error, or a stream."""

from __future__ import annotations

import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from proxy.simulator import quota, stated
from proxy.simulator.emit import Emitter, Event, HttpSink, Stopped
from proxy.simulator.errors import STREAM_ERROR_STATUS, Api, error_body
from proxy.simulator.exchange import Exchange, SimError, new_request_id
from proxy.simulator.state import STATE

Produce = Callable[[Emitter, Exchange], Awaitable[None]]
SSE_TYPE = "text/event-stream; charset=utf-8"


def id_headers(api: Api, request_id: str) -> dict[str, str]:
    headers = {"x-request-id": request_id}
    if api == "anthropic":
        headers["request-id"] = request_id
    return headers


def json_response(
    api: Api, status: int, obj: Any, *, request_id: str = "", gzip: bool = False,
    extra: dict[str, str] | None = None,
) -> web.Response:
    data = orjson.dumps(obj)
    headers = {"content-type": "application/json", **id_headers(api, request_id or new_request_id()), **(extra or {})}
    if gzip:
        compressor = zlib.compressobj(wbits=31)
        data = compressor.compress(data) + compressor.flush()
        headers["content-encoding"] = "gzip"
    if status == 429:
        headers.setdefault("retry-after", "1")
    return web.Response(status=status, body=data, headers=headers)


def error_response(error: SimError) -> web.Response:
    body = error_body(error.api, error.status, error.message)
    return json_response(error.api, error.status, body, gzip=error.gzip, extra=error.headers)


def abort(request: web.BaseRequest) -> None:
    """Drop the connection with no terminator, so the client sees a truncated body."""
    if request.transport is not None:
        request.transport.abort()


async def respond_json(request: web.Request, ex: Exchange, build: Callable[[Exchange], Event]) -> web.StreamResponse:
    """A non-streaming answer, sent when its last token would have been generated."""
    state = request.app[STATE]
    with state.generating():
        await ex.clock(state).all_tokens(ex.output_tokens)
    if ex.config.disconnect_after is not None:
        abort(request)
        return web.Response()
    if ex.config.stream_error:
        raise SimError(ex.api, STREAM_ERROR_STATUS[ex.api], gzip=ex.gzip)
    extra = limit_headers(ex) | stated.headers(ex)
    return json_response(ex.api, 200, build(ex), request_id=ex.request_id, gzip=ex.gzip, extra=extra)


def limit_headers(ex: Exchange) -> dict[str, str]:
    """Charge the request to its account and state what is left (quota.py)."""
    if ex.account is None:
        return {}
    quota.consume(ex.account, ex.prompt_tokens, ex.output_tokens)
    return quota.headers(ex.api, ex.account)


async def respond_stream(
    request: web.Request,
    ex: Exchange,
    produce: Produce,
    frame: Callable[[Event], bytes],
    *,
    content_type: str = SSE_TYPE,
    total_deltas: int | None = None,
) -> web.StreamResponse:
    state = request.app[STATE]
    resp = web.StreamResponse(headers={"content-type": content_type, "cache-control": "no-cache"})
    resp.headers.update(id_headers(ex.api, ex.request_id))
    resp.headers.update(limit_headers(ex))
    resp.headers.update(stated.headers(ex))
    if ex.gzip:
        resp.headers["content-encoding"] = "gzip"
    await resp.prepare(request)
    sink = HttpSink(resp, ex.gzip)
    emitter = Emitter(
        sink.send,
        frame,
        ex.clock(state),
        lambda: abort(request),
        total_deltas=ex.output_tokens if total_deltas is None else total_deltas,
        stream_error=ex.config.stream_error,
        disconnect_after=ex.config.disconnect_after,
    )
    with state.generating():
        try:
            await produce(emitter, ex)
        except Stopped:
            if emitter.aborted:
                return resp
        except ConnectionError:  # the client went away
            return resp
    try:
        await sink.close()
    except ConnectionError:
        pass
    return resp
