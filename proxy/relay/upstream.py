"""The upstream side of a relayed request, for both relays (reverse.py for HTTP, websocket.py):
who the request is for (its tag, its meter), the headers sent upstream, opening the upstream
request, and the words for an upstream (or the forward proxy to it) that could not be reached.

`Finish` ends a relay early: the client already has its answer, and the row gets the outcome.
"""

from __future__ import annotations

import asyncio
from time import perf_counter_ns

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from proxy.common.headers import TAG_HEADER, inject_credential, request_headers
from proxy.common.schema import Outcome
from proxy.meter.meter import Meter
from proxy.relay import conn_timing, kernel_timing
from proxy.relay.app_state import AppState
from proxy.relay.errors import api_shape, error_response
from proxy.settings.routes import Route

# aiohttp's client adds these when absent; a transparent relay must not.
SKIP_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")

TAG_KEY = web.RequestKey("llmtap_tag", str)  # set by dispatch from a /_tag/<tag>/ path prefix


class Finish(Exception):
    """Ends a relay early with an outcome for the row (the client already has its answer):
    raised, and caught by the relay, which returns `response` and records the outcome."""

    def __init__(self, outcome: Outcome, error: tuple[str, str], response: web.StreamResponse) -> None:
        super().__init__(outcome)
        self.outcome, self.error, self.response = outcome, error, response

    @classmethod
    def answered_locally(cls, outcome: Outcome, error: tuple[str, str], response: web.StreamResponse,
                         meter: Meter | None, status: int) -> "Finish":
        """Before any upstream headers: the client gets llmtap's own `response` with `status`, and
        the meter is told so (`Meter.on_answered_locally`)."""
        if meter is not None:
            meter.on_answered_locally(status)
        return cls(outcome, error, response)

    @classmethod
    def after_headers(cls, outcome: Outcome, message: str, response: web.StreamResponse) -> "Finish":
        """The upstream's answer had begun (`response` is already the client's): cut short."""
        return cls(outcome, (str(outcome), message), response)


def request_tag(request: web.Request, state: AppState) -> str | None:
    """A /_tag/<tag>/ base URL, else the X-Llmtap-Tag header, else `serve --tag`."""
    return request.get(TAG_KEY) or request.headers.get(TAG_HEADER) or state.config.tag


def start_meter(state: AppState, request: web.Request, route: Route | None, path: str, received: int,
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
        headers["Accept-Encoding"] = "identity"  # so that an echo of the key can be masked (relay/key_mask.py)
    return headers


def through_proxy(route: Route, url: URL, headers: CIMultiDict[str]) -> dict[str, str] | None:
    """The forward proxy's credentials: the `proxy_headers` of its CONNECT for a TLS upstream; for a
    plain one, aiohttp sends the request itself to the proxy and ignores `proxy_headers`, so they go in
    the request's own headers (as aiohttp's deprecated `proxy_auth` put them)."""
    if route.proxy_headers is None or url.scheme in ("https", "wss"):
        return route.proxy_headers
    headers.update(route.proxy_headers)
    return None


async def open_request(state: AppState, request: web.Request, url: URL, body: bytes, meter: Meter | None,
                       path: str, route: Route) -> aiohttp.ClientResponse:
    """The upstream's response (its status and headers read), or `Finish` when none came: the
    upstream (or the forward proxy to it) could not be reached, did not answer in time, or the
    forward proxy refused llmtap's credentials."""
    headers = outgoing_headers(request, route, path)
    marks = None if meter is None else meter.on_upstream_sent(perf_counter_ns(), tls=url.scheme == "https")
    timing = conn_timing.CURRENT.set(marks)  # the connector stamps them (proxy/relay/conn_timing.py)
    try:
        response = await state.session.request(
            request.method, url, headers=headers, data=body or None,
            allow_redirects=False, auto_decompress=False, skip_auto_headers=SKIP_AUTO_HEADERS,
            proxy=route.proxy, proxy_headers=through_proxy(route, url, headers),
        )
    except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
        raise _unreachable(exc, route, path, meter) from None
    finally:
        kernel_timing.settle()  # the response's first byte was read stamped, or never will be
        conn_timing.CURRENT.reset(timing)
    if response.status == 407 and route.proxy is not None:  # the forward proxy's answer, not the upstream's
        response.close()
        status, code, message = proxy_refused(route, 407)
        raise Finish.answered_locally(Outcome.UPSTREAM_UNREACHABLE, (code, message),
                                      error_response(path, status, f"llmtap: {message}", code), meter, status)
    return response


def _unreachable(exc: BaseException, route: Route, path: str, meter: Meter | None) -> Finish:
    """No upstream response: the forward proxy failed, the upstream did not answer in time, or not at all."""
    host = route.upstream.host
    if (failed := proxy_failure(exc, route)) is not None:
        status, code, message = failed
        outcome = Outcome.UPSTREAM_TIMEOUT if status == 504 else Outcome.UPSTREAM_UNREACHABLE
        return Finish.answered_locally(outcome, (code, message),
                                       error_response(path, status, f"llmtap: {message}", code), meter, status)
    if isinstance(exc, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
        message = f"upstream {host} did not answer in time ({cause(exc, 'timed out')})"
        return Finish.answered_locally(Outcome.UPSTREAM_TIMEOUT, ("upstream_timeout", message),
                                       error_response(path, 504, f"llmtap: {message}", "upstream_timeout"), meter, 504)
    message = f"cannot reach upstream {host}: {cause(exc, 'connection failed')}"
    return Finish.answered_locally(Outcome.UPSTREAM_UNREACHABLE, ("upstream_unreachable", message),
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
        return 502, "upstream_proxy_unreachable", f"cannot reach {where}: {cause(exc, 'connection failed')}"
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


def cause(exc: BaseException, default: str) -> str:
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
