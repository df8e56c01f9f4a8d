"""proxy/common/instances.py: the state files of running proxies and the admin client, against a real proxy."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from proxy.common import paths, instances as running
from .serving import RunningProxy
from .state_files import state_of
from proxy.simulator.app import Simulator

from .conftest import proxy_config


def test_a_state_file_is_owner_only_and_names_its_proxy(tmp_path: Path) -> None:
    path = running.write_state(host="::1", port=4321, db=str(tmp_path / "x.duckdb"), admin_token="t0k")
    assert path == paths.state_dir() / "4321.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    state = running.read_state(path)
    assert state is not None and (state.url, state.admin_token, state.pid) == ("http://[::1]:4321", "t0k", os.getpid())
    assert state.holds(tmp_path / "x.duckdb") and not state.holds(tmp_path / "y.duckdb")
    assert state_of(os.getpid()) == state
    running.clear_state(path)
    assert not path.exists()


def test_a_dead_proxys_state_is_stale_not_running(tmp_path: Path) -> None:
    directory = paths.state_dir()
    directory.mkdir(parents=True)
    dead = 2**22 + 12345  # above the default pid_max: no such process
    (directory / "9.json").write_text(json.dumps({"pid": dead, "host": "127.0.0.1", "port": 9, "db": None,
                                                  "admin_token": "x"}))
    assert running.states() == [] and [s.port for s in running.stale_states()] == [9]
    assert running.find_running() is None


def test_connect_host_brackets_ipv6_and_maps_wildcards() -> None:
    assert [running.connect_host(h) for h in (None, "0.0.0.0", "::", "::1", "[::1]", "127.0.0.1")] == [
        "127.0.0.1", "127.0.0.1", "[::1]", "[::1]", "[::1]", "127.0.0.1"]


async def test_the_admin_client_finds_the_proxy_holding_a_database(sim: Simulator, tmp_path: Path) -> None:
    import asyncio

    async with RunningProxy(proxy_config(sim.url, tmp_path)) as p:
        running.write_state(host="127.0.0.1", port=p.port, db=str(p.config.db_path), admin_token=p.admin_token)
        live = await asyncio.to_thread(running.find_running, p.config.db_path)
        other = await asyncio.to_thread(running.find_running, tmp_path / "other.duckdb")
        (columns, _types, found), truncated = await asyncio.to_thread(
            live.client.sql, "SELECT count(*) AS n FROM requests") if live else ((None, None, None), None)
        refused = await asyncio.to_thread(running.AdminClient(p.url, "wrong").health)
    assert live is not None and live.url == p.url and live.health["ok"] is True
    assert other is None and refused is None
    assert (columns, found, truncated) == (["n"], [(0,)], False)


async def test_a_query_without_db_names_the_file_serve_records_to(sim: Simulator, tmp_path: Path) -> None:
    """`llmtap serve --db elsewhere` runs; `llmtap report` without --db finds no file at the default
    path and says where serve records, and how to read it."""
    import asyncio

    from click.testing import CliRunner

    from proxy.cli import main

    elsewhere = tmp_path / "elsewhere" / "team.duckdb"
    elsewhere.parent.mkdir()
    async with RunningProxy(proxy_config(sim.url, tmp_path, db=str(elsewhere))) as p:
        running.write_state(host="127.0.0.1", port=p.port, db=str(elsewhere), admin_token=p.admin_token)
        result = await asyncio.to_thread(CliRunner().invoke, main, ["report"])
    assert result.exit_code != 0
    assert f"records to {elsewhere}: read it with --db {elsewhere}" in result.output, result.output
    assert f"port {p.port}" in result.output


async def test_llmtap_ui_says_which_of_two_serves_it_opened(sim: Simulator, tmp_path: Path) -> None:
    import asyncio

    from click.testing import CliRunner

    from analysis.web import WebUi
    from analysis.web.cli import ui

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with RunningProxy(proxy_config(sim.url, tmp_path / "a"), ui=WebUi()) as first, \
            RunningProxy(proxy_config(sim.url, tmp_path / "b"), ui=WebUi()) as second:
        for p in (first, second):
            running.write_state(host="127.0.0.1", port=p.port, db=str(p.config.db_path), admin_token=p.admin_token)
            os.utime(paths.state_dir() / f"{p.port}.json", (1e9 + (p is second), 1e9 + (p is second)))  # second: newest
        result = await asyncio.to_thread(CliRunner().invoke, ui, ["--no-browser"])
    assert result.exit_code == 0, result.output
    assert f"2 llmtap serves are running; this is the newest, {second.url}" in result.output
    assert f"--url {first.url}  records to {first.config.db_path}" in result.output
