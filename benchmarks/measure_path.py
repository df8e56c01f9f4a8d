"""What measuring costs in-process, with no socket: the meter, the recorder, Prometheus and the store's
writer thread, on overhead.py's workload.

  stream   64 streams of the simulator's Chat Completions shape (a role chunk, 100 text deltas, the
           finishing chunk, [DONE]; one read per event), their reads interleaved round-robin as the
           loop serves them; per chunk
  plain    non-streaming requests of 16 tokens, ended in batches as a saturated loop ends them; per request

Figures: the loop's thread CPU (`loop_us`; of it `on_chunk_us`, the meter's reads, and `end_rows_us`,
the ends and rows), the writer's (`writer_us`: the process's CPU less the loop's, DuckDB's threads
included) and both (`all_us`). Relay-only costs nothing here: these are measuring's own. Steadier
than a serve on a shared machine, and blind to what only a serve has (cache misses between streams,
the GIL's hand-offs, the syscalls).

Run: python benchmarks/measure_path.py [stream|plain] [--rounds N] [--no-store]
(pin it: taskset -c 1 ...; PYTHONPATH=<tree> to time another tree)
"""
from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.meter.meter import Meter
from proxy.observe.metrics import PrometheusMetrics
from proxy.record.recorder import Recorder, on_rows, store_observer
from proxy.record.store import Store
from proxy.settings.config import ServeConfig

STREAMS, TOKENS = 64, 100
REQ = CIMultiDictProxy(CIMultiDict({
    "Host": "127.0.0.1:8787", "User-Agent": "Python/3.11 aiohttp/3.10", "Accept": "*/*",
    "Accept-Encoding": "gzip, deflate", "Content-Type": "application/json", "x-sim-ttft-ms": "200",
    "x-sim-itl-ms": "20", "x-sim-tokens": "100", "x-sim-prefill-us-per-token": "0", "Content-Length": "80"}))
RESP_S = CIMultiDictProxy(CIMultiDict({"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "Date": "x",
                                       "Server": "y", "Transfer-Encoding": "chunked"}))
RESP_P = CIMultiDictProxy(CIMultiDict({"Content-Type": "application/json", "Content-Length": "400", "Date": "x",
                                       "Server": "y"}))
BODY_S = json.dumps({"model": "bench", "stream": True, "messages": [{"role": "user", "content": "Say something."}]}).encode()
BODY_P = json.dumps({"model": "bench", "messages": [{"role": "user", "content": "Say something."}]}).encode()
PLAIN = ('{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"bench","choices":[{"index":0,'
         '"message":{"role":"assistant","content":"%s"},"finish_reason":"stop"}],'
         '"usage":{"prompt_tokens":12,"completion_tokens":16,"total_tokens":28}}'
         % " ".join(f"tok{i}" for i in range(16))).encode()


def stream_reads(i: int) -> list[bytes]:
    """One stream's reads, one event each."""
    head = {"id": "chatcmpl-%08d" % i, "object": "chat.completion.chunk", "created": 1764500000, "model": "bench"}

    def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return b"data: " + orjson.dumps(head | {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}) + b"\n\n"

    return [event({"role": "assistant", "content": ""}), *(event({"content": " tok%d" % t}) for t in range(TOKENS)),
            event({}, "stop"), b"data: [DONE]\n\n"]


def started(recorder: Recorder, body: bytes, headers: CIMultiDictProxy[str]) -> Meter:
    now = time.perf_counter_ns
    meter = recorder.start(received_ns=now(), method="POST", path="/v1/chat/completions", query={}, headers=REQ)
    meter.on_request_read(body)
    meter.on_upstream_sent(now()).reused = True
    meter.response_started(200, headers, now())
    return meter


async def stream_round(recorder: Recorder, reads: list[list[bytes]], spent: list[float]) -> int:
    """64 streams' reads interleaved round-robin, then their ends; the reads' and the ends' CPU into `spent`."""
    now = time.perf_counter_ns
    meters = [started(recorder, BODY_S, RESP_S) for _ in range(STREAMS)]
    for k in range(len(reads[0])):
        t0 = time.thread_time()
        for i, meter in enumerate(meters):
            meter.on_chunk(reads[i][k], now())
        spent[0] += time.thread_time() - t0
        await asyncio.sleep(0)
    t0 = time.thread_time()
    for meter in meters:
        meter.on_response_end(now())
        recorder.end(meter, None, None)
    recorder.record_ended()
    spent[1] += time.thread_time() - t0
    return STREAMS * len(reads[0])


async def plain_round(recorder: Recorder) -> int:
    """256 non-streaming requests, ended 16 to a loop turn."""
    now = time.perf_counter_ns
    for i in range(256):
        meter = started(recorder, BODY_P, RESP_P)
        meter.on_chunk(PLAIN, now())
        meter.on_response_end(now())
        recorder.end(meter, None, None)
        if i % 16 == 0:
            await asyncio.sleep(0)
    return 256


async def main(kind: str, rounds: int, no_store: bool) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp())
    recorder = Recorder(ServeConfig(db=str(folder / "x.duckdb")), lambda line: None)
    store = None
    if not no_store:
        store = Store(folder / "x.duckdb")
        store.start()
        recorder.observe(store_observer(store, True))
    recorder.observe(on_rows(PrometheusMetrics(store_stats=store.stats if store else None).observe))
    reads = [stream_reads(i) for i in range(STREAMS)]
    pt0, tt0 = time.process_time(), time.thread_time()
    n, spent = 0, [0.0, 0.0]
    for _ in range(rounds):
        n += await stream_round(recorder, reads, spent) if kind == "stream" else await plain_round(recorder)
        await asyncio.sleep(0.01)
    recorder.record_ended()
    tt1 = time.thread_time()
    if store:
        store.close()
    pt1 = time.process_time()
    return {"kind": kind, "n": n, "loop_us": (tt1 - tt0) / n * 1e6, "all_us": (pt1 - pt0) / n * 1e6,
            "on_chunk_us": spent[0] / n * 1e6, "end_rows_us": spent[1] / n * 1e6,
            "writer_us": ((pt1 - pt0) - (tt1 - tt0)) / n * 1e6}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", nargs="?", choices=["stream", "plain"], default="stream")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--no-store", action="store_true", help="no DuckDB store: the loop's part alone")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.kind, args.rounds, args.no_store))))
