"""Soak: a bounded mixed load against real `llmtap serve` and `llmtap mock-upstream` processes,
sampling the proxy's memory, open file descriptors and event-loop lag, and reporting their trend.

The load mixes what a proxy meets in a day: streams of every API, non-streaming calls, gzip,
upstream errors (429), in-stream errors, upstreams that break off, clients that leave mid-stream.
Every `--interval` seconds it samples the serve process: RSS (/proc/PID/status), open fds
(/proc/PID/fd), the event-loop lag p99 from GET /_llmtap/health, and DuckDB's own buffers
(duckdb_memory(), over the admin endpoint). DuckDB caches the database it writes up to its memory
limit (serve --db-memory-mb), so the memory judged is the RSS outside DuckDB's buffers. After a
warm-up (the first fifth of the run) a least-squares line through each series gives its slope;
the run passes when none climbs by more than its tolerance over the measured window. At the end serve stops with
SIGTERM and every request the load sent must have its row.

Run:  python benchmarks/soak.py                 # 10 minutes
      python benchmarks/soak.py --minutes 5 --concurrency 32
Exit status 0: no upward trend, every row there; 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import duckdb

from proxy.common import instances as running

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository: its tests/ helpers, as a script
from tests import procfs  # noqa: E402
from tests.state_files import state_of  # noqa: E402

RSS_TOLERANCE_MB = 15.0  # over the measured window, beyond the warm-up
DUCKDB_MEMORY = "SELECT sum(memory_usage_bytes) FROM duckdb_memory()"
FD_TOLERANCE = 10
LAG_TOLERANCE_MS = 5.0


@dataclass
class Sample:
    t: float
    rss_mb: float
    duckdb_mb: float  # DuckDB's own buffers (its cache of the database): bounded by serve --db-memory-mb
    fds: int
    lag_p99_ms: float
    pending: int
    sent: int


@dataclass
class Load:
    sent: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    failures: int = 0  # client-side errors other than the ones a kind provokes on purpose


def rss_mb(pid: int) -> float:
    return procfs.rss_kib(pid) / 1024


fds = procfs.open_fds


def slope_per_min(xs: list[float], ys: list[float]) -> float:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    return 0.0 if var == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var * 60


# -- the processes -----------------------------------------------------------------------------

ADMIN_TOKEN = "llmtap-soak-admin-token"  # serve takes it from its environment
ADMIN_HEADERS = {running.TOKEN_HEADER: ADMIN_TOKEN}


def start_processes(work: Path) -> tuple[subprocess.Popen, subprocess.Popen, str, int]:
    env = {**os.environ, "LLMTAP_HOME": str(work / "home"), "LLMTAP_CONFIG": str(work / "none.toml"),
           "LLMTAP_ADMIN_TOKEN": ADMIN_TOKEN}
    mock = subprocess.Popen([sys.executable, "-m", "proxy", "mock-upstream", "--port", "0", "--ttft-ms", "30",
                             "--itl-ms", "3", "--tokens", "40"], stdout=subprocess.PIPE, text=True, env=env)
    line = mock.stdout.readline() if mock.stdout else ""
    upstream = line.strip().rsplit(" ", 1)[-1]
    if not upstream.startswith("http"):
        raise SystemExit(f"mock-upstream did not start: {line!r}")
    serve = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--port", "0", "--upstream", upstream,
                              "--db", str(work / "soak.duckdb"), "--quiet"],
                             stderr=open(work / "serve.log", "wb"), env=env)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if (state := state_of(serve.pid, work / "home")) is not None:
            return mock, serve, state.url, serve.pid
        time.sleep(0.1)
    raise SystemExit("llmtap serve did not start in 30 s: " + (work / "serve.log").read_text())


# -- the load -------------------------------------------------------------------------------------

CHAT = {"model": "sim-gpt", "stream": True, "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hello " * 50}]}
MESSAGES = {"model": "sim-claude", "stream": True, "max_tokens": 256, "messages": [{"role": "user", "content": "hi"}]}
RESPONSES = {"model": "sim-gpt", "stream": True, "input": "hi"}

# kind: (weight, path, body, extra headers)
KINDS: dict[str, tuple[int, str, dict, dict[str, str]]] = {
    "chat_stream": (30, "/v1/chat/completions", CHAT, {}),
    "messages_stream": (20, "/v1/messages", MESSAGES, {}),
    "responses_stream": (10, "/v1/responses", RESPONSES, {}),
    "chat_plain": (10, "/v1/chat/completions", {**CHAT, "stream": False}, {}),
    "gzip_stream": (8, "/v1/messages", MESSAGES, {"x-sim-gzip": "1", "Accept-Encoding": "gzip"}),
    "rate_limited": (5, "/v1/chat/completions", CHAT, {"x-sim-status": "429"}),
    "stream_error": (5, "/v1/messages", MESSAGES, {"x-sim-stream-error": "1"}),
    "upstream_breaks_off": (5, "/v1/chat/completions", CHAT, {"x-sim-disconnect-after": "5"}),
    "client_leaves": (7, "/v1/chat/completions", CHAT, {"x-sim-tokens": "400"}),
}


async def one(s: aiohttp.ClientSession, base: str, kind: str, load: Load) -> None:
    _, path, body, headers = KINDS[kind]
    tokens = {"x-sim-tokens": str(random.randint(5, 120))}
    async with s.post(base + path, json=body, headers={**tokens, **headers}) as r:
        if kind == "client_leaves":
            await r.content.readany()
            r.close()
            return
        try:
            await r.read()
        except aiohttp.ClientPayloadError:
            if kind != "upstream_breaks_off":
                raise


async def worker(s: aiohttp.ClientSession, base: str, load: Load, stop: asyncio.Event) -> None:
    kinds, weights = list(KINDS), [w for w, *_ in KINDS.values()]
    while not stop.is_set():
        kind = random.choices(kinds, weights)[0]
        load.sent += 1
        load.by_kind[kind] = load.by_kind.get(kind, 0) + 1
        try:
            await one(s, base, kind, load)
        except (aiohttp.ClientError, asyncio.TimeoutError):
            load.failures += 1


async def sample(s: aiohttp.ClientSession, base: str, pid: int, t0: float, load: Load) -> Sample:
    async with s.get(base + "/_llmtap/health", headers=ADMIN_HEADERS) as r:
        health = await r.json()
    async with s.post(base + "/_llmtap/sql", json={"sql": DUCKDB_MEMORY}, headers=ADMIN_HEADERS) as r:
        duckdb_mb = ((await r.json())["rows"][0][0] or 0) / 2**20
    lag = health["event_loop_lag"]["p99_ms"] or 0.0
    store = health.get("store") or {}
    return Sample(time.monotonic() - t0, rss_mb(pid), duckdb_mb, fds(pid), lag, store.get("pending_requests", 0),
                  load.sent)


async def soak(base: str, pid: int, seconds: float, concurrency: int, interval: float) -> tuple[list[Sample], Load]:
    load, stop, samples = Load(), asyncio.Event(), []
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as s:
        workers = [asyncio.create_task(worker(s, base, load, stop)) for _ in range(concurrency)]
        t0 = time.monotonic()
        while (now := time.monotonic() - t0) < seconds:
            samples.append(await sample(s, base, pid, t0, load))
            last = samples[-1]
            print(f"{last.t:7.0f} s  rss {last.rss_mb:6.1f} MB (duckdb {last.duckdb_mb:5.1f})  fds {last.fds:4d}  "
                  f"lag p99 {last.lag_p99_ms:6.2f} ms  "
                  f"pending {last.pending:5d}  requests {last.sent}", flush=True)
            await asyncio.sleep(min(interval, max(0.0, seconds - now)))
        stop.set()
        await asyncio.gather(*workers)
        samples.append(await sample(s, base, pid, t0, load))
    return samples, load


# -- the verdict --------------------------------------------------------------------------------------


def trends(samples: list[Sample], warmup: float) -> list[tuple[str, float, float, float, bool]]:
    """(series, slope per minute, growth over the measured window, tolerance, ok) after the warm-up."""
    kept = [x for x in samples if x.t >= warmup] or samples
    minutes = (kept[-1].t - kept[0].t) / 60 if len(kept) > 1 else 0.0
    ts = [x.t for x in kept]
    out = []
    for name, values, tolerance in (("rss_outside_duckdb_mb", [x.rss_mb - x.duckdb_mb for x in kept], RSS_TOLERANCE_MB),
                                    ("open_fds", [float(x.fds) for x in kept], FD_TOLERANCE),
                                    ("loop_lag_p99_ms", [x.lag_p99_ms for x in kept], LAG_TOLERANCE_MS)):
        slope = slope_per_min(ts, values) if len(kept) > 2 else 0.0
        growth = slope * minutes
        out.append((name, slope, growth, tolerance, growth <= tolerance))
    return out


def rows_recorded(db: Path) -> int:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("SELECT count(*) FROM requests").fetchone()[0]
    finally:
        con.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the run (default 10)")
    parser.add_argument("--concurrency", type=int, default=24, help="clients at once (default 24)")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between samples (default 5)")
    parser.add_argument("--keep", type=Path, help="keep the database and logs in this directory")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="llmtap-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    mock, serve, base, pid = start_processes(work)
    try:
        samples, load = asyncio.run(soak(base, pid, args.minutes * 60, args.concurrency, args.interval))
    finally:
        serve.send_signal(signal.SIGTERM)
        code = serve.wait(60)
        mock.send_signal(signal.SIGTERM)
        mock.wait(10)
    rows = rows_recorded(work / "soak.duckdb")
    duration = samples[-1].t
    print(f"\n{load.sent} requests in {duration / 60:.1f} min ({load.sent / duration:.0f}/s), "
          f"{args.concurrency} at once; client errors outside the provoked ones: {load.failures}")
    print("mix: " + ", ".join(f"{k} {n}" for k, n in sorted(load.by_kind.items(), key=lambda kv: -kv[1])))
    print(f"serve exit status {code}; rows recorded {rows} of {load.sent}")
    first, last = samples[0], samples[-1]
    print(f"rss {first.rss_mb:.1f} -> {last.rss_mb:.1f} MB (max {max(x.rss_mb for x in samples):.1f}), of which "
          f"DuckDB's buffers {first.duckdb_mb:.1f} -> {last.duckdb_mb:.1f} MB (bounded by --db-memory-mb); "
          f"fds {first.fds} -> {last.fds}; lag p99 max {max(x.lag_p99_ms for x in samples):.2f} ms")
    warmup = duration / 5
    print(f"\ntrend after the first {warmup:.0f} s (least squares):")
    ok = code == 0 and rows == load.sent
    for name, slope, growth, tolerance, fine in trends(samples, warmup):
        print(f"  {name:22s} {slope:+8.3f}/min  {growth:+8.2f} over the window  (tolerance {tolerance:g})  "
              f"{'ok' if fine else 'RISING'}")
        ok = ok and fine
    print("\nno upward trend, every row recorded" if ok else "\nFAILED")
    if not args.keep:
        print(f"(files in {work})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
