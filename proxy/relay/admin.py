"""The admin endpoint under /_llmtap/: health, and SQL for `llmtap sql` while serving; the web UI.

DuckDB lets one process write a file, so while `llmtap serve` runs, the CLI
asks the proxy to run its read-only query. It answers loopback peers only
(unless --allow-remote), and always asks for the admin token (`allowed`), or, for the web UI's
reads, the session its login gave (proxy/relay/ui_doors.py).

The web UI (`/_llmtap/ui/*`: its files; `/_llmtap/api/*`: its JSON) is what the composition root
gave (`state.ui`, analysis/web/): proxy/ never imports analysis/. An API answer is computed in
admin SQL's threads (proxy/record/admin_sql.py), with the limits of every admin query.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from typing import Any

import orjson
from aiohttp import web

from proxy.record import admin_sql
from proxy.observe import live
from proxy.settings.client_key import same_secret
from proxy.relay import otlp, ui_doors
from proxy.relay.guard import is_loopback
from proxy.relay.app_state import STATE, AppState
from proxy.common.instances import ADMIN_PREFIX, TOKEN_HEADER

FLUSH_BEFORE_QUERY_S = 2.0

MAX_ROWS = 100_000  # per answer; "truncated": true says there were more


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(data, default=str), content_type="application/json")


def _local_name(host: str | None) -> bool:
    """A Host or Origin naming this machine; anything else is a browser page's own name (DNS rebinding)."""
    if not host:
        return True
    name = host.rsplit("://", 1)[-1].lower()
    name = name[1:].partition("]")[0] if name.startswith("[") else name.rsplit(":", 1)[0]
    return name == "localhost" or name.endswith(".localhost") or is_loopback(name)


def allowed(request: web.Request, state: AppState, name: str | None = None) -> bool:
    """Loopback peers only, unless `--allow-remote`; and always the admin token, but for the web UI's
    reads of `name` (its files; with its session, the API) and the exchange of a login ticket
    (proxy/relay/ui_doors.py).

    The token is made per start unless configured, and kept in the owner-only state file
    (proxy/common/instances.py): another Unix user cannot read it, and a web page cannot read files, nor
    send a custom header cross-site without a preflight (which llmtap refuses). A browser page is
    refused even with a token (its Origin, or its own name in Host: DNS rebinding).
    """
    if not (is_loopback(request.remote) or state.config.allow_remote):
        return False
    local = state.config.allow_remote or _local_name(request.host)
    if _token_sent(request, state.admin_token):
        return request.headers.get("Origin") is None and local
    if name is None or not local or (state.ui is None and state.admin_relay is None):  # a worker: the primary's
        return False
    return ui_doors.ui_request(request, name, state.admin_token)


FORBIDDEN = ("llmtap admin endpoint: forbidden. It answers loopback peers (remote ones only with "
             "--allow-remote) carrying the admin token in X-Llmtap-Admin-Token or Authorization: "
             "Bearer; llmtap's own commands read it from the running proxy's owner-only state "
             "file (or set it with --admin-token-file / $LLMTAP_ADMIN_TOKEN)")


def forbidden() -> web.Response:
    return _json({"error": FORBIDDEN}, 403)


def _token_sent(request: web.Request, token: str) -> bool:
    sent = request.headers.get(TOKEN_HEADER) or request.headers.get("Authorization", "").removeprefix("Bearer ")
    return same_secret(sent, token)  # bytes in constant time: a value that is not UTF-8 is just wrong


async def handle(request: web.Request, name: str) -> web.StreamResponse:
    """A request under /_llmtap/ on the relay's port. In a `serve --workers` worker, once allowed
    here by the same rules, it is answered by the primary (which holds the database, the metrics
    and the live feed) through the primary's private socket: `state.admin_relay`."""
    state = request.app[STATE]
    if not allowed(request, state, name):
        return forbidden()
    if state.admin_relay is not None:
        return await state.admin_relay(request, name)
    return await answer(request, state, name)


async def answer(request: web.Request, state: AppState, name: str) -> web.StreamResponse:
    """An allowed admin request, answered by this process."""
    if name == "health" and request.method == "GET":
        return _json(health(state))
    if name == "live" and request.method == "GET":
        return await live.stream(request, live.feed_of(state.recorder, state.loop_lag, state.report))
    if name == "sql" and request.method == "POST":
        return await sql(request, state)
    if name == "metrics" and request.method == "GET":
        return await metrics(state)
    if name.startswith("otlp/"):  # a worker's, relayed: allowed there (proxy/relay/otlp.py)
        return await otlp.receive(request, state, name[len("otlp/"):])
    if name.startswith(("ui/", "api/")) or name == "ui":
        return await ui(request, state, name)
    return _json({"error": f"no admin endpoint {request.method} /_llmtap/{name}"}, 404)


def health(state: AppState) -> dict[str, Any]:
    store = state.store
    stats = store.stats() if store is not None else None
    return {
        # "ok": serving (every admin client finds the proxy by it); what needs a look is in "warnings": writes
        # to the database failing (a full disk; since when, what waits and what was dropped), the file removed
        "ok": True,
        "warnings": stats["warnings"] if stats is not None else [],
        "db": str(state.config.db_path) if store is not None else None,
        "requests_seen": state.requests_seen,
        "url_tags": True,  # /_tag/<tag>/ base URLs are understood
        "routes": [{"prefix": r.label, "upstream": str(r.upstream), "injects_key": r.credential is not None}
                   for r in state.routes.routes],
        "event_loop_lag": state.loop_lag.summary(),  # this process's: with --workers, the primary's
        "fast_paths": fast_paths(state),  # which of aiohttp's internals this process uses (proxy/relay/fast_paths.py)
        "store": stats,
        "sql_queries": state.admin_sql.pending if state.admin_sql is not None else 0,  # running or queued
        **({"workers": state.workers.health()} if state.workers is not None else {}),
    }


def fast_paths(state: AppState) -> dict[str, Any]:
    """The probe's answer, with the upstream connector's own (`TimedConnector.hooked`) for conn_timing,
    and `kernel_stamps`: the moments the kernel dates in this process (proxy/relay/kernel_timing.py):
    `arrival` (a request's first byte), `upstream` (the handshake's round trip, the request's write,
    a plain-http answer's first byte), `tls_flight` (a TLS 1.3 upstream's first flight)."""
    connector = state.upstream_session.connector if state.upstream_session is not None else None
    found = state.fast.summary(hooked=getattr(connector, "hooked", False) if connector is not None else None)
    upstream = bool(getattr(connector, "kernel", False))
    where = {"arrival": state.fast.on("arrival") and state.fast.on("kernel_stamps"), "upstream": upstream,
             "tls_flight": upstream and bool(getattr(connector, "hooked", False))}
    return {**found, "kernel_stamps": [name for name, on in where.items() if on]}


async def metrics(state: AppState) -> web.Response:
    """The Prometheus scrape, rendered off the event loop (prometheus_client is thread-safe)."""
    if state.metrics is None:
        return _json({"error": "this proxy has no metrics"}, 404)
    body, content_type = await asyncio.get_running_loop().run_in_executor(None, state.metrics.render)
    return web.Response(body=body, headers={"Content-Type": content_type})


async def sql(request: web.Request, state: AppState) -> web.Response:
    """One read-only query (store.Store.query) in admin SQL's own threads (proxy/record/admin_sql.py), with
    its timeout and its answer's byte cap; stopped when the client goes away. The rows of requests
    already over are written first (at most FLUSH_BEFORE_QUERY_S), so `llmtap sql`, `report` and
    `errors` right after a tool exits see its requests."""
    if state.store is None or state.admin_sql is None:
        return _json({"error": "this proxy is not recording to a database"}, 400)
    try:
        query = orjson.loads(await request.read())["sql"]
        if not isinstance(query, str):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        return _json({"error": 'send JSON {"sql": "SELECT ..."}'}, 400)
    store, max_bytes = state.store, state.config.sql_max_bytes
    state.recorder.record_ended()  # the requests over already are in the answer, not a second later

    def run(stop: Any) -> Any:
        store.flush(FLUSH_BEFORE_QUERY_S)
        return store.query(query, None, MAX_ROWS + 1, max_bytes=max_bytes, stop=stop)

    try:
        columns, types, rows = await state.admin_sql.run(run)
    except (admin_sql.Busy, admin_sql.Closed) as exc:
        return _json({"error": str(exc)}, 503)
    except Exception as exc:  # the query's own error, its timeout, its size: for the user
        return _json({"error": str(exc)}, 400)
    truncated = len(rows) > MAX_ROWS
    return _json({"columns": columns, "types": types, "rows": rows[:MAX_ROWS], "truncated": truncated})


# -- the web UI (proxy/relay/ui_doors.py; its files and API: state.ui, from the composition root) ----


async def ui(request: web.Request, state: AppState, name: str) -> web.StreamResponse:
    if state.ui is None:
        return _json({"error": "this proxy has no web UI"}, 404)
    if name == "ui/login" and request.method == "POST":
        return await ui_doors.login(request, state.ui_tickets, state.admin_token)
    if name == "ui/ticket" and request.method == "POST":  # the admin token only: `llmtap ui`
        if not _token_sent(request, state.admin_token):
            return forbidden()
        return _json({"ticket": state.ui_tickets.issue(), "path": ui_doors.LOGIN_PATH})
    if request.method not in ui_doors.READ_ONLY:
        return _json({"error": f"no admin endpoint {request.method} /_llmtap/{name}"}, 405)
    if name == "ui":
        return web.Response(status=308, headers={**ui_doors.HEADERS, "Location": "/_llmtap/ui/"})
    if name.startswith("ui/"):
        found = state.ui.asset(name[3:] or "index.html")
        if found is None:
            return web.Response(status=404, text="not found\n", headers=ui_doors.HEADERS)
        body, content_type = found
        return web.Response(body=body, headers={**ui_doors.HEADERS, "Content-Type": content_type})
    return await api(request, state, name[4:])


async def api(request: web.Request, state: AppState, name: str) -> web.Response:
    """`GET /_llmtap/api/<name>?...`: one of the UI's figures, computed (queries and all) in an admin SQL
    thread as `llmtap sql` is, on one cursor (`store.reader`); the answer is JSON made there too."""
    if state.store is None or state.admin_sql is None or state.ui is None:
        return _ui_json(b'{"error": "this proxy is not recording to a database"}', 400)
    handler = state.ui.endpoint(name)
    if handler is None:
        return _ui_json(orjson.dumps({"error": f"no API endpoint /_llmtap/api/{name}"}), 404)
    params = {key: request.query.getall(key) for key in request.query.keys()}
    store, max_bytes = state.store, state.config.sql_max_bytes
    state.recorder.record_ended()

    def run(stop: Any) -> tuple[int, bytes]:
        store.flush(FLUSH_BEFORE_QUERY_S)
        with store.reader(stop, max_bytes=max_bytes) as query:
            return handler(query, params)

    try:
        status, body = await state.admin_sql.run(run)
    except (admin_sql.Busy, admin_sql.Closed) as exc:
        return _ui_json(orjson.dumps({"error": str(exc)}), 503)
    except Exception as exc:  # the query's own error, its timeout, its size: for the page
        return _ui_json(orjson.dumps({"error": str(exc)}), 400)
    return _ui_json(body, status)


def _ui_json(body: bytes, status: int = 200) -> web.Response:
    return web.Response(status=status, body=body, headers={**ui_doors.HEADERS, "Content-Type": "application/json"})


# -- serve --workers N: the primary's private admin socket -----------------------------------------


async def end_live_streams(app: web.Application) -> None:
    """aiohttp's `on_shutdown`, run before it waits for the running handlers: the live feed's streams
    end rather than hold the stop for its timeout."""
    live.end_streams(app[STATE].recorder)


def private_app(state: AppState) -> web.Application:
    """What the primary answers on its private Unix socket (in the 0700 run directory): the admin
    requests its workers were sent and allowed, relayed with the token. It checks again: the peer
    is a process of this Unix user (SO_PEERCRED) and sends the admin token."""
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[STATE] = state
    app.on_shutdown.append(end_live_streams)
    app.router.add_route("*", ADMIN_PREFIX + "{name:.*}", _private)
    return app


async def _private(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    if not (_same_user(request) and _token_sent(request, state.admin_token)):
        return _json({"error": FORBIDDEN}, 403)
    return await answer(request, state, request.match_info["name"])


def _same_user(request: web.Request) -> bool:
    transport = request.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or getattr(socket, "SO_PEERCRED", None) is None:
        return False
    try:
        _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                              struct.calcsize("3i")))
    except (OSError, struct.error):
        return False
    return uid == os.getuid()
