"""The reverse relay (HTTP): one client request in, the upstream's answer out, chunk by chunk.
The upstream side, shared with the WebSocket relay, is proxy/relay/upstream.py.

Each upstream read is written to the client before anything else happens to
it; only then does the meter look at its copy. Nothing here waits on the
database.
"""

from __future__ import annotations

import asyncio
from time import perf_counter_ns

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from proxy.relay.body_budget import RETRY_AFTER_S, Lease, OverBudget
from proxy.relay.body_pipe import BodyPipe, give_meter
from proxy.relay.errors import error_response
from proxy.relay.key_mask import KeyMask, mask_of
from proxy.relay.upstream import Finish, cause, open_request, start_meter
from proxy.common.headers import response_headers
from proxy.meter.meter import Meter
from proxy.meter.redact import redact, request_secrets
from proxy.relay.app_state import STATE, AppState
from proxy.settings.routes import Route
from proxy.common.schema import Outcome


class BodyTooLarge(Exception):
    pass


async def read_body(request: web.Request, limit: int, lease: Lease | None = None) -> bytes:
    """The whole body, up to `limit` bytes (else BodyTooLarge), each byte taken from `lease` first
    (else OverBudget): its Content-Length at once, a chunked body's bytes as they come."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise BodyTooLarge
    if lease is not None and declared:
        lease.take(declared)
    parts: list[bytes] = []
    size = 0
    async for data in request.content.iter_any():
        size += len(data)
        if size > limit:
            raise BodyTooLarge
        if lease is not None and size > lease.size:
            lease.take(size - lease.size)
        parts.append(data)
    return b"".join(parts)


async def relay(request: web.Request, route: Route, path: str, query: str, received: int) -> web.StreamResponse:
    state = request.app[STATE]
    meter = start_meter(state, request, route, path, received)
    outcome: Outcome | None = None
    error: tuple[str, str] | None = None
    lease = state.body_budget.lease()
    try:
        return await _relay(state, request, route, path, query, meter, lease)
    except Finish as fin:
        outcome, error = fin.outcome, fin.error
        return fin.response
    except asyncio.CancelledError:
        outcome, error = Outcome.CLIENT_DISCONNECTED, ("client_disconnected", "the client closed the connection")
        raise
    except Exception as exc:  # a bug of ours: the client gets a clear 502, the row says why
        secrets = request_secrets(request.headers, request.query, (route.credential,))
        outcome, error = Outcome.PROXY_ERROR, ("proxy_error", redact(f"{type(exc).__name__}: {exc}", secrets) or "")
        state.report(f"llmtap: internal error relaying {request.method} {path}: {error[1]}")
        return error_response(path, 502, f"llmtap internal error: {error[1]}", "llmtap_internal_error")
    finally:
        lease.release()
        if meter is not None:
            state.recorder.end(meter, outcome, error)


async def _relay(
    state: AppState, request: web.Request, route: Route, path: str, query: str, meter: Meter | None,
    lease: Lease | None = None,
) -> web.StreamResponse:
    try:
        body = await read_body(request, state.config.max_body_bytes, lease)
    except OverBudget:
        raise _over_budget(state, path, meter) from None
    except BodyTooLarge:
        mb = state.config.max_body_mb
        resp = error_response(path, 413, f"request body is larger than llmtap's limit of {mb:g} MiB "
                              "(raise it with `llmtap serve --max-body-mb`)", "request_too_large")
        raise Finish.answered_locally(Outcome.HTTP_ERROR, ("request_too_large", f"request body over {mb:g} MiB"),
                                      resp, meter, 413) from None
    if meter is not None:
        meter.on_request_read(body)
    url = route.target(path, query)
    upstream = await open_request(state, request, url, body, meter, path, route)
    try:
        return await _stream_back(request, upstream, meter, mask_of(route.credential))
    finally:
        upstream.release() if upstream.content.is_eof() else upstream.close()


def _over_budget(state: AppState, path: str, meter: Meter | None) -> Finish:
    """The `Finish` for a request whose body would take the bodies in memory past their limit."""
    mb = state.config.body_memory_mb
    message = (f"llmtap is holding {mb:g} MiB of request bodies, its limit (serve --body-memory-mb); "
               f"try again in {RETRY_AFTER_S} s")
    resp = error_response(path, 503, message, "body_memory_full")
    resp.headers["Retry-After"] = str(RETRY_AFTER_S)
    return Finish.answered_locally(Outcome.HTTP_ERROR, ("body_memory_full",
                                   f"request bodies in memory at the {mb:g} MiB limit"), resp, meter, 503)


async def _stream_back(request: web.Request, upstream: aiohttp.ClientResponse, meter: Meter | None,
                       mask: KeyMask | None) -> web.StreamResponse:
    t = perf_counter_ns()
    if meter is not None:
        try:
            meter.response_started(upstream.status, upstream.headers, t)
        except Exception as exc:
            meter.mark_broken(f"meter: {type(exc).__name__}: {exc}")
    headers = response_headers(upstream.headers)
    if mask is not None:  # the injected key echoed: masked (proxy/relay/key_mask.py)
        headers = CIMultiDict(mask.headers(headers.items()))
    if "Origin" in request.headers:  # a page of an allowed origin (guard.py refused the others) reads it
        for name, value in request.app[STATE].guard.cors_headers(request).items():
            headers.setdefault(name, value)
    fast = request.app[STATE].fast
    out = (_Answer if fast.on("headers_later") else web.StreamResponse)(
        status=upstream.status, reason=upstream.reason, headers=headers)
    await out.prepare(request)
    content = upstream.content
    try:
        if content.is_eof():  # the whole body came with the headers (most non-streaming answers)
            return await _answer_at_once(content, out, meter, mask)
        request.writer.send_headers()
        if fast.on("body_pipe") and type(content) is aiohttp.StreamReader:
            await BodyPipe(request, content, meter, mask).relay()
        else:
            await _read_and_write(content, out, meter, mask)
        if meter is not None:
            meter.on_response_end(perf_counter_ns())
        await out.write_eof()  # the last chunk at once, then a wait while the client drains
    except (asyncio.TimeoutError, aiohttp.ServerTimeoutError):
        _abort(request)
        raise Finish.after_headers(Outcome.UPSTREAM_TIMEOUT, "the upstream went silent past the idle timeout", out) from None
    except ConnectionResetError:  # ClientGone included: the client left, not the upstream
        raise Finish.after_headers(Outcome.CLIENT_DISCONNECTED, "the client closed the connection mid-response", out) from None
    except aiohttp.ClientError as exc:
        _abort(request)
        raise Finish.after_headers(Outcome.STREAM_TRUNCATED, f"the upstream broke off the body: {cause(exc, 'closed')}", out) from None
    return out


class _Answer(web.StreamResponse):
    """The relayed response. Its headers wait for the first write (as `web.Response`'s do), so a body
    that came whole with the upstream's headers leaves in one write with them; a streamed body sends
    them at once (`send_headers`). The `headers_later` fast path (proxy/relay/fast_paths.py); without it a
    plain `web.StreamResponse`, whose headers leave in their own write at `prepare`."""

    _send_headers_immediately = False


async def _answer_at_once(content: aiohttp.StreamReader, out: web.StreamResponse, meter: Meter | None,
                          mask: KeyMask | None) -> web.StreamResponse:
    data = content.read_nowait() if mask is None else mask.whole(content.read_nowait())
    t = perf_counter_ns()
    if meter is not None:
        meter.on_response_end(t)
    await out.write_eof(data)  # the headers, the body and (chunked) its last chunk, in one write
    if meter is not None and data:
        give_meter(meter, data, t)
    return out


async def _read_and_write(content: aiohttp.StreamReader, out: web.StreamResponse, meter: Meter | None,
                          mask: KeyMask | None) -> None:
    """The public path of a body (proxy/relay/fast_paths.py), read by read and written to the client:
    aiohttp's own backpressure (`write` drains a full transport; the reader pauses the upstream past
    its high water), its idle timeout (`sock_read`, re-armed per read), and a client gone raises
    from `write` (or cancels the handler). Each piece is stamped once this task has it."""
    while data := await content.readany():
        t = perf_counter_ns()
        if mask is not None and not (data := mask.piece(data)):
            continue
        await out.write(data)
        if meter is not None:
            give_meter(meter, data, t)
    if mask is not None and (tail := mask.flush()):
        await out.write(tail)
        if meter is not None:
            give_meter(meter, tail, perf_counter_ns())


def _abort(request: web.Request) -> None:
    """End the client's response the way the upstream ended ours: cut, not completed."""
    if request.transport is not None:
        request.transport.abort()
