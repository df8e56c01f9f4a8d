"""`llmtap sql`, the views, and where queries run (the file, or the running proxy)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner, Result

from analysis.cli import COMMANDS
from analysis.export import export
from analysis.filters import Filters
from analysis.source import FileSource, ServeSource, SourceError, open_source
from analysis.views import DERIVED_COLUMNS, create_views
from .analysis_fixture import build_fixture_db
from proxy.common import paths
from proxy.cli import main
from proxy.common.schema import REQUEST_COLUMN_NAMES, create_tables_sql

from .waiting import START_S


@pytest.fixture(scope="module")
def fixture_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sql") / "fixture.duckdb"
    build_fixture_db(path)
    return path


@pytest.fixture
def db(fixture_file: Path, tmp_path: Path) -> Path:
    """A copy of the fixture per test (some tests lock it)."""
    path = tmp_path / "llmtap.duckdb"
    shutil.copy(fixture_file, path)
    return path


def sql(db: Path, *args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(main, ["sql", "--db", str(db), *args], input=input)


def ok(result: Result) -> str:
    assert result.exit_code == 0, result.output
    return result.output


QUERY = (
    "SELECT tool, count(*) AS n, min(e2e_ms) AS fastest, max(started_at) AS last,"
    " bool_or(error) AS any_error, max(tag) AS tag FROM requests"
    " WHERE tool IN ('codex', 'curl') GROUP BY tool ORDER BY tool"
)

EXPECTED = {
    "table": """\
tool   n  fastest  last                       any_error  tag
-----  -  -------  -------------------------  ---------  ---
codex  6    320.0  2026-11-30T11:05:00+00:00  true
curl   1    700.0  2026-11-30T17:40:00+00:00  false
""",
    "csv": """\
tool,n,fastest,last,any_error,tag
codex,6,320.0,2026-11-30T11:05:00+00:00,true,
curl,1,700.0,2026-11-30T17:40:00+00:00,false,
""",
    "json": """\
[
  {
    "tool": "codex",
    "n": 6,
    "fastest": 320.0,
    "last": "2026-11-30T11:05:00+00:00",
    "any_error": true,
    "tag": null
  },
  {
    "tool": "curl",
    "n": 1,
    "fastest": 700.0,
    "last": "2026-11-30T17:40:00+00:00",
    "any_error": false,
    "tag": null
  }
]
""",
    "ndjson": """\
{"tool":"codex","n":6,"fastest":320.0,"last":"2026-11-30T11:05:00+00:00","any_error":true,"tag":null}
{"tool":"curl","n":1,"fastest":700.0,"last":"2026-11-30T17:40:00+00:00","any_error":false,"tag":null}
""",
    "markdown": """\
| tool | n | fastest | last | any_error | tag |
| --- | ---: | ---: | --- | --- | --- |
| codex | 6 | 320.0 | 2026-11-30T11:05:00+00:00 | true |  |
| curl | 1 | 700.0 | 2026-11-30T17:40:00+00:00 | false |  |
""",
}


@pytest.mark.parametrize("fmt", list(EXPECTED))
def test_sql_formats(db: Path, fmt: str) -> None:
    assert ok(sql(db, QUERY, "--format", fmt)) == EXPECTED[fmt]


def test_table_is_the_default(db: Path) -> None:
    assert ok(sql(db, QUERY)) == EXPECTED["table"]


def test_query_from_stdin_or_a_file(db: Path, tmp_path: Path) -> None:
    assert ok(sql(db, input=QUERY)) == EXPECTED["table"]
    assert ok(sql(db, "-", "--format", "csv", input=QUERY)) == EXPECTED["csv"]
    query_file = tmp_path / "q.sql"
    query_file.write_text(QUERY)
    assert ok(sql(db, "--file", str(query_file))) == EXPECTED["table"]


def test_sql_usage_errors(db: Path, tmp_path: Path) -> None:
    empty = sql(db, input="  \n")
    assert (empty.exit_code, empty.output.splitlines()[-1]) == (2, "Error: the query is empty")
    query_file = tmp_path / "q.sql"
    query_file.write_text(QUERY)
    both = sql(db, "SELECT 1", "--file", str(query_file))
    assert (both.exit_code, both.output.splitlines()[-1]) == (2, "Error: give QUERY or --file, not both")


def test_a_bad_query_shows_duckdbs_message(db: Path) -> None:
    result = sql(db, "SELECT * FROM nope")
    assert result.exit_code == 1
    assert result.output.startswith("Error: Catalog Error: Table with name nope does not exist!")


def test_the_database_is_opened_read_only(db: Path) -> None:
    result = sql(db, "CREATE TABLE scratch AS SELECT 1")
    assert result.exit_code == 1
    assert "read-only" in result.output
    assert ok(sql(db, "SELECT count(*) AS n FROM requests", "--format", "csv")) == "n\n31\n"


def test_a_missing_database(tmp_path: Path) -> None:
    result = sql(tmp_path / "none.duckdb", "SELECT 1")
    assert result.exit_code == 1
    assert result.output == (
        f"Error: no database at {tmp_path}/none.duckdb yet: run `llmtap serve` or `llmtap demo` first\n")


def test_db_defaults_to_the_data_directory_and_llmtap_db(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = CliRunner().invoke(main, ["sql", "SELECT 1"])
    assert f"no database at {paths.default_db_path()} yet" in missing.output
    monkeypatch.setenv("LLMTAP_DB", str(db))
    assert ok(CliRunner().invoke(main, ["sql", "SELECT 2 AS x", "--format", "csv"])) == "x\n2\n"


# -- the views ------------------------------------------------------------------------

def test_requests_view_shadows_the_table_with_derived_columns(db: Path) -> None:
    columns = ok(sql(db, "SELECT * FROM requests LIMIT 0", "--format", "csv")).strip().split(",")
    assert columns == [*REQUEST_COLUMN_NAMES, *DERIVED_COLUMNS]
    assert ok(sql(db, (
        "SELECT day, hour, error, round(decode_tokens_per_s, 3) AS dtps, round(cache_read_share, 4) AS crs"
        " FROM requests WHERE tool = 'codex' AND stream ORDER BY started_at LIMIT 1"), "--format", "csv")) == (
        "day,hour,error,dtps,crs\n2026-11-28,2026-11-28T14:00:00,false,74.39,0.8\n")


def test_show_tables_names_each_table_once(db: Path) -> None:
    names = ok(sql(db, "show tables;")).split()[2:]
    assert names.count("requests") == 1 and {"chunks", "errors", "hourly", "daily"} <= set(names)
    assert ok(sql(db, "  SHOW TABLES ")).split()[2:] == names


def test_errors_hourly_and_daily_views(db: Path) -> None:
    assert ok(sql(db, "SELECT count(*) AS n, bool_and(outcome <> 'ok') AS all_failed FROM errors",
                  "--format", "csv")) == "n,all_failed\n15,true\n"
    # the rollups are over generations: the fixture's one GET /v1/models (2026-11-30) is left out
    assert ok(sql(db, "SELECT day, requests, errors, ttft_p50_ms FROM daily", "--format", "csv")) == (
        "day,requests,errors,ttft_p50_ms\n"
        "2026-11-28,10,5,950.0\n2026-11-29,12,9,450.0\n2026-11-30,8,1,1800.0\n")
    assert ok(sql(db, "SELECT count(*) AS hours, sum(requests) AS n FROM hourly", "--format", "csv")) == (
        "hours,n\n14,30\n")


def test_create_views_is_idempotent_and_works_read_write(db: Path) -> None:
    con = duckdb.connect(str(db))
    try:
        create_views(con)
        create_views(con)
        assert con.execute("SELECT count(*) FROM requests WHERE error").fetchone() == (15,)
        writer = con.cursor()  # another connection: the table, not the view
        writer.execute("INSERT INTO requests (id, outcome) VALUES ('x', 'ok')")
        assert con.execute("SELECT count(*) FROM requests").fetchone() == (32,)
    finally:
        con.close()


def test_create_views_on_an_empty_database(tmp_path: Path) -> None:
    con = duckdb.connect(str(tmp_path / "empty.duckdb"))
    create_views(con)  # no tables yet: no views, no error
    assert con.execute("SELECT count(*) FROM duckdb_views() WHERE NOT internal").fetchone() == (0,)
    con.execute(create_tables_sql())
    create_views(con)
    assert con.execute("SELECT count(*) FROM errors").fetchone() == (0,)
    con.close()


# -- while `llmtap serve` holds the file ------------------------------------------------

# A stand-in for the proxy's admin endpoint (the real one is another module's):
# it holds the database read-write in its own process, as `llmtap serve` does,
# and answers POST /_llmtap/sql per the contract: read-only statements only,
# at most MAX_ROWS rows.
SERVE_DOUBLE = textwrap.dedent("""
    import asyncio, json, os, sys
    import duckdb, orjson
    from aiohttp import web
    from analysis.views import create_views

    db, state_dir, token = sys.argv[1], sys.argv[2], sys.argv[3] or None
    MAX_ROWS = 100_000
    READ_ONLY = ("SELECT", "WITH", "FROM", "DESCRIBE", "SHOW", "SUMMARIZE", "EXPLAIN")
    con = duckdb.connect(db)
    cursor = con.cursor()
    create_views(cursor)

    async def sql(request):
        if token and request.headers.get("X-Llmtap-Admin-Token") != token:
            return web.json_response({"error": "the admin token is wrong"}, status=403)
        query = (await request.json())["sql"]
        if query.split(None, 1)[0].upper() not in READ_ONLY:
            return web.json_response({"error": "only read-only queries run through the proxy"}, status=400)
        try:
            result = cursor.execute(query)
            rows = result.fetchmany(MAX_ROWS) if result.description else []
        except duckdb.Error as exc:
            return web.json_response({"error": str(exc)}, status=400)
        description = result.description or []
        body = {"columns": [d[0] for d in description], "types": [str(d[1]) for d in description],
                "rows": rows}
        return web.Response(body=orjson.dumps(body, default=str), content_type="application/json")

    async def serve():
        app = web.Application()
        app.router.add_post("/_llmtap/sql", sql)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        state = os.path.join(state_dir, f"{port}.json")
        with open(state + ".tmp", "w") as f:
            json.dump({"pid": os.getpid(), "host": "127.0.0.1", "port": port, "db": db,
                       "admin_token": token}, f)
        os.replace(state + ".tmp", state)
        await asyncio.Event().wait()

    asyncio.run(serve())
""")


@pytest.fixture
def serving(db: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """The fixture database held by a serve stand-in; the test's token via indirect params."""
    token = getattr(request, "param", "")
    state_dir = paths.state_dir()
    state_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", SERVE_DOUBLE, str(db), str(state_dir), token],
                            env={**os.environ})
    try:
        deadline = time.monotonic() + START_S
        while not list(state_dir.glob("*.json")):
            assert proc.poll() is None, "the serve stand-in exited"
            assert time.monotonic() < deadline, "the serve stand-in did not start"
            time.sleep(0.02)
        yield db
    finally:
        proc.terminate()
        proc.wait(10)


def test_queries_go_to_the_running_serve(
    serving: Path, fixture_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # must not be used for the proxy's own port
    with pytest.raises(duckdb.IOException, match="lock"):
        duckdb.connect(str(serving), read_only=True)
    source = open_source(serving)
    assert isinstance(source, ServeSource)
    assert source.query("SELECT 1 AS one") == (["one"], ["INTEGER"], [(1,)])
    for fmt in ("table", "json", "csv"):
        assert ok(sql(serving, QUERY, "--format", fmt)) == EXPECTED[fmt]
    local_report = ok(CliRunner().invoke(main, ["report", "--db", str(fixture_file), "--by", "tool"]))
    assert ok(CliRunner().invoke(main, ["report", "--db", str(serving), "--by", "tool"])) == local_report


def test_export_through_serve(serving: Path, fixture_file: Path, tmp_path: Path) -> None:
    """The endpoint runs no COPY: rows are fetched in pages and written here."""
    local = CliRunner().invoke(main, ["export", "--db", str(fixture_file), "--out", str(tmp_path / "a")])
    remote = CliRunner().invoke(main, ["export", "--db", str(serving), "--out", str(tmp_path / "b")])
    assert remote.exit_code == 0, remote.output
    assert remote.output == local.output.replace(str(tmp_path / "a"), str(tmp_path / "b"))
    source = open_source(serving)
    export(source, tmp_path / "c", "parquet", Filters(since=datetime(2026, 11, 29, tzinfo=timezone.utc)),
           page_rows=40)
    con = duckdb.connect()

    def files(name: str, table: str) -> str:
        return f"read_parquet('{tmp_path}/{name}/{table}/*/*.parquet', hive_partitioning = true)"

    for table, rows in (("requests", 21), ("chunks", 371)):  # chunks: ten pages of 40
        assert con.execute(f"SELECT count(*) FROM {files('c', table)}").fetchone() == (rows,)
        missing = con.execute(
            f"SELECT count(*) FROM (SELECT * FROM {files('a', table)} WHERE day >= '2026-11-29'"
            f" EXCEPT ALL SELECT * FROM {files('c', table)})"
        ).fetchone()
        assert missing == (0,), table


def test_query_errors_come_back_from_serve(serving: Path) -> None:
    result = sql(serving, "SELECT * FROM nope")
    assert result.exit_code == 1
    assert result.output.startswith("Error: Catalog Error: Table with name nope does not exist!")


@pytest.mark.parametrize("serving", ["s3cret"], indirect=True)
def test_serve_with_an_admin_token(serving: Path) -> None:
    assert ok(sql(serving, "SELECT count(*) AS n FROM requests", "--format", "csv")) == "n\n31\n"
    (state_file,) = paths.state_dir().glob("*.json")
    state = json.loads(state_file.read_text())
    state_file.write_text(json.dumps({**state, "admin_token": "wrong"}))
    result = sql(serving, "SELECT 1")
    assert result.exit_code == 1
    assert result.output == "Error: llmtap serve refused the request: the admin token is wrong\n"


@pytest.fixture
def held(db: Path) -> Iterator[Path]:
    """The database held read-write by this process, and no serve running."""
    con = duckdb.connect(str(db))
    try:
        yield db
    finally:
        con.close()


def test_locked_and_no_serve(held: Path) -> None:
    with pytest.raises(SourceError, match=r"in use by another process, and no running `llmtap serve` was found"):
        open_source(held)


def test_serve_records_another_database(held: Path, tmp_path: Path) -> None:
    state = paths.state_dir() / "9.json"
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text(json.dumps({"pid": os.getpid(), "host": "127.0.0.1", "port": 9,
                                 "db": str(tmp_path / "other.duckdb"), "admin_token": None}))
    with pytest.raises(SourceError, match=r"the running `llmtap serve` records to .*other\.duckdb, not to this file"):
        open_source(held)


def test_serve_not_answering(held: Path) -> None:
    state = paths.state_dir() / "9.json"
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text(json.dumps({"pid": os.getpid(), "host": "0.0.0.0", "port": 9, "db": str(held),
                                 "admin_token": None}))
    result = sql(held, "SELECT 1")
    assert result.exit_code == 1
    assert result.output.startswith("Error: cannot reach llmtap serve at http://127.0.0.1:9:")


def test_an_unlocked_file_is_read_directly(db: Path) -> None:
    source = open_source(db)
    assert isinstance(source, FileSource)
    source.close()


# -- help ----------------------------------------------------------------------------------

@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name)
def test_every_command_has_help(command: object) -> None:
    name = command.name  # type: ignore[attr-defined]
    result = CliRunner().invoke(main, [name, "--help"])
    assert result.exit_code == 0
    assert result.output.startswith(f"Usage: main {name} [OPTIONS]")
    summary = " ".join(result.output.split("\n\n")[1].split())  # as click wraps it
    assert summary and summary == " ".join(command.help.split("\n\n")[0].split())  # type: ignore[attr-defined]
    assert "--db" in result.output or name in ("top", "prices")  # top reads the live feed; prices no rows
    listing = CliRunner().invoke(main, ["--help"]).output
    assert f"  {name} " in listing


@pytest.mark.parametrize("query", [
    "SELECT * FROM read_parquet('{dir}/requests.parquet')",
    "SELECT * FROM read_csv('{dir}/requests.csv')",
    "SELECT * FROM '{dir}/requests.json'",
])
def test_reading_a_file_points_to_from(db: Path, query: str) -> None:
    for name in ("requests.parquet", "requests.csv", "requests.json"):
        (db.parent / name).write_text("id\n1\n")  # there, so the refusal is the lock-down, not a missing file
    result = sql(db, query.format(dir=db.parent))
    assert result.exit_code == 1
    assert "file system operations are disabled" in result.output
    assert "hint: llmtap's SQL reads its inputs and no other file" in result.output and "--from" in result.output


def test_other_sql_errors_have_no_file_hint(db: Path) -> None:
    result = sql(db, "SELECT nope FROM requests")
    assert result.exit_code == 1 and "hint:" not in result.output
