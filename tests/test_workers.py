"""`llmtap serve --workers 2`: two processes relay on one port, one database gets every row.

Real `serve` processes against the simulated upstream, on loopback and port 0. Each request goes over a
fresh connection, so the kernel (SO_REUSEPORT) spreads them over both processes; with 2 processes and
dozens of connections, the chance that one process gets none is below 2^-40.
"""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import duckdb
import pytest

from proxy.common import paths, instances as running
from .state_files import state_of
from proxy.simulator.app import Simulator
from proxy.serve.workers import VIA_HEADER

from .waiting import START_S

CHAT = {"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]}


async def start_serve(upstream: str, db: Path, *extra: str) -> tuple[subprocess.Popen, running.State]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--port", "0", "--upstream", upstream, "--db", str(db), "--quiet",
         "--workers", "2", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if (state := state_of(proc.pid)) is not None:
            return proc, state
        if proc.poll() is not None:
            raise AssertionError(f"serve exited: {proc.stderr.read() if proc.stderr else ''}")
        await asyncio.sleep(0.05)
    proc.kill()
    raise AssertionError(f"serve --workers 2 did not start in {START_S:g} s")


def stop(proc: subprocess.Popen) -> tuple[str, str]:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.communicate(timeout=40)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()


def fresh_connections() -> aiohttp.ClientSession:
    """Every request on a new connection: the kernel picks a process for each."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))


async def chat(s: aiohttp.ClientSession, base: str, stream: bool = False, **headers: str) -> bytes:
    async with s.post(base + "/v1/chat/completions", json={**CHAT, "stream": stream}, headers=headers) as r:
        body = await r.read()
        assert r.status == 200, body
        return body


async def sql(s: aiohttp.ClientSession, admin: running.AdminClient, query: str) -> tuple[int, str | None, list]:
    async with s.post(admin.endpoint("sql"), json={"sql": query}, headers=admin.headers()) as r:
        data = await r.json()
        return r.status, r.headers.get(VIA_HEADER), data.get("rows", data)


async def count_until(s: aiohttp.ClientSession, admin: running.AdminClient, expected: int,
                      query: str = "SELECT count(*) FROM requests") -> int:
    n = -1
    for _ in range(100):  # rows reach the database within about a second; 20 s at most
        status, _via, rows = await sql(s, admin, query)
        assert status == 200, rows
        if (n := rows[0][0]) >= expected:
            return n
        await asyncio.sleep(0.2)
    return n


async def health(s: aiohttp.ClientSession, admin: running.AdminClient) -> dict:
    async with s.get(admin.endpoint("health"), headers=admin.headers()) as r:
        assert r.status == 200
        return await r.json()


def open_files(pid: int) -> list[str]:
    found = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            found.append(os.readlink(fd))
        except OSError:
            pass
    return found


async def test_every_process_relays_and_the_one_database_gets_every_row(sim: Simulator, tmp_path: Path) -> None:
    db = tmp_path / "workers.duckdb"
    proc, state = await start_serve(sim.url, db)
    admin = running.AdminClient(state.url, state.admin_token)
    try:
        assert len(state.workers) == 1 and state.workers[0] != proc.pid
        async with fresh_connections() as s:
            await asyncio.gather(*(chat(s, state.url) for _ in range(60)),
                                 *(chat(s, state.url, stream=True) for _ in range(20)))
            assert await count_until(s, admin, 80) == 80
            assert await count_until(s, admin, 20, "SELECT count(DISTINCT request_id) FROM chunks") == 20
            # each process relayed some; the counts are exact and add up
            processes = (await health(s, admin))["workers"]
            assert [p["role"] for p in processes] == ["primary", "worker"]
            assert [p["pid"] for p in processes] == [proc.pid, state.workers[0]]
            assert all(p["requests"] > 0 for p in processes), processes
            assert sum(p["requests"] for p in processes) == 80
            assert "p99_ms" in processes[1]["event_loop_lag"]  # the worker's own, from its heartbeat
            # the admin SQL answers on whichever process takes the connection, with the same rows
            answers = [await sql(s, admin, "SELECT count(*) FROM requests") for _ in range(30)]
            assert {(status, rows[0][0]) for status, _via, rows in answers} == {(200, 80)}
            assert {via for _status, via, _rows in answers} == {None, "1"}  # the primary's own, and relayed
            # Prometheus counts every process's requests
            async with s.get(admin.endpoint("metrics"), headers=admin.headers()) as r:
                assert r.status == 200
                assert "80.0" in await r.text()
            # and without the token, or with a wrong one, every process refuses
            for headers in ({}, {running.TOKEN_HEADER: "guessed"}, {"Authorization": "Bearer guessed"}):
                for _ in range(15):
                    async with s.post(admin.endpoint("sql"), json={"sql": "SELECT 1"}, headers=headers) as r:
                        assert r.status == 403
                    async with s.get(admin.endpoint("live"), headers=headers) as r:
                        assert r.status == 403
            # a browser page is refused even with the token, on every process
            for _ in range(15):
                async with s.get(admin.endpoint("health"),
                                 headers={**admin.headers(), "Origin": "https://evil.example"}) as r:
                    assert r.status == 403
    finally:
        out, err = stop(proc)
    assert proc.returncode == 0, err
    con = duckdb.connect(str(db), read_only=True)
    refused = "error_type = 'admin_forbidden'"  # each refused admin request leaves a row too
    assert con.execute(f"SELECT count(*) FILTER (NOT coalesce({refused}, false)), count(*) FILTER ({refused}), count(DISTINCT id) "
                       "FROM requests").fetchone() == (80, 105, 185)
    con.close()
    assert not list(paths.state_dir().glob("*"))  # the state file and the private socket are gone


async def test_no_worker_opens_the_database_and_the_token_is_not_in_its_command_line(
        sim: Simulator, tmp_path: Path) -> None:
    db = tmp_path / "private.duckdb"
    proc, state = await start_serve(sim.url, db)
    try:
        async with fresh_connections() as s:
            await asyncio.gather(*(chat(s, state.url, stream=True) for _ in range(20)))
            assert await count_until(s, running.AdminClient(state.url, state.admin_token), 20) == 20
        worker = state.workers[0]
        assert any(f.startswith(str(db)) for f in open_files(proc.pid))  # the primary holds it
        assert not any(str(db) in f for f in open_files(worker))  # the worker, not even its WAL
        assert str(db) not in Path(f"/proc/{worker}/maps").read_text()
        token = state.admin_token or ""
        assert token and token.encode() not in Path(f"/proc/{worker}/cmdline").read_bytes()
        assert token.encode() not in Path(f"/proc/{worker}/environ").read_bytes()
        run_dir = paths.state_dir()
        assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
        for path in run_dir.iterdir():  # the state file and the primary's private socket
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    finally:
        out, err = stop(proc)
    assert proc.returncode == 0, err
    assert token not in out + err


async def test_sigterm_flushes_the_rows_of_every_process_in_flight(sim: Simulator, tmp_path: Path) -> None:
    db = tmp_path / "stop.duckdb"
    proc, state = await start_serve(sim.url, db)
    slow = {"x-sim-tokens": "20", "x-sim-itl-ms": "50"}  # a second each: still streaming when SIGTERM comes
    try:
        async with fresh_connections() as s:
            async with s.get(state.url + "/_llmtap/health",
                             headers=running.AdminClient(state.url, state.admin_token).headers()) as r:
                assert r.status == 200
            streams = [asyncio.create_task(chat(s, state.url, stream=True, **slow)) for _ in range(24)]
            for _ in range(200):  # until the upstream has every request (both processes are relaying them)
                if sum(path.startswith("/v1/chat") for _m, path, *_ in sim.requests) >= 24:
                    break
                await asyncio.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            bodies = await asyncio.gather(*streams)
        assert all(b.rstrip().endswith(b"data: [DONE]") for b in bodies)
    finally:
        out, err = stop(proc)
    assert proc.returncode == 0, err
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*), count(*) FILTER (outcome = 'ok') FROM requests").fetchone() == (24, 24)
    assert con.execute("SELECT count(DISTINCT request_id) FROM chunks").fetchone() == (24,)
    con.close()


async def test_a_killed_worker_is_reported_and_replaced(sim: Simulator, tmp_path: Path) -> None:
    db = tmp_path / "restart.duckdb"
    proc, state = await start_serve(sim.url, db)
    admin = running.AdminClient(state.url, state.admin_token)
    try:
        first = state.workers[0]
        os.kill(first, signal.SIGKILL)
        replaced = None
        for _ in range(200):  # the primary starts another at once (it was not young), 20 s at most
            now = state_of(proc.pid)
            if now is not None and now.workers and now.workers[0] != first:
                replaced = now.workers[0]
                break
            await asyncio.sleep(0.1)
        assert replaced is not None
        async with fresh_connections() as s:
            await asyncio.gather(*(chat(s, state.url) for _ in range(40)))
            assert await count_until(s, admin, 40) == 40
            processes = (await health(s, admin))["workers"]
            assert processes[1]["pid"] == replaced and processes[1]["restarts"] == 1
            assert processes[1]["requests"] > 0 and processes[0]["requests"] > 0
    finally:
        out, err = stop(proc)
    assert proc.returncode == 0, err
    assert f"worker 1 (pid {first}) was killed by signal 9" in err


async def test_top_s_live_feed_streams_through_either_process(sim: Simulator, tmp_path: Path) -> None:
    db = tmp_path / "live.duckdb"
    proc, state = await start_serve(sim.url, db)
    admin = running.AdminClient(state.url, state.admin_token)
    vias: set[str | None] = set()
    try:
        async with fresh_connections() as s:
            for _ in range(12):
                async with s.get(admin.endpoint("live"), headers=admin.headers()) as r:
                    assert r.status == 200
                    vias.add(r.headers.get(VIA_HEADER))
                    load = asyncio.gather(*(chat(s, state.url) for _ in range(6)))
                    seen = 0
                    for _ in range(40):  # ticks, 250 ms apart: until the six finished requests show
                        line = await asyncio.wait_for(r.content.readline(), 10)
                        if line.startswith(b"data: "):
                            seen += line.count(b'"outcome":"ok"')  # finished entries only
                            if seen >= 6:
                                break
                    await load
                    assert seen >= 6  # rows finished in either process reach the feed
                if len(vias) == 2:
                    break
    finally:
        out, err = stop(proc)
    assert proc.returncode == 0, err
    assert vias == {None, "1"}


async def test_a_port_another_process_listens_on_stops_the_start(sim: Simulator, tmp_path: Path) -> None:
    """SO_REUSEPORT must not let serve --workers share a port that is already taken."""
    import socket

    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # even one that would share it
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "proxy", "serve", "--host", "127.0.0.1", "--port", str(port),
                               "--upstream", sim.url, "--db", str(tmp_path / "x.duckdb"), "--workers", "2"],
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "cannot listen" in proc.stderr and "in use" in proc.stderr
    assert not list(paths.state_dir().glob("*.json"))


def gone(pid: int) -> bool:
    """The process has exited (a zombie no one reaps yet counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


async def tagged_stream(s: aiohttp.ClientSession, base: str, tag: str, ended: dict[str, float]) -> None:
    """A slow stream tagged `tag`; its end time in `ended` if it came whole (the primary's own are cut)."""
    slow = {"x-sim-tokens": "40", "x-sim-itl-ms": "50", "x-llmtap-tag": tag}  # two seconds each
    try:
        body = await chat(s, base, stream=True, **slow)
    except (aiohttp.ClientError, AssertionError):
        return
    if body.rstrip().endswith(b"data: [DONE]"):
        ended[tag] = time.monotonic()


async def test_rows_a_worker_finishes_after_its_primary_is_killed_are_written_once_by_the_next_start(
        sim: Simulator, tmp_path: Path) -> None:
    db = tmp_path / "spill.duckdb"
    proc, state = await start_serve(sim.url, db)
    worker = state.workers[0]
    ended: dict[str, float] = {}
    try:
        async with fresh_connections() as s:
            streams = [asyncio.create_task(tagged_stream(s, state.url, f"s{i}", ended)) for i in range(24)]
            for _ in range(200):  # until the upstream has every request (both processes are relaying them)
                if sum(path.startswith("/v1/chat") for _m, path, *_ in sim.requests) >= 24:
                    break
                await asyncio.sleep(0.05)
            proc.kill()
            killed = time.monotonic()
            await asyncio.wait_for(asyncio.gather(*streams), 30)
    finally:
        stop(proc)
    for _ in range(300):  # the worker ends its requests (up to 5 s), spills, and exits
        if gone(worker):
            break
        await asyncio.sleep(0.05)
    assert gone(worker)
    after = {tag for tag, t in ended.items() if t > killed}  # finished by the worker alone
    assert after, ended  # the kernel gave it some of the 24 (2^-24 that it got none)
    run_dir = paths.state_dir()
    (spilled,) = run_dir.glob("spill-*.jsonl")
    assert stat.S_IMODE(spilled.stat().st_mode) == 0o600 and stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    kept = spilled.read_bytes()
    for _attempt in range(2):  # the second start finds the same file again, as after a crash before its removal
        proc, state = await start_serve(sim.url, db)
        try:
            async with fresh_connections() as s:
                admin = running.AdminClient(state.url, state.admin_token)
                assert await count_until(s, admin, len(after)) >= len(after)
                for _ in range(100):
                    if not spilled.exists():
                        break
                    await asyncio.sleep(0.1)
        finally:
            out, err = stop(proc)
        assert proc.returncode == 0, err
        assert not spilled.exists()
        spilled.write_bytes(kept)
        os.chmod(spilled, 0o600)
    assert "already there" in err
    spilled.unlink()
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("SELECT tag, count(*) FROM requests GROUP BY tag").fetchall()
    chunks = con.execute("SELECT count(*), count(DISTINCT request_id) FROM chunks").fetchone()
    con.close()
    assert {tag for tag, _ in rows} >= after and all(n == 1 for _, n in rows), (rows, after)
    assert {tag for tag, _ in rows} <= set(ended)  # rows only of streams that came whole
    assert chunks[1] == len(rows) and chunks[0] >= 40 * len(rows)  # each request's chunk rows came with it
    print(f"primary killed: {len(after)} of 24 streams finished by the worker, {len(rows)} rows after the restart")


async def test_private_sockets_killed_primaries_left_are_removed_at_start_and_nothing_else(
        sim: Simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil
    import tempfile

    # a home short enough for the socket to be in its run directory (under pytest-xdist, tmp_path is 10
    # characters longer, and a path past workers.SOCKET_PATH_MAX goes to a directory of its own)
    home = tempfile.mkdtemp(prefix="llmtap-")
    monkeypatch.setenv("LLMTAP_HOME", home)
    try:
        await _private_sockets(sim, tmp_path)
    finally:
        shutil.rmtree(home, ignore_errors=True)


async def _private_sockets(sim: Simulator, tmp_path: Path) -> None:
    import socket

    db = tmp_path / "sockets.duckdb"
    proc, state = await start_serve(sim.url, db)
    proc.kill()
    stop(proc)
    for _ in range(300):
        if gone(state.workers[0]):
            break
        await asyncio.sleep(0.05)
    run_dir = paths.state_dir()
    left = run_dir / f"{state.port}.{proc.pid}.sock"
    assert left.exists()  # what a killed primary leaves
    outside = tmp_path / "outside.sock"
    keep = []
    with socket.socket(socket.AF_UNIX) as bound, socket.socket(socket.AF_UNIX) as listening, \
            socket.socket(socket.AF_UNIX) as others:
        bound.bind(str(outside))  # a socket elsewhere, named by a symlink in the run directory
        (run_dir / f"1.{proc.pid}.sock").symlink_to(outside)
        keep.append(run_dir / f"1.{proc.pid}.sock")
        (run_dir / f"2.{proc.pid}.sock").write_bytes(b"")  # not a socket
        keep.append(run_dir / f"2.{proc.pid}.sock")
        listening.bind(str(run_dir / f"3.{os.getpid()}.sock"))  # a live process listens on it
        listening.listen()
        keep.append(run_dir / f"3.{os.getpid()}.sock")
        others.bind(str(run_dir / f"4.{proc.pid}.sock"))  # another user's
        os.chown(run_dir / f"4.{proc.pid}.sock", 65534, 65534)
        keep.append(run_dir / f"4.{proc.pid}.sock")
        (run_dir / "notes.sock").write_bytes(b"")  # not a name of ours
        keep.append(run_dir / "notes.sock")
        with socket.socket(socket.AF_UNIX) as reused:  # its pid alive (pid reuse) but nobody listens
            reused.bind(str(run_dir / f"5.{os.getpid()}.sock"))
        proc, state = await start_serve(sim.url, db)
        out, err = stop(proc)
        assert proc.returncode == 0, err
        assert not left.exists() and not (run_dir / f"5.{os.getpid()}.sock").exists()
        assert all(os.path.lexists(path) for path in keep), sorted(os.listdir(run_dir))
        assert outside.exists()


async def test_a_spill_file_someone_else_could_have_written_is_left_alone(sim: Simulator, tmp_path: Path) -> None:
    from datetime import datetime, timezone

    from proxy.serve import spill

    db = tmp_path / "planted.duckdb"
    run_dir = running.private_dir()

    def planted(n: int) -> Path:
        row = {"id": f"{n:032x}", "status": 200, "outcome": "ok", "started_at": datetime.now(timezone.utc),
               "tag": f"p{n}"}
        made = spill.write([(row, [], None)], db)
        return made.rename(run_dir / f"spill-{n}.jsonl")

    good = planted(1)
    planted(2).chmod(0o644)  # others can read it
    planted(3).chmod(0o620)  # others can write it
    os.chown(planted(4), 65534, 65534)  # another user's
    outside = planted(5).rename(tmp_path / "spill-5.jsonl")
    (run_dir / "spill-5.jsonl").symlink_to(outside)
    proc, state = await start_serve(sim.url, db)
    try:
        async with fresh_connections() as s:
            admin = running.AdminClient(state.url, state.admin_token)
            assert await count_until(s, admin, 1) == 1
    finally:
        out, err = stop(proc)
    assert proc.returncode == 0, err
    assert not good.exists() and outside.exists()
    assert all((run_dir / f"spill-{n}.jsonl").exists() for n in (2, 3, 4)) and os.path.islink(run_dir / "spill-5.jsonl")
    assert err.count("left ") == 4, err
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT list(tag) FROM requests").fetchone()[0] == ["p1"]
    con.close()


async def test_the_web_ui_logs_in_and_answers_through_either_process(sim: Simulator, tmp_path: Path) -> None:
    """`llmtap ui --no-browser`'s link, traded on some process, gives a session every process takes;
    the primary answers the pages and the API (docs/ui.md)."""
    from click.testing import CliRunner

    from proxy.cli import main

    proc, state = await start_serve(sim.url, tmp_path / "ui.duckdb")
    vias: set[str | None] = set()
    try:
        result = await asyncio.to_thread(CliRunner().invoke, main, ["ui", "--no-browser"])
        assert result.exit_code == 0, result.output
        link = result.output.strip().rpartition(" ")[2]
        assert link.startswith(state.url + "/_llmtap/ui/#login=")
        ticket = link.rpartition("=")[2]
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
            async with s.post(state.url + "/_llmtap/ui/login", json={"ticket": ticket}) as r:
                assert r.status == 200 and "Set-Cookie" not in r.headers
                s.headers["X-Llmtap-Ui"] = (await r.json())["session"]
            async with s.post(state.url + "/_llmtap/ui/login", json={"ticket": ticket}) as r:
                assert r.status == 403  # once only, whichever process took it
            for _ in range(16):
                async with s.get(state.url + "/_llmtap/api/requests?since=1h") as r:
                    assert r.status == 200, await r.text()
                    vias.add(r.headers.get(VIA_HEADER))
                    assert set(await r.json()) >= {"total", "rows"}  # a worker's rows reach the primary in time
                async with s.get(state.url + "/_llmtap/ui/") as r:
                    assert r.status == 200 and "default-src 'self'" in r.headers["Content-Security-Policy"]
                if len(vias) == 2:
                    break
    finally:
        out, err = stop(proc)
    assert proc.returncode == 0, err
    assert vias == {None, "1"}
