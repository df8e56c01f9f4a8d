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
import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import orjson
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.observe.metrics import PrometheusMetrics
from proxy.record.recorder import Recorder, on_rows, store_observer
from proxy.record.store import Store
from proxy.settings.config import ServeConfig

STREAMS, TOKENS = 64, 100
parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("kind", nargs="?", choices=["stream", "plain"], default="stream")
parser.add_argument("--rounds", type=int, default=20)
parser.add_argument("--no-store", action="store_true", help="no DuckDB store: the loop's part alone")
args = parser.parse_args()
kind, rounds, nostore = args.kind, args.rounds, args.no_store
def stream_reads(i):
    head = {"id": "chatcmpl-%08d" % i, "object": "chat.completion.chunk", "created": 1764500000, "model": "bench"}
    ch = lambda d, f=None: b"data: " + orjson.dumps(head | {"choices": [{"index": 0, "delta": d, "finish_reason": f}]}) + b"\n\n"
    out = [ch({"role": "assistant", "content": ""})]
    out += [ch({"content": " tok%d" % t}) for t in range(TOKENS)]
    out.append(ch({}, "stop")); out.append(b"data: [DONE]\n\n")
    return out
REQ = CIMultiDictProxy(CIMultiDict({"Host": "127.0.0.1:8787", "User-Agent": "Python/3.11 aiohttp/3.10", "Accept": "*/*",
    "Accept-Encoding": "gzip, deflate", "Content-Type": "application/json", "x-sim-ttft-ms": "200", "x-sim-itl-ms": "20",
    "x-sim-tokens": "100", "x-sim-prefill-us-per-token": "0", "Content-Length": "80"}))
RESP_S = CIMultiDictProxy(CIMultiDict({"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "Date": "x", "Server": "y",
                                       "Transfer-Encoding": "chunked"}))
RESP_P = CIMultiDictProxy(CIMultiDict({"Content-Type": "application/json", "Content-Length": "400", "Date": "x", "Server": "y"}))
BODY_S = json.dumps({"model": "bench", "stream": True, "messages": [{"role": "user", "content": "Say something."}]}).encode()
BODY_P = json.dumps({"model": "bench", "messages": [{"role": "user", "content": "Say something."}]}).encode()
PLAIN = ('{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"bench","choices":[{"index":0,'
         '"message":{"role":"assistant","content":"%s"},"finish_reason":"stop"}],'
         '"usage":{"prompt_tokens":12,"completion_tokens":16,"total_tokens":28}}' % " ".join(f"tok{i}" for i in range(16))).encode()

async def main():
    d = Path(tempfile.mkdtemp())
    cfg = ServeConfig(db=str(d / "x.duckdb"))
    rec = Recorder(cfg, lambda s: None)
    store = None
    if not nostore:
        store = Store(d / "x.duckdb"); store.start()
        rec.observe(store_observer(store, True))
    rec.observe(on_rows(PrometheusMetrics(store_stats=store.stats if store else None).observe))
    reads = [stream_reads(i) for i in range(STREAMS)]
    pt0, tt0 = time.process_time(), time.thread_time()
    n = 0
    chunk_t = [0.0, 0.0]
    for r in range(rounds):
        now = time.perf_counter_ns
        if kind == "stream":
            meters = []
            for i in range(STREAMS):
                m = rec.start(received_ns=now(), method="POST", path="/v1/chat/completions", query={}, headers=REQ)
                m.on_request_read(BODY_S); m.on_upstream_sent(now()); m.connection.reused = True
                m.response_started(200, RESP_S, now()); meters.append(m)
            for k in range(len(reads[0])):
                c0 = time.thread_time()
                for i, m in enumerate(meters):
                    m.on_chunk(reads[i][k], now()); n += 1
                chunk_t[0] += time.thread_time() - c0
                await asyncio.sleep(0)
            c0 = time.thread_time()
            for m in meters:
                m.on_response_end(now()); rec.end(m, None, None)
            rec.record_ended()
            chunk_t[1] += time.thread_time() - c0
        else:
            for i in range(256):
                m = rec.start(received_ns=now(), method="POST", path="/v1/chat/completions", query={}, headers=REQ)
                m.on_request_read(BODY_P); m.on_upstream_sent(now()); m.connection.reused = True
                m.response_started(200, RESP_P, now()); m.on_chunk(PLAIN, now()); m.on_response_end(now())
                rec.end(m, None, None); n += 1
                if i % 16 == 0: await asyncio.sleep(0)
        await asyncio.sleep(0.01)
    rec.record_ended()
    tt1 = time.thread_time()
    if store: store.close()
    pt1 = time.process_time()
    print(json.dumps({"kind": kind, "n": n, "loop_us": (tt1 - tt0) / n * 1e6, "all_us": (pt1 - pt0) / n * 1e6,
                      "on_chunk_us": chunk_t[0] / n * 1e6, "end_rows_us": chunk_t[1] / n * 1e6, "writer_us": ((pt1 - pt0) - (tt1 - tt0)) / n * 1e6}))

asyncio.run(main())
