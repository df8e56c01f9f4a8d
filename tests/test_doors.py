"""Who gets in (#15), tried as an attacker would, on real sockets: SQL that reaches for files,
a web page in the user's browser, and another Unix user on the same machine."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import aiohttp
import duckdb
import pytest
from click.testing import CliRunner

from proxy.common import instances as running
from proxy.cli import main
from proxy.record.migrations import migrate
from .serving import RunningProxy

from .conftest import proxy_config, rows
from .faultkit import Serve, raw_exchange, status_of
from .upstreams import Script, ScriptedUpstream

REAL = "sk-real-upstream-key-for-doors-0123456789"


async def admin_sql(p: RunningProxy, query: str) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s:
        async with s.post(p.admin.endpoint("sql"), json={"sql": query}, headers=p.admin.headers()) as r:
            return r.status, await r.json()


# -- SQL through the proxy touches nothing but the database -------------------------------------------


@pytest.mark.parametrize("query", [
    "SELECT * FROM read_text('/etc/passwd')",
    "SELECT * FROM read_blob('/proc/self/environ')",
    "SELECT * FROM read_csv('/etc/hostname')",
    "SELECT * FROM glob('/*')",
    "SELECT * FROM '/etc/passwd'",
    "EXPLAIN ANALYZE COPY (SELECT 'owned') TO '{out}'",
    "EXPLAIN COPY (SELECT 'owned') TO '{out}'",
    "SELECT * FROM read_text('{state}')",
    "SELECT * FROM read_text('{db}.wal')",
    # the database's own files, which DuckDB's lock-down lets through (#27 item 8): pages retention deleted
    "SELECT * FROM read_blob('{db}')",
    "SELECT * FROM read_blob('{db}.wal')",
    "SELECT content FROM system.main.read_blob('{db}.wal')",
    "SELECT * FROM read_csv('{db}.wal', header = false, columns = {{'a': 'BLOB'}})",
    "SELECT * FROM glob('{db}*')",
    "SELECT * FROM '{db}.wal'",
    "SELECT * FROM query('SELECT * FROM read_blob(''{db}'')')",
    "DESCRIBE SELECT * FROM read_blob('{db}')",
    "EXPLAIN ANALYZE SELECT * FROM read_blob('{db}')",
    "SELECT * FROM requests WHERE id IN (SELECT content::VARCHAR FROM read_blob('{db}.wal'))",
])
async def test_admin_sql_reads_no_file_and_writes_none(tmp_path: Path, query: str) -> None:
    out = tmp_path / "written-by-sql.txt"
    async with RunningProxy(proxy_config("http://127.0.0.1:9", tmp_path)) as p:
        state = running.write_state(host="127.0.0.1", port=p.port, db=str(p.config.db_path), admin_token=p.admin_token)
        status, answer = await admin_sql(p, query.format(out=out, state=state, db=p.config.db_path))
        assert status == 400 and "rows" not in answer, answer
        assert "root:" not in json.dumps(answer) and p.admin_token not in json.dumps(answer)
        assert (await admin_sql(p, "SELECT count(*) AS n FROM requests"))[0] == 200  # the database still answers
    assert not out.exists()


@pytest.mark.parametrize("query", [
    "SET enable_external_access = true",
    "SELECT set_config('enable_external_access', 'true')" ,
    "INSTALL httpfs",
    "LOAD httpfs",
    "ATTACH '{other}' AS other",
    "COPY requests TO '{other}.csv'",
    "PRAGMA enable_profiling",
    "CALL enable_logging()",
    # what an EXPLAIN ANALYZE runs, it runs: only of a SELECT (#27 item 6)
    "EXPLAIN ANALYZE CHECKPOINT",
    "EXPLAIN ANALYZE FORCE CHECKPOINT",
    "EXPLAIN ANALYZE VACUUM",
    "EXPLAIN ANALYZE CREATE TEMP TABLE t AS SELECT 1",
    "SELECT * FROM force_checkpoint()",
    "FORCE CHECKPOINT",
    "VACUUM",
    "CREATE TEMP TABLE t AS SELECT 1",
])
async def test_admin_sql_changes_no_setting_and_loads_nothing(tmp_path: Path, query: str) -> None:
    other = tmp_path / "other.duckdb"
    async with RunningProxy(proxy_config("http://127.0.0.1:9", tmp_path)) as p:
        status, answer = await admin_sql(p, query.format(other=other))
        assert status == 400, answer
        status, answer = await admin_sql(p, "SELECT current_setting('enable_external_access') AS on")
        assert (status, answer["rows"]) == (200, [[False]])
    assert not other.exists() and not Path(f"{other}.csv").exists()


@pytest.mark.parametrize("query", [
    "SHOW TABLES", "DESCRIBE requests", "SUMMARIZE chunks", "EXPLAIN SELECT count(*) FROM requests",
    "EXPLAIN ANALYZE SELECT count(*) FROM requests", "SELECT * FROM range(3)", "SELECT count(*) FROM duckdb_tables()",
    "WITH r AS (SELECT * FROM requests) SELECT count(*) FROM r, unnest([1, 2])",
])
async def test_admin_sql_still_answers_what_reads_the_database(tmp_path: Path, query: str) -> None:
    async with RunningProxy(proxy_config("http://127.0.0.1:9", tmp_path)) as p:
        status, answer = await admin_sql(p, query)
    assert status == 200 and answer["rows"], answer


def test_cli_sql_reads_only_its_database(tmp_path: Path) -> None:
    db = tmp_path / "llmtap.duckdb"
    con = duckdb.connect(str(db))
    migrate(con)
    con.execute("INSERT INTO requests (id) VALUES ('a')")
    con.close()
    runner = CliRunner()
    refused = runner.invoke(main, ["sql", "--db", str(db), "SELECT * FROM read_text('/etc/passwd')"])
    assert refused.exit_code == 1 and "disabled by configuration" in refused.output and "root:" not in refused.output
    written = runner.invoke(main, ["sql", "--db", str(db), f"COPY requests TO '{tmp_path}/x.csv'"])
    assert written.exit_code == 1 and not (tmp_path / "x.csv").exists()
    assert runner.invoke(main, ["sql", "--db", str(db), "SELECT count(*) AS n FROM requests",
                                "--format", "csv"]).output == "n\n1\n"


# -- web pages ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("headers,why", [
    ({"Origin": "https://evil.example", "Content-Type": "text/plain"}, "Origin"),  # a "simple" cross-site POST
    ({"Origin": "null", "Content-Type": "text/plain"}, "Origin"),  # a sandboxed frame
    ({"Sec-Fetch-Site": "cross-site", "Content-Type": "text/plain"}, "Sec-Fetch-Site"),
    ({"Host": "evil.example:8787"}, "Host"),  # DNS rebinding: the page's own name, now 127.0.0.1
])
async def test_web_pages_never_reach_the_upstream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  headers: dict[str, str], why: str) -> None:
    monkeypatch.setenv("REAL_KEY", REAL)
    async with ScriptedUpstream(Script(chunks=[b"{}"])) as up:
        config = proxy_config(up.url, tmp_path, upstream_key_env="REAL_KEY")
        async with RunningProxy(config) as p:
            body = '{"model": "gpt-5", "messages": []}'
            head = "".join(f"{k}: {v}\r\n" for k, v in {"Host": f"127.0.0.1:{p.port}", **headers}.items())
            request = (f"POST /v1/chat/completions HTTP/1.1\r\n{head}Authorization: Bearer {p.state.client_key}\r\n"
                       f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}")
            response = await raw_exchange(p.port, request.encode(), timeout=5)
            found = rows(p)
    assert status_of(response) == 403, response[:300]
    assert why.encode() in response and b'"code":"refused_web_page"' in response
    assert up.received == []
    assert [(r["status"], r["error_type"]) for r in found] == [(403, "refused_web_page")]


async def test_preflights_are_answered_by_llmtap_never_relayed(tmp_path: Path) -> None:
    async with ScriptedUpstream(Script(chunks=[b"{}"], headers=[("Access-Control-Allow-Origin", "*")])) as up:
        async with RunningProxy(proxy_config(up.url, tmp_path, allow_origins=["http://localhost:3000"])) as p:
            async with aiohttp.ClientSession() as s:
                preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
                async with s.options(p.url + "/v1/messages", headers={**preflight, "Origin": "https://evil.example"}) as r:
                    assert r.status == 403 and "Access-Control-Allow-Origin" not in r.headers
                async with s.options(p.url + "/v1/messages", headers={**preflight, "Origin": "http://localhost:3000"}) as r:
                    assert r.status == 204
                    assert r.headers["Access-Control-Allow-Origin"] == "http://localhost:3000"
                    assert r.headers["Access-Control-Allow-Headers"] == "content-type"
                async with s.post(p.url + "/v1/messages", data=b"{}", headers={"Origin": "http://localhost:3000"}) as r:
                    assert r.status == 200
                    assert r.headers["Access-Control-Allow-Origin"] == "*"  # the upstream's own answer is kept
            found = rows(p, "SELECT method, status, error_type FROM requests ORDER BY started_at")
    assert [(r.method, r.path_qs) for r in up.received] == [("POST", "/v1/messages")]  # no OPTIONS relayed
    assert [(r["method"], r["status"], r["error_type"]) for r in found] == [
        ("OPTIONS", 403, "refused_web_page"), ("OPTIONS", 204, None), ("POST", 200, None)]


async def test_tools_and_allowed_pages_are_relayed(tmp_path: Path) -> None:
    """What SDKs and CLIs send (no Origin, Host 127.0.0.1 or localhost) is relayed as before."""
    async with ScriptedUpstream(Script(chunks=[b"{}"])) as up:
        async with RunningProxy(proxy_config(up.url, tmp_path, allow_origins=["https://app.example"])) as p:
            async with aiohttp.ClientSession() as s:
                for headers in ({}, {"Host": f"localhost:{p.port}"}, {"Host": f"[::1]:{p.port}"},
                                {"Origin": "https://app.example", "Sec-Fetch-Site": "cross-site"},
                                {"Sec-Fetch-Site": "none"}):
                    async with s.post(p.url + "/v1/chat/completions", data=b"{}", headers=headers) as r:
                        assert r.status == 200, headers
    assert len(up.received) == 5


# -- credential injection authenticates the client ------------------------------------------------------


async def test_the_client_key_is_made_once_and_owner_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REAL_KEY", REAL)
    async with ScriptedUpstream(Script(chunks=[b"{}"])) as up:
        async with RunningProxy(proxy_config(up.url, tmp_path, upstream_key_env="REAL_KEY")) as p:
            first = p.state.client_key
        async with RunningProxy(proxy_config(up.url, tmp_path, upstream_key_env="REAL_KEY")) as p:
            assert p.state.client_key == first
    from proxy.common import paths

    key_file = paths.client_key_path()
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(key_file.parent.stat().st_mode) == 0o700


# -- the admin token ------------------------------------------------------------------------------------------


async def test_the_admin_token_is_in_no_command_line_and_no_output(tmp_path: Path) -> None:
    async with ScriptedUpstream(Script(chunks=[b"{}"])) as up:
        serve = await Serve(up.url, tmp_path / "t.duckdb").started()
        try:
            assert serve.state is not None and serve.state.admin_token
            token = serve.state.admin_token
            cmdline = Path(f"/proc/{serve.proc.pid}/cmdline").read_bytes()
            environ = Path(f"/proc/{serve.proc.pid}/environ").read_bytes()
            assert token.encode() not in cmdline and token.encode() not in environ
            health = serve.admin.health()
            assert health is not None and health["ok"] is True
            assert running.AdminClient(serve.base, "not-the-token").health() is None
            env = {**os.environ, "LLMTAP_HOME": os.environ["LLMTAP_HOME"]}
            sql = subprocess.run([sys.executable, "-m", "proxy", "sql", "--db", str(tmp_path / "t.duckdb"),
                                  "SELECT count(*) AS n FROM requests WHERE error_type = 'admin_forbidden'",
                                  "--format", "csv"], capture_output=True, text=True, timeout=60, env=env)
            assert sql.returncode == 0 and sql.stdout == "n\n1\n", sql.stderr  # found the token itself; the
            # request with the wrong one left its row
        finally:
            assert serve.stop() == 0
    assert token not in serve.output()


# -- another Unix user on the same machine ----------------------------------------------------------------

OTHER_USER = "llmtap-other"
ATTACK = textwrap.dedent("""
    import json, sys, urllib.request, urllib.error
    base, state_file, key_file = sys.argv[1:4]
    out = {}
    for name, path in (("state", state_file), ("client_key", key_file)):
        try:
            open(path).read()
            out[name] = "read"
        except OSError as exc:
            out[name] = type(exc).__name__
    def status(path, headers, body=b"{}"):
        request = urllib.request.Request(base + path, data=body, headers=headers, method="POST")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(request, timeout=10) as r:
                return r.status
        except urllib.error.HTTPError as exc:
            return exc.code
    out["sql"] = status("/_llmtap/sql", {"Content-Type": "application/json"},
                        json.dumps({"sql": "SELECT * FROM read_text('/etc/shadow')"}).encode())
    out["sql_guessed_token"] = status("/_llmtap/sql", {"Content-Type": "application/json",
                                      "X-Llmtap-Admin-Token": "guess"}, b'{"sql": "SELECT 1"}')
    out["injected_key"] = status("/v1/chat/completions", {"Authorization": "Bearer sk-anything"})
    out["no_key"] = status("/v1/chat/completions", {})
    print(json.dumps(out))
""")


def other_user() -> pwd.struct_passwd | None:
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        return None
    try:
        return pwd.getpwnam(OTHER_USER)
    except KeyError:
        made = subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER_USER],
                              capture_output=True, timeout=30)
        if made.returncode != 0:
            return None
        return pwd.getpwnam(OTHER_USER)


async def test_another_unix_user_gets_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a shared machine: the user's home is world-readable (Debian's default), llmtap's files
    in it are not. The other user can connect to 127.0.0.1 like anyone."""
    user = other_user()
    if user is None:
        pytest.skip("needs root and useradd to make a second Unix user")
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    home = Path(tempfile.mkdtemp(prefix="llmtap-shared-home-", dir="/tmp"))
    try:
        home.chmod(0o755)
        data = home / ".local" / "share" / "llmtap"
        monkeypatch.setenv("LLMTAP_HOME", str(data))
        monkeypatch.setenv("REAL_KEY", REAL)
        async with ScriptedUpstream(Script(chunks=[b"{}"])) as up:
            config = proxy_config(up.url, home, upstream_key_env="REAL_KEY", db=str(data / "llmtap.duckdb"))
            async with RunningProxy(config) as p:
                state = running.write_state(host="127.0.0.1", port=p.port, db=str(p.config.db_path),
                                            admin_token=p.admin_token)
                from proxy.common import paths

                argv = [python, "-c", ATTACK, p.url, str(state), str(paths.client_key_path())]
                attack = await asyncio.get_running_loop().run_in_executor(None, lambda: subprocess.run(
                    argv, capture_output=True, text=True, timeout=60, user=user.pw_uid, group=user.pw_gid,
                    extra_groups=[], cwd="/"))
                found = rows(p, "SELECT path, status, error_type FROM requests WHERE path NOT LIKE '/_llmtap%'")
        assert attack.returncode == 0, attack.stderr
        result = json.loads(attack.stdout)
        assert result == {"state": "PermissionError", "client_key": "PermissionError", "sql": 403,
                          "sql_guessed_token": 403, "injected_key": 401, "no_key": 401}
        assert up.received == []  # the real key was never spent
        assert [(r["status"], r["error_type"]) for r in found] == [(401, "invalid_client_key")] * 2
    finally:
        shutil.rmtree(home, ignore_errors=True)


# -- a real browser ------------------------------------------------------------------------------------------

EVIL_PAGE = """<!doctype html><script>
window.results = {};
const body = JSON.stringify({model: "gpt-5", messages: [{role: "user", content: "spend the key"}]});
Promise.allSettled([
  fetch(PROXY + "/v1/chat/completions", {method: "POST", mode: "no-cors",
        headers: {"Content-Type": "text/plain"}, body}).then(r => window.results.simple = r.type),
  fetch(PROXY + "/v1/chat/completions", {method: "POST", headers: {"Content-Type": "application/json"}, body})
    .then(r => window.results.cors = r.status, e => window.results.cors = "blocked"),
]).then(() => window.done = true);
</script>"""


async def test_a_page_in_a_real_browser_cannot_spend_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chromium opens a page of another origin that posts to the proxy (a simple cross-site POST, then a
    CORS request), and a DNS-rebound name of the proxy's own address: the upstream sees nothing."""
    from aiohttp import web

    from .browser import Chromium, find_chromium

    binary = find_chromium()
    if binary is None:
        pytest.skip("no Chromium on this machine")
    monkeypatch.setenv("REAL_KEY", REAL)
    async with ScriptedUpstream(Script(chunks=[b"{}"])) as up:
        async with RunningProxy(proxy_config(up.url, tmp_path, upstream_key_env="REAL_KEY")) as p:
            page = web.Application()
            async def evil(_: web.Request) -> web.Response:
                return web.Response(text=EVIL_PAGE.replace("PROXY", repr(p.url)), content_type="text/html")

            page.router.add_get("/", evil)
            runner = web.AppRunner(page)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            page_port = runner.addresses[0][1]
            try:
                rules = "--host-resolver-rules=MAP evil.example 127.0.0.1"
                async with asyncio.timeout(60), Chromium(binary, flags=(rules,)) as browser:
                    await browser.open(f"http://127.0.0.1:{page_port}/")
                    await browser.wait_for("window.done === true", 20)
                    results = await browser.evaluate("window.results")
                    await browser.open(f"http://evil.example:{p.port}/v1/models")  # rebinding: its own name
                    rebound = await browser.evaluate("document.body.innerText")
            finally:
                await runner.cleanup()
            found = rows(p, "SELECT method, status, error_type FROM requests ORDER BY started_at")
    assert results == {"simple": "opaque", "cors": "blocked"}
    assert "does not name this machine" in rebound
    assert up.received == []
    assert {(r["method"], r["status"], r["error_type"]) for r in found} == {
        ("POST", 403, "refused_web_page"), ("OPTIONS", 403, "refused_web_page"), ("GET", 403, "refused_web_page")}


BROWSER_RECORDER = """#!/bin/sh
# a browser as `webbrowser` starts it: its argv stays readable in /proc/PID/cmdline while it runs
sh -c 'sleep 120; :' llmtap-browser-recorder "$1" </dev/null >/dev/null 2>&1 &
echo $! > "$RECORDER_PID"
"""


async def test_llmtap_ui_puts_no_login_link_on_the_browsers_command_line(tmp_path: Path) -> None:
    """`llmtap ui` starts the browser ($BROWSER) as any user would see it: a second Unix user reads every
    /proc/*/cmdline and finds the browser's argument, but no ticket in it; the file it names is owner-only,
    and its link trades for a session once."""
    from analysis.web import WebUi

    from .other_user import _ensure_user, can_read

    user = _ensure_user()
    recorder = tmp_path / "browser.sh"
    recorder.write_text(BROWSER_RECORDER)
    recorder.chmod(0o755)
    pid_file = tmp_path / "recorder.pid"
    async with ScriptedUpstream(Script(chunks=[b"{}"])) as up:
        async with RunningProxy(proxy_config(up.url, tmp_path), ui=WebUi()) as p:
            env = {**os.environ, "BROWSER": f"{recorder} %s", "RECORDER_PID": str(pid_file),
                   "LLMTAP_HOME": str(tmp_path / "home"), "LLMTAP_ADMIN_TOKEN": p.admin_token}
            done = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "proxy", "ui", "--url", p.url],
                                           env=env, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0 and "opened" in done.stdout, done.stdout + done.stderr
            pid = int(pid_file.read_text())
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                opened = argv[argv.index(b"llmtap-browser-recorder") + 1].decode()
                sniffed = await asyncio.to_thread(subprocess.run, ["runuser", "-u", user.pw_name, "--", "sh", "-c",
                                                  "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '"],
                                                  capture_output=True, text=True, timeout=60)
            finally:
                os.kill(pid, 9)
            assert opened in sniffed.stdout  # the other user sees the browser's argument...
            assert opened.startswith("file://") and "#login=" not in opened  # ...a path
            opener = Path(opened.removeprefix("file://"))
            assert stat.S_IMODE(opener.stat().st_mode) == 0o600 and not can_read(user, opener)
            link = opener.read_text().split('url=', 1)[1].split('"', 1)[0]
            assert link.startswith(p.url + "/_llmtap/ui/#login=")
            ticket = link.rpartition("=")[2]
            assert ticket not in sniffed.stdout
            async with aiohttp.ClientSession() as s:
                for status in (200, 403):  # the owner's browser trades it, once
                    async with s.post(p.url + "/_llmtap/ui/login", json={"ticket": ticket}) as r:
                        assert r.status == status


async def test_no_dot_dot_in_an_admin_path_reaches_the_primary(tmp_path: Path) -> None:
    """`serve --workers 2`: `/_llmtap/ui/../metrics` and its encodings, sent on raw sockets (clients
    normalise paths) with no credential and with the UI's session, never answer the metrics or SQL,
    whichever process takes the connection (a worker relayed them to the primary with the admin token)."""
    from .test_workers import VIA_HEADER, start_serve, stop

    async with ScriptedUpstream(Script(chunks=[b"{}"])) as up:
        proc, state = await start_serve(up.url, tmp_path / "w.duckdb")
        try:
            port = int(state.url.rpartition(":")[2])
            ticket = running.AdminClient(state.url, state.admin_token).call("ui/ticket", {})["ticket"]
            async with aiohttp.ClientSession() as s:
                async with s.post(state.url + "/_llmtap/ui/login", json={"ticket": ticket}) as r:
                    session = (await r.json())["session"]
            paths = ["/_llmtap/ui/../metrics", "/_llmtap/api/%2e%2e/metrics", "/_llmtap/ui/..%2fmetrics",
                     "/_llmtap/ui/.%2e/metrics", "/_llmtap/health/../metrics", "/_llmtap/ui/%2E%2E/health"]
            via: set[str] = set()
            for path in paths:
                for credential in ("", f"X-Llmtap-Ui: {session}\r\n"):
                    for _ in range(6):  # connections spread over the processes (SO_REUSEPORT)
                        answer = await raw_exchange(port, f"GET {path} HTTP/1.1\r\nHost: {state.url[7:]}\r\n{credential}"
                                                          "Connection: close\r\n\r\n".encode())
                        head, _, body = answer.partition(b"\r\n\r\n")
                        assert not head.startswith(b"HTTP/1.1 200"), (path, answer[:300])
                        assert b"llmtap_requests" not in body and b'"ok"' not in body, (path, answer[:300])
            for _ in range(20):  # and the same connections do reach a worker, which relays what it allows
                async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
                    async with s.get(state.url + "/_llmtap/health", headers={"X-Llmtap-Ui": session}) as r:
                        assert r.status == 200
                        via.add("worker" if VIA_HEADER in r.headers else "primary")
        finally:
            stop(proc)
    assert via == {"worker", "primary"}


def test_a_planted_world_readable_client_key_is_refused_in_one_line(tmp_path: Path) -> None:
    """Someone leaves a world-readable `client-key` in the data directory: serve refuses to spend the
    injected key with it, in one line that says the fix (it was a traceback)."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    planted = home / "client-key"
    planted.write_text("sk-llmtap-planted-by-someone-else-0123456789\n")
    planted.chmod(0o644)
    done = subprocess.run([sys.executable, "-m", "proxy", "serve", "--port", "0", "--db", str(tmp_path / "x.duckdb"),
                           "--upstream", "http://127.0.0.1:9", "--upstream-key-env", "REAL_KEY"],
                          env={**os.environ, "LLMTAP_HOME": str(home), "REAL_KEY": REAL},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr == f"Error: {planted} is readable by other users: chmod 600 {planted}\n"
