"""The HTTP relay: one client request in, the upstream's answer out, chunk by chunk.

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

from proxy.relay import conn_timing
from proxy.relay.body_budget import RETRY_AFTER_S, Lease, OverBudget
from proxy.relay.body_pipe import BodyPipe, give_meter
from proxy.relay.errors import api_shape, error_response
from proxy.common.headers import TAG_HEADER, inject_credential, request_headers, response_headers
from proxy.meter.meter import Meter
from proxy.meter.redact import redact, request_secrets
from proxy.relay.app_state import STATE, ProxyState
from proxy.settings.routes import Route
from proxy.common.schema import Outcome

# aiohttp's client adds these when absent; a transparent relay must not.
SKIP_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")


class BodyTooLarge(Exception):
    pass


class Finish(Exception):
    """Ends a relay early with an outcome for the row (the client already has its answer)."""

    def __init__(self, outcome: Outcome, error: tuple[str, str], response: web.StreamResponse) -> None:
        super().__init__(outcome)
        self.outcome, self.error, self.response = outcome, error, response


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


def split_raw_path(raw: str) -> tuple[str, str]:
    path, _, query = raw.partition("?")
    return path, query


TAG_KEY = web.RequestKey("llmtap_tag", str)  # set by dispatch from a /_tag/<tag>/ path prefix


def request_tag(request: web.Request, state: ProxyState) -> str | None:
    """A /_tag/<tag>/ base URL, else the X-Llmtap-Tag header, else `serve --tag`."""
    return request.get(TAG_KEY) or request.headers.get(TAG_HEADER) or state.config.tag


def start_meter(state: ProxyState, request: web.Request, route: Route | None, path: str, received: int,
                relayed: bool = True) -> Meter | None:
    """`state.recorder.start` for this request (`route` None: no route matched). The injected key
    is the request's credential only when it is relayed (a refusal's is what the client sent)."""
    return state.recorder.start(
        received_ns=received, method=request.method, path=path,
        query=request.query if request.query_string else {}, headers=request.headers,
        route=route.label if route is not None else "", upstream_host=(route.upstream.host or "") if route else "",
        tag=request_tag(request, state), credential=route.credential if route is not None and relayed else None,
        relayed=relayed,
    )


def outgoing_headers(request: web.Request, route: Route, path: str) -> CIMultiDict[str]:
    """The headers sent upstream: end-to-end ones, the credential injected where the route does."""
    headers = request_headers(request.headers)
    if route.credential:
        inject_credential(headers, api_shape(path), route.credential)
    return headers


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
    state: ProxyState, request: web.Request, route: Route, path: str, query: str, meter: Meter | None,
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
        raise _finish(Outcome.HTTP_ERROR, ("request_too_large", f"request body over {mb:g} MiB"), resp, meter, 413) from None
    if meter is not None:
        meter.on_request_read(body)
    url = route.target(path, query)
    upstream = await _open_upstream(state, request, url, body, meter, path, route)
    try:
        return await _stream_back(request, upstream, meter)
    finally:
        upstream.release() if upstream.content.is_eof() else upstream.close()


def _over_budget(state: ProxyState, path: str, meter: Meter | None) -> Finish:
    mb = state.config.body_memory_mb
    message = (f"llmtap is holding {mb:g} MiB of request bodies, its limit (serve --body-memory-mb); "
               f"try again in {RETRY_AFTER_S} s")
    resp = error_response(path, 503, message, "body_memory_full")
    resp.headers["Retry-After"] = str(RETRY_AFTER_S)
    return _finish(Outcome.HTTP_ERROR, ("body_memory_full", f"request bodies in memory at the {mb:g} MiB limit"),
                   resp, meter, 503)


async def _open_upstream(state: ProxyState, request: web.Request, url, body: bytes, meter: Meter | None,
                         path: str, route: Route) -> aiohttp.ClientResponse:
    headers = outgoing_headers(request, route, path)
    marks = None if meter is None else meter.on_upstream_sent(perf_counter_ns(), tls=url.scheme == "https")
    timing = conn_timing.CURRENT.set(marks)  # the connector stamps them (proxy/relay/conn_timing.py)
    try:
        response = await state.session.request(
            request.method, url, headers=headers, data=body or None,
            allow_redirects=False, auto_decompress=False, skip_auto_headers=SKIP_AUTO_HEADERS,
            proxy=route.proxy, proxy_auth=route.proxy_auth,
        )
    except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
        raise _unreachable(exc, route, path, meter) from None
    finally:
        conn_timing.settle()  # the response's first byte was read stamped, or never will be
        conn_timing.CURRENT.reset(timing)
    if response.status == 407 and route.proxy is not None:  # the forward proxy's answer, not the upstream's
        response.close()
        status, code, message = proxy_refused(route, 407)
        raise _finish(Outcome.UPSTREAM_UNREACHABLE, (code, message), error_response(path, status, f"llmtap: {message}", code),
                      meter, status)
    return response


def _unreachable(exc: BaseException, route: Route, path: str, meter: Meter | None) -> Finish:
    """No upstream response: the forward proxy failed, the upstream did not answer in time, or not at all."""
    host = route.upstream.host
    if (failed := proxy_failure(exc, route)) is not None:
        status, code, message = failed
        outcome = Outcome.UPSTREAM_TIMEOUT if status == 504 else Outcome.UPSTREAM_UNREACHABLE
        return _finish(outcome, (code, message), error_response(path, status, f"llmtap: {message}", code),
                       meter, status)
    if isinstance(exc, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
        message = f"upstream {host} did not answer in time ({_cause(exc, 'timed out')})"
        return _finish(Outcome.UPSTREAM_TIMEOUT, ("upstream_timeout", message),
                       error_response(path, 504, f"llmtap: {message}", "upstream_timeout"), meter, 504)
    message = f"cannot reach upstream {host}: {_cause(exc, 'connection failed')}"
    return _finish(Outcome.UPSTREAM_UNREACHABLE, ("upstream_unreachable", message),
                   error_response(path, 502, f"llmtap: {message}", "upstream_unreachable"), meter, 502)


def proxy_failure(exc: BaseException, route: Route) -> tuple[int, str, str] | None:
    """(status for the client, error code, message) when the forward proxy itself failed, else None.
    The proxy is named by host and port only: its URL may hold credentials."""
    if route.proxy is None:
        return None
    if isinstance(exc, aiohttp.ClientHttpProxyError):
        return proxy_refused(route, exc.status)
    where = f"the forward proxy {_proxy_label(route)} (used for upstream {route.upstream.host})"
    if isinstance(exc, aiohttp.ClientProxyConnectionError):
        return 502, "upstream_proxy_unreachable", f"cannot reach {where}: {_cause(exc, 'connection failed')}"
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return 504, "upstream_proxy_timeout", f"cannot connect to {where} in time"
    return None


def proxy_refused(route: Route, status: int) -> tuple[int, str, str]:
    """The forward proxy answered `status` instead of connecting llmtap to the upstream."""
    proxy = f"the forward proxy {_proxy_label(route)}"
    if status == 407:
        return 502, "upstream_proxy_auth", (f"{proxy} refused llmtap's credentials (HTTP 407 Proxy Authentication "
                                           "Required): check the user and password in the proxy URL "
                                           "(`llmtap doctor` shows which setting it comes from)")
    return 502, "upstream_proxy_refused", (f"{proxy} refused to connect llmtap to upstream "
                                           f"{route.upstream.host}:{route.upstream.port} (HTTP {status})")


def _proxy_label(route: Route) -> str:
    host, port = (route.proxy.host or "", route.proxy.port) if route.proxy is not None else ("", None)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _cause(exc: BaseException, default: str) -> str:
    """A plain-words cause, without anything the client sent (no URLs with keys)."""
    inner = getattr(exc, "os_error", None) or exc.__cause__ or exc
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return "TLS certificate verification failed (use --ca-bundle for a corporate CA)"
    if isinstance(exc, aiohttp.ClientSSLError):
        return "TLS handshake failed"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the upstream closed the connection before answering"
    text = getattr(inner, "strerror", None) or str(inner) or default
    return f"{type(inner).__name__}: {text}" if text != default else default


def _finish(outcome: Outcome, error: tuple[str, str], response: web.StreamResponse,
            meter: Meter | None, status: int) -> Finish:
    """Before upstream headers: the client gets llmtap's own `response` with `status`."""
    if meter is not None:
        meter.on_refused(status)
    return Finish(outcome, error, response)


async def _stream_back(request: web.Request, upstream: aiohttp.ClientResponse, meter: Meter | None) -> web.StreamResponse:
    t = perf_counter_ns()
    if meter is not None:
        try:
            meter.response_started(upstream.status, upstream.headers, t)
        except Exception as exc:
            meter.mark_broken(f"meter: {type(exc).__name__}: {exc}")
    headers = response_headers(upstream.headers)
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
            return await _answer_at_once(content, out, meter)
        request.writer.send_headers()
        if fast.on("body_pipe") and type(content) is aiohttp.StreamReader:
            await BodyPipe(request, content, meter).relay()
        else:
            await _read_and_write(content, out, meter)
        if meter is not None:
            meter.on_response_end(perf_counter_ns())
        await out.write_eof()  # the last chunk at once, then a wait while the client drains
    except (asyncio.TimeoutError, aiohttp.ServerTimeoutError):
        _abort(request)
        raise _finish_after_headers(Outcome.UPSTREAM_TIMEOUT, "the upstream went silent past the idle timeout", out) from None
    except ConnectionResetError:  # ClientGone included: the client left, not the upstream
        raise _finish_after_headers(Outcome.CLIENT_DISCONNECTED, "the client closed the connection mid-response", out) from None
    except aiohttp.ClientError as exc:
        _abort(request)
        raise _finish_after_headers(Outcome.STREAM_TRUNCATED, f"the upstream broke off the body: {_cause(exc, 'closed')}", out) from None
    return out


class _Answer(web.StreamResponse):
    """The relayed response. Its headers wait for the first write (as `web.Response`'s do), so a body
    that came whole with the upstream's headers leaves in one write with them; a streamed body sends
    them at once (`send_headers`). The `headers_later` fast path (proxy/relay/fast_paths.py); without it a
    plain `web.StreamResponse`, whose headers leave in their own write at `prepare`."""

    _send_headers_immediately = False


async def _answer_at_once(content: aiohttp.StreamReader, out: web.StreamResponse, meter: Meter | None) -> web.StreamResponse:
    data = content.read_nowait()
    t = perf_counter_ns()
    if meter is not None:
        meter.on_response_end(t)
    await out.write_eof(data)  # the headers, the body and (chunked) its last chunk, in one write
    if meter is not None and data:
        give_meter(meter, data, t)
    return out


async def _read_and_write(content: aiohttp.StreamReader, out: web.StreamResponse, meter: Meter | None) -> None:
    """The public path of a body (proxy/relay/fast_paths.py), read by read and written to the client:
    aiohttp's own backpressure (`write` drains a full transport; the reader pauses the upstream past
    its high water), its idle timeout (`sock_read`, re-armed per read), and a client gone raises
    from `write` (or cancels the handler). Each piece is stamped once this task has it."""
    while data := await content.readany():
        t = perf_counter_ns()
        await out.write(data)
        if meter is not None:
            give_meter(meter, data, t)


def _finish_after_headers(outcome: Outcome, message: str, out: web.StreamResponse) -> Finish:
    return Finish(outcome, (str(outcome), message), out)


def _abort(request: web.Request) -> None:
    """End the client's response the way the upstream ended ours: cut, not completed."""
    if request.transport is not None:
        request.transport.abort()
