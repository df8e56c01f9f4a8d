"""WebSocket relay (Codex's transport for the Responses API), frame by frame both ways.

One row per response: a client `response.create` frame starts a meter, the
upstream's frames feed it, and the turn ends when the meter says it is done
(`Meter.on_websocket_turn`'s `done`: the upstream's terminal frame, or the frame
the meter broke on), when the next `response.create` supersedes it, or when the
connection closes. The relay reads no frame's meaning itself.

A message is capped as a request body is (`--max-body-mb`): aiohttp refuses a frame past it from its
header, before buffering its payload, and closes with 1009 (message too big); the row says so. A
message held while it is relayed counts in the bodies' memory budget (`--body-memory-mb`,
proxy/relay/body_budget.py): past it the connection closes with 1013 (try again later). Text stays
bytes from one side to the other (never decoded and encoded again), so a large frame is not copied
more than aiohttp's own reader and writer do.
"""

from __future__ import annotations

import asyncio
from time import perf_counter_ns
from typing import Literal

import aiohttp
from aiohttp import WSCloseCode, WSMsgType, web
from aiohttp.http import WSMessageNoDecodeText

from proxy.relay.body_budget import Lease, OverBudget
from proxy.relay.errors import error_response
from proxy.relay.key_mask import mask_of
from proxy.relay.upstream import outgoing_headers, proxy_failure, proxy_refused, start_meter, through_proxy
from proxy.meter.meter import Meter
from proxy.relay.app_state import STATE, AppState
from proxy.settings.routes import Route
from proxy.common.schema import Outcome

# aiohttp's WebSocket client makes its own handshake headers.
_HANDSHAKE = ("sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions",
              "sec-websocket-protocol", "sec-websocket-accept")


def is_upgrade(request: web.Request) -> bool:
    return request.headers.get("Upgrade", "").lower() == "websocket"


def _protocols(request: web.Request) -> tuple[str, ...]:
    value = request.headers.get("Sec-WebSocket-Protocol", "")
    return tuple(p.strip() for p in value.split(",") if p.strip())


class _Turns:
    """The meter of the response under way on this connection; each starts at its `response.create`."""

    def __init__(self, state: AppState, request: web.Request, route: Route, path: str) -> None:
        self.state, self.request, self.route, self.path = state, request, route, path
        self.meter: Meter | None = None

    def client_frame(self, text: bytes) -> None:
        if not self.state.config.measure or b'"response.create"' not in text:
            return
        self.end(Outcome.STREAM_TRUNCATED, ("superseded", "a new response.create arrived before this response ended"))
        now = perf_counter_ns()
        meter = start_meter(self.state, self.request, self.route, self.path, now)
        if meter is None:
            return
        meter.on_websocket_turn(text, now, done=lambda: self.turn_done(meter))
        self.meter = meter

    def upstream_frame(self, data: bytes) -> None:
        meter = self.meter
        if meter is None:
            return
        try:
            meter.on_message(data, perf_counter_ns())  # calls turn_done when the frame ends the turn
        except Exception as exc:  # pragma: no cover - the meter never raises; if it did, it is broken
            meter.mark_broken(f"meter: {type(exc).__name__}: {exc}")
            self.turn_done(meter)

    def turn_done(self, meter: Meter) -> None:
        """The meter says its turn is over: recorded, outcome as the meter saw it."""
        if self.meter is meter:
            self.end(None, None)

    def end(self, outcome: Outcome | None, error: tuple[str, str] | None) -> None:
        if self.meter is not None:
            self.state.recorder.end(self.meter, outcome, error)
            self.meter = None

    def closed_by_llmtap(self, outcome: Outcome, error: tuple[str, str]) -> None:
        """llmtap closed the connection (a message too big, no memory for it): the turn under way ends
        so, or a row of its own says it (the message refused was the turn's `response.create`)."""
        if self.meter is None and self.state.config.measure:
            now = perf_counter_ns()
            self.meter = start_meter(self.state, self.request, self.route, self.path, now)
            if self.meter is not None:
                self.meter.on_websocket_turn(b"", now)
        self.end(outcome, error)


async def relay(request: web.Request, route: Route, path: str, query: str, received: int) -> web.StreamResponse:
    state = request.app[STATE]
    turns = _Turns(state, request, route, path)
    url = route.target(path, query)
    url = url.with_scheme("wss" if url.scheme == "https" else "ws")
    headers = outgoing_headers(request, route, path)
    for name in _HANDSHAKE:
        headers.popall(name, None)
    try:
        upstream = await state.session.ws_connect(url, headers=headers, protocols=_protocols(request),
                                                  autoping=True, max_msg_size=state.config.max_body_bytes,
                                                  compress=0, decode_text=False,
                                                  proxy=route.proxy, proxy_headers=through_proxy(route, url, headers))
    except aiohttp.WSServerHandshakeError as exc:
        if exc.status == 407 and route.proxy is not None:  # the forward proxy's answer, not the upstream's
            status, code, message = proxy_refused(route, 407)
            return _refuse(turns, received, status, message, code, Outcome.UPSTREAM_UNREACHABLE)
        message = f"upstream refused the WebSocket upgrade with HTTP {exc.status}"
        return _refuse(turns, received, exc.status, message, "websocket_refused", Outcome.HTTP_ERROR)
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        if (failed := proxy_failure(exc, route)) is not None:
            status, code, message = failed
            return _refuse(turns, received, status, message, code,
                           Outcome.UPSTREAM_TIMEOUT if status == 504 else Outcome.UPSTREAM_UNREACHABLE)
        message = f"cannot reach upstream {route.upstream.host} for a WebSocket: {type(exc).__name__}"
        return _refuse(turns, received, 502, message, "upstream_unreachable", Outcome.UPSTREAM_UNREACHABLE)
    client = web.WebSocketResponse[Literal[False]](protocols=_protocols(request), autoping=True, compress=False,
                                   max_msg_size=state.config.max_body_bytes, decode_text=False)
    await client.prepare(request)
    try:
        closer = await _pump(client, upstream, turns, state.body_budget.lease())
    except asyncio.CancelledError:
        turns.end(Outcome.CLIENT_DISCONNECTED, ("client_disconnected", "the client closed the WebSocket"))
        raise
    finally:
        await upstream.close()
    if closer == "llmtap":
        return client
    outcome = Outcome.CLIENT_DISCONNECTED if closer == "client" else Outcome.STREAM_TRUNCATED
    turns.end(outcome, (str(outcome), f"the {closer} closed the WebSocket before the response completed"))
    return client


def _refuse(turns: _Turns, received: int, status: int, message: str, code: str, outcome: Outcome) -> web.Response:
    """The upgrade failed before any frame: the client gets the status, the row says why."""
    turns.meter = start_meter(turns.state, turns.request, turns.route, turns.path, received)
    if turns.meter is not None:
        turns.meter.on_answered_locally(status)
        turns.end(outcome, (code, message))
    return error_response(turns.path, status, f"llmtap: {message}", code)


ClientSide = web.WebSocketResponse[Literal[False]]  # text as bytes, both sides
UpstreamSide = aiohttp.ClientWebSocketResponse[Literal[False]]


async def _pump(client: ClientSide, upstream: UpstreamSide, turns: _Turns, lease: Lease) -> str:
    """Relays until one side closes; returns which: "client", "upstream", or "llmtap" (a message past the
    cap, or past the memory budget: both sides closed, the row written)."""
    mb = turns.state.config.max_body_mb
    closer: list[str] = []

    async def refuse(code: int, outcome: Outcome, error: tuple[str, str]) -> None:
        closer.append("llmtap")
        turns.closed_by_llmtap(outcome, error)
        await asyncio.gather(client.close(code=code), upstream.close(code=code), return_exceptions=True)

    mask = mask_of(turns.route.credential)  # the injected key, masked in what goes back to the client

    async def relayed(msg: WSMessageNoDecodeText, to: ClientSide | UpstreamSide) -> bool:
        """One message to the other side, counted in the budget while held; False if llmtap closed."""
        try:
            lease.take(len(msg.data))
        except OverBudget:
            await refuse(WSCloseCode.TRY_AGAIN_LATER, Outcome.HTTP_ERROR, ("body_memory_full", (
                "WebSocket messages in memory are over llmtap's --body-memory-mb: closed with 1013, try again later")))
            return False
        data = mask.whole(msg.data) if mask is not None and to is client else msg.data
        try:
            await to.send_frame(data, msg.type)
        finally:
            lease.release()
        return True

    def too_big(side: str) -> tuple[str, str]:
        code = "request_too_large" if side == "client" else "response_too_large"
        return code, (f"a WebSocket message from the {side} over llmtap's limit of {mb:g} MiB: closed with 1009 "
                      "(raise it with `llmtap serve --max-body-mb`)")

    async def client_to_upstream() -> None:
        async for msg in client:
            if msg.type == WSMsgType.TEXT:
                turns.client_frame(msg.data)
            if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY) and not await relayed(msg, upstream):
                return
            if _too_big(msg):
                return await refuse(WSCloseCode.MESSAGE_TOO_BIG, Outcome.HTTP_ERROR, too_big("client"))
        await upstream.close()

    async def upstream_to_client() -> None:
        async for msg in upstream:
            if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY) and not await relayed(msg, client):
                return
            if msg.type == WSMsgType.TEXT:
                turns.upstream_frame(msg.data)
            if _too_big(msg):
                return await refuse(WSCloseCode.MESSAGE_TOO_BIG, Outcome.STREAM_ERROR, too_big("upstream"))
        await client.close(code=upstream.close_code or 1000)

    tasks = [asyncio.create_task(client_to_upstream()), asyncio.create_task(upstream_to_client())]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        return closer[0] if closer else "client" if tasks[0] in done else "upstream"
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _too_big(msg: WSMessageNoDecodeText) -> bool:
    """aiohttp's reader refused a frame past max_msg_size (it closed with 1009 already)."""
    return msg.type == WSMsgType.ERROR and getattr(msg.data, "code", None) == WSCloseCode.MESSAGE_TOO_BIG
