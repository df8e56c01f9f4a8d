"""`--from`: databases of several real proxies and Parquet exports, analysed as one."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner, Result

from analysis.multi_source import classify, open_sources
from analysis.remote import s3_secret_sql
from analysis.source import SourceError
from proxy.cli import main
from .serving import RunningProxy
from proxy.simulator.app import Simulator
from proxy.simulator.config import SimConfig

from .analysis_fixture import build_fixture_db
from .conftest import proxy_config
from .test_metrics import MIX, send_mix


async def record_two_gateways(root: Path) -> None:
    """Two real proxies (tags gw-a, gw-b) on one simulated upstream: 4 requests, then 2."""
    async with Simulator(SimConfig(ttft_ms=5, itl_ms=1, tokens=4, prefill_us_per_token=0)) as sim:
        for name, mix in (("a", MIX), ("b", MIX[:2])):
            config = proxy_config(sim.url, root, db=str(root / f"gw-{name}.duckdb"), tag=f"gw-{name}")
            async with RunningProxy(config) as proxy:
                await send_mix(proxy, mix)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gw-a.duckdb and gw-b.duckdb from real proxies; exports/c/ from the 31-row fixture database."""
    root = tmp_path_factory.mktemp("multi")
    asyncio.run(record_two_gateways(root))
    build_fixture_db(root / "c.duckdb")
    out = CliRunner().invoke(main, ["export", "--db", str(root / "c.duckdb"), "--out", str(root / "exports/c")])
    assert out.exit_code == 0, out.output
    (root / "c.duckdb").unlink()  # only its export is left
    return root


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def sql_json(query: str, *sources: str) -> list[dict]:
    args = [arg for s in sources for arg in ("--from", s)]
    result = run("sql", *args, "--format", "json", query)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_sql_over_two_databases_and_an_export(data: Path) -> None:
    a, b, c = str(data / "gw-a.duckdb"), str(data / "gw-b.duckdb"), str(data / "exports/c")
    found = sql_json("SELECT source, count(*) AS n, count(*) FILTER (WHERE error) AS errors,"
                     " count(DISTINCT tag) AS tags FROM requests GROUP BY source ORDER BY source", a, b, c)
    assert found == sorted([{"source": a, "n": 4, "errors": 1, "tags": 1},
                            {"source": b, "n": 2, "errors": 0, "tags": 1},
                            {"source": c, "n": 31, "errors": 15, "tags": 2}], key=lambda g: g["source"])
    # chunks come along, joined to their requests; the views of views.py work on top
    chunks = sql_json("SELECT r.source, count(*) AS n FROM chunks c JOIN requests r ON c.request_id = r.id"
                      " GROUP BY ALL ORDER BY 1", a, c)
    assert chunks == sorted([{"source": a, "n": 6}, {"source": c, "n": 504}], key=lambda g: g["source"])
    daily = sql_json("SELECT sum(requests) AS n FROM daily", a, b, c)
    assert daily == [{"n": 35}]  # the rollups are generations: gw-a's and c's GET /v1/models are left out


def test_a_glob_of_exports_tells_each_export_apart(data: Path) -> None:
    exports = data / "globbed"
    for name in ("a", "b"):
        result = run("export", "--db", str(data / f"gw-{name}.duckdb"), "--out", str(exports / name))
        assert result.exit_code == 0, result.output
    found = sql_json("SELECT source, tag, count(*) AS n FROM requests GROUP BY ALL ORDER BY 1", f"{exports}/*")
    assert found == [{"source": str(exports / "a"), "tag": "gw-a", "n": 4},
                     {"source": str(exports / "b"), "tag": "gw-b", "n": 2}]
    # naming the requests files directly finds their chunks beside them
    files = f"{exports}/*/requests/*/*.parquet"
    assert sql_json("SELECT count(*) AS n FROM chunks", files) == [{"n": 12}]  # a 6-token stream each


def test_report_and_errors_read_every_source(data: Path) -> None:
    args = ["--from", str(data / "gw-a.duckdb"), "--from", str(data / "gw-b.duckdb"), "--format", "json"]
    report = run("report", "--by", "tag", "--all", *args)
    assert report.exit_code == 0, report.output
    groups = {g["tag"]: g["requests"] for g in json.loads(report.output)["groups"]}
    assert groups == {"gw-a": 4, "gw-b": 2}
    errors = run("errors", *args)
    assert errors.exit_code == 0, errors.output
    failed = [(g["outcome"], g["status"], g["count"]) for g in json.loads(errors.output)["groups"]
              if g["outcome"] != "ok"]
    assert failed == [("http_error", 429, 1)]


def test_a_combined_export_keeps_each_rows_source(data: Path) -> None:
    a, b = str(data / "gw-a.duckdb"), str(data / "gw-b.duckdb")
    out = data / "combined"
    result = run("export", "--from", a, "--from", b, "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "requests: 6 rows" in result.output
    found = sql_json("SELECT source, count(*) AS n FROM requests GROUP BY 1 ORDER BY 1", str(out))
    assert found == [{"source": a, "n": 4}, {"source": b, "n": 2}]


def test_the_same_database_twice_is_read_once(data: Path) -> None:
    a = str(data / "gw-a.duckdb")
    assert sql_json("SELECT count(*) AS n FROM requests", a, a) == [{"n": 4}]


def test_a_glob_of_database_files(data: Path) -> None:
    found = sql_json("SELECT source, count(*) AS n FROM requests GROUP BY 1 ORDER BY 1", f"{data}/gw-*.duckdb")
    assert found == [{"source": str(data / "gw-a.duckdb"), "n": 4}, {"source": str(data / "gw-b.duckdb"), "n": 2}]
    nothing = run("sql", "--from", f"{data}/none-*.duckdb", "SELECT 1")
    assert nothing.exit_code == 1 and "no database files match" in nothing.output


def test_local_sources_do_not_load_httpfs(data: Path) -> None:
    """Local inputs are read with the connection locked down: no extension loads, no other file is read."""
    source = open_sources([str(data / "gw-a.duckdb"), str(data / "exports/c")])
    try:
        _, _, found = source.query("SELECT current_setting('enable_external_access')")
        assert found == [(False,)]
        for query in ("LOAD httpfs", "SELECT * FROM read_text('/etc/passwd')"):
            with pytest.raises(SourceError):
                source.query(query)
        assert source.query("SELECT count(*) FROM requests")[2][0][0] > 0  # the inputs themselves are read
    finally:
        source.close()


def test_what_a_from_names() -> None:
    assert classify("s3://bucket/llmtap/*").requests == "s3://bucket/llmtap/*/requests/*/*.parquet"
    assert classify("s3://bucket/llmtap/*").chunks == "s3://bucket/llmtap/*/chunks/*/*.parquet"
    assert classify("s3://b/x/requests/*/*.parquet").chunks == "s3://b/x/chunks/*/*.parquet"
    assert classify("s3://b/gw.duckdb").kind == "duckdb"


def test_errors_say_what_is_wrong(data: Path, tmp_path: Path) -> None:
    missing = run("sql", "--from", str(tmp_path / "nope.duckdb"), "SELECT 1")
    assert missing.exit_code == 1 and "no such file or directory" in missing.output
    empty = tmp_path / "empty"
    empty.mkdir()
    no_files = run("sql", "--from", str(empty), "SELECT 1")
    assert no_files.exit_code == 1 and "no Parquet files match" in no_files.output
    duckdb.connect(str(tmp_path / "other.duckdb")).close()
    other = run("sql", "--from", str(tmp_path / "other.duckdb"), "SELECT 1")
    assert other.exit_code == 1 and "no llmtap requests table" in other.output


def test_a_database_held_by_another_process(data: Path, tmp_path: Path) -> None:
    held = tmp_path / "held.duckdb"
    build_fixture_db(held)
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import duckdb, sys; c = duckdb.connect({str(held)!r}); print('ready', flush=True);"
         " sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(SourceError, match="in use by another process.*llmtap export"):
            open_sources([str(held)])
    finally:
        holder.communicate("", timeout=10)


def test_remote_without_httpfs_fails_cleanly(data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No network here: httpfs cannot be installed, and the commands say so and name the PyPI way
    (nothing is written locally). s3fs against a real S3 server: tests/test_s3.py."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))  # DuckDB's extension directory, empty
    monkeypatch.setenv("LLMTAP_OBJECT_STORE", "httpfs")
    read = run("sql", "--from", "s3://llmtap-test-bucket/exports/*", "SELECT 1")
    assert read.exit_code == 1 and "httpfs" in read.output and "llmtap[s3]" in read.output, read.output
    write = run("export", "--db", str(data / "gw-a.duckdb"), "--out", "s3://llmtap-test-bucket/x")
    assert write.exit_code == 1 and "httpfs" in write.output, write.output
    assert not (tmp_path / "s3:").exists()


def test_s3_secret_from_the_environment() -> None:
    assert s3_secret_sql({}) is None
    assert s3_secret_sql({"AWS_ACCESS_KEY_ID": "AKIA"}) is None
    sql = s3_secret_sql({"AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": "it's", "AWS_REGION": "eu-west-1",
                         "AWS_ENDPOINT_URL": "http://127.0.0.1:9000/"})
    assert sql == ("CREATE OR REPLACE TEMPORARY SECRET llmtap_s3_from_env (TYPE s3, PROVIDER config,"
                   " KEY_ID 'AKIA', SECRET 'it''s', REGION 'eu-west-1', ENDPOINT '127.0.0.1:9000',"
                   " URL_STYLE 'path', USE_SSL false)")
    assert len(duckdb.connect().extract_statements(sql)) == 1  # DuckDB parses it
