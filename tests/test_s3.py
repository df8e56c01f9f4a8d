"""Object storage for real: `export --out s3://` and `--from s3://` through s3fs, against moto's S3 server.

moto's standalone server (PyPI `moto[server]`) is started once for the module as a subprocess on a
free loopback port, with authentication on: after the three IAM calls that make llmtap's user and
its key, every request must be signed with a key moto knows. Nothing here leaves 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import duckdb
import pytest
from click.testing import CliRunner, Result

pytest.importorskip("s3fs")
pytest.importorskip("moto")
import boto3  # noqa: E402  (moto's dependency)

from analysis.remote import enable_remote  # noqa: E402
from proxy.common import duck  # noqa: E402
from proxy.cli import main  # noqa: E402
from .serving import RunningProxy  # noqa: E402
from proxy.simulator.app import Simulator  # noqa: E402
from proxy.simulator.config import SimConfig  # noqa: E402

from .analysis_fixture import build_fixture_db  # noqa: E402
from .conftest import proxy_config  # noqa: E402
from .test_metrics import send_mix  # noqa: E402
from .test_serve_process import start_serve, stream_once  # noqa: E402

BUCKET = "llmtap-team"
REGION = "eu-west-1"
POLICY = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    key: str
    secret: str
    log: Path

    def client(self) -> "boto3.client":
        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.key,
                            aws_secret_access_key=self.secret, region_name=REGION)

    def keys(self, prefix: str) -> list[str]:
        listed = self.client().list_objects_v2(Bucket=BUCKET, Prefix=prefix)
        return sorted(o["Key"] for o in listed.get("Contents", []))


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"}  # the IAM calls below; then every request is signed
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "LLMTAP_OBJECT_STORE"):
        env.pop(name, None)
    with log.open("w") as out:
        server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", "0"],
                                  stdout=subprocess.DEVNULL, stderr=out, env=env)
    try:
        deadline = time.monotonic() + 60  # a timeout only: moto starts in about a second
        while not (found := re.search(r"Running on (http://127\.0\.0\.1:\d+)", log.read_text())):
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        endpoint = found.group(1)
        iam = boto3.client("iam", endpoint_url=endpoint, aws_access_key_id="bootstrap",
                           aws_secret_access_key="bootstrap", region_name=REGION)
        iam.create_user(UserName="llmtap")
        iam.put_user_policy(UserName="llmtap", PolicyName="s3", PolicyDocument=json.dumps(POLICY))
        made = iam.create_access_key(UserName="llmtap")["AccessKey"]
        found_server = S3Server(endpoint, made["AccessKeyId"], made["SecretAccessKey"], log)
        found_server.client().create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
        yield found_server
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture(autouse=True)
def aws_env(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """The variables a user sets for MinIO, R2 and the like; s3fs, whether or not httpfs is installed."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret)
    monkeypatch.setenv("AWS_REGION", REGION)
    monkeypatch.setenv("LLMTAP_OBJECT_STORE", "s3fs")


async def record_gateway(db: Path) -> None:
    """A real proxy on a simulated upstream: 4 requests (one 429, one model list), tag gw-a."""
    async with Simulator(SimConfig(ttft_ms=5, itl_ms=1, tokens=4, prefill_us_per_token=0)) as sim:
        async with RunningProxy(proxy_config(sim.url, db.parent, db=str(db), tag="gw-a")) as proxy:
            await send_mix(proxy)


@pytest.fixture(scope="module")
def gateways(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gw-a.duckdb from a real proxy (today), gw-b.duckdb the 31-row fixture (three days of November 2026)."""
    root = tmp_path_factory.mktemp("gateways")
    asyncio.run(record_gateway(root / "gw-a.duckdb"))
    build_fixture_db(root / "gw-b.duckdb")
    return root


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def ok(*args: str) -> str:
    result = run(*args)
    assert result.exit_code == 0, result.output
    return result.output


def sql_json(query: str, *sources: str) -> list[dict]:
    return json.loads(ok("sql", *[a for s in sources for a in ("--from", s)], "--format", "json", query))


def local(db: Path, query: str) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(query).fetchall()
    finally:
        con.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_gateways_exported_under_one_prefix_read_back_together(s3: S3Server, gateways: Path) -> None:
    prefix = f"s3://{BUCKET}/llmtap"
    for name in ("gw-a", "gw-b"):
        out = ok("export", "--db", str(gateways / f"{name}.duckdb"), "--out", f"{prefix}/{name}")
        assert f"-> {prefix}/{name}/requests (parquet)" in out
    days_b = [d for (d,) in local(gateways / "gw-b.duckdb",
                                  "SELECT DISTINCT CAST(CAST(started_at AT TIME ZONE 'UTC' AS DATE) AS VARCHAR)"
                                  " FROM requests ORDER BY 1")]
    stored = s3.keys("llmtap/gw-b/")  # what the server holds, listed with boto3
    assert stored == sorted(f"llmtap/gw-b/{table}/day={day}/data_0.parquet"
                            for table in ("chunks", "requests") for day in days_b)
    assert len(s3.keys("llmtap/gw-a/")) == 2  # requests and chunks, one day

    counts = {r["source"]: (r["requests"], r["chunks"]) for r in sql_json(
        "SELECT r.source, count(DISTINCT r.id) AS requests, count(c.seq) AS chunks FROM requests r"
        " LEFT JOIN chunks c ON c.request_id = r.id AND c.source = r.source GROUP BY ALL",
        f"{prefix}/*")}
    expected = {}
    for name in ("gw-a", "gw-b"):
        [(n_requests,)] = local(gateways / f"{name}.duckdb", "SELECT count(*) FROM requests")
        [(n_chunks,)] = local(gateways / f"{name}.duckdb", "SELECT count(*) FROM chunks")
        expected[f"{prefix}/{name}"] = (n_requests, n_chunks)
    assert counts == expected and expected[f"{prefix}/gw-a"][0] == 4 and expected[f"{prefix}/gw-b"][0] == 31

    report = json.loads(ok("report", "--from", f"{prefix}/*", "--by", "tag", "--all", "--format", "json"))
    assert report["requests"] == 35 and {g["tag"]: g["requests"] for g in report["groups"]}["gw-a"] == 4
    assert s3.secret not in json.dumps(report)


def test_since_is_pushed_down_to_the_remote_parquet(s3: S3Server, gateways: Path) -> None:
    """`export --since` writes only the window's days; a `--since` read filters inside the Parquet scan
    of the remote files (row groups outside the window are skipped), and answers only the window."""
    out = ok("export", "--db", str(gateways / "gw-b.duckdb"), "--out", f"s3://{BUCKET}/since/gw-b",
             "--since", "2026-11-29")
    assert "requests: 21 rows in 2 days" in out, out
    assert {k.split("/")[3] for k in s3.keys("since/gw-b/requests/")} == {"day=2026-11-29", "day=2026-11-30"}
    ok("export", "--db", str(gateways / "gw-a.duckdb"), "--out", f"s3://{BUCKET}/since/gw-a", "--since", "2026-11-29")

    source = f"s3://{BUCKET}/since/*"  # this test's own files: tests of a module may run in different workers
    since = "TIMESTAMPTZ '2026-11-30 00:00:00+00'"
    plan = "\n".join(r["explain_value"] for r in sql_json(
        f"EXPLAIN SELECT count(*) FROM requests WHERE started_at >= {since}", source))
    scan = plan[plan.index("READ_PARQUET"):]
    assert "Filters:" in scan and "started_at >=" in scan, plan

    [(expected,)] = local(gateways / "gw-b.duckdb", f"SELECT count(*) FROM requests WHERE started_at >= {since}")
    expected += 4  # gw-a's rows are from today
    got = sql_json(f"SELECT count(*) AS n FROM requests WHERE started_at >= {since}", source)
    assert got == [{"n": expected}]
    report = json.loads(ok("report", "--from", source, "--since", "2026-11-30", "--all", "--by", "tag",
                           "--format", "json"))
    assert report["requests"] == expected


def test_overwrite_replaces_the_days_it_writes(s3: S3Server, gateways: Path) -> None:
    target = f"s3://{BUCKET}/overwrite/gw-b"
    ok("export", "--db", str(gateways / "gw-b.duckdb"), "--out", target)
    before = s3.keys("overwrite/gw-b/")
    again = run("export", "--db", str(gateways / "gw-b.duckdb"), "--out", target)
    assert again.exit_code == 1 and "already hold files: pass --overwrite" in again.output, again.output
    # the last day again, with only one tag's rows: that day's file is replaced, the others are kept
    ok("export", "--db", str(gateways / "gw-b.duckdb"), "--out", target, "--overwrite", "--since", "2026-11-30",
       "--tag", "refactor")
    assert s3.keys("overwrite/gw-b/") == before  # the same objects
    # a window that starts mid-day rewrites its first day whole, as the schedule in docs/team.md relies on
    ok("export", "--db", str(gateways / "gw-b.duckdb"), "--out", f"s3://{BUCKET}/overwrite/mid-day")
    ok("export", "--db", str(gateways / "gw-b.duckdb"), "--out", f"s3://{BUCKET}/overwrite/mid-day", "--overwrite",
       "--since", "2026-11-29T12:00:00Z")
    assert sql_json("SELECT count(*) AS n FROM requests", f"s3://{BUCKET}/overwrite/mid-day") == [{"n": 31}]
    [(expected,)] = local(gateways / "gw-b.duckdb", "SELECT count(*) FROM requests WHERE started_at <"
                          " TIMESTAMPTZ '2026-11-30 00:00:00+00' OR tag = 'refactor'")
    assert 9 < expected < 31
    assert sql_json("SELECT count(*) AS n FROM requests", target) == [{"n": expected}]


async def test_serve_exports_while_it_records(s3: S3Server, sim: Simulator, tmp_path: Path) -> None:
    """The scheduled export of docs/team.md: `llmtap export --since ... --overwrite` while `serve` holds the
    database, its rows fetched through the admin endpoint and written to the bucket."""
    db = tmp_path / "live.duckdb"
    proc, admin = await start_serve(sim.url, db, "--quiet", "--tag", "gw-live")
    try:
        async with aiohttp.ClientSession() as s:
            await asyncio.gather(*(stream_once(s, admin.url) for _ in range(3)))
        deadline = time.monotonic() + 30  # a timeout only: the store writes within a second
        while (await asyncio.to_thread(admin.sql, "SELECT count(*) FROM requests"))[0][2] != [(3,)]:
            assert time.monotonic() < deadline, "serve did not record the 3 requests"
            await asyncio.sleep(0.1)
        result = await asyncio.to_thread(run, "export", "--db", str(db), "--out", f"s3://{BUCKET}/live/gw-live",
                                         "--since", "1d", "--overwrite")
        assert result.exit_code == 0, result.output
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.to_thread(proc.communicate, timeout=20)
    assert proc.returncode == 0, err
    got = await asyncio.to_thread(sql_json, "SELECT tag, count(*) AS n FROM requests GROUP BY ALL",
                                  f"s3://{BUCKET}/live/*")
    assert got == [{"tag": "gw-live", "n": 3}]


@pytest.mark.parametrize("case", ["wrong endpoint", "missing bucket", "bad secret", "unknown key"])
def test_clear_errors_naming_no_secret(case: str, s3: S3Server, gateways: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    bucket = BUCKET
    if case == "wrong endpoint":
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{closed_port()}")
    elif case == "missing bucket":
        bucket = "llmtap-no-such-bucket"
    elif case == "bad secret":
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-" + s3.secret[6:])
    else:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWNKEY000000")
    expected = {
        "wrong endpoint": r"^Error: cannot reach the object store at http://127\.0\.0\.1:\d+ \(AWS_ENDPOINT_URL\):"
                          r" could not connect$",
        "missing bucket": rf"^Error: no bucket 'llmtap-no-such-bucket' at the object store at {s3.endpoint}$",
        "bad secret": rf"^Error: the object store at {s3.endpoint} refused access to bucket '{BUCKET}' \(.*signature"
                      r".*\): check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY$",
        "unknown key": rf"^Error: the object store at {s3.endpoint} refused access to bucket '{BUCKET}' \(.*Access"
                       r" Key Id.*\): check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY$",
    }[case]
    write = run("export", "--db", str(gateways / "gw-b.duckdb"), "--out", f"s3://{bucket}/errors/gw-b")
    read = run("sql", "--from", f"s3://{bucket}/llmtap/*", "SELECT count(*) FROM requests")
    for result in (write, read):
        assert result.exit_code == 1
        assert re.match(expected, result.output.strip()), result.output
        for secret in (s3.secret, os.environ["AWS_SECRET_ACCESS_KEY"], s3.key, os.environ["AWS_ACCESS_KEY_ID"]):
            assert secret not in result.output
    assert s3.keys("errors/") == []
    buckets = {b["Name"] for b in s3.client().list_buckets()["Buckets"]}
    assert buckets == {BUCKET}  # a misspelled bucket is not made


def test_a_locked_down_connection_refuses_the_registered_filesystem(s3: S3Server, gateways: Path) -> None:
    """Why remote inputs and outputs are opened unlocked: with external access off, DuckDB refuses a
    registered Python filesystem too (opened(), open_sources(lock=...))."""
    ok("export", "--db", str(gateways / "gw-a.duckdb"), "--out", f"s3://{BUCKET}/locked/gw-a")
    pattern = f"s3://{BUCKET}/locked/gw-a/requests/*/*.parquet"
    con = duck.connect()
    try:
        assert enable_remote(con, os.environ, [pattern]) == "s3fs"
        assert con.execute(f"SELECT count(*) FROM read_parquet('{pattern}')").fetchone() == (4,)
        duck.lock_down(con)
        with pytest.raises(duckdb.PermissionException, match="disabled by configuration"):
            con.execute(f"SELECT count(*) FROM read_parquet('{pattern}')")
    finally:
        con.close()


def test_neither_s3fs_nor_httpfs_says_what_to_install(tmp_path: Path) -> None:
    """A fresh machine without the s3 extra: one line naming `pip install 'llmtap[s3]'` (no network tried)."""
    code = ("import sys; sys.modules['s3fs'] = None\n"
            "from proxy.cli import main\n"
            "main(['sql', '--from', 's3://llmtap-team/llmtap/*', 'SELECT 1'])\n")
    env = {k: v for k, v in os.environ.items() if k != "LLMTAP_OBJECT_STORE"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**env, "HOME": str(tmp_path)})  # DuckDB's extension directory: no httpfs
    assert out.returncode == 1
    assert "neither is installed: pip install 'llmtap[s3]'" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
