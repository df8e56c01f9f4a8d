"""Running the proxy: in-process for tests and the demo, or as `llmtap serve`."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import ipaddress
import socket
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from aiohttp import web

from proxy.relay import fast_paths
from proxy.common import instances as running
from proxy.record.admin_sql import AdminSql
from proxy.relay.app import HTTP_LIMITS, make_app
from proxy.relay.conn_limit import connection_cap
from proxy.relay.arrival import Runner
from proxy.settings.client_key import client_key, telemetry_token
from proxy.settings.config import ConfigError, ServeConfig, admin_token, apply_prices
from proxy.relay.guard import Guard
from proxy.meter.redact import scrub_library_logs
from proxy.common import prices
from proxy.observe.metrics import PrometheusMetrics
from proxy.observe.otel import OtelExporter, OtelSettings, OtelUnavailable
from proxy.observe.thresholds import ThresholdWatch
from proxy.settings.alerts import check_alerts
from proxy.record.recorder import on_rows, store_observer
from proxy.observe.looplag import LoopLag
from proxy.relay.app_state import AdminForward, AppState, WebUi
from proxy.common.terminal_text import stderr_line
from proxy.record.store import Store
from proxy.record.store_reader import QuerySetup


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

    def __init__(self, config: ServeConfig, *, record: bool = True, report: Callable[[str], None] = stderr_line,
                 query_setup: QuerySetup | None = None, reuse_port: bool = False,
                 worker: tuple[str, str | None] | None = None, admin_relay: AdminForward | None = None,
                 ui: WebUi | None = None) -> None:
        """`query_setup` runs on the cursor of each admin query before it (the composition root,
        proxy/cli.py, gives analysis's named views: proxy/ never imports analysis/).

        `reuse_port`: listen with SO_REUSEPORT, beside the other processes of `serve --workers N`.
        `worker`: this is one of those workers (proxy/serve/workers.py), given the primary's admin token
        and client key: it relays and measures, and its rows go to the primary, which alone has the
        database, the metrics and the exporters; `admin_relay` sends the worker's admin requests there.
        `ui`: the web UI under /_llmtap/ui/ and /_llmtap/api/ (analysis/web/, from the composition root);
        a worker has none: the primary answers its /_llmtap/ requests."""
        self.config = config
        apply_prices(config)
        self.reuse_port = reuse_port
        self.is_worker = worker is not None
        routes = config.route_table()
        self.store: Store | None = None
        if record and config.measure and worker is None:
            self.store = Store(config.db_path, flush_interval_s=config.flush_interval_s,
                               record_chunks=config.record_chunks, memory_limit_mb=config.db_memory_mb,
                               retain_days=config.retain_days, retain_bodies_days=config.retain_bodies_days,
                               report=report)
            self.store.query_setup = query_setup
        injects = any(route.credential for route in routes.routes)
        token, key = worker if worker is not None else (admin_token(config), client_key() if injects else None)
        try:
            fast = fast_paths.probe()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.admin_sql = AdminSql(config.sql_timeout_s) if self.store is not None else None
        loop_lag = LoopLag()
        metrics = None if worker is not None else PrometheusMetrics(
            store_stats=self.store.stats if self.store else None, loop_lag=loop_lag.summary)
        self.state = AppState(config=config, routes=routes, store=self.store, report=report,
                              admin_token=token, client_key=key, fast=fast, admin_sql=self.admin_sql,
                              guard=Guard.build(config.allow_origins, config.allow_hosts,
                                                remote=config.allow_remote and bool(_wide_hosts(config))),
                              metrics=metrics, loop_lag=loop_lag, admin_relay=admin_relay,
                              ui=ui if self.store is not None and worker is None else None,
                              telemetry_token=telemetry_token() if config.measure else "")
        self.otel: OtelExporter | None = None
        self.runner: web.AppRunner | None = None
        self.port = config.port
        self.listening: list[str] = []  # the addresses it listens on
        if worker is not None:
            return  # a worker's observers: its rows' shipper (proxy/serve/workers.py), nothing else
        if config.update_prices:
            prices.enable_updates()  # genai-prices' own hourly fetch: opt-in
        recorder = self.state.recorder
        if self.store is not None:
            recorder.observe(store_observer(self.store, config.record_chunks))
        if metrics is not None:
            recorder.observe(on_rows(metrics.observe))
        limits = check_alerts(config.alerts)
        if limits.window_5h_utilization is not None or limits.daily_budget_usd is not None:
            recorder.observe(on_rows(ThresholdWatch(limits, report, config.key_names).observe))
        if (otel_settings := OtelSettings.from_config(config)) is not None:
            try:
                self.otel = OtelExporter.from_settings(otel_settings, report=report)
            except OtelUnavailable as exc:
                raise ConfigError(str(exc)) from None
            recorder.observe(on_rows(self.otel.observe))

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
        raise_open_files()  # before the cap of connections is reckoned from it
        fast = self.state.fast
        self.runner = Runner(make_app(self.state), stamps=fast.on("arrival"), kernel=fast.on("kernel_stamps"),
                             auto_decompress=False, handler_cancellation=True, access_log=None, shutdown_timeout=5.0,
                             **HTTP_LIMITS, keepalive_timeout=self.config.header_timeout_s,  # the head's timeout
                             max_connections=connection_cap(self.config.max_connections))
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
        if self.reuse_port and port and not self.is_worker:  # a worker shares its primary's port
            for host, required in self.config.listen_addresses():
                _refuse_taken(host, port, required)
        for host, required in self.config.listen_addresses():
            site = web.TCPSite(self.runner, host, port, backlog=4096, reuse_address=True,  # type: ignore[arg-type]
                               reuse_port=self.reuse_port or None)
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
        return await in_own_thread(self.store.flush, timeout)

    async def stop_serving(self) -> None:
        """Stop listening; handlers still running end here, and record their requests."""
        if self.runner is not None:
            runner, self.runner = self.runner, None
            await runner.cleanup()

    async def aclose(self) -> None:
        """Admin queries are interrupted first (their handlers then end at once); the store closes in
        a thread of its own, never behind anything in the loop's default executor; then the admin
        SQL threads are waited for (AdminSql.join)."""
        if self.admin_sql is not None:
            self.admin_sql.close()
        await self.stop_serving()
        self.state.recorder.record_ended()
        if self.store is not None:
            await in_own_thread(self.store.close)
        if self.admin_sql is not None:
            await in_own_thread(self.admin_sql.join)  # none is inside DuckDB as the interpreter exits
        if self.otel is not None:
            await in_own_thread(self.otel.shutdown)
            self.otel = None


async def in_own_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args) in a new daemon thread: the shutdown path waits on nothing else's threads."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not done.done():
            done.set_result(value) if ok else done.set_exception(value)

    def target() -> None:
        try:
            result: tuple[bool, Any] = (True, fn(*args))
        except BaseException as exc:  # noqa: BLE001 - raised in the awaiting coroutine
            result = (False, exc)
        with contextlib.suppress(RuntimeError):  # the loop is closed: no one waits
            loop.call_soon_threadsafe(settle, *result)

    threading.Thread(target=target, name=f"llmtap-{getattr(fn, '__name__', 'call')}", daemon=True).start()
    return await done


def _refuse_taken(host: str, port: int, required: bool) -> None:
    """SO_REUSEPORT would let this start share a port that another process of this user listens on
    (another `serve --workers` on it): try the port without it first, so that a taken port stops
    this start as it does without --workers."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        probe = socket.socket(family, socket.SOCK_STREAM)
    except OSError:
        return
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))
    except OSError as exc:
        if required or exc.errno == errno.EADDRINUSE:
            raise
    finally:
        probe.close()


def write_state(proxy: RunningProxy, workers: list[int] | None = None) -> Path:
    db = str(proxy.config.db_path) if proxy.store is not None else None
    return running.write_state(host=proxy.config.main_host, port=proxy.port, db=db, admin_token=proxy.admin_token,
                               workers=workers)


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


def raise_open_files(want: int = 65_536) -> None:
    """Raise the soft limit of open files towards the hard one, as nginx's `worker_rlimit_nofile`
    does: a connection takes two descriptors while its next request is read with the kernel's stamp
    (proxy/relay/kernel_timing.py), and many Linux logins start at a soft 1,024."""
    try:
        import resource
    except ImportError:  # not POSIX
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass
