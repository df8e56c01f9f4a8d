"""How fast are the answers built on sessions and tool runs at a month's size? (#38)

Builds stores with `report_speed.py`'s builder over 30 days (50 chunks a request), then chains each
tool's requests into sessions of 40, as agents make them: in time order per tool, a request asks for
tool calls (every fifth a parallel `Bash` + `Read`; every eighth answer is the person's turn, no call),
and the next request of the session carries their results. `aider`'s calls have no id and its results
a made-up one (as Gemini CLI's do: paired by name and order), `cline` sends no session id (grouped by
tool and key). Then times each command of the issue's table as its own process, wall time and peak
RSS (`os.wait4`'s rusage of that child), and the web UI's API under `llmtap serve`'s defaults
(`--db-memory-mb 256`, `--sql-timeout 60`), serve's peak RSS after it stops.

    python benchmarks/session_speed.py --sizes 50000,500000 [--dir /work/stores-scale] [--runs 3]

A store at DIR/sessions-N.duckdb with the rows is reused. Not a test: figures go to benchmarks/README.md.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import click
import duckdb

sys.path.insert(0, str(Path(__file__).resolve().parent))
import report_speed  # noqa: E402

DAYS = 30
CHUNKS_PER_REQUEST = 50
SESSION_REQUESTS = 40
BUILD_MEMORY = "3GB"  # DuckDB's limit while building (its default, 80 % of the machine's, starves others)

# Each request's place in its tool's chain: `n` in time order, `p` within its session of 40.
CHAIN_SQL = f"""
CREATE OR REPLACE TEMP TABLE chain AS
SELECT *, lag(asks) OVER (PARTITION BY tool, n // {SESSION_REQUESTS} ORDER BY n) AS prev_asks,
  lag(id) OVER (PARTITION BY tool, n // {SESSION_REQUESTS} ORDER BY n) AS prev_id,
  lag(p) OVER (PARTITION BY tool, n // {SESSION_REQUESTS} ORDER BY n) AS prev_p
FROM (SELECT *, outcome = 'ok' AND p < {SESSION_REQUESTS - 1} AND p % 8 != 7 AS asks FROM (
  SELECT id, tool, e2e_ms, started_at, outcome, n, n % {SESSION_REQUESTS} AS p FROM (
    SELECT id, tool, e2e_ms, started_at, outcome,
      row_number() OVER (PARTITION BY tool ORDER BY started_at, id) - 1 AS n FROM requests)))
"""


def _calls(rid: str, p: str, e2e: str, results: bool) -> str:
    """The calls a request `rid` at place `p` asks for (or, `results`, the results that answer them)."""
    def one(k: int, name: str, before_end_ms: int) -> str:
        made_up = f"'run_shell_command_' || (epoch_ms(c.started_at) + {k}) || '_0'"
        call_id = f"CASE WHEN c.tool = 'aider' THEN {made_up if results else 'NULL'} ELSE 'toolu_' || left({rid}, 12) || '_{k}' END"
        ended = "" if results else f", ended_ms := {e2e} - {before_end_ms}"
        return f"struct_pack(id := {call_id}, name := {name}{ended})"
    alone = one(1, f"(['Bash', 'Read', 'Edit', 'Grep'])[1 + {p} % 4]", 2)
    return f"CASE WHEN {p} % 5 = 2 THEN [{one(1, repr('Bash'), 40)}, {one(2, repr('Read'), 2)}] ELSE [{alone}] END"


FIXUP_SQL = f"""
UPDATE requests SET
  session_id = CASE WHEN c.tool = 'cline' THEN NULL ELSE c.tool || '-' || (c.n // {SESSION_REQUESTS}) END,
  key_fingerprint = 'k:' || c.tool || '-' || (c.n // {SESSION_REQUESTS}),
  tool_calls = CASE WHEN c.asks THEN {_calls('c.id', 'c.p', 'c.e2e_ms', False)} END,
  tool_results = CASE WHEN c.prev_asks THEN {_calls('c.prev_id', 'c.prev_p', 'c.e2e_ms', True)} END
FROM chain c WHERE requests.id = c.id
"""


def store(folder: Path, requests: int) -> Path:
    """The store of `requests` requests, built (and chained) when it is not there yet."""
    path = folder / f"sessions-{requests}.duckdb"
    chunks = requests * CHUNKS_PER_REQUEST
    started = time.perf_counter()
    if report_speed.counts(path) != (requests, chunks):
        folder.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        report_speed.build(path, requests, chunks, days=DAYS, memory_limit=BUILD_MEMORY)
    con = duckdb.connect(str(path), config={"memory_limit": BUILD_MEMORY})
    try:
        migrated(con)
        if con.execute("SELECT count(tool_calls) FROM requests").fetchone()[0]:
            return path
        con.execute(CHAIN_SQL)
        con.execute(FIXUP_SQL)
        con.execute("CHECKPOINT")
    finally:
        con.close()
    print(f"built {path} in {time.perf_counter() - started:.0f} s, {path.stat().st_size / 2**20:,.0f} MiB", flush=True)
    return path


def migrated(con: duckdb.DuckDBPyConnection) -> None:
    """Mark every migration applied (the builder makes the tables as they are now), so `serve` opens it."""
    from proxy.record.migrations import MIGRATIONS

    con.execute("CREATE TABLE IF NOT EXISTS _llmtap_migrations (name VARCHAR PRIMARY KEY, applied_at TIMESTAMPTZ)")
    for fn in MIGRATIONS:
        con.execute("INSERT INTO _llmtap_migrations VALUES (?, current_timestamp) ON CONFLICT DO NOTHING", [fn.__name__])


def run(command: list[str], timeout_s: float, env: dict[str, str]) -> tuple[float, float, int, float]:
    """(wall seconds, peak RSS MB, exit status, CPU seconds) of `command` as a child of its own."""
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = started + timeout_s
    while True:
        pid, status, usage = os.wait4(child.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            child.kill()
            pid, status, usage = os.wait4(child.pid, 0)
            return float("inf"), usage.ru_maxrss / 1024, -9, usage.ru_utime + usage.ru_stime
        time.sleep(0.01)
    return (time.perf_counter() - started, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status),
            usage.ru_utime + usage.ru_stime)


def llmtap() -> str:
    return str(Path(sys.executable).with_name("llmtap"))


def installed_env() -> dict[str, str]:
    """The environment less PYTHONDONTWRITEBYTECODE, with the bytecode kept apart: as an installed llmtap
    runs (pip compiles it at install), not recompiling numpy and the rest at every start (0.3-0.9 s)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPYCACHEPREFIX": env.get("PYTHONPYCACHEPREFIX", "/tmp/llmtap-bench-pycache")}


def newest_session_and_models(path: Path) -> tuple[str, list[str]]:
    """The newest session's key, and the two models with the most requests (compare's sides)."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        key = con.execute("SELECT session_id FROM requests WHERE session_id IS NOT NULL"
                          " ORDER BY started_at DESC LIMIT 1").fetchone()[0]
        models = con.execute("SELECT request_model FROM requests GROUP BY 1 ORDER BY count(*) DESC LIMIT 2").fetchall()
        return key, [m for (m,) in models]
    finally:
        con.close()


def commands(path: Path, out: Path) -> list[tuple[str, list[str]]]:
    db = ["--db", str(path)]
    key, models = newest_session_and_models(path)
    return [
        ("report", ["report", *db]),
        ("report --since 7d", ["report", *db, "--since", "7d"]),
        ("status", ["status", *db]),
        ("session KEY", ["session", key, *db]),
        ("sessions", ["sessions", *db]),
        ("sessions --since 30d", ["sessions", *db, "--since", "30d"]),
        ("errors", ["errors", *db]),
        ("report --by tool_name", ["report", *db, "--by", "tool_name"]),
        ("report --html", ["report", *db, "--html", str(out / "report.html")]),
        ("compare --by model A B", ["compare", *db, "--by", "model", *models]),
    ]


def time_cli(path: Path, runs: int, timeout_s: float, code: Path | None) -> list[tuple[str, str]]:
    """Each command's median wall, its peak RSS and median CPU (user + system: what the machine's other
    work does not change); `code`: run the commands of that checkout instead (PYTHONPATH)."""
    env = {**installed_env(), **({"PYTHONPATH": str(code)} if code else {})}
    rows = []
    for label, args in commands(path, path.parent):
        measured = []
        for _ in range(runs):
            measured.append(run([llmtap(), *args], timeout_s, env))
            if measured[-1][0] == float("inf"):
                break  # one run past the limit is enough to say so
        failed = [m for m in measured if m[2] != 0]
        wall = statistics.median(m[0] for m in measured)
        rss, cpu = max(m[1] for m in measured), statistics.median(m[3] for m in measured)
        cell = (f"over {timeout_s:.0f} s" if wall == float("inf") else f"{wall:.2f} s") + f" ({cpu:.2f} s CPU), {rss:.0f} MB"
        if failed and wall != float("inf"):
            cell += f" (exit {failed[0][2]})"
        print(f"  {label:<28} {cell}", flush=True)
        rows.append((label, cell))
    return rows


API_CALLS = (
    ("api sessions?since=24h", "sessions?since=24h"),
    ("api session/KEY?since=24h", "session/{key}?since=24h"),
    ("api report?since=30d", "report?since=30d"),
    ("api overview?since=30d", "overview?since=30d"),
)


def time_api(path: Path, runs: int, port: int) -> list[tuple[str, str]]:
    """Each API call under `llmtap serve` (its defaults), median wall; serve's peak RSS after it stops."""
    from proxy.common.instances import TOKEN_HEADER

    token = "bench-" + os.urandom(8).hex()
    env = {**installed_env(), "LLMTAP_ADMIN_TOKEN": token}
    serve = subprocess.Popen([llmtap(), "serve", "--db", str(path), "--port", str(port), "--upstream",
                              "http://127.0.0.1:9", "--quiet"], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}/_llmtap/api/"
    key, _ = newest_session_and_models(path)

    def get(url: str) -> tuple[int, bytes]:
        request = urllib.request.Request(base + url, headers={TOKEN_HEADER: token})
        try:
            with urllib.request.urlopen(request, timeout=180) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    rows = []
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                get("facets?since=1h")
                break
            except OSError:
                if time.monotonic() > deadline or serve.poll() is not None:
                    serve.kill()
                    raise SystemExit(f"serve did not start: {serve.communicate()[1].decode()[-500:]}") from None
                time.sleep(0.2)
        for label, url in API_CALLS:
            times, status, body = [], 200, b""
            for _ in range(runs):
                started = time.perf_counter()
                status, body = get(url.format(key=key))
                times.append(time.perf_counter() - started)
            cell = f"{statistics.median(times):.2f} s" + ("" if status == 200 else f" (HTTP {status}: {body[:120]!r})")
            print(f"  {label:<28} {cell}", flush=True)
            rows.append((label, cell))
    finally:
        serve.send_signal(signal.SIGINT)
        _, status, usage = os.wait4(serve.pid, 0)
    rows.append(("serve peak RSS, exit", f"{usage.ru_maxrss / 1024:.0f} MB, exit {os.waitstatus_to_exitcode(status)}"))
    print(f"  {rows[-1][0]:<28} {rows[-1][1]}", flush=True)
    return rows


@click.command()
@click.option("--sizes", default="50000,500000", show_default=True, help="Requests per store, comma-separated.")
@click.option("--dir", "folder", type=click.Path(file_okay=False, path_type=Path), default=Path("/work/stores-scale"),
              show_default=True, help="Where the stores are built (and reused).")
@click.option("--runs", default=3, show_default=True, help="Runs of each command (the median wall).")
@click.option("--timeout", "timeout_s", default=120.0, show_default=True, help="A command's longest run.")
@click.option("--port", default=23100, show_default=True, help="serve's port for the API calls.")
@click.option("--build-only", is_flag=True, help="Build the stores, time nothing.")
@click.option("--code", type=click.Path(file_okay=False, path_type=Path),
              help="Time the CLI of this checkout instead (a worktree of main: the figures before).")
@click.option("--no-api", is_flag=True, help="Time the CLI alone.")
def main(sizes: str, folder: Path, runs: int, timeout_s: float, port: int, build_only: bool, code: Path | None,
         no_api: bool) -> None:
    """Build the stores and time the session answers on each."""
    print(f"machine: {report_speed.machine()}", flush=True)
    table: dict[str, dict[int, str]] = {}
    counts = [int(s) for s in sizes.split(",")]
    for requests in counts:
        path = store(folder, requests)
        if build_only:
            continue
        print(f"{requests:,} requests ({path.stat().st_size / 2**20:,.0f} MiB):", flush=True)
        for label, cell in time_cli(path, runs, timeout_s, code) + ([] if no_api else time_api(path, runs, port)):
            table.setdefault(label, {})[requests] = cell
    if table:
        print("\n| command | " + " | ".join(f"{n:,} requests" for n in counts) + " |")
        print("|---|" + "---|" * len(counts))
        for label, cells in table.items():
            print(f"| `{label}` | " + " | ".join(cells.get(n, "-") for n in counts) + " |")
        print(json.dumps(table))


if __name__ == "__main__":
    main()
