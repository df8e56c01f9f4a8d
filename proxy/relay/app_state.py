"""What every request handler shares: config, routes, the upstream session, the recorder, and the
checks made before relaying (the guard, the admin token, the client key)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import aiohttp
from aiohttp import web

from proxy.relay.body_budget import BodyBudget
from proxy.settings.config import ServeConfig
from proxy.relay.fast_paths import FastPaths, probe
from proxy.relay.guard import Guard
from proxy.relay.ui_doors import Tickets
from proxy.observe.looplag import LoopLag
from proxy.record.recorder import Recorder, log_observer
from proxy.settings.routes import RouteTable
from proxy.common.terminal_text import stderr_line


@dataclass
class ProxyState:
    config: ServeConfig
    routes: RouteTable
    store: Any = None  # proxy.record.store.Store, or None when not recording
    report: Callable[[str], None] = stderr_line
    admin_token: str = field(default="", repr=False)  # the admin endpoint's secret (config.admin_token)
    client_key: str | None = field(default=None, repr=False)  # what clients present where a route injects a key
    guard: Guard = field(default_factory=lambda: Guard.build((), (), remote=False))  # web pages, Host names
    session: aiohttp.ClientSession = field(init=False)
    recorder: Recorder = field(init=False)  # every request's life: meters, in flight, rows to the observers
    body_budget: BodyBudget = field(init=False)  # request bodies in memory, all requests together
    metrics: Any = None  # proxy.observe.metrics.PrometheusMetrics, served at GET /_llmtap/metrics
    loop_lag: LoopLag = field(default_factory=LoopLag)
    fast: FastPaths = field(default_factory=probe)  # which fast paths run (proxy/relay/fast_paths.py)
    # serve --workers N (proxy/serve/workers.py): the primary's supervisor of its workers (their health),
    # and in a worker the relay of /_llmtap/ requests to the primary
    workers: Any = None
    admin_relay: Any = None
    admin_sql: Any = None  # proxy.record.admin_sql.AdminSql: the admin endpoint's query threads (with a store)
    # the web UI, from the composition root (analysis/web/: .asset(path), .endpoint(name)); None: no UI
    ui: Any = None
    ui_tickets: Tickets = field(default_factory=Tickets)  # `llmtap ui`'s one-time logins (proxy/relay/ui_doors.py)

    def __post_init__(self) -> None:
        self.recorder = Recorder(self.config, self.report)
        self.body_budget = BodyBudget(self.config.body_memory_bytes)
        if not self.config.quiet:
            self.recorder.observe(log_observer(self.report))

    @property
    def requests_seen(self) -> int:
        return self.recorder.requests_seen


STATE = web.AppKey("llmtap_state", ProxyState)
