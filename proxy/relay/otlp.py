"""The agents' own telemetry, received: OTLP/HTTP under /_llmtap/otlp/ (`OTEL_EXPORTER_OTLP_ENDPOINT`).

The OTel SDKs append `/v1/logs`, `/v1/metrics` and `/v1/traces` to the endpoint. Logs and traces, as
protobuf or JSON, become `agent_events` rows (proxy/meter/agent_events.py: the events and spans the
timeline uses, by an allow-list, never content); metrics are answered with success and not read.

Who may post: a request carrying the telemetry token (`Authorization: Bearer`, or the endpoint's last
segment, `/_llmtap/otlp/<token>`, for a CLI that sends no headers; kept owner-only beside the client key:
`client_key.telemetry_token`, written into each tool's settings by `llmtap setup`), from
a loopback peer (any, with --allow-remote). Another Unix user cannot read the token; a web page cannot
send `Authorization` cross-site without a CORS preflight, which is refused here, as is any request that
carries an `Origin` or a cross-site `Sec-Fetch-Site`.

What it may cost: a body over MAX_EXPORT_BYTES gets a 413 (its Content-Length at once, a chunked one
as it comes: never read whole first); at most MAX_PENDING exports are read or decoded at once, the rest
get a 429 with Retry-After before their body is read. Decoding runs in a separate, lower-priority process
(proxy/record/agent_decoder.py): a protobuf parse holds the GIL, and OTLP/JSON's `json_format` takes some 2 s of CPU for
4 MiB, which in a thread would make the event loop wait for the GIL. A malformed or oversized export gets
a 4xx in OTLP's shape (a `google.rpc.Status`, in the request's own encoding) and stores nothing.
"""

from __future__ import annotations

from concurrent.futures.process import BrokenProcessPool
from datetime import datetime, timezone
from typing import Callable

from aiohttp import web
from google.protobuf import json_format
from google.rpc.status_pb2 import Status

from proxy.meter import agent_events
from proxy.relay.app_state import STATE, AppState
from proxy.relay.guard import is_loopback
from proxy.relay.reverse import BodyTooLarge, read_body
from proxy.settings.client_key import same_secret

PREFIX = "/_llmtap/otlp/"
SIGNALS = ("v1/logs", "v1/metrics", "v1/traces")
MAX_EXPORT_BYTES = 4 * 1024 * 1024  # OTel SDKs batch 512 records: a few hundred KB at most
MAX_PENDING = 4  # exports read or decoded at once; more get a 429
RETRY_AFTER_S = 1
# google.rpc.Code of each status answered (OTLP/HTTP: the body of an error is a google.rpc.Status)
_CODES = {400: 3, 401: 16, 403: 7, 404: 5, 405: 12, 413: 8, 415: 3, 429: 8, 503: 14}

Refused = Callable[[str, int, str, str], None]  # path (never a token), status, code, message: for a row


async def handle(request: web.Request, rest: str, refused: Refused) -> web.StreamResponse:
    """A request under PREFIX on the relay's port (`rest`: the path after it): checked, then received here
    or (a `serve --workers` worker) by the primary, which holds the database."""
    state = request.app[STATE]
    in_path, signal = _token_in_path(rest)
    if (refusal := _refusal(request, state, in_path)) is not None:
        status, code, message = refusal
        refused(PREFIX + signal, status, code, message)
        return error(status, message, _wants_json(request))
    return await receive(request, state, signal)


def _token_in_path(rest: str) -> tuple[str | None, str]:
    """`<token>/v1/logs` -> (token, "v1/logs"): the endpoint may carry the token as its last segment, for a
    CLI whose settings send no headers (Gemini CLI's `telemetry.otlpEndpoint`)."""
    first, _, after = rest.partition("/")
    return (None, rest) if first == "v1" or not after else (first, after)


def _refusal(request: web.Request, state: AppState, in_path: str | None) -> tuple[int, str, str] | None:
    headers = request.headers
    site = headers.get("Sec-Fetch-Site")
    if request.method == "OPTIONS" or "Origin" in headers or site not in (None, "none"):
        return 403, "refused_web_page", "llmtap: telemetry from a web page is refused"
    if not (is_loopback(request.remote) or state.config.allow_remote):
        return 403, "telemetry_forbidden", "llmtap: telemetry is received from this machine only (--allow-remote)"
    auth = headers.get("Authorization", "")
    sent = auth[7:].strip() if auth[:7].lower() == "bearer " else in_path
    if sent is None or not same_secret(sent, state.telemetry_token):
        return 401, "telemetry_unauthenticated", ("llmtap: telemetry needs the token `llmtap setup TOOL` writes "
                                                  "(OTEL_EXPORTER_OTLP_HEADERS=Authorization=Bearer ...)")
    return None


async def receive(request: web.Request, state: AppState, signal: str) -> web.StreamResponse:
    """An allowed export: read (bounded), decoded in the decoding process, its rows to the store."""
    json = _wants_json(request)
    if signal not in SIGNALS:
        return error(404, f"no OTLP endpoint {PREFIX}{signal}: {', '.join(SIGNALS)}", json)
    if request.method != "POST":
        return error(405, "OTLP exports are POSTed", json)
    try:
        agent_events.media_type(request.content_type)
    except agent_events.ExportError as exc:
        return error(exc.status, str(exc), json)
    decoder = state.agent_decoder
    if decoder.pending >= MAX_PENDING:
        busy = error(429, f"llmtap is decoding {MAX_PENDING} exports; try again in {RETRY_AFTER_S} s", json)
        busy.headers["Retry-After"] = str(RETRY_AFTER_S)
        busy.force_close()  # its body is not read
        return busy
    decoder.pending += 1
    try:
        return await _take(request, state, signal, json)
    finally:
        decoder.pending -= 1


async def _take(request: web.Request, state: AppState, signal: str, json: bool) -> web.StreamResponse:
    received_at = datetime.now(timezone.utc)
    try:
        body = await read_body(request, MAX_EXPORT_BYTES)
    except BodyTooLarge:
        too_large = error(413, f"an export is at most {MAX_EXPORT_BYTES:,} bytes", json)
        too_large.force_close()
        return too_large
    if state.admin_relay is not None:  # a worker: the primary decodes and stores
        return await state.admin_relay(request, PREFIX[len("/_llmtap/"):] + signal, body)
    if signal != "v1/metrics":  # the timeline uses no metric
        try:
            rows = await state.agent_decoder.decode(signal, body, MAX_EXPORT_BYTES, request.headers.get("Content-Type"),
                                                    request.headers.get("Content-Encoding"), received_at)
        except agent_events.ExportError as exc:
            return error(exc.status, str(exc), json)
        except BrokenProcessPool:
            return error(503, "llmtap's telemetry decoder stopped; it restarts with the next export", json)
        if rows and state.store is not None:
            state.store.put_agent_events(rows)
    return web.Response(body=b"{}" if json else b"", content_type=agent_events.JSON if json else agent_events.PROTOBUF)


def _wants_json(request: web.Request) -> bool:
    return request.content_type != agent_events.PROTOBUF


def error(status: int, message: str, json: bool) -> web.Response:
    """An OTLP/HTTP error: a google.rpc.Status in the request's encoding."""
    status_message = Status(code=_CODES.get(status, 2), message=message)
    if json:
        return web.Response(status=status, text=json_format.MessageToJson(status_message, indent=None),
                            content_type=agent_events.JSON)
    return web.Response(status=status, body=status_message.SerializeToString(), content_type=agent_events.PROTOBUF)
