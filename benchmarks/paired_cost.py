"""What measuring costs per request: llmtap and llmtap --no-measure side by side, on one core.

overhead.py runs its targets one after another, and this VM's speed drifts by a third from
minute to minute: its "req/s lost to measuring" moves by ±6 points from round to round.
Here both proxies run at the same time, pinned to the same core, each saturated by its own
wrk (non-streaming, 16 tokens, --connections each) on the other core with the simulated
upstream. CPU per request is each process's CPU time (every thread: the event loop and the
store's writer) over the requests it answered. Both see the same machine at the same
moment, so the difference between them is steady to a few µs per round.

    cost = 1 - relay-only CPU per request / llmtap CPU per request

is the share of a saturated core's req/s that measuring and storing take, the figure
overhead.py's target (≤ 15 %) is about. Side by side, the two processes share the core's
caches, and each costs more per request than alone (overhead.py's figure is the one the
target is checked against); what this script gives is a difference that holds still.

Run: python benchmarks/paired_cost.py [--rounds 5] [--seconds 4] [--connections 128] [--events N]

With `--events N` the answers are streams of N events, sent at once: what measuring a stream
costs per request (divide by N for a figure per event).

With `--against DIR`, the second proxy is llmtap measuring too, run from the source tree DIR
(a `git worktree` of a change, say): the difference is then what the change saves or costs
per request, measured the same steady way.

With wrk (Debian package `wrk`) when installed; else two aiohttp load processes, which on one
core cannot saturate both proxies (the CPU per request is still each one's own).
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import click

from overhead_client import PLAIN_BODY, STREAM_BODY, parse_wrk, sim_headers, write_wrk_script
from overhead_procs import BenchError, Procs, cpu_seconds, pick_cpus, start_serve, start_upstream

PATH = "/v1/chat/completions"
CLIENT = str(Path(__file__).with_name("overhead_client.py"))


def load_argv(loader: str, workdir: Path, url: str, connections: int, seconds: int, events: int) -> list[str]:
    """One saturation load against url: wrk, or overhead_client.py's aiohttp loader. Non-streaming
    answers of 16 tokens, or with `events`, streams of that many events sent at once."""
    headers = sim_headers(0, 0, events or 16)
    if loader == "wrk":
        script = write_wrk_script(workdir / "post.lua", headers, STREAM_BODY if events else PLAIN_BODY)
        return [shutil.which("wrk") or "wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "10s",
                "-s", str(script), url + PATH]
    return [sys.executable, CLIENT, "load", url, str(connections), "0", str(seconds), json.dumps(headers),
            *(["stream"] if events else [])]


def answered(loader: str, output: str) -> int:
    if loader == "wrk":
        return int(parse_wrk(output)["requests"])
    return int(json.loads(output.strip().splitlines()[-1])["requests"])


def side_by_side(procs: Procs, load_cpu: int | None, loader: str, argvs: list[list[str]],
                 pids: list[int]) -> list[float]:
    """Run one load per proxy at once; CPU µs per answered request of each proxy."""
    before = [cpu_seconds([pid]) for pid in pids]
    loads = [procs.start(f"load{i}", argv, load_cpu, pipe=True) for i, argv in enumerate(argvs)]
    outputs = [load.communicate(timeout=120)[0] for load in loads]
    for load in loads:
        procs.stop(load)
    used = [cpu_seconds([pid]) - b for pid, b in zip(pids, before)]
    counts = [answered(loader, out) for out in outputs]
    if not all(counts):
        raise BenchError(f"a load answered no request: {counts}")
    return [u * 1e6 / n for u, n in zip(used, counts)]


@click.command()
@click.option("--rounds", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--seconds", type=click.IntRange(min=1), default=4, show_default=True, help="Length of each round.")
@click.option("--connections", type=click.IntRange(min=1), default=128, show_default=True,
              help="Connections to each proxy.")
@click.option("--loader", type=click.Choice(["auto", "wrk", "aiohttp"]), default="auto", show_default=True)
@click.option("--against", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Compare with llmtap (measuring) from this source tree instead of relay-only.")
@click.option("--events", type=click.IntRange(min=0), default=0, show_default=True,
              help="Streamed answers of this many events (sent at once) instead of non-streaming ones.")
def main(rounds: int, seconds: int, connections: int, loader: str, against: Path | None, events: int) -> None:
    if loader == "auto":
        loader = "wrk" if shutil.which("wrk") else "aiohttp"
    load_cpu, proxy_cpu = pick_cpus()
    with tempfile.TemporaryDirectory(prefix="llmtap-paired-") as tmp, Procs(Path(tmp)) as procs:
        try:
            upstream = start_upstream(procs, load_cpu, 0, 0, 16)
            (measured, measured_url), (other, other_url) = (
                start_serve(procs, "llmtap", proxy_cpu, upstream, measure=True),
                start_serve(procs, "other", proxy_cpu, upstream, measure=against is not None,
                            source=against.resolve() if against else None))
            urls, pids = [measured_url, other_url], [measured.pid, other.pid]
            argvs = lambda secs: [load_argv(loader, Path(tmp), u, connections, secs, events) for u in urls]  # noqa: E731
            side_by_side(procs, load_cpu, loader, argvs(2), pids)  # warm-up
            costs = []
            column = "against µs/req" if against else "relay-only µs/req"
            click.echo(f"{'round':>5}  {'llmtap µs/req':>13}  {column:>17}  {'difference' if against else 'measuring':>9}"
                       f"  {'share' if against else 'cost':>6}")
            for r in range(1, rounds + 1):
                m, rel = side_by_side(procs, load_cpu, loader, argvs(seconds), pids)
                costs.append((m, rel))
                click.echo(f"{r:>5}  {m:>13.1f}  {rel:>17.1f}  {m - rel:>+9.1f}  {1 - rel / m:>6.1%}")
        except (BenchError, subprocess.TimeoutExpired, RuntimeError) as exc:
            raise SystemExit(f"paired_cost.py: {exc}") from None
    m, rel = statistics.median(c[0] for c in costs), statistics.median(c[1] for c in costs)
    added = statistics.median(c[0] - c[1] for c in costs)
    cost = statistics.median(1 - c[1] / c[0] for c in costs)
    click.echo(f"{'median':>5}  {m:>13.1f}  {rel:>17.1f}  {added:>+9.1f}  {cost:>6.1%}  (each column's own median)")


if __name__ == "__main__":
    main()
