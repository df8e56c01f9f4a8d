"""Retention and size: serve deletes old rows as it runs, `llmtap prune` and `compact` shrink a file,
`compact` leaves a file a serve holds alone, `llmtap status` says what the file holds."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import re
import stat
from pathlib import Path

import aiohttp
import duckdb
import pytest
from click.testing import CliRunner

from proxy.record import retention, store as store_mod
from analysis.db_status import fmt_bytes
from proxy.cli import main
from .serving import RunningProxy
from proxy.simulator.app import Simulator
from proxy.record.store import Store

from .conftest import proxy_config, rows
from .waiting import wait_until
from .faultkit import Serve

UTC = dt.timezone.utc
NOW = dt.datetime.now(UTC)


def old_request(p: Store, rid: str, days: float, *, chunks: int = 3, body: bool = True) -> None:
    """A request row `days` old, with its chunks (and body), through the store as the proxy puts them."""
    if body:
        p.put_body((rid, "request body " * 20, "response body " * 20, False, False))
    p.put({"id": rid, "started_at": NOW - dt.timedelta(days=days), "kind": "generation", "status": 200},
          [(rid, i, float(i), 40, "content_block_delta") for i in range(chunks)])


async def test_serve_retention_deletes_old_rows_in_batches(sim: Simulator, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(store_mod, "PRUNE_INTERVAL_S", 0.1)
    monkeypatch.setattr(retention, "BATCH_REQUESTS", 2)  # five old requests: three steps
    reports: list[str] = []
    config = proxy_config(sim.url, tmp_path, retain_days=30, retain_bodies_days=7, capture_bodies=True)
    async with RunningProxy(config, report=reports.append) as p:
        assert p.store is not None
        for i in range(5):
            old_request(p.store, f"old-{i}", 40 + i)
        old_request(p.store, "mid", 10)  # kept, its body is not
        old_request(p.store, "new", 1)  # kept whole
        async with aiohttp.ClientSession() as session:  # and a request of now, through the proxy
            async with session.post(p.url + "/v1/chat/completions",
                                    json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}) as r:
                assert r.status == 200
                await r.read()
        await p.aflush()
        await wait_until(lambda: p.store.stats()["requests_pruned"] == 5 and p.store.stats()["bodies_pruned"] == 6, 30)
        kept = {r["id"]: r for r in rows(p, "SELECT id FROM requests")}
        assert {"mid", "new"} <= set(kept) and len(kept) == 3 and not any(k.startswith("old") for k in kept)
        assert rows(p, "SELECT DISTINCT request_id FROM chunks WHERE request_id LIKE 'old%'") == []
        assert len(rows(p, "SELECT * FROM chunks WHERE request_id IN ('mid', 'new')")) == 6
        bodies = {r["request_id"] for r in rows(p, "SELECT request_id FROM bodies")}
        assert "new" in bodies and "mid" not in bodies and not any(b.startswith("old") for b in bodies)
        stats = p.store.stats()
        assert (stats["requests_pruned"], stats["chunks_pruned"]) == (5, 15)
    said = [r for r in reports if "retention deleted" in r and "deleted 0 request(s)" not in r]
    # reported once per run, not per step (three steps of two here): one run, unless the writer woke
    # between the puts above and took the first rows apart
    assert 1 <= len(said) <= 2
    assert "requests older than 30 day(s), bodies older than 7 day(s)" in said[0]
    deleted = [re.search(r"deleted (\d+) request\(s\), (\d+) chunk\(s\) and (\d+) body", r).groups() for r in said]
    assert [sum(int(d[i]) for d in deleted) for i in range(3)] == [5, 15, 6]


def test_retention_settings_from_the_config_file(tmp_path: Path):
    path = tmp_path / "config.toml"
    path.write_text('upstream = "http://127.0.0.1:9"\nretain_days = 30\nretain_bodies_days = 2.5\n')
    done = CliRunner().invoke(main, ["serve", "--config", str(path), "--retain-days", "14", "--print-config"])
    assert done.exit_code == 0, done.output
    assert "retain_days = 14.0" in done.output and "retain_bodies_days = 2.5" in done.output
    path.write_text('upstream = "http://127.0.0.1:9"\nretain_days = -1\n')
    done = CliRunner().invoke(main, ["serve", "--config", str(path), "--print-config"])
    assert done.exit_code == 1 and "retain_days is a number of days above 0, not -1" in done.output


def recorded(db: Path, *, old: int, new: int, chunks: int = 200) -> None:
    """`old` requests 60 days old and `new` ones a day old, with their chunks and bodies, written by the Store."""
    s = Store(db, report=lambda _line: None)
    s.start()
    for i in range(old + new):
        old_request(s, f"r{i}", 60 if i < old else 1, chunks=chunks)
        if i % 500 == 499:
            assert s.flush(60)
    assert s.flush(60)
    s.close()


def counts(db: Path) -> tuple[int, int, int]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return tuple(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("requests", "chunks", "bodies"))
    finally:
        con.close()


def test_prune_then_compact_shrink_the_file(tmp_path: Path):
    db = tmp_path / "llmtap.duckdb"
    recorded(db, old=2700, new=300)
    before = db.stat().st_size
    done = CliRunner().invoke(main, ["prune", "--older-than", "30d", "--db", str(db)])
    assert done.exit_code == 0, done.output
    assert done.output.startswith("deleted 2,700 request(s), 540,000 chunk(s) and 2,700 body row(s) of requests started before ")
    assert "to shrink it: llmtap compact" in done.output
    # the sizes it prints are the file's, measured before and after (no "keeps its size" when it grew)
    (said,) = [line for line in done.output.splitlines() if line.startswith("the file ")]
    grown = db.stat().st_size
    change = "grew" if grown > before else "shrank" if grown < before else "kept its size"
    assert said.startswith(f"the file {change}: {fmt_bytes(before)} -> {fmt_bytes(grown)} with its .wal"), said
    assert not db.with_name(db.name + ".wal").exists()  # checkpointed: the size printed is the file's
    assert counts(db) == (300, 60_000, 300)
    free = json.loads(CliRunner().invoke(main, ["status", "--db", str(db), "--format", "json"]).output)["free_bytes"]
    # the deleted rows' blocks, free in a file of the same size: 9 in 10 rows went, but which 256 KiB blocks
    # end free varies with DuckDB's threads (8 of 16 under load, more on a quiet machine)
    assert free > before / 3

    done = CliRunner().invoke(main, ["compact", "--db", str(db)])
    assert done.exit_code == 0, done.output
    assert done.output.startswith(f"compacted {db}: ")
    after = db.stat().st_size
    assert after < before / 2, (before, after)
    assert counts(db) == (300, 60_000, 300)
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    assert sorted(os.listdir(tmp_path)) == ["llmtap.duckdb"]  # no temporary file left
    assert json.loads(CliRunner().invoke(main, ["status", "--db", str(db), "--format", "json"]).output)["free_bytes"] == 0
    s = Store(db)  # and serve opens it: its migrations are all there
    s.start()
    s.close()


def test_prune_bodies_only(tmp_path: Path):
    db = tmp_path / "llmtap.duckdb"
    recorded(db, old=30, new=10, chunks=2)
    done = CliRunner().invoke(main, ["prune", "--older-than", "2w", "--bodies-only", "--db", str(db)])
    assert done.exit_code == 0, done.output
    assert done.output.startswith("deleted 0 request(s), 0 chunk(s) and 30 body row(s)")
    assert counts(db) == (40, 80, 10)


async def test_prune_and_compact_refuse_while_serve_holds_the_file(tmp_path: Path):
    db = tmp_path / "llmtap.duckdb"
    async with Serve("http://127.0.0.1:9", db) as serve:
        for command in ("compact", "prune"):
            args = [command, "--db", str(db), *(["--older-than", "30d"] if command == "prune" else [])]
            done = await asyncio.to_thread(CliRunner().invoke, main, args)
            assert done.exit_code == 1
            assert f"llmtap serve (PID {serve.proc.pid}, {serve.base}) records to {db}: stop it before you {command}" \
                in done.output
            assert "--retain-days N" in done.output
        serve.stop()
    assert counts(db) == (0, 0, 0)


def test_status_of_a_file(tmp_path: Path):
    db = tmp_path / "llmtap.duckdb"
    recorded(db, old=100, new=100, chunks=50)
    done = CliRunner().invoke(main, ["status", "--db", str(db)])
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert lines[0] == f"database  {db}"
    assert lines[1].startswith("size      ") and lines[1].endswith("MiB")
    assert lines[2].startswith("requests  200   ") and lines[2].endswith(" per request")
    assert lines[3].startswith("chunks    10,000   ") and lines[3].endswith(" per chunk")
    assert lines[4].startswith("bodies    200   ")
    assert lines[5] == f"oldest    {NOW - dt.timedelta(days=60):%Y-%m-%d %H:%M:%S} UTC"
    assert lines[6] == f"newest    {NOW - dt.timedelta(days=1):%Y-%m-%d %H:%M:%S} UTC"
    assert lines[7].startswith("proxy     none running: tools pointed at llmtap fail with connection refused")

    data = json.loads(CliRunner().invoke(main, ["status", "--db", str(db), "--format", "json"]).output)
    assert (data["requests"], data["chunks"], data["bodies"]) == (200, 10_000, 200)
    per = data["bytes_per_request"] * 200 + data["bytes_per_chunk"] * 10_000 + data["bytes_per_body"] * 200
    assert per == pytest.approx(data["file_bytes"] - data["free_bytes"], rel=0.01)  # its used blocks, all of them
    assert data["proxy"] is None


async def test_status_through_the_serve_that_holds_it(tmp_path: Path):
    db = tmp_path / "llmtap.duckdb"
    recorded(db, old=0, new=20, chunks=5)
    async with Serve("http://127.0.0.1:9", db) as serve:
        done = await asyncio.to_thread(CliRunner().invoke, main, ["status", "--db", str(db)])
        serve.stop()
    assert done.exit_code == 0, done.output
    assert "requests  20" in done.output and "chunks    100" in done.output
    assert f"proxy     llmtap serve (PID {serve.proc.pid}) at {serve.base} records to this file" in done.output
    fast = next(line for line in done.output.splitlines() if line.startswith("fast      "))  # proxy/relay/fast_paths.py
    assert "body_pipe" in fast and f"(aiohttp {aiohttp.__version__})" in fast
