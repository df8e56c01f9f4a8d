"""A real `llmtap serve` process: rows survive SIGTERM, queries work while it serves, no key is stored."""

from __future__ import annotations

import asyncio
import os
import signal
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

from .waiting import START_S, wait_until

KEY = "sk-live-DO-NOT-STORE-4f9a8b7c6d5e"


async def start_serve(upstream: str, db: Path, *extra: str) -> tuple[subprocess.Popen, running.AdminClient]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--port", "0", "--upstream", upstream, "--db", str(db), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if (state := state_of(proc.pid)) is not None:
            return proc, running.AdminClient(state.url, state.admin_token)
        if proc.poll() is not None:
            raise AssertionError(f"serve exited: {proc.stderr.read() if proc.stderr else ''}")
        await asyncio.sleep(0.05)
    proc.kill()
    raise AssertionError(f"serve did not start in {START_S:g} s")


async def stream_once(s: aiohttp.ClientSession, base: str) -> None:
    body = {"model": "gpt-x", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    async with s.post(base + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}) as r:
        await r.read()


async def test_sigterm_flushes_and_queries_work_while_serving(sim: Simulator, tmp_path: Path) -> None:
    db = tmp_path / "serve.duckdb"
    proc, admin = await start_serve(sim.url, db, "--quiet")
    base = admin.url
    try:
        async with aiohttp.ClientSession() as s:
            load = [asyncio.create_task(stream_once(s, base)) for _ in range(40)]
            counts = []
            for _ in range(5):  # queries through the admin endpoint while the streams run
                async with s.post(base + "/_llmtap/sql", json={"sql": "SELECT count(*) FROM requests"},
                                  headers=admin.headers()) as r:
                    assert r.status == 200, await r.text()
                    counts.append((await r.json())["rows"][0][0])
                await asyncio.sleep(0.05)
            await asyncio.gather(*load)
            async with s.post(base + "/_llmtap/sql", json={"sql": "DROP TABLE requests"}, headers=admin.headers()) as r:
                assert r.status == 400
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert counts == sorted(counts)
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*), count(DISTINCT key_fingerprint) FROM requests").fetchone() == (40, 1)
    con.close()
    assert not list(paths.state_dir().glob("*.json"))
    written = [p for p in tmp_path.rglob("*") if p.is_file()] + [p for p in paths.data_dir().rglob("*") if p.is_file()]
    for path in written:
        assert KEY.encode() not in path.read_bytes(), path
        assert KEY[8:].encode() not in path.read_bytes(), path
    assert KEY not in out + err
    assert oct(os.stat(db).st_mode & 0o777) == "0o600"


async def test_no_upstream_refuses_to_start(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "proxy", "serve", "--port", "0"], capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0
    assert "no upstream configured" in proc.stderr and "llmtap serve --upstream" in proc.stderr


async def test_health_reports_store_and_loop_lag(sim: Simulator, tmp_path: Path) -> None:
    from .serving import RunningProxy

    from .conftest import proxy_config

    async with RunningProxy(proxy_config(sim.url, tmp_path)) as p:
        await wait_until(lambda: p.state.loop_lag.samples, what="a loop lag sample")
        async with aiohttp.ClientSession() as s:
            async with s.get(p.url + "/_llmtap/health", headers=p.admin.headers()) as r:
                health = await r.json()
    assert health["ok"] is True and health["store"]["requests_written"] == 0
    assert health["event_loop_lag"]["p99_ms"] is not None and health["event_loop_lag"]["p99_ms"] < 50


def test_a_soft_limit_of_open_files_is_raised_towards_the_hard_one() -> None:
    """A connection holds two descriptors while its next request is read stamped (proxy/relay/kernel_timing.py):
    serve (RunningProxy, before it reckons its cap of connections) started under a soft limit of 1,024
    raises it towards the hard limit."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 1024:
        pytest.skip(f"the hard limit here is {hard}")
    code = ("import resource; from proxy.serve.server import raise_open_files; raise_open_files(); "
            "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])")
    out = subprocess.run(["bash", "-c", f'ulimit -S -n 1024 && "{sys.executable}" -c "{code}"'],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == min(65_536, hard if hard != resource.RLIM_INFINITY else 65_536)
