"""`llmtap serve` from start to stop: the proxy, its worker processes with `--workers`, the state
file that `status`, `sql` and `top` find it by, and a clean stop on SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any, Callable

from proxy.common import instances as running
from proxy.common.terminal_text import stderr_line
from proxy.record.store_reader import QuerySetup
from proxy.relay.app import routes_banner
from proxy.serve.server import RunningProxy, remote_warning, tune_runtime, write_state
from proxy.serve.workers import Workers
from proxy.settings.config import ServeConfig


async def serve_forever(config: ServeConfig, report: Callable[[str], None] = stderr_line,
                        query_setup: QuerySetup | None = None, workers: int = 1, ui: Any = None) -> None:
    """Serve until SIGINT or SIGTERM, then stop cleanly: in-flight rows and the queue are flushed.

    `workers` N > 1: this process (the primary) relays too, and starts N - 1 worker processes
    listening on the same addresses (SO_REUSEPORT), which send it their rows (proxy/serve/workers.py).
    `ui`: the web UI (analysis/web/, given by the composition root), served by this process."""
    running.remove_stale_sockets()  # those of primaries of `serve --workers` killed before their stop
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with RunningProxy(config, report=report, query_setup=query_setup, reuse_port=workers > 1,
                            ui=ui) as proxy:
        tune_runtime()
        pool: Workers | None = None
        state_file: Path | None = None
        if workers > 1:
            pool = Workers(proxy, workers - 1,
                           on_change=lambda pids: write_state(proxy, pids) if state_file is not None else None)
            try:
                await pool.start()
            except BaseException:
                await pool.stop()
                raise
        state_file = write_state(proxy, pool.pids() if pool is not None else None)
        report(routes_banner(proxy.state, proxy.url))
        if len(proxy.listening) > 1:
            report(f"  (on {' and '.join(proxy.listening)}, port {proxy.port})")
        if warning := remote_warning(config):
            report(warning)
        if note := proxy.state.fast.refusal_note():
            report(note)
        if pool is not None:
            report(f"  {workers} processes: this one (pid {os.getpid()}, the database) and workers "
                   f"{', '.join(map(str, pool.pids()))}")
        if proxy.store is not None:
            report(f"recording to {config.db_path}  (query it: llmtap sql \"SELECT * FROM requests\")")
        spilled = asyncio.create_task(_load_spills(proxy, report)) if proxy.store is not None else None
        try:
            await stop.wait()
        finally:
            if spilled is not None:
                spilled.cancel()
            report("llmtap: stopping, flushing rows ...")
            running.clear_state(state_file)
            if pool is not None:  # the workers' last rows reach the store before it closes
                await asyncio.gather(pool.stop(), proxy.stop_serving())
    report("llmtap: stopped")


async def _load_spills(proxy: RunningProxy, report: Callable[[str], None]) -> None:
    """The rows workers kept when their primary died (proxy/serve/spill.py): at the start, then every RESCAN_S
    (a worker of the primary that died may still be finishing its requests as this one starts)."""
    from proxy.serve import spill

    loop = asyncio.get_running_loop()
    while True:
        await loop.run_in_executor(None, spill.load, proxy.store, proxy.config.db_path, report)
        await asyncio.sleep(spill.RESCAN_S)
