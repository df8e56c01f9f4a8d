"""Admin SQL that does not end (#27 item 6): queries through the proxy run in threads of their own,
stop when their client leaves or their time is up, answer at most a few MiB, and never hold up the
proxy's stop."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from proxy.record import admin_sql
from tests import procfs
from proxy.common import instances as running
from .serving import RunningProxy

from .conftest import proxy_config
from .faultkit import Serve

# Minutes of work at least: it ends only when interrupted.
LONG = "SELECT count(*) AS n FROM range(10000000000000) t(x) WHERE hash(x) = 42"
CONNECTIONS = "SELECT * FROM duckdb_connection_count()"  # each query's cursor is one, until it ends


async def post_sql(admin: running.AdminClient, query: str, timeout: float = 60) -> tuple[int, dict]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
        async with s.post(admin.endpoint("sql"), json={"sql": query}, headers=admin.headers()) as r:
            return r.status, await r.json()


async def connections(admin: running.AdminClient) -> int:
    status, answer = await post_sql(admin, CONNECTIONS)
    assert status == 200, answer
    return answer["rows"][0][0]


async def wait_for(condition, within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {within_s} s")
        await asyncio.sleep(0.05)


def cli_sql(db: Path, query: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "proxy", "sql", "--db", str(db), query],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


async def test_a_query_whose_client_left_is_interrupted(sim, tmp_path: Path) -> None:
    """`llmtap sql` interrupted (SIGINT, as Ctrl-C): the query it sent stops, its thread is free
    (one client: the other thread answers the count of open cursors meanwhile)."""
    async with Serve(sim.url, tmp_path / "llmtap.duckdb", "--quiet") as serve:
        idle = await connections(serve.admin)
        client = cli_sql(serve.db, LONG)
        try:
            await wait_for(lambda: _more(serve.admin, idle + 1), 30, "the long query did not start")
        finally:
            client.send_signal(signal.SIGINT)
            client.communicate(timeout=20)
        await wait_for(lambda: _more(serve.admin, idle, exactly=True), 20, "the abandoned queries still run")
        answered = subprocess.run([sys.executable, "-m", "proxy", "sql", "--db", str(serve.db), "SELECT 42 AS answer",
                                   "--format", "csv"],
                                  capture_output=True, text=True, timeout=60)
        assert answered.stdout == "answer\n42\n", answered.stderr
        assert serve.stop() == 0


async def _more(admin: running.AdminClient, n: int, exactly: bool = False) -> bool:
    now = await connections(admin)
    return now == n if exactly else now >= n


async def test_a_query_past_its_time_is_stopped_in_words(tmp_path: Path) -> None:
    async with RunningProxy(proxy_config("http://127.0.0.1:9", tmp_path, sql_timeout_s=0.5)) as p:
        idle = await connections(p.admin)
        started = time.monotonic()
        status, answer = await post_sql(p.admin, LONG)
        assert status == 400 and time.monotonic() - started < 30
        assert answer["error"] == ("the query was stopped after 0.5 s, the limit for a query through the proxy "
                                   "(serve --sql-timeout)")
        await wait_for(lambda: _more(p.admin, idle, exactly=True), 20, "the stopped query still runs")


async def test_timed_out_queries_leave_the_next_answering_and_serve_stops_cleanly(sim, tmp_path: Path) -> None:
    """Three queries in a row past `--sql-timeout`: each is stopped in words, the query after them
    answers, and serve then stops with exit 0, its WAL checkpointed (#38: after one timeout the next
    heavy call failed too, and serve once ended abnormally after timed-out queries)."""
    db = tmp_path / "llmtap.duckdb"
    async with Serve(sim.url, db, "--quiet", "--sql-timeout", "0.5") as serve:
        for _ in range(3):
            status, answer = await post_sql(serve.admin, LONG)
            assert status == 400 and answer["error"].startswith("the query was stopped after 0.5 s"), answer
        status, answer = await post_sql(serve.admin, "SELECT count(*) AS n FROM requests, range(1000)")
        assert status == 200 and answer["rows"] == [[0]], answer
        assert serve.stop() == 0, serve.output()
    assert not db.with_name(db.name + ".wal").exists()


async def test_an_answer_past_its_size_is_refused_in_words_and_never_held(tmp_path: Path) -> None:
    """200,000 rows of 10 KB, 2 GB as JSON (the first 100,000 rows would be sent): refused at 8 MiB,
    with the memory it took bounded (DuckDB makes 2,048 rows at a time, 20 MB here)."""
    async with RunningProxy(proxy_config("http://127.0.0.1:9", tmp_path, sql_max_mb=8)) as p:
        before = procfs.reset_peak() / 1024
        status, answer = await post_sql(p.admin, "SELECT repeat('x', 10000) AS s FROM range(200000)")
        grew = procfs.peak_rss_kib() / 1024 - before
        assert status == 400
        assert answer["error"].startswith("the answer is larger than the 8 MiB that a query through the proxy "
                                          "may return (serve --sql-max-mb)")
        assert grew < 200, f"the process grew by {grew:.0f} MB"
        status, answer = await post_sql(p.admin, "SELECT repeat('x', 1000) AS s FROM range(1000)")
        assert status == 200 and len(answer["rows"]) == 1000


async def test_past_the_threads_and_the_queue_a_query_is_answered_busy(tmp_path: Path) -> None:
    async with RunningProxy(proxy_config("http://127.0.0.1:9", tmp_path)) as p:
        assert p.admin_sql is not None
        capacity = admin_sql.THREADS + admin_sql.QUEUE
        long = [asyncio.create_task(post_sql(p.admin, LONG)) for _ in range(capacity)]
        await wait_for(lambda: _pending(p, capacity), 20, "the long queries were not taken")
        status, answer = await post_sql(p.admin, "SELECT 1")
        assert status == 503 and answer["error"].startswith("llmtap is busy with 6 admin queries")
        for task in long:
            task.cancel()
        await asyncio.gather(*long, return_exceptions=True)
        await wait_for(lambda: _pending(p, 0), 20, "the cancelled queries still hold their threads")
        assert (await post_sql(p.admin, "SELECT 1 AS one"))[1]["rows"] == [[1]]


async def _pending(p: RunningProxy, n: int) -> bool:
    assert p.admin_sql is not None
    return p.admin_sql.pending == n


async def _health_queries(admin: running.AdminClient, n: int) -> bool:
    health = await asyncio.get_running_loop().run_in_executor(None, admin.health)
    return health is not None and health["sql_queries"] == n


async def test_sigterm_with_long_queries_running_stops_in_time_and_a_restart_opens_the_database(
        sim, tmp_path: Path) -> None:
    """Six long queries (two running, four queued): serve still stops within its shutdown timeout,
    and lets the database go for the next start."""
    db = tmp_path / "llmtap.duckdb"
    async with Serve(sim.url, db, "--quiet") as serve:
        idle = await connections(serve.admin)
        long = [asyncio.create_task(post_sql(serve.admin, LONG, timeout=120))]
        await wait_for(lambda: _more(serve.admin, idle + 1), 30, "the first long query did not start")
        long += [asyncio.create_task(post_sql(serve.admin, LONG, timeout=120)) for _ in range(5)]
        await wait_for(lambda: _health_queries(serve.admin, 6), 30, "the long queries were not taken")
        started = time.monotonic()
        code = serve.stop(signal.SIGTERM, timeout=15)
        took = time.monotonic() - started
        await asyncio.gather(*long, return_exceptions=True)
    assert code == 0 and took < 15, (code, took, serve.output())
    async with Serve(sim.url, db, "--quiet") as again:
        assert (await post_sql(again.admin, "SELECT 7 AS n"))[1]["rows"] == [[7]]
        assert again.stop() == 0
    assert os.path.exists(db)


async def test_a_query_right_after_a_request_sees_its_row(sim, tmp_path: Path) -> None:
    """`llmtap sql`, `report`, `errors` reach a running proxy through this endpoint: a request over a
    moment ago is in the answer though the writer would write it only at its next flush (#31)."""
    async with RunningProxy(proxy_config(sim.url, tmp_path, flush_interval_s=30)) as p:
        async with aiohttp.ClientSession() as s:
            async with s.post(p.url + "/v1/chat/completions", json={"model": "m", "messages": []},
                              headers={"x-sim-status": "404"}) as r:
                assert r.status == 404
                await r.read()
        status, answer = await post_sql(p.admin, "SELECT count(*) FROM requests WHERE status = 404")
    assert status == 200 and answer["rows"] == [[1]], answer


async def test_the_sql_threads_have_ended_when_the_proxy_has_stopped(sim, tmp_path: Path) -> None:
    """A query running as the proxy stops is interrupted, and its thread has ended once the stop
    returns: none is inside DuckDB when the interpreter exits (which would abort the process,
    SIGABRT, after the rows were written: seen 1 stop in 6 in `serve --workers 2`)."""
    async with RunningProxy(proxy_config(sim.url, tmp_path)) as p:
        idle = await connections(p.admin)
        long = asyncio.create_task(post_sql(p.admin, LONG, timeout=120))
        await wait_for(lambda: _more(p.admin, idle + 1), 30, "the long query did not start")
        sql = p.admin_sql
    assert sql is not None and sql.join(0), "an admin SQL thread still runs after the stop"
    await asyncio.gather(long, return_exceptions=True)
