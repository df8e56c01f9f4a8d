"""The aiohttp application: request dispatch, the upstream session, lifecycle."""

from __future__ import annotations

import asyncio
import re
import urllib.parse
from time import perf_counter_ns
from typing import Any, AsyncIterator, Awaitable, Callable

import aiohttp
from aiohttp import web

from proxy.relay import admin, arrival, conn_timing, otlp, websocket
from proxy.settings import client_key
from proxy.relay.guard import is_preflight
from proxy.settings.egress import client_ssl_context
from proxy.relay.errors import error_response
from proxy.relay.reverse import relay
from proxy.relay.upstream import TAG_KEY, start_meter
from proxy.relay.app_state import STATE, AppState
from proxy.settings.routes import Route
from proxy.common.instances import ADMIN_PREFIX, TAG_PREFIX
from proxy.common.schema import Outcome

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
RECEIVED = web.RequestKey("llmtap_received", int)  # the request's first byte, perf_counter_ns
# Generous header limits: Codex sends a JSON document in a header.
HTTP_LIMITS: dict[str, Any] = {"max_line_size": 65536, "max_field_size": 65536}


async def dispatch(request: web.Request) -> web.StreamResponse:
    received = request[RECEIVED]
    state = request.app[STATE]
    path, query = split_raw_path(request.raw_path)
    if path.startswith(otlp.PREFIX):  # the agents' own telemetry: its token, not the admin one

        def telemetry_refused(where: str, status: int, code: str, message: str) -> None:
            _record_local(request, where, received, status, Outcome.HTTP_ERROR, (code, message))

        return await otlp.handle(request, path[len(otlp.PREFIX):], telemetry_refused)
    if path.startswith(ADMIN_PREFIX):  # checked as sent, `..` refused: a worker relays the very bytes checked
        if climbs(path) or not admin.allowed(request, state, path[len(ADMIN_PREFIX):]):  # a row says someone tried
            _record_local(request, path, received, 403, Outcome.HTTP_ERROR, ("admin_forbidden", admin.FORBIDDEN))
            return admin.forbidden()
        return await admin.handle(request, path[len(ADMIN_PREFIX):])
    if path.startswith(TAG_PREFIX):
        path = strip_tag(request, path)
    if climbs(path):
        return reject(request, path, received, 400, "llmtap: a path with a '..' segment (however encoded) or a NUL "
                      "byte is refused", "bad_path")
    if (refused := state.guard.refusal(request)) is not None:
        return reject(request, path, received, 403, refused, "refused_web_page")
    if is_preflight(request):  # answered here, never relayed
        return preflight(request, path, received)
    route = state.routes.match(path)
    if route is None:
        prefixes = ", ".join(state.routes.prefixes)
        message = f"llmtap: no route for {path}; configured prefixes: {prefixes}"
        return reject(request, path, received, 404, message, "no_route")
    if route.credential is not None:  # llmtap spends its key for this client: the client key, not sent on
        if not client_key.accepts(state.client_key or "", request.headers, request.query):
            return reject(request, path, received, 401, CLIENT_KEY_NEEDED, "invalid_client_key", route)
        query = client_key.without_key(query)
    if websocket.is_upgrade(request):
        return await websocket.relay(request, route, path, query, received)
    return await relay(request, route, path, query, received)


def split_raw_path(raw: str) -> tuple[str, str]:
    path, _, query = raw.partition("?")
    return path, query


NOT_A_FORWARD_PROXY = ("llmtap is a reverse proxy, not a forward proxy: only paths (`/v1/...`) are relayed, "
                       "to the configured upstreams; CONNECT and absolute URLs are refused")
# A `..` segment, between `/` or `\\`; `..;x` too (Tomcat's path parameters: `/v1/..;/admin` climbs).
_DOT_DOT = re.compile(r"(?:^|[/\\])\.\.(?:[/\\;]|$)")
_IIS_ESCAPE = re.compile(r"%[uU]([0-9a-fA-F]{4})")
# Overlong UTF-8 (`%c0%ae` is `.`, `%c0%af` is `/`): invalid, but lenient decoders take the bits they carry.
_OVERLONG = re.compile(rb"[\xc0\xc1][\x80-\xbf]|\xe0[\x80-\x9f][\x80-\xbf]|\xf0[\x80-\x8f][\x80-\xbf][\x80-\xbf]")


def climbs(path: str) -> bool:
    """A `..` segment, however encoded: `%2e%2e`, `.%2e`, `..%2f`, `..\\`, `..;`, IIS's `%u002e`,
    overlong UTF-8 (`%c0%ae`, `%e0%80%ae`), up to three times encoded; and a NUL byte, where a server
    in C would end the path. An upstream that resolves such a path would serve one outside the
    route's base URL. An ordinary path (no `%`) costs one regex search; without `.` or `%`, none."""
    if "." not in path and "%" not in path:
        return False
    if "%" not in path:
        return _DOT_DOT.search(path) is not None
    for _ in range(3):
        if _DOT_DOT.search(path) or "\x00" in path:
            return True
        try:
            decoded = _decoded(path)
        except UnicodeError:  # not text even byte by byte: refused too
            return True
        if decoded == path:
            return False
        path = decoded
    return _DOT_DOT.search(path) is not None or "\x00" in path


def _decoded(path: str) -> str:
    """One round of decoding as the most lenient servers do it: `%uXXXX`, `%XX`, then overlong UTF-8."""
    if "%u" in path or "%U" in path:
        path = _IIS_ESCAPE.sub(_iis_char, path)
    raw = urllib.parse.unquote_to_bytes(path.encode("utf-8", "surrogateescape"))  # raw bytes as sent
    if max(raw, default=0) >= 0xC0:
        raw = _OVERLONG.sub(_overlong_char, raw)
    return raw.decode("utf-8", "replace")


def _iis_char(m: re.Match[str]) -> str:
    code = int(m[1], 16)
    return "\ufffd" if 0xD800 <= code < 0xE000 else chr(code)  # a lone surrogate has no UTF-8


def _overlong_char(m: re.Match[bytes]) -> bytes:
    b = m[0]
    if len(b) == 2:
        code = (b[0] & 0x1F) << 6 | b[1] & 0x3F
    elif len(b) == 3:
        code = (b[0] & 0x0F) << 12 | (b[1] & 0x3F) << 6 | b[2] & 0x3F
    else:
        code = (b[1] & 0x3F) << 12 | (b[2] & 0x3F) << 6 | b[3] & 0x3F
    return chr(code).encode("utf-8", "surrogatepass")


def strip_tag(request: web.Request, path: str) -> str:
    """`/_tag/<tag>/rest` -> `/rest`, recording <tag>: a base URL that tags tools which send no custom headers."""
    tag, _, rest = path[len(TAG_PREFIX):].partition("/")
    if tag:
        request[TAG_KEY] = urllib.parse.unquote(tag)[:200]
    return "/" + rest


CLIENT_KEY_NEEDED = ("llmtap: this route puts llmtap's upstream key in place of yours, so it needs llmtap's "
                     "client key as the API key (`llmtap setup TOOL` prints it or writes it into the tool's "
                     "configuration)")


def reject(request: web.Request, path: str, received: int, status: int, message: str, code: str,
           route: Route | None = None) -> web.Response:
    """Answer locally with an error in the API's shape, and leave a row that says so (with the
    route it was for, when one matched)."""
    _record_local(request, path, received, status, Outcome.HTTP_ERROR, (code, message), route)
    return error_response(path, status, message, code)


def preflight(request: web.Request, path: str, received: int) -> web.Response:
    """A CORS preflight: llmtap's own 204 for an allowed origin, else a 403; a row either way."""
    response = request.app[STATE].guard.preflight(request)
    if response is None:
        return reject(request, path, received, 403, "llmtap: CORS preflights are refused but from the origins "
                      "of `llmtap serve --allow-origin ORIGIN`", "refused_web_page")
    _record_local(request, path, received, response.status, Outcome.OK, None)
    return response


def _record_local(request: web.Request, path: str, received: int, status: int, outcome: Outcome,
                  error: tuple[str, str] | None, route: Route | None = None) -> None:
    state = request.app[STATE]
    meter = start_meter(state, request, route, path, received, relayed=False)
    if meter is not None:
        meter.on_answered_locally(status)
        state.recorder.end(meter, outcome, error)


@web.middleware
async def on_arrival(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every request's first step (one middleware, not two: each costs a call per request): its
    arrival is stamped (`RECEIVED`: its first byte, arrival.py), then a target that asks for a
    forward proxy is refused (`refuse_forward_target`)."""
    received = request[RECEIVED] = arrival.take(request, perf_counter_ns())
    if (refused := refuse_forward_target(request, received)) is not None:
        return refused
    return await handler(request)


def refuse_forward_target(request: web.Request, received: int) -> web.Response | None:
    """CONNECT, absolute-form (`GET http://host/...`) and `OPTIONS *` targets: refused before routing
    (CONNECT and `*` match no route), in words, with a row; None for a path, which is relayed."""
    target = request.raw_path
    if request.method == "CONNECT" or not target.startswith("/"):
        status = 405 if request.method == "CONNECT" else 400
        return reject(request, target.partition("?")[0], received, status, NOT_A_FORWARD_PROXY,
                      "not_a_forward_proxy")
    return None


async def _upstream_session(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    cfg = state.config
    # measuring, the connector stamps each request's connection moments (proxy/relay/conn_timing.py)
    pool: dict[str, Any] = dict(limit=cfg.pool_size, ttl_dns_cache=300, keepalive_timeout=30, ssl=client_ssl_context(cfg.ca_bundle))
    fast = state.fast
    connector = (conn_timing.TimedConnector(hook_tcp=fast.on("conn_timing"), kernel=fast.on("kernel_stamps"), **pool)
                 if cfg.measure else aiohttp.TCPConnector(**pool))
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=cfg.connect_timeout_s, sock_read=cfg.idle_timeout_s)
    state.open_session(aiohttp.ClientSession(
        connector=connector, timeout=timeout, auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        **HTTP_LIMITS,
    ))
    lag = asyncio.create_task(state.loop_lag.run())  # kept referenced until cleanup
    yield
    lag.cancel()
    state.agent_decoder.close()
    await state.session.close()
    if isinstance(connector, conn_timing.TimedConnector):  # its resolver is its own, not the connector's
        await connector.resolver.close()


def make_app(state: AppState) -> web.Application:
    app = web.Application(client_max_size=0, middlewares=[on_arrival])
    app[STATE] = state
    app.cleanup_ctx.append(_upstream_session)
    app.on_shutdown.append(admin.end_live_streams)
    app.router.add_route("*", "/{tail:(?s:.*)}", dispatch)  # every path, a `%0a` in it too: each leaves a row
    return app


def routes_banner(state: AppState, base_url: str) -> str:
    lines = [f"llmtap listening on {base_url}"]
    for route in sorted(state.routes.routes, key=lambda r: r.prefix):
        via = f"  (through the forward proxy {route.proxy.host}:{route.proxy.port})" if route.proxy else ""
        lines.append(f"  {base_url}{route.prefix or ''}  ->  {route.upstream}{via}")
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
