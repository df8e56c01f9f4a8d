"""What every request handler shares, `AppState` (under the app's `STATE` key): config, routes, the
upstream session, the recorder, and the checks made before relaying (the guard, the admin token,
the client key).

Built whole by its constructor (proxy/serve/server.py gives it the store, the metrics and the admin
SQL threads). What can only come later comes in through a method, never an attribute set from
outside: the upstream session, opened with the app (`open_session`), and a primary's supervisor of
its `serve --workers` workers, which starts once the proxy listens (`attach_workers`). What higher
layers provide is typed by a Protocol here (`WorkerHealth`, `AdminForward`, `WebUi`): the relay imports
nothing of proxy/serve.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol

import aiohttp
from aiohttp import web

from proxy.common.terminal_text import stderr_line
from proxy.relay.ui_doors import Tickets
from proxy.observe.looplag import LoopLag
from proxy.record.agent_decoder import Decoder
from proxy.record.recorder import Recorder, log_observer
from proxy.relay.body_budget import BodyBudget
from proxy.relay.fast_paths import FastPaths, probe
from proxy.relay.guard import Guard
from proxy.settings.config import ServeConfig
from proxy.settings.routes import RouteTable

if TYPE_CHECKING:
    from proxy.observe.metrics import PrometheusMetrics
    from proxy.record.admin_sql import AdminSql
    from proxy.record.store import Store


class WorkerHealth(Protocol):
    """A primary's supervisor of its `serve --workers` workers (proxy/serve/workers.py `Workers`)."""

    def health(self) -> list[dict[str, Any]]:
        """Each process's share, for health's `workers` list."""
        ...


class AdminForward(Protocol):
    """In a `serve --workers` worker: an allowed /_llmtap/ request, answered by the primary
    (proxy/serve/workers.py `AdminRelay`)."""

    async def __call__(self, request: web.Request, name: str, body: bytes | None = None) -> web.StreamResponse:
        """`body`: the request's, already read (else read here)."""
        ...


class WebUi(Protocol):
    """The web UI's files and JSON API (analysis/web/ `WebUi`, given by the composition root)."""

    def asset(self, path: str) -> tuple[bytes, str] | None:
        """A file's bytes and content type, or None."""
        ...

    def endpoint(self, name: str) -> Callable[[Any, dict[str, list[str]]], tuple[int, bytes]] | None:
        """The handler of `GET /_llmtap/api/<name>`: given a query function and the parameters, run in
        an admin SQL thread; its status and JSON."""
        ...


@dataclass
class AppState:
    config: ServeConfig
    routes: RouteTable
    store: Store | None = None  # None when not recording
    report: Callable[[str], None] = stderr_line
    admin_token: str = field(default="", repr=False)  # the admin endpoint's secret (config.admin_token)
    client_key: str | None = field(default=None, repr=False)  # what clients present where a route injects a key
    guard: Guard = field(default_factory=lambda: Guard.build((), (), remote=False))  # web pages, Host names
    metrics: PrometheusMetrics | None = None  # served at GET /_llmtap/metrics (a worker has none)
    loop_lag: LoopLag = field(default_factory=LoopLag)
    fast: FastPaths = field(default_factory=probe)  # which fast paths run (proxy/relay/fast_paths.py)
    admin_relay: AdminForward | None = None  # in a worker: its /_llmtap/ requests go to the primary
    admin_sql: AdminSql | None = None  # the admin endpoint's query threads (with a store)
    recorder: Recorder = field(init=False)  # every request's life: meters, in flight, rows to the observers
    body_budget: BodyBudget = field(init=False)  # request bodies in memory, all requests together
    upstream_session: aiohttp.ClientSession | None = field(default=None, init=False, repr=False)  # `open_session`
    workers: WorkerHealth | None = field(default=None, init=False)  # a primary's, while they run (`attach_workers`)
    ui: WebUi | None = None  # the web UI, from the composition root (analysis/web/); None: no UI
    telemetry_token: str = field(default="", repr=False)  # what the agents' OTLP exports carry (proxy/relay/otlp.py)
    agent_decoder: Decoder = field(default_factory=Decoder)  # decodes them, in a process of its own
    ui_tickets: Tickets = field(default_factory=Tickets)  # `llmtap ui`'s one-time logins (proxy/relay/ui_doors.py)

    def __post_init__(self) -> None:
        self.recorder = Recorder(self.config, self.report)
        self.recorder.secrets = tuple(s for s in (self.client_key, *(r.credential for r in self.routes.routes)) if s)
        self.body_budget = BodyBudget(self.config.body_memory_bytes)
        if not self.config.quiet:
            self.recorder.observe(log_observer(self.report))

    @property
    def session(self) -> aiohttp.ClientSession:
        """The upstream session: one per app, opened at its start (`open_session`)."""
        if self.upstream_session is None:
            raise RuntimeError("the upstream session opens with the app (proxy/relay/app.py)")
        return self.upstream_session

    def open_session(self, session: aiohttp.ClientSession) -> None:
        """The app started (its cleanup context): its upstream session, closed with it."""
        self.upstream_session = session

    def attach_workers(self, workers: WorkerHealth | None) -> None:
        """A primary's workers are running (None: they stopped): health lists them."""
        self.workers = workers

    @property
    def requests_seen(self) -> int:
        return self.recorder.requests_seen


STATE = web.AppKey("llmtap_state", AppState)
