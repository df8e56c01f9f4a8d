"""How fast is the report on a big database? 1,000,000 requests and 50,000,000 chunks.

Builds the database with DuckDB SQL alone (generate_series over seeded random()):
six models with their own traffic share, prefill cost and decode speed, five
tools, 14 days ending now, log-normal input and output token counts, about 3 %
failures (429s, 500s, 529s, timeouts, disconnects, truncated streams), and the
chunk rows of the successful streams. Then it times, on a fresh read-only
connection with the CLI's views (as `llmtap report` opens it):

- the per-model aggregate query of the report (requests, error %, TTFT
  p50/p90/p99, TPOT p50/p99, E2E p50/p99, median tokens/s, token sums), over
  the last 24 h and over everything: the first run and the median of 5;
- `render_html` over the whole database (median of 3) and the file's size;
- `llmtap report --db` (and `--html`) end to end as a subprocess, when the CLI has it.

    python benchmarks/report_speed.py [--db PATH] [--requests N] [--chunks N] [--keep]

An existing `--db` with the same row counts is reused; the target is a report
query under 2 s on a 2-core machine.
"""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import click
import duckdb

from analysis.html.queries import summary_sql
from analysis.html.report import render_html
from analysis.source import open_source
from proxy.common.schema import create_tables_sql

# name, traffic share, dialect, TTFT at 0 input tokens (ms), prefill (ms per 1k input tokens), TPOT (ms)
MODELS = (
    ("gpt-4o-mini", 0.30, "openai_chat", 280, 12, 9),
    ("claude-sonnet-4-5", 0.25, "anthropic", 650, 35, 21),
    ("gpt-5", 0.12, "openai_responses", 900, 28, 16),
    ("gemini-2.5-flash", 0.13, "gemini", 380, 9, 6),
    ("claude-haiku-4-5", 0.12, "anthropic", 350, 15, 8),
    ("qwen3-coder-30b", 0.08, "openai_chat", 60, 110, 24),
)
TOOLS = ("claude-code", "codex", "aider", "cline", "openai-python")
DAYS = 14
# outcome, HTTP status, error type, cumulative probability
FAILURES = (
    ("http_error", 429, "rate_limit_error", 0.012),
    ("http_error", 500, "server_error", 0.016),
    ("http_error", 529, "overloaded_error", 0.019),
    ("upstream_timeout", None, "TimeoutError", 0.022),
    ("client_disconnected", 200, None, 0.027),
    ("stream_truncated", 200, None, 0.030),
)
RUNS = 5


def models_sql() -> str:
    rows, low = [], 0.0
    for name, share, dialect, base, prefill, tpot in MODELS:
        rows.append(f"('{name}', {low}, {low + share}, '{dialect}', {base}, {prefill}, {tpot})")
        low += share
    return "CREATE TEMP TABLE models AS SELECT * FROM (VALUES " + ", ".join(rows) + \
        ") m(name, lo, hi, dialect, base, prefill, tpot)"


def sql_literal(value: str | int | None) -> str:
    if value is None:
        return "NULL"
    return f"'{value}'" if isinstance(value, str) else str(value)


def failure_case(field: int, ok_value: str | int | None) -> str:
    """A CASE over the uniform draw `u_fail`: field `field` of the drawn FAILURES row, else `ok_value`."""
    arms = " ".join(f"WHEN u_fail < {f[3]} THEN {sql_literal(f[field])}" for f in FAILURES)
    return f"CASE {arms} ELSE {sql_literal(ok_value)} END"


def requests_sql(count: int, days: int = DAYS) -> str:
    normal = "sqrt(-2 * ln(1 - random())) * cos(2 * pi() * random())"  # Box-Muller
    tools = "[" + ", ".join(f"'{t}'" for t in TOOLS) + "]"
    return f"""
    INSERT INTO requests BY NAME
    WITH draws AS (
        SELECT i, random() AS u_model, random() AS u_fail, random() AS u_time, random() AS u_stream,
            {normal} AS z_in, {normal} AS z_out, {normal} AS z_queue, {normal} AS z_tpot
        FROM generate_series(1, {count}) g(i)
    ), sized AS (
        SELECT d.*, m.*,
            least(200000, greatest(20, round(exp(7.8 + 1.3 * z_in))))::BIGINT AS inp,
            least(8000, greatest(1, round(exp(5.4 + 0.9 * z_out))))::BIGINT AS outp,
            {failure_case(0, "ok")} AS outcome, {failure_case(1, 200)} AS status,
            {failure_case(2, None)} AS error_type
        FROM draws d JOIN models m ON d.u_model >= m.lo AND d.u_model < m.hi
    ), timed AS (
        SELECT *, base + prefill * inp / 1000 + exp(3.5 + 0.8 * z_queue) AS ttft, tpot * exp(0.18 * z_tpot) AS itl
        FROM sized
    )
    SELECT md5(i::VARCHAR) AS id,
        now() - to_seconds(u_time * {days * 86400}) AS started_at,
        '/' AS route, 'api.example.test' AS upstream_host, 'POST' AS method, '/v1/messages' AS path,
        'generation' AS kind,  -- as the proxy records it (m003); a NULL kind is derived from the path per query
        dialect, {tools}[1 + i % {len(TOOLS)}] AS tool, 'sdk/1.0' AS user_agent,
        CASE WHEN i % 7 = 0 THEN 'bench' END AS tag, 'sess-' || (i // 40) AS session_id,
        name AS request_model, u_stream < 0.9 AS stream, 4096 AS max_tokens, 2 + i % 30 AS message_count,
        inp * 4 AS request_bytes, status, name AS response_model, outcome, error_type,
        CASE WHEN error_type IS NOT NULL THEN 'upstream said: ' || error_type END AS error_message,
        0.3 AS proxy_overhead_ms,
        CASE WHEN outcome = 'ok' THEN 'stop' END AS finish_reason,
        CASE WHEN status = 200 THEN ttft * 0.9 END AS upstream_headers_ms,
        CASE WHEN status = 200 THEN ttft END AS ttft_ms,
        CASE WHEN status = 200 THEN ttft + itl * (outp - 1) END AS last_token_ms,
        CASE WHEN status = 200 THEN ttft + itl * (outp - 1) + 2 ELSE 40 + 200 * u_time END AS e2e_ms,
        CASE WHEN status = 200 AND outp > 1 THEN itl END AS tpot_ms,
        CASE WHEN status = 200 THEN outp * 1000 / (ttft + itl * (outp - 1) + 2) END AS output_tokens_per_s,
        CASE WHEN status = 200 THEN inp END AS input_tokens,
        CASE WHEN status = 200 THEN outp END AS output_tokens,
        CASE WHEN status = 200 THEN (inp * 0.6 * u_stream)::BIGINT END AS cache_read_tokens,
        'usage' AS tokens_source
    FROM timed
    ORDER BY started_at"""  # as the proxy appends them: the time window's zone maps skip the rest


def chunks_sql(count: int) -> str:
    """`count` chunk rows, spread evenly over the successful streams (the others stream nothing); as
    the proxy writes them, each request's rows together, in about the order the requests came."""
    return f"""
    INSERT INTO chunks
    WITH streams AS (
        SELECT id, started_at, ttft_ms, coalesce(tpot_ms, 10) AS tpot_ms FROM requests WHERE stream AND outcome = 'ok'
    ),
    per AS (SELECT ceil({count} / count(*))::INTEGER AS n FROM streams)
    SELECT id, j, ttft_ms + j * tpot_ms, 60 + (j * 37) % 90,
        CASE WHEN j = 0 THEN 'message_start' ELSE 'content_block_delta' END
    FROM streams, per, generate_series(0, per.n - 1) c(j)
    ORDER BY started_at, id, j
    LIMIT {count}"""


# Each request's output events, as the proxy records them (the count of its chunk rows).
EVENTS_SQL = """
UPDATE requests SET output_events = coalesce(c.n, 0)
FROM (SELECT r.id, c.n FROM requests r LEFT JOIN (SELECT request_id, count(*) AS n FROM chunks GROUP BY 1) c
      ON c.request_id = r.id) c
WHERE requests.id = c.id"""


def build(path: Path, requests: int, chunks: int, days: int = DAYS, memory_limit: str | None = None) -> float:
    started = time.perf_counter()
    con = duckdb.connect(str(path))
    try:
        if memory_limit:  # a shared machine's other work needs its memory
            con.execute(f"SET memory_limit = '{memory_limit}'")
        con.execute(create_tables_sql())
        con.execute("SELECT setseed(0.42)")
        con.execute(models_sql())
        con.execute(requests_sql(requests, days))
        con.execute(chunks_sql(chunks))
        con.execute(EVENTS_SQL)
        con.execute("CHECKPOINT")
    finally:
        con.close()
    return time.perf_counter() - started


def counts(path: Path) -> tuple[int, int] | None:
    if not path.exists():
        return None
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute("SELECT (SELECT count(*) FROM requests), (SELECT count(*) FROM chunks)").fetchone()
    except duckdb.Error:
        return None
    finally:
        con.close()


def timed(action: Callable[[], object], runs: int) -> tuple[float, float]:
    """(first run, median of `runs` including the first), in seconds."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return times[0], statistics.median(times)


def machine() -> str:
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    memory_kb = next((int(line.split()[1]) for line in meminfo if line.startswith("MemTotal")), 0)
    cpu = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")),
        platform.processor(),
    )  # fmt: skip
    return (
        f"{os.cpu_count()} cores ({cpu}), {memory_kb / 2**20:.1f} GiB memory, "
        f"Python {platform.python_version()}, DuckDB {duckdb.__version__}, "
        f"load average {os.getloadavg()[0]:.1f} (other work skews the times)"
    )


def time_cli(path: Path, out_dir: Path) -> None:
    llmtap = shutil.which("llmtap") or str(Path(sys.executable).with_name("llmtap"))
    probe = subprocess.run([llmtap, "report", "--help"], capture_output=True, text=True)
    if probe.returncode != 0:
        print("llmtap report:           not available (analysis/cli.py not there yet)")
        return
    commands = {"llmtap report --db DB": [llmtap, "report", "--db", str(path)]}
    if "--html" in probe.stdout:
        commands["llmtap report --html"] = [llmtap, "report", "--db", str(path), "--html", str(out_dir / "cli.html")]
    for label, command in commands.items():
        started = time.perf_counter()
        result = subprocess.run(command, capture_output=True, text=True)
        elapsed = time.perf_counter() - started
        status = "" if result.returncode == 0 else f"  (exit {result.returncode}: {result.stderr.strip()[:200]})"
        print(f"{label + ':':<24} {elapsed:6.2f} s end to end{status}")


def report(path: Path, out_dir: Path) -> None:
    source = open_source(path)
    try:
        for label, where in (("last 24 h", "started_at >= now() - INTERVAL 24 HOUR"), ("all", "TRUE")):
            first, median = timed(lambda w=where: source.query(summary_sql(w)), RUNS)
            print(f"report query, {label + ':':<10} first {first:6.3f} s, median of {RUNS} {median:6.3f} s")
        pages: list[str] = []
        first, median = timed(lambda: pages.append(render_html(source.query)), 3)
    finally:
        source.close()
    (out_dir / "report.html").write_text(pages[-1], encoding="utf-8")
    size = f"{len(pages[-1]) / 1024:.0f} KiB"
    print(f"render_html, all:        first {first:6.3f} s, median of 3 {median:6.3f} s, {size}")
    time_cli(path, out_dir)


@click.command()
@click.option("--db", type=click.Path(dir_okay=False, path_type=Path), help="Database file (default: a temp dir).")
@click.option("--requests", default=1_000_000, show_default=True, help="Request rows.")
@click.option("--chunks", default=50_000_000, show_default=True, help="Chunk rows.")
@click.option("--keep", is_flag=True, help="Keep the temp database and the rendered HTML.")
def main(db: Path | None, requests: int, chunks: int, keep: bool) -> None:
    """Build a big database and time the report over it."""
    temp = Path(tempfile.mkdtemp(prefix="llmtap-bench-"))
    path = db or temp / "bench.duckdb"
    try:
        print(f"machine: {machine()}")
        if counts(path) == (requests, chunks):
            print(f"database: {path} (reused)")
        else:
            path.unlink(missing_ok=True)
            seconds = build(path, requests, chunks)
            print(f"database: {path}, built in {seconds:.1f} s")
        print(f"rows: {requests:,} requests, {chunks:,} chunks; file {path.stat().st_size / 2**20:,.0f} MiB")
        report(path, temp)
    finally:
        if keep:
            print(f"kept: {temp}")
        else:
            shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    main()
