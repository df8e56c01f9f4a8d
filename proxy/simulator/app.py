"""The simulator's aiohttp application, and `Simulator` to run it on a port."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from proxy.simulator import anthropic, gemini, openai_chat, openai_responses, websocket
from proxy.simulator.config import SimConfig
from proxy.simulator.exchange import STARTED, SimError
from proxy.simulator.respond import error_response, json_response
from proxy.simulator.slowstart import SlowStart
from proxy.simulator.state import STATE, RecordedRequest, SimState

DEFAULT_MODELS = ("sim-gpt", "sim-claude", "sim-gemini")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _observe(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Stamp the arrival time, record the request, and answer SimError in the API's shape."""
    request[STARTED] = asyncio.get_running_loop().time()
    state = request.app[STATE]
    if state.record:
        headers = {name.lower(): value for name, value in request.headers.items()}
        state.requests.append((request.method, request.path_qs, headers, await request.read()))
    try:
        return await handler(request)
    except SimError as error:
        return error_response(error)


async def _ok(request: web.Request) -> web.Response:
    return web.Response()


async def _models(request: web.Request) -> web.Response:
    """An OpenAI-style list whose items also carry Anthropic's fields."""
    configured = request.app[STATE].config.model
    names = [configured] if configured else list(DEFAULT_MODELS)
    data = [
        {
            "id": name,
            "object": "model",
            "type": "model",
            "created": 1735689600,
            "created_at": "2025-01-01T00:00:00Z",
            "owned_by": "llmtap-simulator",
            "display_name": name,
        }
        for name in names
    ]
    body = {"object": "list", "data": data, "has_more": False, "first_id": names[0], "last_id": names[-1]}
    return json_response("openai", 200, body)


async def _not_found(request: web.Request) -> web.Response:
    raise SimError("openai", 404, f"Unknown path: {request.method} {request.path}")


async def _keep_alive_or_close(request: web.Request, response: web.StreamResponse) -> None:
    """With `keep_alive` off, every answer says `Connection: close` (before its headers go out), so
    the client opens a new connection for each request. A WebSocket stays open."""
    if not request.app[STATE].config.keep_alive and response.status != 101:
        response.force_close()
        response.headers["Connection"] = "close"  # the headers are made before this hook runs


async def _echo_peer(request: web.Request, response: web.StreamResponse) -> None:
    """A request with `x-sim-echo-peer: 1` gets `x-sim-peer`: the port its connection came from
    (which connection carried it, for a capture of encrypted traffic: benchmarks/wire_truth.py)."""
    if request.headers.get("x-sim-echo-peer") == "1":
        peer = request.transport.get_extra_info("peername") if request.transport is not None else None
        if peer:
            response.headers["x-sim-peer"] = str(peer[1])


async def _close_websockets(app: web.Application) -> None:
    for ws in list(app[STATE].websockets):
        await ws.close()


def make_simulator_app(config: SimConfig | None = None, *, record: bool = True) -> web.Application:
    """record=False stops keeping every request (for long benchmark runs)."""
    app = web.Application(middlewares=[_observe], client_max_size=64 * 1024 * 1024)
    app[STATE] = SimState(config or SimConfig(), record=record)
    app.on_shutdown.append(_close_websockets)
    app.on_response_prepare.append(_keep_alive_or_close)
    app.on_response_prepare.append(_echo_peer)
    app.router.add_route("HEAD", "/", _ok)
    app.router.add_route("HEAD", "/api/hello", _ok)
    app.router.add_post("/v1/chat/completions", openai_chat.handle)
    app.router.add_post("/v1/responses", openai_responses.handle)
    app.router.add_get("/v1/responses", websocket.handle, allow_head=False)
    # The ChatGPT backend Codex uses on a ChatGPT login: the same API under a base without /v1.
    app.router.add_post("/backend-api/codex/responses", openai_responses.handle)
    app.router.add_get("/backend-api/codex/responses", websocket.handle, allow_head=False)
    app.router.add_post("/v1/messages", anthropic.handle)
    app.router.add_post("/v1/messages/count_tokens", anthropic.count_tokens)
    app.router.add_get("/v1/models", _models, allow_head=False)
    app.router.add_post("/v1beta/models/{target}", gemini.handle)
    app.router.add_route("*", "/{tail:.*}", _not_found)
    return app


class Simulator:
    """Runs the simulated upstream on host:port (0 = an ephemeral port).

    Inside `async with`: .port, .url (no trailing slash), .requests (method,
    path_qs, headers with lower-case names, raw body as received) and
    .active_streams. Request bodies are not decompressed on arrival, so
    .requests shows exactly what a proxy forwarded. With `ssl_context` it
    serves https (the context holds its certificate). With a config's
    connect_delay_ms, a `SlowStart` front holds each new connection on the
    public port and the server itself listens on another loopback port.
    """

    def __init__(
        self, config: SimConfig | None = None, host: str = "127.0.0.1", port: int = 0, *, record: bool = True,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.app = make_simulator_app(config, record=record)
        self.host = host
        self.port = port
        self.ssl_context = ssl_context
        self._runner: web.AppRunner | None = None
        self._front: SlowStart | None = None

    @property
    def state(self) -> SimState:
        return self.app[STATE]

    @property
    def config(self) -> SimConfig:
        return self.state.config

    @config.setter
    def config(self, config: SimConfig) -> None:
        self.state.config = config

    @property
    def requests(self) -> list[RecordedRequest]:
        return self.state.requests

    @property
    def active_streams(self) -> int:
        return self.state.active_streams

    @property
    def connections(self) -> int | None:
        """Connections accepted so far, with connect_delay_ms (None without)."""
        return self._front.connections if self._front is not None else None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.ssl_context else 'http'}://{host}:{self.port}"

    async def __aenter__(self) -> Simulator:
        runner = web.AppRunner(self.app, access_log=None, auto_decompress=False, shutdown_timeout=1.0)
        await runner.setup()
        self._runner = runner
        delay, public = self.config.connect_delay_ms, self.port
        inner = ("::1" if ":" in self.host else "127.0.0.1", 0) if delay else (self.host, public)
        await web.TCPSite(runner, *inner, ssl_context=self.ssl_context).start()
        self.port = runner.addresses[0][1]
        if delay:
            self._front = SlowStart(delay / 1000, inner[0], self.port)
            try:
                self.port = await self._front.start(self.host, public)
            except BaseException:
                await self.__aexit__()
                raise
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._front is not None:
            await self._front.close()
            self._front = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
