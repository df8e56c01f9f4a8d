"""Running the proxy: in-process for tests and the demo, or as `llmtap serve`."""

from __future__ import annotations

import asyncio
import gc
import ipaddress
import signal
import socket
import sys
from pathlib import Path
from typing import Any, Callable

from aiohttp import web

from . import running
from .app import HTTP_LIMITS, make_app, routes_banner
from .arrival import Runner
from .client_key import client_key
from .config import ConfigError, ServeConfig, admin_token
from .guard import Guard
from .redact import scrub_library_logs
from . import prices
from .metrics import METRICS_NAMES, PrometheusMetrics
from .otel import OtelExporter, OtelSettings, OtelUnavailable
from .recorder import on_rows, store_observer
from .relay_state import ProxyState, _stderr
from .store import QuerySetup, Store


def check_bind(config: ServeConfig) -> None:
    """Loopback unless asked otherwise: a proxy holding API keys is not for the network.

    A wider address needs `--allow-remote`. The admin endpoint always needs its token (made per
    start unless configured); remote admin clients need one they know: `--admin-token-file`.
    """
    wide = _wide_hosts(config)
    if wide and not config.allow_remote:
        raise ConfigError(
            f"refusing to listen on {', '.join(wide)}: llmtap binds loopback only unless you pass "
            "--allow-remote"
        )


def _wide_hosts(config: ServeConfig) -> list[str]:
    return [host for host, _ in config.listen_addresses() if not is_loopback_bind(host)]


def is_loopback_bind(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        try:
            return ipaddress.ip_address(host).is_loopback  # an IPv6 literal
        except ValueError:
            return False


def remote_warning(config: ServeConfig) -> str | None:
    wide = _wide_hosts(config)
    if not wide:
        return None
    return (f"llmtap: WARNING: listening on {', '.join(wide)}, reachable from other machines: anyone who can "
            "connect can send requests through it to the upstreams (and use any key it injects); "
            "the admin endpoint requires the admin token")


class RunningProxy:
    """`async with RunningProxy(config) as proxy:` serves on `proxy.url` until the block ends."""

    default_query_setup: QuerySetup | None = None  # for callers that give none (the tests give the views)

    def __init__(self, config: ServeConfig, *, record: bool = True, report: Callable[[str], None] = _stderr,
                 query_setup: QuerySetup | None = None) -> None:
        """`query_setup` runs on the cursor of each admin query before it (the composition root,
        proxy/cli.py, gives analysis's named views: proxy/ never imports analysis/)."""
        self.config = config
        routes = config.route_table()
        self.store: Store | None = None
        if record and config.measure:
            self.store = Store(config.db_path, flush_interval_s=config.flush_interval_s,
                               record_chunks=config.record_chunks, memory_limit_mb=config.db_memory_mb,
                               retain_days=config.retain_days, retain_bodies_days=config.retain_bodies_days,
                               report=report)
            self.store.query_setup = query_setup or self.default_query_setup
        injects = any(route.credential for route in routes.routes)
        self.state = ProxyState(config=config, routes=routes, store=self.store, report=report,
                                admin_token=admin_token(config), client_key=client_key() if injects else None,
                                guard=Guard.build(config.allow_origins, config.allow_hosts,
                                                  remote=config.allow_remote and bool(_wide_hosts(config))))
        if config.metrics_names not in METRICS_NAMES:
            raise ConfigError(f"metrics_names is {' or '.join(METRICS_NAMES)}, not {config.metrics_names!r}")
        if config.update_prices:
            prices.enable_updates()  # genai-prices' own hourly fetch: opt-in
        self.state.metrics = PrometheusMetrics(store_stats=self.store.stats if self.store else None,
                                               loop_lag=self.state.loop_lag.summary, names=config.metrics_names)
        recorder = self.state.recorder
        if self.store is not None:
            recorder.observe(store_observer(self.store, config.record_chunks))
        recorder.observe(on_rows(self.state.metrics.observe))
        self.otel: OtelExporter | None = None
        if (otel_settings := OtelSettings.from_config(config)) is not None:
            try:
                self.otel = OtelExporter.from_settings(otel_settings, report=report)
            except OtelUnavailable as exc:
                raise ConfigError(str(exc)) from None
            recorder.observe(on_rows(self.otel.observe))
        self.runner: web.AppRunner | None = None
        self.port = config.port
        self.listening: list[str] = []  # the addresses it listens on

    @property
    def admin_token(self) -> str:
        return self.state.admin_token

    @property
    def admin(self) -> running.AdminClient:
        """An admin client for this proxy, with its token."""
        return running.AdminClient(self.url, self.state.admin_token)

    @property
    def url(self) -> str:
        host = self.config.main_host
        return f"http://{'[' + host + ']' if ':' in host else host}:{self.port}"

    async def __aenter__(self) -> "RunningProxy":
        scrub_library_logs()
        if self.store is not None:
            self.store.start()
        self.runner = Runner(make_app(self.state), auto_decompress=False, handler_cancellation=True,
                                    access_log=None, shutdown_timeout=5.0, **HTTP_LIMITS)
        await self.runner.setup()
        try:
            await self._listen()
        except OSError:
            await self.aclose()
            raise
        return self

    async def _listen(self) -> None:
        """Each address on one port (the first's, when the port is 0). An optional one (::1 of
        "localhost") that cannot be had is left out, with a note."""
        port = self.config.port
        for host, required in self.config.listen_addresses():
            site = web.TCPSite(self.runner, host, port, backlog=4096, reuse_address=True)  # type: ignore[arg-type]
            try:
                await site.start()
            except OSError as exc:
                if required:
                    raise
                self.state.report(f"llmtap: not listening on {host} ({exc.strerror or exc})")
                continue
            self.listening.append(host)
            if port == 0:
                port = self.runner.addresses[-1][1]  # type: ignore[union-attr]
        self.port = port

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def flush(self, timeout: float = 10) -> bool:
        """Every row of a request that is over, written; False on timeout. Blocks: for tests and tools."""
        self.state.recorder.record_ended()
        return self.store.flush(timeout) if self.store is not None else True

    async def aflush(self, timeout: float = 10) -> bool:
        """`flush` without blocking the event loop: the rows are built here, the wait is in a thread."""
        self.state.recorder.record_ended()
        if self.store is None:
            return True
        return await asyncio.get_running_loop().run_in_executor(None, self.store.flush, timeout)

    async def aclose(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()  # handlers still running end here, and record their requests
            self.runner = None
        self.state.recorder.record_ended()
        if self.store is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.store.close)
        if self.otel is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.otel.shutdown)
            self.otel = None


def write_state(proxy: RunningProxy) -> Path:
    db = str(proxy.config.db_path) if proxy.store is not None else None
    return running.write_state(host=proxy.config.main_host, port=proxy.port, db=db, admin_token=proxy.admin_token)


SWITCH_INTERVAL_S = 0.0005


def tune_runtime() -> None:
    """The relay allocates many short-lived objects per chunk, and CPython's default thresholds
    then run the cyclic collector so often that it took a fifth of the event loop (py-spy).
    Freeze what startup made (it lives as long as the process) and collect young objects less
    often; memory stays bounded (see benchmarks/soak.py).

    And the store's writer thread holds the GIL while it builds a batch: with CPython's default
    switch interval (5 ms) the event loop waited up to 5 ms for it, in the middle of streams.
    At 0.5 ms a chunk waits at most about that long (benchmarks/store_throughput.py "stall")."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 50)
    sys.setswitchinterval(SWITCH_INTERVAL_S)


async def serve_forever(config: ServeConfig, report: Callable[[str], None] = _stderr,
                        query_setup: QuerySetup | None = None) -> None:
    """Serve until SIGINT or SIGTERM, then stop cleanly: in-flight rows and the queue are flushed."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with RunningProxy(config, report=report, query_setup=query_setup) as proxy:
        tune_runtime()
        state_file = write_state(proxy)
        report(routes_banner(proxy.state, proxy.url))
        if len(proxy.listening) > 1:
            report(f"  (on {' and '.join(proxy.listening)}, port {proxy.port})")
        if warning := remote_warning(config):
            report(warning)
        if proxy.store is not None:
            report(f"recording to {config.db_path}  (query it: llmtap sql \"SELECT * FROM requests\")")
        try:
            await stop.wait()
        finally:
            report("llmtap: stopping, flushing rows ...")
            running.clear_state(state_file)
    report("llmtap: stopped")


def run(coro_fn: Callable[[], Any]) -> Any:
    """Run a coroutine on uvloop where the platform has it."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.run(coro_fn())
    return uvloop.run(coro_fn())
