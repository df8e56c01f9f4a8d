"""How big does the database get? N days of heavy Claude Code use, written by the Store itself.

Each day (in working hours, ending now): `--generations` streamed `POST /v1/messages?beta=true`
answers of 300 to 2,000 output events each (log-uniform; message_start, content_block_start, ping,
the deltas, content_block_stop, message_delta, message_stop: one chunk row each, as the meter
records them), 0.6 `count_tokens` calls per generation, one `HEAD /` probe per session (a session
is 40 generations), and 1 % 429/529 answers without a stream. Every request row has every column a
real one has (ids, fingerprints, session ids, user agent, timings, tokens). The rows go through
`proxy.record.store.Store` (`put`, the writer thread, its batches), so the file is exactly what
`llmtap serve` writes. `--bodies` also captures bodies as `serve --capture-bodies` would: Claude Code's
request JSON (15 KB of system prompt, 25 KB of tools, then the session's conversation so far, of
source code and answers) and the SSE stream, each cut at 256 KiB; the text is the standard
library's source, so take that figure as a rough one.

Then it prints the file's size, bytes per request and per chunk (apportioned as `llmtap status`
does), the time of `llmtap report --since 7d` on it (the CLI as a subprocess: first run and the
median of 3), and what retention costs on it: the longest single retention step (one transaction,
`retention.BATCH_REQUESTS` requests with their chunks) when the oldest day expires, and
`llmtap compact` afterwards (both on a copy, `expired.duckdb`).

    python benchmarks/db_size.py [--days 7] [--generations 1500] [--bodies] [--keep DIR]
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import click

from analysis.db_status import fmt_bytes, gather
from proxy.common import duck
from proxy.record import retention
from proxy.record.store import Store

UTC = dt.timezone.utc
MODELS = (("claude-sonnet-4-5-20250929", 0.75, 700, 18), ("claude-opus-4-1-20250805", 0.15, 1100, 30),
          ("claude-haiku-4-5-20251001", 0.10, 350, 7))  # name, share, TTFT ms, ms per event
UA = "claude-cli/2.1.197 (external, cli)"
CAPTURE_MAX = 256 * 1024  # serve's --capture-max-kb default


def ids(rng: random.Random) -> str:
    return f"{rng.getrandbits(128):032x}"


def text_pool(megabytes: int = 8) -> str:
    """What Claude Code's conversations are made of, near enough: source code and its comments (the
    standard library's, read from this Python)."""
    parts, size = [], 0
    for path in sorted(Path(os.path.dirname(os.__file__)).glob("*.py")):
        parts.append(path.read_text(errors="replace"))
        size += len(parts[-1])
        if size > megabytes << 20:
            break
    return "".join(parts)


class Day:
    """One day's requests, as the meter's rows and chunk rows."""

    def __init__(self, rng: random.Random, day_start: dt.datetime, generations: int, fingerprint: str,
                 pool: str) -> None:
        self.rng, self.start, self.n, self.fingerprint, self.pool = rng, day_start, generations, fingerprint, pool
        if pool:  # Claude Code's own part of every request: some 15 KB of system prompt, 25 KB of tool schemas
            self.system = pool[:15_000]
            self.tools = [{"name": f"Tool{i}", "description": pool[15_000 + i * 1_500:16_000 + i * 1_500],
                           "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}
                          for i in range(17)]

    def requests(self):  # type: ignore[no-untyped-def]
        rng = self.rng
        # ten working hours, the last ten of this day's 24 (so the newest day ends now)
        times = sorted(rng.uniform(14 * 3600, 24 * 3600) for _ in range(self.n))
        session, history = str(uuid.UUID(int=rng.getrandbits(128))), []
        for i, t in enumerate(times):
            at = self.start + dt.timedelta(seconds=t)
            if i % 40 == 0:
                session, history = str(uuid.UUID(int=rng.getrandbits(128))), []
                yield self.probe(at - dt.timedelta(seconds=1), session), [], None
            turn = i % 40
            row, chunks = self.generation(at, session, turn)
            body = self.body(row, chunks, history) if self.pool else None
            yield row, chunks, body
            if rng.random() < 0.6:  # its request is the generation's, but the stream
                counted = self.count_tokens(at - dt.timedelta(milliseconds=300), session, turn)
                counted_body = None if body is None else \
                    (counted["id"], body[1], f'{{"input_tokens":{counted["input_tokens"]}}}', body[3], False)
                yield counted, [], counted_body

    def body(self, row: dict, chunks: list[tuple], history: list[dict]) -> tuple:
        """The bodies row `serve --capture-bodies` keeps: Claude Code's request JSON (system prompt and
        tools, then the conversation so far: tool results of code, answers), and the SSE stream."""
        history.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{ids(self.rng)[:24]}",
                                                      "content": self.excerpt(self.rng.randint(500, 6_000))}]})
        request = json.dumps({"model": row["request_model"], "max_tokens": 32000, "stream": True,
                              "system": [{"type": "text", "text": self.system}], "tools": self.tools,
                              "messages": history, "metadata": {"user_id": json.dumps({"session_id": row["session_id"]})}})
        answer, size = [], 0
        for _rid, _seq, _offset, _n, name in chunks:
            data: dict = {"type": name, "index": 0}
            if name == "content_block_delta":
                data["delta"] = {"type": "text_delta", "text": self.excerpt(self.rng.randint(3, 30))}
            answer.append(f"event: {name}\ndata: {json.dumps(data)}\n\n")
            size += len(answer[-1])
            if size > CAPTURE_MAX:
                break
        response = "".join(answer)
        history.append({"role": "assistant", "content": [{"type": "text", "text": self.excerpt(self.rng.randint(200, 2_000))}]})
        return (row["id"], request[:CAPTURE_MAX], response[:CAPTURE_MAX] if chunks else None,
                len(request) > CAPTURE_MAX, len(response) > CAPTURE_MAX)

    def excerpt(self, n: int) -> str:
        start = self.rng.randrange(0, len(self.pool) - n)
        return self.pool[start:start + n]

    def base(self, at: dt.datetime, session: str) -> dict:
        return {
            "id": ids(self.rng), "started_at": at, "route": "/", "upstream_host": "api.anthropic.com",
            "method": "POST", "dialect": "anthropic", "tool": "claude-code", "user_agent": UA, "tag": None,
            "key_fingerprint": self.fingerprint, "session_id": session,
        }

    def probe(self, at: dt.datetime, session: str) -> dict:
        return {**self.base(at, session), "method": "HEAD", "path": "/", "dialect": None, "user_agent": "Bun/1.2.19",
                "status": 404, "outcome": "http_error", "response_bytes": 0, "request_bytes": 0,
                "proxy_overhead_ms": 0.2, "upstream_headers_ms": 38.0, "first_byte_ms": 38.1, "e2e_ms": 38.4,
                "kind": "probe", "session_id": None}

    def count_tokens(self, at: dt.datetime, session: str, turn: int) -> dict:
        rng = self.rng
        e2e = rng.uniform(120, 400)
        return {**self.base(at, session), "path": "/v1/messages/count_tokens?beta=true",
                "request_model": MODELS[0][0], "stream": False, "message_count": 1 + 2 * turn,
                "request_bytes": 60_000 + turn * 4_000, "status": 200, "response_bytes": 25, "outcome": "ok",
                "proxy_overhead_ms": 0.3, "upstream_headers_ms": e2e - 1, "first_byte_ms": e2e - 0.5,
                "e2e_ms": e2e, "input_tokens": 15_000 + turn * 1_000, "tokens_source": "usage", "kind": "token_count"}

    def generation(self, at: dt.datetime, session: str, turn: int) -> tuple[dict, list[tuple]]:
        rng = self.rng
        u = rng.random()
        model, _, ttft0, per_event = next(m for m, lo in zip(MODELS, (0.75, 0.90, 1.01)) if u < lo)
        row = {**self.base(at, session), "path": "/v1/messages?beta=true", "request_model": model, "stream": True,
               "max_tokens": 32_000, "message_count": 1 + 2 * turn, "request_bytes": 76_000 + turn * 4_000,
               "proxy_overhead_ms": rng.uniform(0.2, 0.6), "kind": "generation"}
        if rng.random() < 0.01:  # rate limited or overloaded: an error body, no stream
            status = rng.choice((429, 529))
            e2e = rng.uniform(80, 400)
            row.update(status=status, response_bytes=130, outcome="http_error", upstream_headers_ms=e2e - 2,
                       first_byte_ms=e2e - 1, e2e_ms=e2e, retry_after="20" if status == 429 else None,
                       error_type="rate_limit_error" if status == 429 else "overloaded_error",
                       error_message="Number of request tokens has exceeded your per-minute rate limit"
                       if status == 429 else "Overloaded")
            return row, []
        events = int(math.exp(rng.uniform(math.log(300), math.log(2000))))
        ttft = ttft0 * rng.uniform(0.6, 2.5) + turn * 15
        rid, offset, chunks, size = row["id"], ttft, [], 0
        names = ["message_start", "content_block_start", "ping"] + ["content_block_delta"] * (events - 6) + \
                ["content_block_stop", "message_delta", "message_stop"]
        for seq, name in enumerate(names):
            n = 480 if name == "message_start" else rng.randint(110, 260) if name == "content_block_delta" else 90
            chunks.append((rid, seq, offset, n, name))
            size += n
            offset += rng.expovariate(1 / per_event) if name == "content_block_delta" else 0.05
        gaps = sorted(b[2] - a[2] for a, b in zip(chunks, chunks[1:]))
        out = int(events * rng.uniform(1.1, 1.6))
        row.update(status=200, response_model=model, finish_reason=rng.choice(("end_turn", "tool_use", "tool_use")),
                   response_bytes=size, outcome="ok", empty_choices_chunks=0, upstream_headers_ms=ttft * 0.8,
                   first_byte_ms=ttft * 0.8 + 0.2, ttft_ms=ttft, first_text_ms=ttft + 1.0, last_token_ms=offset,
                   e2e_ms=offset + 1.5, tpot_ms=(offset - ttft) / (out - 1), gap_p50_ms=gaps[len(gaps) // 2],
                   gap_p99_ms=gaps[int(len(gaps) * 0.99)], gap_max_ms=gaps[-1], output_events=events,
                   output_tokens_per_s=out * 1000 / (offset + 1.5), output_tokens=out, tokens_source="usage",
                   cache_read_tokens=20_000 + turn * 1_000 + rng.randint(0, 4_000),
                   cache_creation_tokens=rng.randint(200, 3_000))
        # as the meter records it: cached input included
        row["input_tokens"] = rng.randint(3, 40) + row["cache_read_tokens"] + row["cache_creation_tokens"]
        return row, chunks


def build(path: Path, days: int, generations: int, bodies: bool, seed: int) -> tuple[int, float]:
    rng = random.Random(seed)
    now = dt.datetime.now(UTC)
    fingerprint = "k:" + hashlib.sha256(b"sk-ant-bench").hexdigest()[:12]
    pool = text_pool() if bodies else ""
    store = Store(path, report=lambda line: print(line, file=sys.stderr))
    store.start()
    started, n = time.perf_counter(), 0
    try:
        for d in range(days, 0, -1):
            day = Day(rng, now - dt.timedelta(days=d), generations, fingerprint, pool)
            pending = body_bytes = 0
            for row, chunks, body in day.requests():
                if body is not None:
                    store.put_body(body)
                    body_bytes += len(body[1]) + len(body[2] or "")
                store.put(row, chunks)
                n += 1
                pending += len(chunks)
                if pending > 200_000 or body_bytes > 16 << 20:  # under the store's bounds for waiting rows
                    assert store.flush(300)
                    pending = body_bytes = 0
            assert store.flush(300)
            size = sum(p.stat().st_size for p in (path, path.with_name(path.name + ".wal")) if p.exists())
            print(f"  day {days - d + 1}: {n:,} requests so far, {fmt_bytes(size)} with the .wal", file=sys.stderr)
    finally:
        store.close(timeout=300)
    stats = store.stats()
    assert not any(stats[k] for k in ("requests_dropped", "chunks_dropped", "bodies_dropped")), stats
    return n, time.perf_counter() - started


def llmtap() -> str:
    return shutil.which("llmtap") or str(Path(sys.executable).with_name("llmtap"))


def time_report(path: Path, runs: int = 3) -> tuple[float, float]:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run([llmtap(), "report", "--since", "7d", "--db", str(path)], capture_output=True, text=True)
        times.append(time.perf_counter() - started)
        if done.returncode != 0:
            raise SystemExit(f"llmtap report failed: {done.stderr}")
    return times[0], statistics.median(times)


def expire_oldest_day(path: Path, days: int) -> tuple[int, float, float]:
    """Retention as serve runs it when the oldest day expires: (steps, longest step s, all s)."""
    con = duck.connect(path)
    try:
        duck.lock_down(con)
        cutoff = dt.datetime.now(UTC) - dt.timedelta(days=days - 1)  # the oldest of the days built
        steps, longest, started, more = 0, 0.0, time.perf_counter(), True
        while more:
            t = time.perf_counter()
            _done, more = retention.prune_step(con, rows_before=cutoff)
            longest = max(longest, time.perf_counter() - t)
            steps += 1
        return steps, longest, time.perf_counter() - started
    finally:
        con.close()


@click.command()
@click.option("--days", type=click.IntRange(min=2), default=7, show_default=True)
@click.option("--generations", type=click.IntRange(min=1), default=1500, show_default=True, help="Generations a day.")
@click.option("--bodies", is_flag=True, help="Capture bodies too (serve --capture-bodies).")
@click.option("--seed", type=int, default=17, show_default=True)
@click.option("--keep", type=click.Path(file_okay=False, path_type=Path), help="Build in this directory and keep it.")
def main(days: int, generations: int, bodies: bool, seed: int, keep: Path | None) -> None:
    """Build N days of heavy Claude Code use through the Store and measure the file."""
    directory = keep or Path(tempfile.mkdtemp(prefix="llmtap-db-size-"))
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "llmtap.duckdb"
    path.unlink(missing_ok=True)
    try:
        print(f"machine: {os.cpu_count()} vCPU, Python {sys.version.split()[0]}, DuckDB {__import__('duckdb').__version__}")
        print(f"building {days} days x {generations:,} generations/day{' with bodies' if bodies else ''} in {path}")
        n, took = build(path, days, generations, bodies, seed)
        status = gather(path)
        per_request, per_chunk = status.bytes_per_row("requests"), status.bytes_per_row("chunks")
        print(f"written:          {n:,} requests in {took:.0f} s through the Store")
        print(f"rows:             {status.rows['requests']:,} requests, {status.rows['chunks']:,} chunks, "
              f"{status.rows['bodies']:,} bodies")
        free = status.file_bytes - status.used_bytes
        print(f"file:             {fmt_bytes(status.file_bytes)} ({fmt_bytes(status.file_bytes / days)} a day), "
              f"{fmt_bytes(free)} of it free blocks")
        print(f"per request:      {fmt_bytes(per_request or 0)} (its own row)")
        print(f"per chunk:        {fmt_bytes(per_chunk or 0)}")
        if bodies:
            print(f"per body:         {fmt_bytes(status.bytes_per_row('bodies') or 0)}")
        print(f"per generation:   {fmt_bytes(status.file_bytes / (days * generations))} (all of the file)")
        first, median = time_report(path)
        print(f"report --since 7d: {first:.2f} s first run, {median:.2f} s median of 3 (llmtap as a subprocess)")
        expired = directory / "expired.duckdb"  # retention and compact on a copy: --keep keeps the file as built
        shutil.copyfile(path, expired)
        steps, longest, total = expire_oldest_day(expired, days)
        print(f"retention, oldest day expiring: {steps} step(s) of up to {retention.BATCH_REQUESTS:,} requests, "
              f"the longest {longest * 1000:.0f} ms, {total:.1f} s in all")
        started = time.perf_counter()
        done = subprocess.run([llmtap(), "compact", "--db", str(expired)], capture_output=True, text=True)
        print(f"compact after it: {done.stdout.strip() or done.stderr.strip()} in {time.perf_counter() - started:.1f} s")
    finally:
        if keep is None:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
