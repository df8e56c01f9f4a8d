"""The load of benchmarks/overhead.py.

In the benchmark's own process (pinned beside the upstream): streaming clients that
time every SSE event. As separate processes, started with this file as the script:

    python overhead_client.py probe URL    GET URL every 10 ms, sample by sample, until told to stop
    python overhead_client.py load URL     POSTs from N connections (when wrk is absent); non-streaming,
                                           or streaming with a last argument `stream`
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter_ns
from typing import Any
from urllib.parse import urlsplit

import aiohttp

PATH = "/v1/chat/completions"
HEALTH = "/_llmtap/health"
PROMPT = [{"role": "user", "content": "Say something."}]
STREAM_BODY = json.dumps({"model": "bench", "stream": True, "messages": PROMPT}).encode()
PLAIN_BODY = json.dumps({"model": "bench", "messages": PROMPT}).encode()
CONTENT, EMPTY = b'"content":"', b'"content":""'


def sim_headers(ttft_ms: float, itl_ms: float, tokens: int) -> dict[str, str]:
    """The simulator's per-request overrides (the proxies pass them on untouched)."""
    return {"Content-Type": "application/json", "x-sim-ttft-ms": str(ttft_ms), "x-sim-itl-ms": str(itl_ms),
            "x-sim-tokens": str(tokens), "x-sim-prefill-us-per-token": "0"}


@dataclass
class Streams:
    """What the client saw of a set of streams."""

    ttft_ms: list[float] = field(default_factory=list)  # request sent -> first non-empty content event
    gaps_ms: list[float] = field(default_factory=list)  # between consecutive content events
    events: int = 0  # every SSE event received
    errors: int = 0


async def one_stream(session: aiohttp.ClientSession, url: str, headers: dict[str, str], out: Streams,
                     timed: bool = True) -> None:
    """One stream; its events always count in `out`, its timings only when `timed`."""
    sent = perf_counter_ns()
    try:
        async with session.post(url, data=STREAM_BODY, headers=headers) as resp:
            if resp.status != 200:
                await resp.read()
                out.errors += 1
                return
            buf, last, events, ttft, gaps = b"", 0, 0, None, []
            async for data in resp.content.iter_any():
                t = perf_counter_ns()
                buf += data
                while (end := buf.find(b"\n\n")) >= 0:
                    event, buf = buf[:end], buf[end + 2:]
                    events += 1
                    if CONTENT in event and EMPTY not in event:
                        if ttft is None:
                            ttft = (t - sent) / 1e6
                        else:
                            gaps.append((t - last) / 1e6)
                        last = t
    except (aiohttp.ClientError, asyncio.TimeoutError):
        out.errors += 1
        return
    out.events += events
    if ttft is None:
        out.errors += 1
    elif timed:
        out.ttft_ms.append(ttft)
        out.gaps_ms.extend(gaps)


def _session(limit: int) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit, force_close=False),
                                 timeout=aiohttp.ClientTimeout(total=300, sock_read=60), auto_decompress=False)


async def run_streams(base: str, concurrency: int, per_worker: int, headers: dict[str, str],
                      warm: dict[str, str]) -> Streams:
    """`concurrency` workers, each `per_worker` streams one after another, on connections
    opened beforehand by one short `warm` stream per worker."""
    url = base + PATH
    async with _session(concurrency) as session:
        await asyncio.gather(*(one_stream(session, url, warm, Streams(), False) for _ in range(concurrency)))
        out = Streams()

        async def worker() -> None:
            for _ in range(per_worker):
                await one_stream(session, url, headers, out)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out


async def run_steady(base: str, concurrency: int, per_worker: int, sim: tuple[float, float, int],
                     warm: dict[str, str], started: Callable[[], None], steady: Callable[[], None],
                     ending: Callable[[], None]) -> Streams:
    """`concurrency` streams open all the time, their tokens spread evenly, `per_worker` of
    them timed per worker. Called back: `started()` once the connections are open, `steady()`
    when the timed streams begin (the last lead-in ended), `ending()` when the first worker
    is done with its timed ones.

    All streams have one length, so starting them together would keep them in step: their
    first tokens, their ends and the next requests would all come in bursts of
    `concurrency`. So worker i first runs an untimed lead-in stream (i+1)/concurrency as
    long, which spreads the timed streams' phases over a whole stream; an untimed trailing
    stream keeps every worker busy until the last timed stream has ended. Events of untimed
    streams count in `events` (the CPU window covers them)."""
    ttft_ms, itl_ms, tokens = sim
    url, full = base + PATH, sim_headers(ttft_ms, itl_ms, tokens)
    async with _session(concurrency) as session:
        await asyncio.gather(*(one_stream(session, url, warm, Streams(), False) for _ in range(concurrency)))
        out, leads, timed = Streams(), [0], [0]
        started()

        async def worker(i: int) -> None:
            lead = sim_headers(ttft_ms, itl_ms, max(1, round(tokens * (i + 1) / concurrency)))
            await one_stream(session, url, lead, out, False)
            leads[0] += 1
            if leads[0] == concurrency:
                steady()
            for _ in range(per_worker):
                await one_stream(session, url, full, out)
            timed[0] += 1
            if timed[0] == 1:
                ending()
            await one_stream(session, url, full, out, False)

        await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return out


async def hold_streams(base: str, n: int, headers: dict[str, str], measure: Callable[[], Any], *, settle_s: float,
                       timeout_s: float = 60.0) -> tuple[int, Any]:
    """Open n streams (in batches of 100), wait until each has had its first event, call
    `measure()`, then drop them all. Returns (streams that were open, measure's result)."""
    url, opened, all_open = base + PATH, 0, asyncio.Event()

    async def one(session: aiohttp.ClientSession) -> None:
        nonlocal opened
        async with session.post(url, data=STREAM_BODY, headers=headers) as resp:
            await resp.content.readany()
            opened += 1
            if opened == n:
                all_open.set()
            async for _ in resp.content.iter_any():
                pass

    async with _session(0) as session:
        tasks = []
        try:
            for start in range(0, n, 100):
                tasks += [asyncio.create_task(one(session)) for _ in range(min(100, n - start))]
                await asyncio.sleep(0.05)
            try:
                await asyncio.wait_for(all_open.wait(), timeout_s)
            except asyncio.TimeoutError:
                pass
            await asyncio.sleep(settle_s)
            return opened, measure()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


# -- the health probe (a separate process) ---------------------------------------------------


class ProbeFailed(RuntimeError):
    pass


class Probe:
    """`overhead_client.py probe` as a child: every line written to it starts a new segment of
    samples ("stop" ends it); it prints every segment's latencies in ms as JSON."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        line = proc.stdout.readline()
        if line.strip() != "ready":
            raise ProbeFailed(f"the health probe did not start (exit status {proc.poll()})")
        self.priority = "?"

    def mark(self) -> None:
        self.proc.stdin.write("mark\n")
        self.proc.stdin.flush()

    def stop(self) -> list[list[float]]:
        self.proc.stdin.write("stop\n")
        self.proc.stdin.flush()
        out, _ = self.proc.communicate(timeout=30)
        result = json.loads(out.strip().splitlines()[-1])
        self.priority = result["priority"]
        return result["segments"]


def probe_main(url: str, interval_s: float = 0.01, max_s: float = 600.0, token: str = "") -> None:
    """Real-time priority when allowed, so that its own wake-ups are not what it measures."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        priority = "fifo"
    except (OSError, AttributeError):
        priority = "normal"
    import http.client

    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    headers = {"X-Llmtap-Admin-Token": token} if token else {}
    conn.request("GET", parts.path, headers=headers)
    conn.getresponse().read()
    segments: list[list[float]] = [[]]
    print("ready", flush=True)
    start = due = time.perf_counter()
    stdin, pending = sys.stdin.fileno(), b""
    while time.perf_counter() - start < max_s:
        t = time.perf_counter()
        conn.request("GET", parts.path, headers=headers)
        conn.getresponse().read()
        segments[-1].append((time.perf_counter() - t) * 1000)
        due += interval_s
        ready, _, _ = select.select([stdin], [], [], max(0.0, due - time.perf_counter()))
        if ready:
            data = os.read(stdin, 1024)
            pending += data
            if not data or b"stop" in pending:
                break
            segments.extend([] for _ in range(pending.count(b"\n")))
            pending = pending.rsplit(b"\n", 1)[1]
            due = time.perf_counter()
    print(json.dumps({"priority": priority, "segments": segments}), flush=True)


def live_main(url: str, token: str) -> None:
    """What the web UI's Live page holds open: `GET /_llmtap/live`, read as it comes, until "stop" on
    stdin; prints the ticks read."""
    import http.client

    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request("GET", parts.path, headers={"X-Llmtap-Admin-Token": token, "Accept": "text/event-stream"})
    response = conn.getresponse()
    if response.status != 200:
        sys.exit(f"the live feed answered {response.status}")
    print("ready", flush=True)
    sock, stdin, ticks = response.fp, sys.stdin.fileno(), 0
    while True:
        ready, _, _ = select.select([stdin, sock], [], [], 1.0)
        if stdin in ready:
            break
        if sock in ready:
            data = response.read1(65536)
            if not data:
                break
            ticks += data.count(b"event: tick")
    print(ticks, flush=True)


# -- the non-streaming load ------------------------------------------------------------------

WRK_SCRIPT = """\
wrk.method = "POST"
wrk.body = '{body}'
{headers}
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('WRKJSON {{"requests":%d,"duration_s":%f,"errors":%d,"p50_ms":%f,"p99_ms":%f}}\\n',
    summary.requests, summary.duration / 1e6, e.connect + e.read + e.write + e.status + e.timeout,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
"""


def write_wrk_script(path: Path, headers: dict[str, str], body: bytes = PLAIN_BODY) -> Path:
    lines = "\n".join(f'wrk.headers["{k}"] = "{v}"' for k, v in headers.items())
    path.write_text(WRK_SCRIPT.format(body=body.decode(), headers=lines))
    return path


def parse_wrk(output: str) -> dict[str, float]:
    for line in output.splitlines():
        if line.startswith("WRKJSON "):
            result = json.loads(line[len("WRKJSON "):])
            result["rps"] = result["requests"] / result["duration_s"]
            return result
    raise RuntimeError(f"no result from wrk:\n{output[-2000:]}")


async def _load(base: str, connections: int, warmup_s: float, seconds: float, headers: dict[str, str],
                body: bytes = PLAIN_BODY) -> dict:
    url, done, errors, latencies = base + PATH, 0, 0, []
    start = time.perf_counter() + warmup_s
    end = start + seconds

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal done, errors
        while (t := time.perf_counter()) < end:
            try:
                async with session.post(url, data=body, headers=headers) as resp:
                    await resp.read()
                    ok = resp.status == 200
            except (aiohttp.ClientError, asyncio.TimeoutError):
                ok = False
            now = time.perf_counter()
            if t >= start and now <= end:
                done += 1
                errors += not ok
                latencies.append((now - t) * 1000)

    asyncio.get_running_loop().call_later(warmup_s, lambda: print("go", flush=True))
    async with _session(connections) as session:
        await asyncio.gather(*(worker(session) for _ in range(connections)))
    latencies.sort()
    pick = (lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))]) if latencies else (lambda q: 0.0)
    return {"requests": done, "duration_s": seconds, "errors": errors, "rps": done / seconds,
            "p50_ms": pick(0.5), "p99_ms": pick(0.99)}


def load_main(url: str, connections: int, warmup_s: float, seconds: float, headers: dict[str, str],
              body: bytes = PLAIN_BODY) -> None:
    try:
        import uvloop
        run = uvloop.run
    except ImportError:  # pragma: no cover
        run = asyncio.run
    print(json.dumps(run(_load(url, connections, warmup_s, seconds, headers, body))), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "probe":
        probe_main(sys.argv[2], max_s=float(sys.argv[3]) if len(sys.argv) > 3 else 600.0,
                   token=sys.argv[4] if len(sys.argv) > 4 else "")
    elif sys.argv[1] == "live":
        live_main(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "load":
        load_main(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), json.loads(sys.argv[6]),
                  STREAM_BODY if sys.argv[7:8] == ["stream"] else PLAIN_BODY)
    else:
        sys.exit(f"unknown mode {sys.argv[1]!r}")
