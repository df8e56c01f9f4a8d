"""The aiohttp application: request dispatch, the upstream session, lifecycle."""

from __future__ import annotations

import asyncio
import re
import ssl
import urllib.parse
from time import perf_counter_ns
from typing import AsyncIterator, Awaitable, Callable

import aiohttp
from aiohttp import web

from . import admin, websocket
from .errors import error_response
from .forward import TAG_KEY, relay, request_tag, split_raw_path
from .meter import Meter
from .relay_state import STATE, ProxyState
from .routes import Route

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ADMIN_PREFIX = "/_llmtap/"
TAG_PREFIX = "/_tag/"
# Generous header limits: Codex sends a JSON document in a header.
HTTP_LIMITS = {"max_line_size": 65536, "max_field_size": 65536}


async def dispatch(request: web.Request) -> web.StreamResponse:
    received = perf_counter_ns()
    state = request.app[STATE]
    path, query = split_raw_path(request.raw_path)
    if path.startswith(ADMIN_PREFIX):
        return await admin.handle(request, path[len(ADMIN_PREFIX):])
    if path.startswith(TAG_PREFIX):
        path = strip_tag(request, path)
    if climbs(path):
        return reject(request, path, received, 400, "llmtap: a path with a '..' segment is refused", "bad_path")
    route = state.routes.match(path)
    if route is None:
        prefixes = ", ".join(state.routes.prefixes)
        message = f"llmtap: no route for {path}; configured prefixes: {prefixes}"
        return reject(request, path, received, 404, message, "no_route")
    if websocket.is_upgrade(request):
        return await websocket.relay(request, route, path, query, received)
    return await relay(request, route, path, query, received)


NOT_A_FORWARD_PROXY = ("llmtap is a reverse proxy, not a forward proxy: only paths (`/v1/...`) are relayed, "
                       "to the configured upstreams; CONNECT and absolute URLs are refused")
_SEPARATORS = re.compile(r"[/\\]")


def climbs(path: str) -> bool:
    """A `..` segment, however encoded (`%2e%2e`, `..%2f`, `..\\`, twice-encoded): an upstream that
    resolves it would serve a path outside the route's base URL."""
    if "." not in path and "%" not in path:
        return False
    for _ in range(3):
        if ".." in _SEPARATORS.split(path):
            return True
        decoded = urllib.parse.unquote(path)
        if decoded == path:
            return False
        path = decoded
    return ".." in _SEPARATORS.split(path)


def strip_tag(request: web.Request, path: str) -> str:
    """`/_tag/<tag>/rest` -> `/rest`, recording <tag>: a base URL that tags tools which send no custom headers."""
    tag, _, rest = path[len(TAG_PREFIX):].partition("/")
    if tag:
        request[TAG_KEY] = urllib.parse.unquote(tag)[:200]
    return "/" + rest


def reject(request: web.Request, path: str, received: int, status: int, message: str, code: str) -> web.Response:
    """Answer locally with an error in the API's shape, and leave a row that says so."""
    state = request.app[STATE]
    if state.config.measure:
        meter = Meter(received_ns=received, method=request.method, path=path, query={},
                      headers=request.headers, route="", upstream_host="", tag=request_tag(request, state))
        meter.status = status
        state.record(meter, "http_error", (code, message))
    return error_response(path, status, message, code)


@web.middleware
async def refuse_forward_proxying(request: web.Request, handler: Handler) -> web.StreamResponse:
    """CONNECT, absolute-form (`GET http://host/...`) and `OPTIONS *` targets: refused before routing
    (CONNECT and `*` match no route), in words, with a row."""
    target = request.raw_path
    if request.method == "CONNECT" or not target.startswith("/"):
        status = 405 if request.method == "CONNECT" else 400
        return reject(request, target.partition("?")[0], perf_counter_ns(), status, NOT_A_FORWARD_PROXY,
                      "not_a_forward_proxy")
    return await handler(request)


def _ssl_context(ca_bundle: str | None) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=ca_bundle) if ca_bundle else ssl.create_default_context()


async def _upstream_session(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    cfg = state.config
    connector = aiohttp.TCPConnector(limit=cfg.pool_size, ttl_dns_cache=300, keepalive_timeout=30,
                                     ssl=_ssl_context(cfg.ca_bundle))
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=cfg.connect_timeout_s, sock_read=cfg.idle_timeout_s)
    state.session = aiohttp.ClientSession(
        connector=connector, timeout=timeout, auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        **HTTP_LIMITS,
    )
    lag = asyncio.create_task(state.loop_lag.run())  # kept referenced until cleanup
    yield
    lag.cancel()
    await state.session.close()


def make_app(state: ProxyState) -> web.Application:
    app = web.Application(client_max_size=0, middlewares=[refuse_forward_proxying])
    app[STATE] = state
    app.cleanup_ctx.append(_upstream_session)
    app.router.add_route("*", "/{tail:.*}", dispatch)
    return app


def routes_banner(state: ProxyState, base_url: str) -> str:
    lines = [f"llmtap listening on {base_url}"]
    for route in sorted(state.routes.routes, key=lambda r: r.prefix):
        lines.append(f"  {base_url}{route.prefix or ''}  ->  {route.upstream}")
    lines.append(_tool_hints(base_url, state.routes.routes))
    return "\n".join(lines)


def _tool_hints(base_url: str, routes: list[Route]) -> str:
    anthropic = next((r for r in routes if "anthropic" in r.prefix), None)
    openai = next((r for r in routes if "openai" in r.prefix), None)
    a = base_url + (anthropic.prefix if anthropic else "")
    o = base_url + (openai.prefix if openai else "")
    return (
        "point your tools at it:\n"
        f"  Claude Code / Anthropic SDK:  ANTHROPIC_BASE_URL={a}        (no /v1)\n"
        f"  OpenAI SDK / Codex / Cline:   OPENAI_BASE_URL={o}/v1        (with /v1)\n"
        f"  Cline (Anthropic provider):   base URL {a}/v1"
    )
