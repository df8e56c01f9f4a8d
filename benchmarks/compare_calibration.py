"""How often `llmtap compare` is right: false calls, coverage and power on synthetic channels.

Each run draws two sides' requests from one model of a channel,

    TTFT = BASE_MS + PER_TOKEN_MS x input tokens + noise,
    noise = NOISE_MS x Student-t(3 d.f.), and 1 request in STALL_EVERY waits Exp(STALL_MS) more,

(a heavy tail both ways, and a long right tail as upstreams have), writes them as rows of the real
schema into an in-memory DuckDB with the real views, and runs the same library function the CLI
runs (`analysis.compare.compare`) on them, side B against side A. The cases:

  A/A alike     both sides' prompts 1k-3k input tokens, the same channel
  A/A shifted   A's prompts 1k-3k, B's 2k-6k, the same channel (the same speed per token)
  +20 alike     B is 20 ms slower at every input length, prompts alike
  +20 shifted   B is 20 ms slower, prompts shifted as above

each at n = 30, 100 and 300 requests a side. Per case it prints:
  refused  runs where compare gave no figures (too few requests, no shared input length)
  false    runs that called B slower or faster where it is not (A/A), or faster where it is slower
  cover    runs whose 95 % interval holds the true difference (0 or 20 ms), of those with one
  power    runs that called B slower (the +20 cases)
  bias     the mean estimate less the true difference; width: the median width of the interval

Targets (issue #26): false <= 5 % and cover >= 93 % in every case. With R runs a rate p is known
to about +-2 sqrt(p(1-p)/R): +-2.8 points at 5 % with 240 runs; `false` and `cover` are followed
by their 95 % Wilson intervals (a rate of 2 % in 1,000 runs: 1.3-3.1 %), which say whether a
figure is under a target or only a draw of the seed.

Run from the tree to measure (its `analysis` on the path):
  PYTHONPATH=. python benchmarks/compare_calibration.py [--runs N] [--seed N] [--sizes 30,100,300]
      [--cases 'A/A alike,+20 alike']
The script uses only `compare(query, sides, where)`, `Side`, the schema and the views, so it also
runs against an older tree (PYTHONPATH=/path/to/old/tree) to measure an earlier method.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import click
import duckdb
import numpy as np

from analysis.compare import Side, compare
from analysis.views import create_views
from proxy.common.schema import create_tables_sql

BASE_MS = 400.0
PER_TOKEN_MS = 0.05  # 20,000 input tokens a second of prefill
NOISE_MS = 30.0
STALL_EVERY = 20
STALL_MS = 300.0
ALIKE = ((1_000, 3_000), (1_000, 3_000))
SHIFTED = ((1_000, 3_000), (2_000, 6_000))
CASES: tuple[tuple[str, tuple[tuple[int, int], tuple[int, int]], float], ...] = (
    ("A/A alike", ALIKE, 0.0),
    ("A/A shifted", SHIFTED, 0.0),
    ("+20 alike", ALIKE, 20.0),
    ("+20 shifted", SHIFTED, 20.0),
)
SIDES = [Side("A", "route = '/a'"), Side("B", "route = '/b'")]


def ttft(rng: np.random.Generator, inputs: np.ndarray, extra_ms: float) -> np.ndarray:
    noise = NOISE_MS * rng.standard_t(3, size=len(inputs))
    stalls = np.where(rng.random(len(inputs)) < 1 / STALL_EVERY, rng.exponential(STALL_MS, len(inputs)), 0.0)
    return BASE_MS + PER_TOKEN_MS * inputs + extra_ms + noise + stalls


def side_rows(rng: np.random.Generator, run: int, route: str, n: int, span: tuple[int, int],
              extra_ms: float) -> dict[str, list[Any]]:
    inputs = rng.integers(span[0], span[1] + 1, size=n)
    return {"route": [route] * n, "tag": [f"r{run}"] * n, "input_tokens": inputs.tolist(),
            "ttft_ms": ttft(rng, inputs.astype(float), extra_ms).tolist()}


def database(rng: np.random.Generator, runs: int, n: int, spans: tuple[tuple[int, int], tuple[int, int]],
             extra_ms: float) -> duckdb.DuckDBPyConnection:
    """Every run's rows, tagged r0, r1, ...: side /a as drawn, side /b `extra_ms` slower."""
    con = duckdb.connect()
    con.execute("SET threads = 1")
    con.execute(create_tables_sql())
    columns: dict[str, list[Any]] = {"route": [], "tag": [], "input_tokens": [], "ttft_ms": []}
    for run in range(runs):
        for route, span, extra in (("/a", spans[0], 0.0), ("/b", spans[1], extra_ms)):
            for name, values in side_rows(rng, run, route, n, span, extra).items():
                columns[name].extend(values)
    total = len(columns["route"])
    con.execute(
        "INSERT INTO requests (id, started_at, outcome, stream, kind, route, tag, input_tokens, ttft_ms) "
        "SELECT printf('%032x', i), TIMESTAMPTZ '2026-11-30 00:00:00+00' + to_seconds(i), 'ok', TRUE, "
        "'generation', route, tag, input_tokens, ttft_ms FROM (SELECT unnest(range(?)) AS i, unnest(?) AS route, "
        "unnest(?) AS tag, unnest(?) AS input_tokens, unnest(?) AS ttft_ms)",
        [total, columns["route"], columns["tag"], columns["input_tokens"], columns["ttft_ms"]])
    create_views(con)
    return con


def querier(con: duckdb.DuckDBPyConnection) -> Callable[[str], tuple[list[str], list[str], list[tuple]]]:
    """The Query callable compare takes, on this connection."""
    def query(sql: str) -> tuple[list[str], list[str], list[tuple]]:
        cur = con.execute(sql)
        return [d[0] for d in cur.description], [], cur.fetchall()

    return query


def call_of(d: Any) -> str:
    """'slower', 'faster' or '' (no call); from the verdict's words where an older tree has no `call`."""
    call = getattr(d, "call", None)
    if call is not None:
        return call if call in ("slower", "faster") else ""
    for word in ("slower", "faster"):
        if d.verdict.startswith(f"{d.group} is {word}"):
            return word
    return ""


@dataclass
class Tally:
    runs: int = 0
    refused: int = 0
    false: int = 0
    covered: int = 0
    slower: int = 0
    errors: list[float] = field(default_factory=list)
    widths: list[float] = field(default_factory=list)

    def add(self, d: Any, truth: float) -> None:
        self.runs += 1
        if d.median_diff_ms is None or d.ci_low_ms is None or d.ci_high_ms is None:
            self.refused += 1
            return
        call = call_of(d)
        self.false += call == "faster" or (truth == 0 and call == "slower")
        self.slower += call == "slower"
        self.covered += d.ci_low_ms <= truth <= d.ci_high_ms
        self.errors.append(d.median_diff_ms - truth)
        self.widths.append(d.ci_high_ms - d.ci_low_ms)

    def row(self, name: str, n: int, truth: float) -> str:
        shown = self.runs - self.refused

        def pct(k: int, of: int) -> str:
            return f"{100 * k / of:5.1f}" if of else "    -"

        def ci(k: int, of: int) -> str:
            if not of:
                return f"{'-':>11}"
            low, high = wilson(k, of)
            return f" {100 * low:4.1f}-{100 * high:<5.1f}"

        power = pct(self.slower, self.runs) if truth else "    -"
        bias = f"{np.mean(self.errors):+6.1f}" if self.errors else "     -"
        width = f"{np.median(self.widths):6.1f}" if self.widths else "     -"
        return (f"{name:<12} {n:>4} {self.runs:>5} {pct(self.refused, self.runs)}  {pct(self.false, self.runs)}"
                f"{ci(self.false, self.runs)} {pct(self.covered, shown)}{ci(self.covered, shown)} {power}  {bias}  {width}")


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % Wilson score interval of a rate of k in n."""
    p = k / n
    middle = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, middle - half), min(1.0, middle + half)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--runs", type=click.IntRange(min=1), default=30, show_default=True, help="Runs per case.")
@click.option("--seed", type=int, default=26, show_default=True)
@click.option("--sizes", default="30,100,300", show_default=True, help="Requests a side, comma-separated.")
@click.option("--cases", default=",".join(c[0] for c in CASES), show_default=True,
              help="The cases to run, comma-separated.")
def main(runs: int, seed: int, sizes: str, cases: str) -> None:
    """False calls, coverage and power of compare on synthetic channels (see the module docstring)."""
    rng = np.random.default_rng(seed)
    ns = [int(s) for s in sizes.split(",")]
    click.echo(f"TTFT = {BASE_MS:.0f} ms + {PER_TOKEN_MS} ms/token x input + {NOISE_MS:.0f} ms x t(3) "
               f"+ 1 in {STALL_EVERY} Exp({STALL_MS:.0f} ms); {runs} runs a case, seed {seed}")
    click.echo("percent of runs; cover: of those with an interval; bias and width in ms\n")
    click.echo(f"{'case':<12} {'n':>4} {'runs':>5} {'refused':>5} {'false':>5} {'(95% CI)':>11} {'cover':>5} "
               f"{'(95% CI)':>11} {'power':>5}  {'bias':>6}  {'width':>6}")
    chosen = [c.strip() for c in cases.split(",")]
    unknown = set(chosen) - {c[0] for c in CASES}
    if unknown:
        raise click.BadParameter(f"no case {', '.join(sorted(unknown))}", param_hint="--cases")
    started = time.monotonic()
    for name, spans, extra in (c for c in CASES if c[0] in chosen):
        for n in ns:
            con = database(rng, runs, n, spans, extra)
            query, tally = querier(con), Tally()
            for run in range(runs):
                result = compare(query, SIDES, f"tag = 'r{run}'", "route")
                tally.add(next(d for d in result.differences if d.metric == "ttft"), extra)
            con.close()
            click.echo(tally.row(name, n, extra))
    click.echo(f"\n{time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
