"""`llmtap serve --workers N`: N processes relay and measure; one of them writes the database.

The process `serve` started stays the **primary**: it relays too, and alone owns the DuckDB file
(the Store), the admin endpoint's SQL, Prometheus, OpenTelemetry, the live feed of `llmtap top`
and the state file. It spawns N - 1 **workers** (`python -m proxy.serve.workers FD`: a fresh
interpreter, never a fork of a process that has DuckDB's and the store's threads and an event
loop). Every process listens on the same addresses and port with SO_REUSEPORT, so the kernel
spreads new connections over them (by a hash of the connection's addresses and ports; a
connection stays in the process that accepted it). Linux lets only sockets of the same user
share a port so; and a fixed port some process already listens on stops the start, as without
--workers (`server._refuse_taken`).

A worker relays and meters exactly as `serve` does (its own Recorder builds each finished
request's row and chunk rows), but it has no Store and opens no database: its one observer,
`Shipper`, sends the finished requests in batches to the primary over a socketpair the primary
made and the worker inherited (proxy/serve/row_channel.py: no name, no address, nobody else can
connect or inject rows). The primary hands them to its own recorder's observers (`Recorder.
deliver`): the store, metrics, OpenTelemetry, the live feed and the stderr line see every
worker's rows as their own. One database, one writer process: DuckDB allows a single writer,
and per-worker files would make `sql`, `report`, the admin SQL and retention read several files
for every query; the channel costs the primary an unpickling per row instead.

Admin requests (`/_llmtap/...`) that reach a worker are checked there by the same rules and token
(admin.allowed), then relayed to the primary over its private Unix socket, in the 0700 run
directory (or a 0700 temporary directory when that path is too long for a socket), which checks
again that the peer is this user's process (SO_PEERCRED) and carries the token. So `llmtap sql`,
`top`'s live feed, health and metrics answer alike on whichever process takes the connection,
and describe the whole gateway; health's `event_loop_lag` is the primary's, and its `workers`
list gives each worker's own (from its heartbeat).

Stopping: SIGTERM or SIGINT to the primary sends `stop` to every worker; a worker stops listening,
lets its requests end (as `serve` does, up to its shutdown timeout), ships its last rows and says
`bye`; the primary writes them, then closes the store. Workers ignore SIGINT (a terminal's Ctrl-C
reaches the primary, which stops them in order); SIGTERM sent to a worker itself stops it cleanly
too (its rows shipped), and the primary starts another in its place. A worker that dies
(SIGKILL, a crash) loses what it had not shipped: the rows of its requests in flight and of
those ended in its last few milliseconds; its clients' connections are cut. The primary says so
on stderr and starts another, at most once every `RESTART_BACKOFF_S` while they die young.
When the primary dies, its workers see the channel close and stop as on `stop`: their requests
in flight end, and their rows, with nobody to send them to, go to a spill file in the run
directory that the next primary on the same database writes (proxy/serve/spill.py).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import aiohttp
from aiohttp import web
from yarl import URL

from proxy.relay import admin
from proxy.common import instances as running
from proxy.common import latency
from proxy.serve import spill
from proxy.record.recorder import Finished
from proxy.serve.row_channel import Channel
from proxy.common.event_loop import run
from proxy.serve.server import RunningProxy, tune_runtime
from proxy.common.terminal_text import stderr_line

SHIP_DELAY_S = latency.SHIP_DELAY_S  # the longest a finished request waits in a worker before it is sent
SHIP_BATCH = 512  # requests per message at most
MAX_UNSENT_BYTES = 64 * 1024 * 1024  # the channel's backlog past which a worker drops rows (counted)
BEAT_S = 1.0
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0  # a worker's requests get the server's shutdown timeout (5 s); then its last rows
RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)
YOUNG_S = 10.0  # a worker that dies younger than this is restarted after the next backoff step
RELAYED_HEADERS = ("Content-Type", "Cache-Control", "Location", "Content-Security-Policy",
                   "X-Content-Type-Options", "X-Frame-Options", "Referrer-Policy", "Cross-Origin-Resource-Policy",
                   "Cross-Origin-Opener-Policy")
VIA_HEADER = "X-Llmtap-Worker"  # on admin answers a worker relayed from the primary: the worker's index
SOCKET_PATH_MAX = 100  # sun_path is 108 bytes on Linux, 104 on macOS


# -- the primary's side -----------------------------------------------------------------------------


@dataclass
class WorkerProcess:
    index: int  # 1 .. N-1 (0 is the primary)
    proc: subprocess.Popen[bytes] | None = None
    channel: Channel | None = None
    task: asyncio.Task[None] | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    started: float = 0.0  # monotonic
    rows: int = 0  # finished requests received from it, over all its lives
    restarts: int = 0
    beat: dict[str, Any] = field(default_factory=dict)
    said_bye: bool = False

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None


class Workers:
    """The primary's supervisor of its N - 1 workers."""

    def __init__(self, proxy: RunningProxy, count: int, on_change: Callable[[list[int]], Any] | None = None,
                 report: Callable[[str], None] | None = None) -> None:
        self.proxy, self.count = proxy, count
        self.state = proxy.state
        self.report = report or self.state.report
        self.on_change = on_change
        self.workers = [WorkerProcess(i + 1) for i in range(count)]
        self.stopping = False
        self._admin_runner: web.AppRunner | None = None
        self._admin_dir: Path | None = None  # a temporary directory of ours, removed at stop
        self.admin_path: Path | None = None
        self._restarts: set[asyncio.Task[None]] = set()

    def pids(self) -> list[int]:
        return [w.pid for w in self.workers if w.pid is not None]

    def health(self) -> list[dict[str, Any]]:
        """Each process's share: the primary's own requests, then each worker's (with its own loop lag)."""
        own = self.state.requests_seen - sum(w.rows for w in self.workers)
        out: list[dict[str, Any]] = [{"index": 0, "pid": os.getpid(), "role": "primary", "requests": own}]
        for w in self.workers:
            out.append({"index": w.index, "pid": w.pid, "role": "worker", "alive": w.ready.is_set(),
                        "requests": w.rows, "restarts": w.restarts,
                        "inflight": w.beat.get("inflight"), "rows_dropped": w.beat.get("dropped", 0),
                        "event_loop_lag": w.beat.get("loop_lag")})
        return out

    async def start(self) -> None:
        await self._serve_admin()
        for w in self.workers:
            await self._spawn(w)
        for w in self.workers:
            await self._wait_ready(w)
        self.state.attach_workers(self)

    async def _serve_admin(self) -> None:
        directory = running.private_dir()
        path = directory / f"{self.proxy.port}.{os.getpid()}.sock"
        if len(os.fsencode(path)) > SOCKET_PATH_MAX:
            self._admin_dir = Path(tempfile.mkdtemp(prefix="llmtap-"))  # 0700, a name nobody could take first
            path = self._admin_dir / "admin.sock"
        path.unlink(missing_ok=True)
        runner = web.AppRunner(admin.private_app(self.state), access_log=None, handler_cancellation=True,
                               shutdown_timeout=2.0, auto_decompress=False)  # an OTLP export's gzip: the decoder's
        await runner.setup()
        await web.UnixSite(runner, str(path)).start()
        os.chmod(path, 0o600)
        self._admin_runner, self.admin_path = runner, path

    def _init(self, w: WorkerProcess) -> dict[str, Any]:
        proxy = self.proxy
        config = replace(proxy.config, host=list(proxy.listening), port=proxy.port)
        return {"index": w.index, "config": config, "admin_token": self.state.admin_token,
                "client_key": self.state.client_key, "admin_socket": str(self.admin_path)}

    async def _spawn(self, w: WorkerProcess) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        package_root = str(Path(__file__).resolve().parent.parent)  # this llmtap, whatever the cwd holds
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
        try:
            w.proc = subprocess.Popen([sys.executable, "-P", "-m", "proxy.serve.workers", str(theirs.fileno())],
                                      pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=env)
        finally:
            theirs.close()
        w.started = time.monotonic()
        w.ready.clear()
        w.said_bye = False
        w.channel = await Channel.open(ours)
        w.channel.send(("init", self._init(w)))
        w.task = asyncio.create_task(self._serve(w, w.channel, w.proc))

    async def _wait_ready(self, w: WorkerProcess) -> None:
        assert w.task is not None
        ready = asyncio.create_task(w.ready.wait())
        done, _ = await asyncio.wait({ready, w.task}, timeout=READY_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        if not w.ready.is_set():
            raise OSError(f"worker {w.index} of serve --workers did not start (see its message above)")

    async def _serve(self, w: WorkerProcess, channel: Channel, proc: subprocess.Popen[bytes]) -> None:
        """Everything one life of a worker sends, until its channel closes; then its exit."""
        deliver = self.state.recorder.deliver
        try:
            while (message := await channel.receive()) is not None:
                kind = message[0]
                if kind == "rows":
                    for row, chunks, body in message[1]:
                        deliver(Finished(row, chunks, body))
                    w.rows += len(message[1])
                elif kind == "beat":
                    w.beat = message[1]
                elif kind == "ready":
                    w.ready.set()
                elif kind == "bye":
                    w.said_bye = True
        finally:
            w.ready.clear()
            await channel.close()
            code = await asyncio.get_running_loop().run_in_executor(None, _reap, proc)
        if self.stopping:
            return
        how = f"exited with code {code}" if code is None or code >= 0 else f"was killed by signal {-code}"
        lost = ("its last rows were delivered" if w.said_bye else
                "the rows of its requests in flight (and of those ended in its last milliseconds) are lost, "
                "its clients' connections cut")
        self.report(f"llmtap: worker {w.index} (pid {proc.pid}) {how}: {lost}; starting another")
        task = asyncio.create_task(self._restart(w))
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)

    async def _restart(self, w: WorkerProcess) -> None:
        young = time.monotonic() - w.started < YOUNG_S
        step = min(w.restarts, len(RESTART_BACKOFF_S) - 1) if young else 0
        await asyncio.sleep(RESTART_BACKOFF_S[step] if young else 0.0)
        if self.stopping:
            return
        w.restarts += 1
        try:
            await self._spawn(w)
            await self._wait_ready(w)
        except OSError as exc:
            self.report(f"llmtap: {exc}")
            return  # its _serve, ending, schedules the next attempt
        if self.on_change is not None:
            self.on_change(self.pids())

    async def stop(self) -> None:
        """Each worker stops listening, ends its requests, ships its last rows; then the private socket closes."""
        self.stopping = True
        for task in list(self._restarts):
            task.cancel()
        for w in self.workers:
            if w.channel is not None:
                w.channel.send(("stop",))
        tasks = [w.task for w in self.workers if w.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=STOP_TIMEOUT_S)
            for w in self.workers:
                if w.task in pending and w.proc is not None:
                    self.report(f"llmtap: worker {w.index} (pid {w.pid}) did not stop in {STOP_TIMEOUT_S:.0f} s: killed")
                    w.proc.kill()
            if pending:
                await asyncio.wait(pending, timeout=5.0)
        self.state.attach_workers(None)
        if self._admin_runner is not None:
            await self._admin_runner.cleanup()
            self._admin_runner = None
        if self.admin_path is not None:
            self.admin_path.unlink(missing_ok=True)
        if self._admin_dir is not None:
            shutil.rmtree(self._admin_dir, ignore_errors=True)


def _reap(proc: subprocess.Popen[bytes]) -> int | None:
    try:
        return proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


# -- the worker's side ------------------------------------------------------------------------------


class Shipper:
    """A worker's observer: finished requests, sent to the primary in batches (one per loop
    iteration of the recorder's batch, at most `SHIP_DELAY_S` later)."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.pending: list[tuple[Any, ...]] = []
        self.dropped = 0
        self.shipped = 0
        self.held: spill.Held | None = None  # the primary is gone: rows kept for a spill file
        self._timer: asyncio.TimerHandle | None = None

    def __call__(self, finished: Finished) -> None:
        self.pending.append((finished.row, finished.chunks, finished.body))
        if len(self.pending) >= SHIP_BATCH:
            self.flush()
        elif self._timer is None:
            try:
                self._timer = asyncio.get_running_loop().call_later(SHIP_DELAY_S, self.flush)
            except RuntimeError:
                self.flush()

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self.pending = self.pending, []
        if not batch:
            return
        if self.held is not None or self.channel.writer.is_closing():
            self.orphan()
            assert self.held is not None
            self.held.add(batch)
        elif self.channel.buffered() > MAX_UNSENT_BYTES or not self.channel.send(("rows", batch)):
            self.dropped += len(batch)  # the primary does not keep up: bounded, counted
        else:
            self.shipped += len(batch)

    def orphan(self) -> None:
        """The primary is gone: from now on rows are held, for a spill file (proxy/serve/spill.py)."""
        if self.held is None:
            self.held = spill.Held()

    def spill_held(self, db: Path, report: Callable[[str], None]) -> None:
        """Write the held rows to a spill file that the next primary on `db` writes to the database."""
        held = self.held
        if held is None or not (held.rows or held.dropped):
            return
        dropped = f"; {held.dropped} more dropped (over {spill.MAX_HELD:,})" if held.dropped else ""
        try:
            path = spill.write(held.rows, db) if held.rows else None
        except OSError as exc:
            report(f"llmtap: the primary is gone and {len(held.rows)} request row(s) cannot be kept: {exc}")
            return
        report(f"llmtap: the primary is gone: kept {len(held.rows)} request row(s) in {path}{dropped}; "
               "the next llmtap serve on this database writes them")


class AdminRelay:
    """A worker's /_llmtap/ requests (already allowed by admin.handle), answered by the primary."""

    def __init__(self, socket_path: str, token: str, index: int) -> None:
        self.socket_path, self.token, self.index = socket_path, token, index
        self.session: aiohttp.ClientSession | None = None

    async def __call__(self, request: web.Request, name: str, body: bytes | None = None) -> web.StreamResponse:
        if self.session is None:
            self.session = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=self.socket_path),
                                                 timeout=aiohttp.ClientTimeout(total=None, sock_connect=5))
        headers = {running.TOKEN_HEADER: self.token}  # allowed here (token, or the UI's cookie or login)
        for name_ in ("Content-Type", "Content-Encoding"):  # an OTLP export's too (proxy/relay/otlp.py)
            if value := request.headers.get(name_):
                headers[name_] = value
        # the path as it was checked (encoded as sent, never normalised on the way: proxy/relay/app.py)
        url = URL.build(scheme="http", host="llmtap-primary", path=running.ADMIN_PREFIX + name,
                        query_string=request.query_string, encoded=True)
        body = await request.read() if body is None else body
        response: web.StreamResponse | None = None
        try:
            async with self.session.request(request.method, url, data=body or None, headers=headers,
                                            allow_redirects=False) as upstream:
                response = web.StreamResponse(status=upstream.status, headers={VIA_HEADER: str(self.index)})
                for header in RELAYED_HEADERS:  # the web UI's login and its page's policies too
                    for value in upstream.headers.getall(header, ()):
                        response.headers.add(header, value)
                await response.prepare(request)
                async for data in upstream.content.iter_any():
                    await response.write(data)
                await response.write_eof()
                return response
        except (aiohttp.ClientError, OSError) as exc:
            if response is not None and response.prepared:
                return response  # cut short: the primary is stopping
            return web.json_response({"error": f"llmtap worker: the primary process does not answer: {exc}"},
                                     status=503)

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None


async def _heartbeat(channel: Channel, proxy: RunningProxy, shipper: Shipper) -> None:
    state = proxy.state
    while True:
        channel.send(("beat", {"pid": os.getpid(), "requests_seen": state.requests_seen,
                               "inflight": len(state.recorder.inflight), "loop_lag": state.loop_lag.summary(),
                               "dropped": shipper.dropped}))
        await asyncio.sleep(BEAT_S)


async def worker(fd: int) -> int:
    """One worker's life: told what to serve, serve it, ship every finished request, stop when told."""
    channel = await Channel.open(socket.socket(fileno=fd))
    init = await channel.receive()
    if init is None or init[0] != "init":
        return 2
    setup = init[1]
    index = setup["index"]
    config = replace(setup["config"], quiet=True)  # the primary prints every process's request lines
    report = lambda line: stderr_line(line.replace("llmtap:", f"llmtap worker {index}:", 1))  # noqa: E731
    relay = AdminRelay(setup["admin_socket"], setup["admin_token"], index)
    proxy = RunningProxy(config, report=report, reuse_port=True,
                         worker=(setup["admin_token"], setup["client_key"]), admin_relay=relay)
    shipper = Shipper(channel)
    proxy.state.recorder.observe(shipper)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)

    async def listen_to_primary() -> None:
        while (message := await channel.receive()) is not None:
            if message[0] == "stop":
                break
        else:
            shipper.orphan()  # the primary is gone: the rows of the requests still running are held
        stop.set()  # told to, or the primary is gone

    try:
        await proxy.__aenter__()
    except OSError as exc:
        report(f"llmtap: cannot listen on port {config.port}: {exc}")
        return 1
    tune_runtime()
    channel.send(("ready", {"pid": os.getpid()}))
    tasks = [asyncio.create_task(listen_to_primary()), asyncio.create_task(_heartbeat(channel, proxy, shipper))]
    try:
        await stop.wait()
    finally:
        await relay.close()  # a relayed live feed ends now, rather than hold the stop for the shutdown timeout
        await proxy.stop_serving()  # its requests end here and are recorded
        proxy.state.recorder.record_ended()
        shipper.flush()
        shipper.spill_held(config.db_path, report)
        channel.send(("bye", {"shipped": shipper.shipped, "dropped": shipper.dropped}))
        await channel.drain()
        for task in tasks:
            task.cancel()
        await proxy.aclose()
        await channel.close()
    return 0


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the primary, which stops its workers in order
    return run(lambda: worker(int(argv[0])))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
