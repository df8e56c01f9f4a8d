"""Where the proxy listens and how commands find it (#17): both loopback addresses by default,
`--host` repeatable, doctor's word on a `localhost` that resolves to an address nothing listens on,
and one state file per running proxy."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from proxy.common import instances as running
from .serving import RunningProxy
from proxy.simulator.app import Simulator

from .conftest import proxy_config, rows
from .faultkit import Serve
from .test_run import clean_env, llmtap

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def test_by_default_both_loopback_addresses_answer(sim: Simulator, tmp_path: Path) -> None:
    async with RunningProxy(proxy_config(sim.url, tmp_path)) as p:
        assert p.url == f"http://127.0.0.1:{p.port}"  # what the banner and setup print
        assert p.listening == ["127.0.0.1", "::1"]
        async with aiohttp.ClientSession() as s:
            for base in (f"http://127.0.0.1:{p.port}", f"http://[::1]:{p.port}", f"http://localhost:{p.port}"):
                async with s.post(base + "/v1/chat/completions", json=CHAT) as r:
                    assert r.status == 200, base
        assert len(rows(p)) == 3


async def test_host_is_repeatable_and_the_first_is_the_one_told(sim: Simulator, tmp_path: Path) -> None:
    serve = await Serve(sim.url, tmp_path / "h.duckdb", "--host", "::1", "--host", "127.0.0.1").started()
    try:
        assert serve.state is not None and serve.state.url == f"http://[::1]:{serve.port}"
        async with aiohttp.ClientSession() as s:
            for host in ("[::1]", "127.0.0.1"):
                async with s.post(f"http://{host}:{serve.port}/v1/chat/completions", json=CHAT) as r:
                    assert r.status == 200
    finally:
        assert serve.stop() == 0, serve.output()
    assert f"(on ::1 and 127.0.0.1, port {serve.port})" in serve.output()


def _with_hosts_file(hosts: Path, argv: list[str]) -> list[str]:
    """argv run where /etc/hosts is `hosts` (a private mount namespace), as on systems whose
    localhost is ::1 first."""
    script = 'mount --bind "$0" /etc/hosts && exec "$@"'
    return ["unshare", "--mount", "sh", "-c", script, str(hosts), *argv]


def _can_remount_hosts(hosts: Path) -> bool:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    probe = subprocess.run(_with_hosts_file(hosts, ["getent", "ahosts", "localhost"]), capture_output=True,
                           text=True, timeout=20)
    return probe.returncode == 0 and probe.stdout.startswith("::1")


async def test_doctor_warns_when_localhost_resolves_where_nothing_listens(sim: Simulator, tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("::1 localhost\n127.0.0.1 localhost\n")
    if not _can_remount_hosts(hosts):
        pytest.skip("needs root and unshare to give doctor an /etc/hosts with ::1 localhost")
    only_v4 = await Serve(sim.url, tmp_path / "v4.duckdb", "--host", "127.0.0.1").started()
    try:
        env = {**clean_env(tmp_path), "ANTHROPIC_BASE_URL": f"http://localhost:{only_v4.port}"}
        argv = _with_hosts_file(hosts, [sys.executable, "-m", "proxy", "doctor", "--port", str(only_v4.port),
                                        "--db", str(tmp_path / "v4.duckdb")])
        done = await asyncio.create_subprocess_exec(*argv, env=env, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(done.communicate(), 60)
    finally:
        only_v4.stop()
    line = next((x for x in out.decode().splitlines() if "ANTHROPIC_BASE_URL" in x), "")
    assert line.startswith("WARN") and "localhost resolves to ::1" in line and "nothing listens" in line, out
    async with RunningProxy(proxy_config(sim.url, tmp_path, port=only_v4.port)) as both:  # the default: no gap
        running.write_state(host="127.0.0.1", port=both.port, db=str(both.config.db_path), admin_token=both.admin_token)
        argv = _with_hosts_file(hosts, [sys.executable, "-m", "proxy", "doctor", "--port", str(both.port),
                                        "--db", str(tmp_path / "other.duckdb")])
        done = await asyncio.create_subprocess_exec(*argv, env=env, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(done.communicate(), 60)
    line = next((x for x in out.decode().splitlines() if "ANTHROPIC_BASE_URL" in x), "")
    assert line.startswith("OK"), out


async def count_through_sql(db: Path, expected: int) -> int:
    """`llmtap sql` on `db` (held by a serve) until it counts `expected` rows: the store writes each second."""
    for _ in range(40):
        code, out, err = await llmtap("sql", "--db", str(db), "SELECT count(*) AS n FROM requests",
                                      "--format", "csv", env=dict(os.environ))
        assert code == 0, err
        if int(out.split()[1]) >= expected:
            break
        await asyncio.sleep(0.25)
    return int(out.split()[1])


async def test_two_serves_keep_their_own_state_and_each_database_finds_its_proxy(sim: Simulator,
                                                                                 tmp_path: Path) -> None:
    first = await Serve(sim.url, tmp_path / "first.duckdb").started()
    second = await Serve(sim.url, tmp_path / "second.duckdb").started()
    try:
        async with aiohttp.ClientSession() as s:
            for serve, n in ((first, 2), (second, 1)):
                for _ in range(n):
                    async with s.post(serve.base + "/v1/chat/completions", json=CHAT) as r:
                        assert r.status == 200
        assert {s.port for s in running.states()} == {first.port, second.port}
        for serve, n in ((first, 2), (second, 1)):
            assert await count_through_sql(serve.db, n) == n
        assert second.stop() == 0
        assert await count_through_sql(first.db, 2) == 2  # the first still answers for its database
        assert [s.port for s in running.states()] == [first.port]
    finally:
        first.stop()
        second.stop()
