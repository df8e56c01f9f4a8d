"""Faults in storage: a read-only or full disk, a locked file, SIGKILL mid-write, an old schema.
Requests keep flowing whatever happens to the database; rows are retried, or dropped and reported."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import duckdb
import pytest

from proxy.record.migrations import MIGRATIONS, migrate
from proxy.common.schema import BODY_COLUMNS
from .serving import RunningProxy
from proxy.simulator.app import Simulator
from proxy.simulator.config import SimConfig
from proxy.record.store import Store

from .conftest import proxy_config
from .waiting import wait_until, wait_until_sync
from .faultkit import Baseline, Serve, rss_mb


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A small filesystem of our own (root only): it can be filled up or made read-only."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory: Path) -> Path:
    """Write until the disk is full; delete the file to give the space back."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    return filler


def open_files(directory: Path) -> list[str]:
    """This process's open files under `directory`."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if (target := os.readlink(f"/proc/self/fd/{fd}")).startswith(str(directory)):
                found.append(target)
    return sorted(found)


async def chat(s: aiohttp.ClientSession, base: str, n: int) -> list[int]:
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}

    async def one() -> int:
        async with s.post(base + "/v1/chat/completions", json=body) as r:
            data = await r.read()
            assert data.endswith(b"data: [DONE]\n\n")
            return r.status
    return await asyncio.gather(*(one() for _ in range(n)))


# -- read-only, full ------------------------------------------------------------------------------


def test_a_read_only_database_is_a_clear_error_at_startup(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro", "2m") as mnt:
        s = Store(mnt / "llmtap.duckdb")
        s.start()
        s.close()
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        done = subprocess.run([sys.executable, "-m", "proxy", "serve", "--port", "0", "--upstream",
                               "http://127.0.0.1:9", "--db", str(mnt / "llmtap.duckdb")],
                              capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    assert "cannot open the database" in done.stderr and "Read-only file system" in done.stderr
    assert "--db" in done.stderr and "Traceback" not in done.stderr


async def test_a_full_disk_costs_no_request_and_rows_land_when_space_returns(sim: Simulator, tmp_path: Path) -> None:
    reports: list[str] = []
    with tmpfs(tmp_path / "disk", "4m") as mnt:
        db = mnt / "llmtap.duckdb"
        async with RunningProxy(proxy_config(sim.url, tmp_path, db=str(db)), report=reports.append) as p:
            assert p.store is not None
            async with aiohttp.ClientSession() as s:
                assert await chat(s, p.url, 20) == [200] * 20
                assert p.flush(5)
                base, files = Baseline(), open_files(mnt)
                filler = fill(mnt)
                # DuckDB checkpoints by itself when its WAL grows; on a full disk that fails and
                # invalidates the database: force that moment, from a connection of our own.
                con = duckdb.connect(str(db))
                with pytest.raises(duckdb.Error, match="No space left"):
                    con.execute("CHECKPOINT")
                con.close()
                assert await chat(s, p.url, 50) == [200] * 50  # traffic flows while nothing can be written
                await wait_until(lambda: p.store.stats()["write_errors"] >= 2, 5, "two write errors")
                stats = p.store.stats()
                assert stats["pending_requests"] == 50 and stats["requests_written"] == 20
                async with s.get(p.url + "/_llmtap/health", headers=p.admin.headers()) as r:
                    assert (await r.json())["store"]["write_errors"] >= 2
                filler.unlink()
                assert p.flush(15), p.store.stats()
                assert await chat(s, p.url, 5) == [200] * 5
                assert p.flush(5)
                count = p.store.query("SELECT count(*) FROM requests")[2][0][0]
                assert open_files(mnt) == files, "the database reopened without closing what it had open"
                assert rss_mb() < base.rss + 40
    assert count == 75 and p.store.stats()["requests_dropped"] == 0
    assert any("cannot write to" in r and "retrying" in r for r in reports), reports
    assert any("writing to" in r and "again after" in r for r in reports), reports


def test_rows_over_the_queue_bound_are_dropped_counted_and_reported(tmp_path: Path) -> None:
    reports: list[str] = []
    with tmpfs(tmp_path / "disk", "2m") as mnt:
        store = Store(mnt / "llmtap.duckdb", flush_interval_s=0.1, max_pending_requests=20, report=reports.append)
        store.start()
        try:
            filler = fill(mnt)
            for i in range(50):
                store.put({"id": str(i), "status": 200})
            assert store.stats()["requests_dropped"] == 30
            assert len([r for r in reports if "new rows are dropped" in r]) == 1
            wait_until_sync(lambda: store.stats()["write_errors"] >= 2, 5, "two write errors")
            filler.unlink()
            assert store.flush(15)
            assert store.query("SELECT count(*) FROM requests")[2] == [(20,)]
        finally:
            store.close()
    assert any("30 request row(s) dropped so far" in r for r in reports), reports


# -- locked, killed, old ------------------------------------------------------------------------------------

HOLD = "import duckdb, sys, time; con = duckdb.connect(sys.argv[1]); print('ready', flush=True); time.sleep(30)"


def test_a_locked_database_names_its_holder_at_startup(tmp_path: Path) -> None:
    db = tmp_path / "held.duckdb"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(db)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        done = subprocess.run([sys.executable, "-m", "proxy", "serve", "--port", "0", "--upstream",
                               "http://127.0.0.1:9", "--db", str(db)], capture_output=True, text=True, timeout=30)
    finally:
        holder.kill()
        holder.wait(5)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"is in use by another process (PID {holder.pid}" in done.stderr and "llmtap sql" in done.stderr


async def traffic_until_killed(serve: Serve, kill_at: float, at_write: bool) -> list[float]:
    """Requests from 16 clients; SIGKILL at `kill_at` s (or at the first WAL growth after it)."""
    done: list[float] = []
    stop = asyncio.Event()

    async def client(s: aiohttp.ClientSession) -> None:
        while not stop.is_set():
            try:
                await chat(s, serve.base, 1)
            except (aiohttp.ClientError, AssertionError):
                return
            done.append(time.monotonic())

    wal = Path(f"{serve.db}.wal")
    async with aiohttp.ClientSession() as s:
        clients = [asyncio.create_task(client(s)) for _ in range(16)]
        await asyncio.sleep(kill_at)
        size = wal.stat().st_size if wal.exists() else 0
        deadline = time.monotonic() + 2
        while at_write and time.monotonic() < deadline and (wal.stat().st_size if wal.exists() else 0) == size:
            await asyncio.sleep(0.0005)
        serve.proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        stop.set()
        await asyncio.gather(*clients)
    assert serve.stop() == -signal.SIGKILL
    return [t for t in done if t < killed] + [killed]


async def test_sigkill_loses_at_most_the_last_flush_interval(tmp_path: Path) -> None:
    """`llmtap serve` writes about every second (flush_interval_s = 1.0): a SIGKILL loses the rows of
    the requests that ended in the last interval before it and of the write under way, no more, and
    the file opens again. One kill at an arbitrary moment, one just as a write reaches the WAL."""
    db = tmp_path / "killed.duckdb"
    expected, figures = 0, []
    async with Simulator(SimConfig(ttft_ms=5, itl_ms=1, tokens=20, prefill_us_per_token=0)) as sim:
        for kill_at, at_write in ((1.7, False), (1.3, True)):
            async with Serve(sim.url, db, "--quiet") as serve:
                *done, killed = await traffic_until_killed(serve, kill_at, at_write)
            con = duckdb.connect(str(db), read_only=True)  # it opens: the WAL is replayed
            stored = con.execute("SELECT count(*) FROM requests").fetchone()[0] - expected
            con.close()
            lost = max(0, len(done) - stored)
            span = killed - sorted(done)[-lost] if lost else 0.0  # the lost rows are those of the last `span` s
            figures.append(f"{lost} of {len(done)} rows lost, the last {span:.2f} s")
            assert span < 1.0 + 0.5, figures  # the flush interval, and the write under way at the kill
            expected += stored
        print("SIGKILL:", "; ".join(figures))
        async with Serve(sim.url, db, "--quiet") as serve, aiohttp.ClientSession() as s:  # it writes there again
            assert await chat(s, serve.base, 3) == [200] * 3
            assert serve.stop() == 0
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM requests").fetchone()[0] == expected + 3
    con.close()


async def test_a_database_of_an_older_schema_is_migrated_by_serve(sim: Simulator, tmp_path: Path) -> None:
    db = tmp_path / "old.duckdb"
    con = duckdb.connect(str(db))
    migrate(con, MIGRATIONS[:1])  # as llmtap 0.1 left it
    con.execute("INSERT INTO requests (id, status, outcome) VALUES ('from-0.1', 200, 'ok')")
    con.close()
    async with Serve(sim.url, db, "--quiet", "--capture-bodies") as serve, aiohttp.ClientSession() as s:
        assert await chat(s, serve.base, 2) == [200, 200]
        assert serve.stop() == 0
    con = duckdb.connect(str(db), read_only=True)
    applied = [n for (n,) in con.execute("SELECT name FROM _llmtap_migrations ORDER BY name").fetchall()]
    assert applied == [fn.__name__ for fn in MIGRATIONS]
    assert con.execute("SELECT count(*), count(*) FILTER (id = 'from-0.1') FROM requests").fetchone() == (3, 1)
    assert con.execute("SELECT count(*) FROM bodies").fetchone() == (2,)
    described = [(name, kind) for name, kind, *_ in con.execute("DESCRIBE bodies").fetchall()]
    con.close()
    assert described == [(name, str(duckdb.sqltype(kind))) for name, kind in BODY_COLUMNS]


async def test_duckdb_memory_inside_the_proxy_is_bounded(sim: Simulator, tmp_path: Path) -> None:
    """DuckDB caches what it wrote up to its memory limit, 80% of RAM unless told: serve tells it."""
    async with RunningProxy(proxy_config(sim.url, tmp_path)) as p:
        assert p.store is not None
        assert p.store.query("SELECT current_setting('memory_limit')")[2] == [("256.0 MiB",)]
    async with RunningProxy(proxy_config(sim.url, tmp_path, db_memory_mb=64)) as p:
        assert p.store is not None
        assert p.store.query("SELECT current_setting('memory_limit')")[2] == [("64.0 MiB",)]


# -- the file removed or replaced while serving ------------------------------------------------------


@pytest.mark.parametrize("how", ["removed", "replaced"])
async def test_a_database_file_removed_or_replaced_while_serving_gets_the_later_rows(
        sim: Simulator, tmp_path: Path, how: str) -> None:
    """`rm` of the file (and its .wal), or another database renamed over it: the writer notices before its
    next write, the rows from then on land in the file the path names now, and health says so."""
    reports: list[str] = []
    db = tmp_path / "llmtap.duckdb"
    async with RunningProxy(proxy_config(sim.url, tmp_path), report=reports.append) as p:
        assert p.store is not None
        async with aiohttp.ClientSession() as s:
            assert await chat(s, p.url, 3) == [200] * 3
            assert p.flush(5)
            if how == "removed":
                db.unlink()
                Path(f"{db}.wal").unlink(missing_ok=True)
            else:
                other = tmp_path / "other.duckdb"
                duckdb.connect(str(other)).close()  # a database without llmtap's tables
                os.replace(other, db)
            assert await chat(s, p.url, 4) == [200] * 4
            assert p.flush(5)
            async with s.get(p.url + "/_llmtap/health", headers=p.admin.headers()) as r:
                health = await r.json()
            assert p.store.query("SELECT count(*) FROM requests")[2][0][0] == 4
            assert not [f for f in open_files(tmp_path) if "(deleted)" in f]
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM requests").fetchone() == (4,)
    assert con.execute("SELECT count(*) FROM chunks").fetchone()[0] > 0
    con.close()
    kept = "recreated it" if how == "removed" else "opened the new file"
    warning = f"llmtap store: {db} was {how} while serving; {kept}, rows from now on are kept there"
    assert health["ok"] is True and health["warnings"] == [warning]
    assert health["store"]["files_recreated"] == 1 and health["store"]["requests_dropped"] == 0
    assert reports.count(warning) == 1, reports
    assert db.stat().st_mode & 0o077 == 0 or how == "replaced"  # a file llmtap creates is private


async def test_health_status_doctor_and_metrics_say_so_while_writes_fail(sim: Simulator, tmp_path: Path) -> None:
    """A full disk under a real `serve`: health is still `ok` (it serves; every admin client finds it
    so) but its warnings say since when no write succeeds and what waits in memory; `llmtap status`
    and `doctor` repeat it, Prometheus has a gauge; all of it goes once the space is back."""
    with tmpfs(tmp_path / "disk", "4m") as mnt:
        db = mnt / "llmtap.duckdb"
        async with Serve(sim.url, db, "--quiet") as serve, aiohttp.ClientSession() as s:
            assert await chat(s, serve.base, 5) == [200] * 5
            filler = fill(mnt)
            assert await chat(s, serve.base, 30) == [200] * 30  # each row a WAL append that fails

            def answer() -> dict:
                found = serve.admin.health()
                assert found is not None and found["ok"] is True
                return found
            await wait_until(lambda: answer()["store"]["failing_since"] is not None, 10, "health says writes fail")
            health = answer()
            warning = health["warnings"][0]
            assert warning.startswith(f"cannot write to {db} since ") and "No space left" in warning, warning
            assert "wait in memory and are lost if the process stops now" in warning
            waiting = int(warning.split("): ")[1].split(" request row")[0])
            assert 0 < waiting <= 35, warning
            async with s.get(serve.admin.endpoint("metrics"), headers=serve.admin.headers()) as r:
                line = next(x for x in (await r.text()).splitlines()
                            if x.startswith("llmtap_store_write_failing_seconds "))
            assert float(line.split()[1]) > 0
            status = subprocess.run([sys.executable, "-m", "proxy", "status", "--db", str(db)],
                                    capture_output=True, text=True, timeout=60)
            assert f"WARNING   cannot write to {db} since" in status.stdout, status.stdout + status.stderr
            doctor = subprocess.run([sys.executable, "-m", "proxy", "doctor", "--db", str(db), "--port",
                                     str(serve.port)], capture_output=True, text=True, timeout=60)
            assert "cannot write to" in doctor.stdout and "free space" in doctor.stdout, doctor.stdout + doctor.stderr
            filler.unlink()
            await wait_until(lambda: not answer()["warnings"], 20, "the warning gone once space is back")
            assert answer()["store"]["write_failing_s"] == 0
            assert serve.stop() == 0
