"""How far llmtap's recorded TTFT is from the TTFT the client observes.

Starts `llmtap mock-upstream` and `llmtap serve` as separate processes on
loopback, sends streaming Anthropic Messages requests (each with its own
X-Llmtap-Tag), measures client-side TTFT (request sent -> first
content_block_delta received), then reads the recorded rows through the
proxy's admin endpoint and compares request by request. Also reports the
proxy's event-loop lag and the store's counters.

    python benchmarks/ttft_accuracy.py --requests 200 --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

MARKER = b"content_block_delta"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "proxy", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


ADMIN_HEADERS = {"X-Llmtap-Admin-Token": "llmtap-accuracy-admin-token"}  # serve reads it from its environment


async def wait_ready(url: str, deadline_s: float = 20) -> None:
    end = time.monotonic() + deadline_s
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < end:
            try:
                async with s.head(url + "/") as r:
                    if r.status < 500:
                        return
            except aiohttp.ClientError:
                await asyncio.sleep(0.1)
    raise SystemExit(f"{url} did not start")


async def one(s: aiohttp.ClientSession, base: str, tag: str) -> float:
    body = {"model": "claude-x", "stream": True, "max_tokens": 100, "messages": [{"role": "user", "content": "hi " * 50}]}
    t0 = time.perf_counter()
    async with s.post(base + "/v1/messages", json=body, headers={"X-Llmtap-Tag": tag}) as r:
        ttft = None
        async for data in r.content.iter_any():
            if ttft is None and MARKER in data:
                ttft = (time.perf_counter() - t0) * 1000
        assert ttft is not None, "no content event"
        return ttft


async def drive(base: str, n: int, concurrency: int, prefix: str = "acc") -> dict[str, float]:
    sem = asyncio.Semaphore(concurrency)
    client: dict[str, float] = {}

    async def task(i: int) -> None:
        async with sem:
            client[f"{prefix}-{i}"] = await one(s, base, f"{prefix}-{i}")

    async with aiohttp.ClientSession() as s:
        await asyncio.gather(*(task(i) for i in range(n)))
    return client


async def recorded(base: str, expected: int) -> tuple[dict[str, float], dict]:
    async with aiohttp.ClientSession() as s:
        for _ in range(50):  # rows land within the flush interval
            async with s.post(base + "/_llmtap/sql", json={"sql": "SELECT tag, ttft_ms FROM requests WHERE tag LIKE 'acc-%'"},
                              headers=ADMIN_HEADERS) as r:
                rows = (await r.json())["rows"]
            if len(rows) >= expected:
                break
            await asyncio.sleep(0.2)
        async with s.get(base + "/_llmtap/health", headers=ADMIN_HEADERS) as r:
            health = await r.json()
    return {tag: ttft for tag, ttft in rows}, health


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--ttft-ms", type=float, default=200)
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="llmtap-acc-")
    env = {**os.environ, "LLMTAP_HOME": home, "LLMTAP_CONFIG": str(Path(home) / "none.toml"),
           "LLMTAP_ADMIN_TOKEN": ADMIN_HEADERS["X-Llmtap-Admin-Token"]}
    up_port, px_port = free_port(), free_port()
    procs = [start(["mock-upstream", "--port", str(up_port), "--ttft-ms", str(args.ttft_ms), "--itl-ms", "20",
                    "--tokens", "50", "--prefill-us-per-token", "0"], env)]
    procs.append(start(["serve", "--port", str(px_port), "--upstream", f"http://127.0.0.1:{up_port}", "--quiet"], env))
    base = f"http://127.0.0.1:{px_port}"
    try:
        await wait_ready(f"http://127.0.0.1:{up_port}")
        await wait_ready(base)
        await drive(base, 5, 1, "warm")  # warm-up: connections, imports
        t0 = time.perf_counter()
        client = await drive(base, args.requests, args.concurrency)
        wall = time.perf_counter() - t0
        rec, health = await recorded(base, args.requests)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
    diffs = [client[t] - rec[t] for t in client if t in rec and rec[t] is not None]
    print(f"{len(diffs)} of {args.requests} requests matched; {args.concurrency} concurrent; {wall:.1f} s")
    print(f"client TTFT median {statistics.median(client.values()):.2f} ms (upstream set to {args.ttft_ms:g} ms)")
    print(f"client − recorded TTFT: median {statistics.median(diffs):.3f} ms, p99 {pct(diffs, 0.99):.3f} ms, "
          f"min {min(diffs):.3f}, max {max(diffs):.3f}")
    print("proxy event-loop lag:", json.dumps(health["event_loop_lag"]), " store:", json.dumps(
        {k: health["store"][k] for k in ("requests_written", "chunks_written", "requests_dropped", "write_errors")}))


if __name__ == "__main__":
    asyncio.run(main())
