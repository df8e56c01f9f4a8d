"""`llmtap serve --workers N`: how throughput scales from 1 process to 2 (#21).

For each N (default 1, then 2), against one upstream: nginx with canned answers when it is installed
(`--upstream canned`: a sliver of a core, so that serve's processes get the rest), else
`llmtap mock-upstream` (`--upstream simulator`, about half a core at these rates):

  req/s      non-streaming POSTs from `--connections` keep-alive connections for `--seconds` (wrk)
  chunks/s   streaming POSTs the same way, each stream `--tokens` tokens as fast as the upstream
             sends them; counted by the proxy itself: the chunk rows it wrote to its one database
             during the run (every worker's rows reach it), per second

and prints the 2-worker / 1-worker ratio of each, the CPU seconds of serve's processes, and the load
average (other work on the machine skews everything here). Nothing is pinned: serve's processes
need the cores they can get, and the upstream and wrk share them, so on a 2-core machine the ratio
is what a second relay process buys when every process of the test competes for the same two.

    python benchmarks/workers_scaling.py                      # about a minute
    python benchmarks/workers_scaling.py --workers 1,2,1,2 --seconds 10 --json out.json   # interleaved rounds, medians
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from overhead_client import PLAIN_BODY, STREAM_BODY, parse_wrk, sim_headers, write_wrk_script  # noqa: E402
from overhead_procs import (ADMIN_TOKEN, CANNED_HEADER, LLMTAP, BenchError, Procs, cpu_seconds, cpu_model,  # noqa: E402
                            loadavg, nginx_binary, start_canned_upstream, start_upstream, tree)

from proxy.common import instances as running  # noqa: E402
from tests.state_files import state_of  # noqa: E402


def start_serve(procs: Procs, workers: int, upstream: str) -> tuple[subprocess.Popen, running.AdminClient]:
    home = procs.workdir / f"serve-{workers}"
    home.mkdir(exist_ok=True)
    env = {**os.environ, "LLMTAP_HOME": str(home), "LLMTAP_CONFIG": str(home / "none.toml"),
           "LLMTAP_ADMIN_TOKEN": ADMIN_TOKEN}
    argv = [*LLMTAP, "serve", "--port", "0", "--host", "127.0.0.1", "--upstream", upstream,
            "--db", str(home / "bench.duckdb"), "--quiet", "--workers", str(workers)]
    proc = procs.start(f"serve-{workers}", argv, None, env=env)
    url = procs.wait_ready(f"serve-{workers}", proc, lambda: (s.url if (s := state_of(proc.pid, home)) else None))
    return proc, running.AdminClient(url, ADMIN_TOKEN)


def wrk(procs: Procs, url: str, connections: int, seconds: float, headers: dict[str, str], body: bytes,
        name: str) -> dict[str, float]:
    script = write_wrk_script(procs.workdir / f"{name}.lua", headers, body)
    threads = str(min(2, connections))
    out = subprocess.run([shutil.which("wrk") or "wrk", "-t", threads, "-c", str(connections), "-d", f"{max(1, round(seconds))}s",
                          "--timeout", "30s", "-s", str(script), url + "/v1/chat/completions"],
                         capture_output=True, text=True, timeout=seconds + 60)
    return parse_wrk(out.stdout + out.stderr)


def count(admin: running.AdminClient, table: str) -> int:
    (_cols, _types, rows), _truncated = admin.sql(f"SELECT count(*) FROM {table}")
    return int(rows[0][0])


def settled(admin: running.AdminClient, table: str, timeout: float = 20.0) -> int:
    """The table's count once it stops growing (the store writes about every second)."""
    last, deadline = -1, time.monotonic() + timeout
    while time.monotonic() < deadline:
        n = count(admin, table)
        if n == last:
            return n
        last = n
        time.sleep(1.2)
    return last


def one(procs: Procs, workers: int, upstream: str, p: dict[str, Any]) -> dict[str, Any]:
    proc, admin = start_serve(procs, workers, upstream)
    try:
        plain = sim_headers(0, 0, p["plain_tokens"])
        stream = {**sim_headers(0, p["itl_ms"], p["tokens"]), CANNED_HEADER: "stream"}
        wrk(procs, admin.url, p["connections"], 2, plain, PLAIN_BODY, "warm")  # connections, caches, the pool
        pids = tree(proc.pid)
        upstream_pids = [pid for name, pr in procs.running if name == "upstream" for pid in tree(pr.pid)]
        cpu0, up0 = cpu_seconds(pids), cpu_seconds(upstream_pids)
        plain_run = wrk(procs, admin.url, p["connections"], p["seconds"], plain, PLAIN_BODY, "plain")
        cpu1, up1 = cpu_seconds(pids), cpu_seconds(upstream_pids)
        chunks0 = settled(admin, "chunks")
        t0 = time.monotonic()
        stream_run = wrk(procs, admin.url, p["connections"], p["seconds"], stream, STREAM_BODY, "stream")
        elapsed = time.monotonic() - t0
        cpu2, up2 = cpu_seconds(pids), cpu_seconds(upstream_pids)
        chunks = settled(admin, "chunks") - chunks0
        health = admin.health(10) or {}
        per_process = [w.get("requests") for w in health.get("workers", [])] or [health.get("requests_seen")]
        rows = count(admin, "requests")
    finally:
        procs.stop(proc)
    return {
        "workers": workers, "processes": len(pids),
        "req_per_s": round(plain_run["rps"], 1), "plain_p50_ms": round(plain_run["p50_ms"], 2),
        "plain_p99_ms": round(plain_run["p99_ms"], 2), "plain_errors": plain_run["errors"],
        "plain_cpu_s": round(cpu1 - cpu0, 2), "plain_upstream_cpu_s": round(up1 - up0, 2),
        "streams_per_s": round(stream_run["rps"], 1), "chunks_per_s": round(chunks / elapsed, 0),
        "stream_errors": stream_run["errors"], "stream_cpu_s": round(cpu2 - cpu1, 2),
        "stream_upstream_cpu_s": round(up2 - up1, 2),
        "rows": rows, "requests_per_process": per_process,
    }


@click.command()
@click.option("--workers", "counts", default="1,2", show_default=True,
              help="serve --workers values, in order; repeated ones (1,2,1,2) are rounds, their medians compared.")
@click.option("--seconds", type=float, default=8.0, show_default=True, help="Each load's duration.")
@click.option("--connections", type=int, default=64, show_default=True, help="wrk's connections.")
@click.option("--tokens", type=int, default=100, show_default=True, help="Tokens per stream.")
@click.option("--itl-ms", type=float, default=0.0, show_default=True, help="The upstream's delay between tokens.")
@click.option("--plain-tokens", type=int, default=20, show_default=True, help="Tokens per non-streaming answer.")
@click.option("--upstream", "upstream_kind", type=click.Choice(["canned", "simulator"]), default=None,
              help="canned: nginx answering with canned answers (the default when nginx is installed), which "
                   "leaves the cores to serve; simulator: `llmtap mock-upstream`, which takes about half a core.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), help="Also write the results here.")
def main(counts: str, seconds: float, connections: int, tokens: int, itl_ms: float, plain_tokens: int,
         upstream_kind: str | None, json_out: Path | None) -> None:
    """serve --workers 1 and 2: non-streaming req/s and streaming chunks/s, and their ratio."""
    if shutil.which("wrk") is None:
        raise click.ClickException("wrk is not installed (apt-get install -y wrk)")
    upstream_kind = upstream_kind or ("canned" if nginx_binary() else "simulator")
    if upstream_kind == "canned" and itl_ms:
        raise click.ClickException("--itl-ms needs --upstream simulator (the canned answers come at once)")
    p = {"seconds": seconds, "connections": connections, "tokens": tokens, "itl_ms": itl_ms,
         "plain_tokens": plain_tokens, "upstream": upstream_kind}
    results: list[dict[str, Any]] = []
    load_before = loadavg()
    with tempfile.TemporaryDirectory(prefix="llmtap-workers-") as tmp, Procs(Path(tmp)) as procs:
        try:
            if upstream_kind == "canned":
                upstream = start_canned_upstream(procs, None, tokens, plain_tokens)
            else:
                upstream = start_upstream(procs, None, 0, 0, tokens)
            for n in (int(x) for x in counts.split(",")):
                results.append(one(procs, n, upstream, p))
                r = results[-1]
                click.echo(f"--workers {n}: {r['req_per_s']:,.0f} req/s (p50 {r['plain_p50_ms']} ms, "
                           f"p99 {r['plain_p99_ms']} ms; CPU s serve {r['plain_cpu_s']}, upstream "
                           f"{r['plain_upstream_cpu_s']}), {r['chunks_per_s']:,.0f} chunks/s "
                           f"({r['streams_per_s']:,.0f} streams/s; CPU s serve {r['stream_cpu_s']}, upstream "
                           f"{r['stream_upstream_cpu_s']}); requests per process {r['requests_per_process']}")
        except BenchError as exc:
            raise click.ClickException(str(exc)) from None
    load_after = loadavg()
    click.echo(f"{os.cpu_count()} CPUs ({cpu_model()}); upstream: {upstream_kind}; load average before {load_before}, "
               f"after {load_after}")
    medians = {n: {k: statistics.median(r[k] for r in results if r["workers"] == n) for k in ("req_per_s", "chunks_per_s")}
               for n in dict.fromkeys(r["workers"] for r in results)}
    base = medians.get(1)
    for n, m in medians.items():
        if base is not None and n != 1:
            click.echo(f"--workers {n} / --workers 1 (medians of the rounds): req/s x{m['req_per_s'] / base['req_per_s']:.2f}, "
                       f"chunks/s x{m['chunks_per_s'] / max(base['chunks_per_s'], 1):.2f}")
    if json_out is not None:
        json_out.write_text(json.dumps({"params": p, "results": results, "loadavg": [load_before, load_after]},
                                       indent=2))


if __name__ == "__main__":
    main()
