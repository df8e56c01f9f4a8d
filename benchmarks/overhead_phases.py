"""The phases of benchmarks/overhead.py, each run against one target at a time."""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import overhead_procs as procs_mod
from overhead_client import (Probe, ProbeFailed, Streams, hold_streams, parse_wrk, run_steady, run_streams,
                             sim_headers, write_wrk_script)
from overhead_procs import BenchError, Procs, cpu_seconds, cpu_times, rss_kib, tree
from overhead_report import AGAINST, CADDY, DIRECT, LLMTAP, NGINX, RELAY, percentile

CLIENT = str(Path(__file__).resolve().parent / "overhead_client.py")


@dataclass
class Params:
    rounds: int = 5
    streams: int = 64  # concurrent streams
    per_worker: int = 3  # streams each concurrent worker runs in turn
    single_streams: int = 20  # 1-stream TTFT samples per round
    single_tokens: int = 10  # TTFT does not depend on the length: short streams, more samples
    ttft_ms: float = 200
    itl_ms: float = 20
    tokens: int = 100
    connections: int = 256
    warmup_s: float = 1.0
    seconds: float = 5.0
    open_streams: int = 1000
    rss_itl_ms: float = 1000  # the open streams' pace: slow, so they stay open
    idle_s: float = 2.0
    tail_s: float = 1.5  # after a phase: the store's next flush lands in the CPU window
    settle_s: float = 1.0
    page: bool = False  # also time the concurrent streams with and without a web UI page's live feed open


QUICK = Params(rounds=1, streams=4, per_worker=3, single_streams=3, single_tokens=5, ttft_ms=20, itl_ms=2,
               tokens=20, connections=16, warmup_s=0.3, seconds=1.0, open_streams=20, rss_itl_ms=200,
               idle_s=0.3, tail_s=0.3, settle_s=0.2)


@dataclass
class Target:
    name: str
    url: str
    pid: int | None = None  # the relay's process (None: direct)
    health: bool = False

    def pids(self) -> list[int]:
        return tree(self.pid) if self.pid else []


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Bench:
    def __init__(self, p: Params, procs: Procs, runner: asyncio.Runner, cpus: tuple[int | None, int | None],
                 loader: str) -> None:
        self.p, self.procs, self.runner, self.loader = p, procs, runner, loader
        self.load_cpu, self.proxy_cpu = cpus
        self.upstream = ""
        self.targets: dict[str, Target] = {}
        self.probe_priority: str | None = None  # the health probe's scheduling: fifo or normal
        self.page_order: list[tuple[bool, bool]] = []  # --page: which stretch ran first, per round
        self.against: Path | None = None
        self.warm = sim_headers(0, 0, 1)

    def start(self, nginx: bool, against: Path | None = None, caddy: bool = False) -> None:
        """Every target; `against`: a source tree whose llmtap (measuring) is one more target."""
        p = self.p
        self.against = against
        self.upstream = procs_mod.start_upstream(self.procs, self.load_cpu, p.ttft_ms, p.itl_ms, p.tokens)
        self.targets[DIRECT] = Target(DIRECT, self.upstream)
        for name, measure in ((LLMTAP, True), (RELAY, False), *(((AGAINST, True),) if against else ())):
            proc, url = procs_mod.start_serve(self.procs, name, self.proxy_cpu, self.upstream, measure=measure,
                                              source=against if name == AGAINST else None)
            self.targets[name] = Target(name, url, proc.pid, health=True)
        if nginx:
            proc, url = procs_mod.start_nginx(self.procs, self.proxy_cpu, self.upstream)
            self.targets[NGINX] = Target(NGINX, url, proc.pid, health=True)
        if caddy:
            proc, url = procs_mod.start_caddy(self.procs, self.proxy_cpu, self.upstream)
            self.targets[CADDY] = Target(CADDY, url, proc.pid, health=True)
        for target in self.targets.values():
            self.runner.run(run_streams(target.url, 4, 2, self.warm, self.warm))

    def round(self, index: int) -> dict[str, dict[str, Any]]:
        names = list(self.targets)
        order = names[index % len(names):] + names[:index % len(names)]
        values: dict[str, dict[str, Any]] = {name: {} for name in order}
        for phase in (self.single, self.concurrent, self.saturation):
            for name in order:
                values[name].update(phase(self.targets[name]))
        for name in [n for n in order if n in (LLMTAP, RELAY, AGAINST)]:
            values[name].update(self.rss(name, measure=name != RELAY, index=index))
        return values

    def single(self, target: Target) -> dict[str, Any]:
        p = self.p
        s = self.runner.run(run_streams(target.url, 1, p.single_streams,
                                        sim_headers(p.ttft_ms, p.itl_ms, p.single_tokens), self.warm))
        return {"ttft_p50_ms_single": percentile(s.ttft_ms, 50), "ttft_p99_ms_single": percentile(s.ttft_ms, 99),
                "single_errors": s.errors}

    def concurrent(self, target: Target) -> dict[str, Any]:
        p = self.p
        probe = self._probe(target) if target.health else None
        window: dict[str, float] = {}

        def started() -> None:
            window["user"], window["sys"] = cpu_times(target.pids())
            window["t"] = time.perf_counter()

        def mark() -> None:  # the probe's segments: idle, warm-up and lead-in, steady, the rest
            if probe is not None:
                probe.mark()

        try:
            if probe is not None:
                cpu0, t0 = cpu_seconds(target.pids()), time.perf_counter()
                time.sleep(p.idle_s)
                window["probe_rate"] = (cpu_seconds(target.pids()) - cpu0) / (time.perf_counter() - t0)
                probe.mark()
            s: Streams = self.runner.run(run_steady(target.url, p.streams, p.per_worker,
                                                    (p.ttft_ms, p.itl_ms, p.tokens), self.warm, started,
                                                    mark, mark))
            segments = probe.stop() if probe is not None else None
            self.probe_priority = probe.priority if probe is not None else self.probe_priority
            window["probe_s"] = time.perf_counter() - window["t"] if probe is not None else 0.0
        finally:
            if probe is not None:
                self.procs.stop(probe.proc)
        time.sleep(p.tail_s)
        out: dict[str, Any] = {
            "ttft_p50_ms_concurrent": percentile(s.ttft_ms, 50), "ttft_p99_ms_concurrent": percentile(s.ttft_ms, 99),
            "itl_p50_ms_concurrent": percentile(s.gaps_ms, 50), "itl_p99_ms_concurrent": percentile(s.gaps_ms, 99),
            "events_relayed": s.events, "concurrent_errors": s.errors,
        }
        if target.pid:
            user, system = cpu_times(target.pids())
            per_chunk = 1e6 / max(1, s.events)
            total = user + system - window["user"] - window["sys"]
            # The health probe's own cost, at its idle rate, is not the relaying's.
            probe_cpu = window.get("probe_rate", 0.0) * window["probe_s"]
            out.update(cpu_us_per_chunk=(total - probe_cpu) * per_chunk, cpu_us_per_chunk_with_probe=total * per_chunk,
                       cpu_user_us_per_chunk=(user - window["user"]) * per_chunk,
                       cpu_sys_us_per_chunk=(system - window["sys"]) * per_chunk,
                       probe_cpu_pct_idle=window.get("probe_rate", 0.0) * 100)
        if target.name in (LLMTAP, RELAY):
            out.update(_inproxy_lag(target.url))
        if p.page and target.name == LLMTAP and target.pid:
            out.update(self._page_cost(target))
        if segments is not None:
            idle = segments[0]
            # the timed streams' stretch; a run too short to sample it falls back to the whole phase
            load = segments[2] if len(segments) > 2 and segments[2] else [x for seg in segments[1:] for x in seg]
            out.update(health_p50_idle_ms=percentile(idle, 50), health_p99_idle_ms=percentile(idle, 99),
                       health_p99_load_ms=percentile(load, 99), health_max_load_ms=max(load, default=math.nan),
                       loop_lag_p99_ms=percentile(load, 99) - percentile(idle, 50))
        return out

    def _page_cost(self, target: Target) -> dict[str, Any]:
        """The concurrent streams twice more, without and with what the web UI's Live page holds open
        (`GET /_llmtap/live`, one batched tick every 250 ms, read by a separate process), in turn
        order from round to round: the relay's CPU per relayed event each time, and their ratio."""
        p = self.p
        order = (False, True) if len(self.page_order) % 2 == 0 else (True, False)
        self.page_order.append(order)
        found: dict[str, float] = {}
        for with_page in order:
            viewer = None
            if with_page:
                viewer = self.procs.start(f"viewer-{target.name}", [sys.executable, CLIENT, "live", target.url
                                                                    + "/_llmtap/live", procs_mod.ADMIN_TOKEN],
                                          self.load_cpu, pipe=True)
                if viewer.stdout.readline().strip() != "ready":
                    raise BenchError(f"the live viewer did not start:\n{self.procs.log_tail(f'viewer-{target.name}')}")
            window: dict[str, float] = {}

            def started(window: dict[str, float] = window) -> None:
                window["cpu"] = cpu_seconds(target.pids())

            try:
                s: Streams = self.runner.run(run_steady(target.url, p.streams, p.per_worker,
                                                        (p.ttft_ms, p.itl_ms, p.tokens), self.warm, started,
                                                        lambda: None, lambda: None))
                used = cpu_seconds(target.pids()) - window["cpu"]
            finally:
                if viewer is not None:
                    ticks = _stop_viewer(viewer)
                    self.procs.stop(viewer)
            key = "cpu_us_per_chunk_page" if with_page else "cpu_us_per_chunk_nopage"
            found[key] = used * 1e6 / max(1, s.events)
            if with_page:
                found["page_ticks"] = ticks
            time.sleep(p.tail_s)
        found["page_cpu_ratio"] = found["cpu_us_per_chunk_page"] / found["cpu_us_per_chunk_nopage"]
        return found

    def _probe(self, target: Target) -> Probe:
        proc = self.procs.start(f"probe-{target.name}", [sys.executable, CLIENT, "probe", target.url + "/_llmtap/health",
                                                          "600", procs_mod.ADMIN_TOKEN], self.load_cpu, pipe=True)
        try:
            return Probe(proc)
        except ProbeFailed as exc:
            self.procs.stop(proc)
            raise BenchError(f"{exc}:\n{self.procs.log_tail(f'probe-{target.name}')}") from None

    def saturation(self, target: Target) -> dict[str, Any]:
        p = self.p
        headers = sim_headers(0, 0, 16)
        if self.loader == "wrk":
            script = write_wrk_script(self.procs.workdir / "post.lua", headers)
            wrk = lambda seconds: [shutil.which("wrk"), "-t1", f"-c{p.connections}", f"-d{seconds}s",  # noqa: E731
                                   "--timeout", "10s", "-s", str(script), target.url + "/v1/chat/completions"]
            self._run("wrk", wrk(max(1, round(p.warmup_s))), p.warmup_s + 30)
            cpu0, t0 = cpu_times(target.pids()), time.perf_counter()
            result = parse_wrk(self._run("wrk", wrk(max(1, round(p.seconds))), p.seconds + 30))
        else:
            argv = [sys.executable, CLIENT, "load", target.url, str(p.connections), str(p.warmup_s), str(p.seconds),
                    json.dumps(headers)]
            proc = self.procs.start("loader", argv, self.load_cpu, pipe=True)
            try:
                if proc.stdout.readline().strip() != "go":  # its start-up and warm-up are over
                    raise BenchError(f"the load generator failed:\n{self.procs.log_tail('loader')}")
                cpu0, t0 = cpu_times(target.pids()), time.perf_counter()
                out, _ = proc.communicate(timeout=p.seconds + p.warmup_s + 60)
            finally:
                self.procs.stop(proc)
            result = json.loads(out.strip().splitlines()[-1])
        elapsed = time.perf_counter() - t0
        out = {"saturation_rps": result["rps"], "saturation_errors": result["errors"],
               "saturation_p99_ms": result["p99_ms"]}
        if target.pid:
            user, system = cpu_times(target.pids())
            out["saturation_user_pct"] = (user - cpu0[0]) / elapsed * 100
            out["saturation_sys_pct"] = (system - cpu0[1]) / elapsed * 100
            out["saturation_cpu_pct"] = out["saturation_user_pct"] + out["saturation_sys_pct"]
        time.sleep(self.p.tail_s)
        return out

    def _run(self, name: str, argv: list[str], timeout: float) -> str:
        proc = self.procs.start(name, argv, self.load_cpu, pipe=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        finally:
            self.procs.stop(proc)
        if proc.returncode != 0:
            raise BenchError(f"{name} failed ({proc.returncode}):\n{out}\n{self.procs.log_tail(name)}")
        return out

    def rss(self, name: str, *, measure: bool, index: int) -> dict[str, Any]:
        p = self.p
        label = f"{name}-rss{index}"
        proc, url = procs_mod.start_serve(self.procs, label, self.proxy_cpu, self.upstream, measure=measure,
                                          source=self.against if name == AGAINST else None)
        try:
            self.runner.run(run_streams(url, 8, 2, self.warm, self.warm))
            time.sleep(p.tail_s)
            idle = rss_kib(proc.pid)
            opened, full = self.runner.run(hold_streams(url, p.open_streams, sim_headers(0, p.rss_itl_ms, 1000),
                                                        lambda: rss_kib(proc.pid), settle_s=p.settle_s))
        finally:
            self.procs.stop(proc)
            shutil.rmtree(self.procs.workdir / label, ignore_errors=True)
        if opened < p.open_streams:
            log(f"  rss: only {opened} of {p.open_streams} streams opened")
        return {"rss_idle_kib": idle, "rss_open_kib": full, "open_streams": opened,
                "rss_kib_per_stream": (full - idle) / opened if opened else math.nan}


def _stop_viewer(viewer: Any) -> int:
    """Tell the live viewer to stop; the ticks it read."""
    try:
        viewer.stdin.write("stop\n")
        viewer.stdin.flush()
        out, _ = viewer.communicate(timeout=30)
        return int(out.strip().splitlines()[-1])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return -1


def _inproxy_lag(url: str) -> dict[str, float]:
    """The proxy's own timer-lag probe (rolling window of the last minute) from its health answer."""
    try:
        request = urllib.request.Request(url + "/_llmtap/health", headers=procs_mod.ADMIN_HEADERS)
        with urllib.request.urlopen(request, timeout=5) as resp:
            lag = json.loads(resp.read()).get("event_loop_lag") or {}
    except (OSError, ValueError):
        return {}
    return {"inproxy_lag_p99_ms": lag["p99_ms"]} if isinstance(lag.get("p99_ms"), (int, float)) else {}
