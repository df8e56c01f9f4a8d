"""Loopback by default, an admin endpoint that needs the right peer and token, never an open
proxy, and private files. Requests are sent as raw bytes so that each request line is exact."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
from pathlib import Path

import aiohttp
import orjson
import pytest

from .serving import RunningProxy

from .conftest import proxy_config, rows
from .faultkit import JSON, RawConn, RawUpstream, Serve, body_of, http_head, raw_exchange, status_of
from .upstreams import Script, ScriptedUpstream
from .waiting import wait_until
from proxy.simulator.app import Simulator


def own_address() -> str | None:
    """A non-loopback address of this machine (traffic to it never leaves the machine)."""
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=5).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return next((a for a in out if "." in a and not a.startswith("127.")), None)


OWN = own_address()
needs_own_address = pytest.mark.skipif(OWN is None, reason="no non-loopback address on this machine")


async def get_from(address: str, port: int, path: str, headers: dict[str, str] | None = None,
                   source: str | None = None) -> int:
    connector = aiohttp.TCPConnector(local_addr=(source, 0) if source else None)
    async with aiohttp.ClientSession(connector=connector) as s:
        async with s.get(f"http://{address}:{port}{path}", headers=headers or {}) as r:
            return r.status


# -- binding ---------------------------------------------------------------------------------------


def serve_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "proxy", "serve", "--port", "0", "--upstream", "http://127.0.0.1:9",
                           *args], capture_output=True, text=True, timeout=30)


def test_a_wider_address_needs_allow_remote(tmp_path: Path) -> None:
    refused = serve_cli("--host", "0.0.0.0", "--db", str(tmp_path / "a.duckdb"))
    assert refused.returncode == 1 and "--allow-remote" in refused.stderr and "Traceback" not in refused.stderr
    assert not (tmp_path / "a.duckdb").exists()


def test_the_admin_token_is_never_taken_from_the_command_line(tmp_path: Path) -> None:
    """`ps` shows every user a command line: the token comes from a file or the environment."""
    given = serve_cli("--admin-token", "visible-to-all", "--db", str(tmp_path / "a.duckdb"))
    assert given.returncode == 2 and "No such option" in given.stderr
    loose = tmp_path / "token"
    loose.write_text("t0ken\n")
    loose.chmod(0o644)
    wide = serve_cli("--admin-token-file", str(loose), "--db", str(tmp_path / "b.duckdb"))
    assert wide.returncode == 1 and "readable by other users" in wide.stderr and "t0ken" not in wide.stderr


async def test_allow_remote_with_a_token_starts_and_warns(tmp_path: Path) -> None:
    token_file = tmp_path / "admin-token"
    token_file.write_text("t0ken-for-the-test\n")
    token_file.chmod(0o600)
    serve = await Serve(None, tmp_path / "r.duckdb", "--upstream", "http://127.0.0.1:9", "--host", "0.0.0.0",
                        "--allow-remote", "--admin-token-file", str(token_file)).started()
    try:
        assert await get_from("127.0.0.1", serve.port, "/_llmtap/health") == 403
        token = {"X-Llmtap-Admin-Token": "t0ken-for-the-test"}
        assert await get_from("127.0.0.1", serve.port, "/_llmtap/health", token) == 200
    finally:
        assert serve.stop() == 0
    assert "WARNING: listening on 0.0.0.0" in serve.output()
    assert "t0ken-for-the-test" not in serve.output()


@needs_own_address
async def test_binds_loopback_by_default(tmp_path: Path) -> None:
    serve = await Serve("http://127.0.0.1:9", tmp_path / "l.duckdb").started()
    try:
        assert serve.base.startswith("http://127.0.0.1:")
        assert await get_from("127.0.0.1", serve.port, "/_llmtap/health", serve.admin.headers()) == 200
        with pytest.raises(aiohttp.ClientConnectorError):
            await get_from(OWN, serve.port, "/_llmtap/health")  # type: ignore[arg-type]
    finally:
        assert serve.stop() == 0
    assert "WARNING" not in serve.output()


# -- the admin endpoint ------------------------------------------------------------------------------


@needs_own_address
async def test_admin_answers_loopback_peers_only_even_when_bound_wider(tmp_path: Path) -> None:
    """Without --allow-remote (RunningProxy skips the CLI's bind check), remote peers never get in."""
    async with RunningProxy(proxy_config("http://127.0.0.1:9", tmp_path, host="0.0.0.0")) as p:
        assert await get_from("127.0.0.1", p.port, "/_llmtap/health", p.admin.headers()) == 200
        assert await get_from(OWN, p.port, "/_llmtap/health", p.admin.headers(), source=OWN) == 403  # type: ignore[arg-type]
    async with RunningProxy(proxy_config("http://127.0.0.1:9", tmp_path, host="0.0.0.0", admin_token="tok")) as p:
        assert await get_from(OWN, p.port, "/_llmtap/health", {"Authorization": "Bearer tok"}, OWN) == 403  # type: ignore[arg-type]
        assert await get_from("127.0.0.1", p.port, "/_llmtap/health", {"Authorization": "Bearer tok"}) == 200


@needs_own_address
async def test_with_allow_remote_remote_peers_need_the_token(tmp_path: Path) -> None:
    config = proxy_config("http://127.0.0.1:9", tmp_path, host="0.0.0.0", allow_remote=True, admin_token="tok")
    async with RunningProxy(config) as p:
        assert await get_from(OWN, p.port, "/_llmtap/health", source=OWN) == 403  # type: ignore[arg-type]
        assert await get_from(OWN, p.port, "/_llmtap/health", {"Authorization": "Bearer nope"}, OWN) == 403  # type: ignore[arg-type]
        assert await get_from(OWN, p.port, "/_llmtap/health", {"Authorization": "Bearer tok"}, OWN) == 200  # type: ignore[arg-type]
        assert await get_from("127.0.0.1", p.port, "/_llmtap/health") == 403


@pytest.mark.parametrize("headers,status", [
    ({}, 200),
    ({"Host": "localhost:1234"}, 200),
    ({"Origin": "http://localhost:3000"}, 403),  # a page: never the admin endpoint
    ({"Host": "attacker.example:8787"}, 403),  # DNS rebinding: the page's own name, resolved to 127.0.0.1
    ({"Origin": "https://attacker.example"}, 403),  # a page elsewhere posting to 127.0.0.1
    ({"Origin": "null"}, 403),
])
async def test_admin_refuses_browsers_even_with_the_token(tmp_path: Path, headers: dict, status: int) -> None:
    async with RunningProxy(proxy_config("http://127.0.0.1:9", tmp_path)) as p:
        async with aiohttp.ClientSession() as s:
            async with s.post(p.url + "/_llmtap/sql", json={"sql": "SELECT 1"},
                              headers={**p.admin.headers(), **headers}) as r:
                assert r.status == status
            async with s.post(p.url + "/_llmtap/sql", json={"sql": "SELECT 1"}) as r:
                assert r.status == 403  # no token, no admin


# -- never an open proxy ---------------------------------------------------------------------------------


async def test_never_an_open_proxy(tmp_path: Path) -> None:
    """Whatever the request line and headers, nothing reaches the other server."""
    async with ScriptedUpstream(Script(chunks=[b"{}"])) as configured, ScriptedUpstream(Script(chunks=[b"{}"])) as other:
        oport = other.url.rsplit(":", 1)[1]
        target = f"127.0.0.1:{oport}"
        config = proxy_config(None, tmp_path, routes={"/api": configured.url + "/base"})  # type: ignore[arg-type]
        async with RunningProxy(config) as p:
            refused = {
                f"GET http://{target}/v1/models HTTP/1.1\r\nHost: {target}\r\n": 400,
                f"GET http://127.0.0.1:{p.port}/api/v1/models HTTP/1.1\r\nHost: {target}\r\n": 400,
                f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n": 405,
                f"GET @{target}/v1/models HTTP/1.1\r\nHost: x\r\n": 400,
                "GET /api/../v1/models HTTP/1.1\r\nHost: x\r\n": 400,
                "GET /api/%2e%2e/%2E%2E/v1/models HTTP/1.1\r\nHost: x\r\n": 400,
                "GET /api/..%2f..%2fv1/models HTTP/1.1\r\nHost: x\r\n": 400,
                "GET /api/%252e%252e/v1/models HTTP/1.1\r\nHost: x\r\n": 400,
                "OPTIONS * HTTP/1.1\r\nHost: x\r\n": 400,
                f"GET /v1/models HTTP/1.1\r\nHost: {target}\r\n": 404,  # no route: only /api is configured
            }
            for line, status in refused.items():
                response = await raw_exchange(p.port, (line + "Connection: close\r\n\r\n").encode(), timeout=3)
                assert status_of(response) == status, (line, response[:300])
            relayed = [
                f"GET /api/v1/models HTTP/1.1\r\nHost: {target}\r\nX-Forwarded-Host: {target}\r\n",
                f"GET /api//{target}/v1/models HTTP/1.1\r\nHost: {target}\r\n",
                f"GET /api/v1/models?url=http://{target}/ HTTP/1.1\r\nHost: {target}\r\n",
            ]
            for line in relayed:
                response = await raw_exchange(p.port, (line + "Connection: close\r\n\r\n").encode(), timeout=3)
                assert status_of(response) == 200, (line, response[:300])
            found = rows(p, "SELECT status, outcome FROM requests")
    assert other.received == []
    cport = configured.url.rsplit(":", 1)[1]
    assert [r.path_qs for r in configured.received] == [
        "/base/v1/models", f"/base//{target}/v1/models", f"/base/v1/models?url=http://{target}/"]
    assert all(dict((k.lower(), v) for k, v in r.headers)["host"] == f"127.0.0.1:{cport}" for r in configured.received)
    assert len(found) == len(refused) + len(relayed) - 1  # aiohttp itself refuses "@host" before dispatch


# -- files -----------------------------------------------------------------------------------------------------


async def test_files_are_private_when_created_by_serve(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        async with ScriptedUpstream(Script(chunks=[b"{}"])) as up:
            db = tmp_path / "new-dir" / "llmtap.duckdb"
            serve = await Serve(up.url, db, "--capture-bodies").started()
            try:
                async with aiohttp.ClientSession() as s:
                    async with s.post(serve.base + "/v1/chat/completions", data=b"{}") as r:
                        assert r.status == 200
                wal = Path(f"{db}.wal")
                for _ in range(60):  # the store writes about every second
                    if wal.exists():
                        break
                    await asyncio.sleep(0.05)
                assert stat.S_IMODE(wal.stat().st_mode) == 0o600
                assert serve.state is not None
                assert stat.S_IMODE(serve.state.path.stat().st_mode) == 0o600
                assert stat.S_IMODE(serve.state.path.parent.stat().st_mode) == 0o700
            finally:
                assert serve.stop() == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700


# -- log lines -------------------------------------------------------------------------------------------------


async def test_log_lines_show_control_characters_escaped(tmp_path: Path) -> None:
    """A model name, a tag and an upstream's error message with CR, LF, ESC, NUL and C1 controls: every
    request's stderr line is one line, with the controls shown as escapes, never sent to the terminal."""
    error = orjson.dumps({"error": {"type": "invalid_request_error",
                                    "message": "no model\r\nllmtap: GET /v1/forged  200  ok\x1b]0;owned\x07"}})
    async with ScriptedUpstream(Script(status=400, headers=[("Content-Type", "application/json")],
                                       chunks=[error])) as up:
        lines: list[str] = []
        async with RunningProxy(proxy_config(up.url, tmp_path, quiet=False), report=lines.append) as p:
            model = "m\r\nllmtap: POST /v1/forged  200  ok\x1b[2J\x00\x85"
            body = orjson.dumps({"model": model, "messages": []})  # JSON-escaped on the wire
            for target, tag in (("/v1/chat/completions", "t\x85\x9b2J"), ("/_tag/t%1b%5b2J%0d%0a/v1/chat/completions", "")):
                head = (f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {len(body)}\r\nConnection: close\r\n").encode()
                if tag:
                    head += b"X-Llmtap-Tag: " + tag.encode() + b"\r\n"
                response = await raw_exchange(p.port, head + b"\r\n" + body, timeout=3)
                assert status_of(response) == 400, response[:300]
            found = rows(p, "SELECT request_model, tag, error_message FROM requests ORDER BY started_at")
    assert [r["request_model"] for r in found] == [model, model]  # the row keeps what was sent
    assert [r["tag"] for r in found] == ["t\x85\x9b2J", "t\x1b[2J\r\n"]  # (aiohttp refuses C0 controls in headers)
    logged = [line for line in lines if line.startswith("llmtap: POST")]
    assert len(logged) == 2, lines
    for line in logged:
        assert not any(ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f for c in line), repr(line)
        assert "m\\r\\nllmtap: POST /v1/forged  200  ok\\u001b[2J\\u0000\\u0085" in line, line
        assert "error: no model\\r\\nllmtap: GET /v1/forged  200  ok\\u001b]0;owned\\u0007" in line, line


# -- every path leaves a row; no `..` however encoded ----------------------------------------------------------


async def answer_ok(conn: RawConn) -> None:
    await conn.read_request()
    await conn.send(http_head(200, {**JSON, "Connection": "close"}, length=2) + b"{}")


async def test_every_path_leaves_a_row_whatever_its_bytes(tmp_path: Path) -> None:
    """Encoded line breaks, CR and NUL in a path: relayed as sent (still encoded) or refused in the
    API's error shape, never aiohttp's own plain-text 404; a row each way."""
    async with RawUpstream(answer_ok) as up:
        config = proxy_config(None, tmp_path, routes={"/api": up.url + "/base"})  # type: ignore[arg-type]
        async with RunningProxy(config) as p:
            cases = {"/api/v1/a%0ab": 200, "/api/v1/a%0Db%0A": 200, "/api/v1/a%0d%0aX-Injected:%20yes": 200,
                     "/api/v1/a%00b": 400, "/nowhere%0a": 404}
            for target, status in cases.items():
                response = await raw_exchange(p.port, f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                                              .encode(), timeout=3)
                assert status_of(response) == status, (target, response[:300])
                if status != 200:
                    assert orjson.loads(body_of(response))["error"]["code"] in ("bad_path", "no_route"), response
            found = rows(p, "SELECT path, status, error_type FROM requests")
    assert sorted((r["path"], r["status"]) for r in found) == sorted(cases.items())
    assert {r["path"]: r["error_type"] for r in found if r["status"] != 200} == {
        "/api/v1/a%00b": "bad_path", "/nowhere%0a": "no_route"}
    assert [r.split(b"\r\n", 1)[0] for r in up.requests] == [
        b"GET /base/v1/a%0ab HTTP/1.1", b"GET /base/v1/a%0Db%0A HTTP/1.1", b"GET /base/v1/a%0d%0aX-Injected:%20yes HTTP/1.1"]
    assert not any(b"\r\nX-Injected" in r for r in up.requests)


async def test_header_bytes_that_are_not_utf8_leave_rows_and_clear_refusals(tmp_path: Path) -> None:
    """`Origin`, `Sec-Fetch-Site` or `Host` with a byte that is not UTF-8: a 403 in the API's shape
    (its message quotes the header: the byte shown as U+FFFD), never a 500; a `User-Agent` with one:
    relayed. A row each way (such text had made the store reject the row)."""
    async with RawUpstream(answer_ok) as up:
        async with RunningProxy(proxy_config(up.url, tmp_path)) as p:
            cases = {b"Host: localhost\r\nOrigin: http://evil\xff.example": 403,
                     b"Host: localhost\r\nSec-Fetch-Site: cross\xfe": 403,
                     b"Host: evil\xff.example.com": 403, b"Host: localhost\r\nUser-Agent: tool\xff/1": 200}
            for headers, status in cases.items():
                response = await raw_exchange(p.port, b"GET /v1/models HTTP/1.1\r\n" + headers
                                              + b"\r\nConnection: close\r\n\r\n", timeout=3)
                assert status_of(response) == status, (headers, response[:300])
                if status == 403:
                    assert "\ufffd" in orjson.loads(body_of(response))["error"]["message"]
            found = rows(p, "SELECT status, error_type, error_message, user_agent FROM requests ORDER BY started_at")
    assert [(r["status"], r["error_type"]) for r in found] == [(403, "refused_web_page")] * 3 + [(200, None)]
    assert "(Origin http://evil\ufffd.example)" in found[0]["error_message"]
    assert found[3]["user_agent"] == "tool\ufffd/1"


CLIMBS = [
    "/api/..;/admin", "/api/v1/..;jsessionid=1/admin", "/api/%2e%2e;/admin", "/api/..%3b/admin",
    "/api/.%2e/admin", "/api/%2e./admin", "/api/%2E%2e/admin", "/api/..%2fadmin", "/api/..%5cadmin", "/api/..\\admin",
    "/api/%252e%252e/admin", "/api/%25252e%25252e/admin", "/api/%25u002e%25u002e/admin",
    "/api/%c0%ae%c0%ae/admin", "/api/%C0%AE./admin", "/api/%e0%80%ae%e0%80%ae/admin", "/api/%f0%80%80%ae%f0%80%80%ae/admin",
    "/api/..%c0%afadmin", "/api/..%e0%80%afadmin", "/api/%u002e%u002e/admin", "/api/%U002E./admin",
    "/api/.%00./admin", "/api/..%00/admin", "/api/v1/models%00.json",
]


async def test_no_encoding_of_a_dot_dot_segment_reaches_the_upstream(tmp_path: Path) -> None:
    """Each way to spell `..` that some server decodes (Tomcat's `..;`, IIS's `%u002e`, overlong UTF-8,
    mixed and repeated percent-encoding, backslashes; a NUL byte): a 400 in the API's shape, a row."""
    async with RawUpstream(answer_ok) as up:
        config = proxy_config(None, tmp_path, routes={"/api": up.url + "/base"})  # type: ignore[arg-type]
        async with RunningProxy(config) as p:
            for target in CLIMBS:
                response = await raw_exchange(p.port, f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                                              .encode(), timeout=3)
                assert status_of(response) == 400, (target, response[:300])
                error = orjson.loads(body_of(response))["error"]
                assert error["code"] == "bad_path" and "'..' segment" in error["message"], (target, error)
            for target in ("/api/v1/models/gpt-4.1", "/api/v1/a%20b.json", "/api/v1/.well/..x/%2e/a..b"):
                response = await raw_exchange(p.port, f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                                              .encode(), timeout=3)
                assert status_of(response) == 200, (target, response[:300])
            found = rows(p, "SELECT path, status, error_type FROM requests WHERE status = 400")
    assert sorted(r["path"] for r in found) == sorted(CLIMBS)
    assert {(r["status"], r["error_type"]) for r in found} == {(400, "bad_path")}
    assert len(up.requests) == 3  # only the ordinary paths


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


async def test_a_websocket_message_past_the_body_cap_closes_with_1009_and_a_row(sim: Simulator, tmp_path: Path) -> None:
    """A Responses WebSocket through `llmtap serve --max-body-mb 2` to the simulator: a normal turn
    relays, a 64 MiB message is refused from its frame's header (1009, a row saying so), and the
    proxy's peak RSS does not grow by the message (it grew by several times it: no cap at all)."""
    huge = 64 * 1024 * 1024
    async with Serve(sim.url, tmp_path / "ws.duckdb", "--max-body-mb", "2") as serve:
        url = serve.base + "/v1/responses"
        async with aiohttp.ClientSession() as s:
            async with s.ws_connect(url) as ws:  # a normal turn first: relayed, its row written
                await ws.send_json({"type": "response.create", "model": "gpt-x", "input": "hi"})
                while (await ws.receive_json(timeout=10))["type"] != "response.completed":
                    pass
            before = _peak_rss_mib(serve.proc.pid)
            async with s.ws_connect(url, max_msg_size=0) as ws:
                message = b'{"type": "response.create", "model": "gpt-x", "input": "' + b"x" * huge + b'"}'
                sending = asyncio.create_task(ws.send_frame(message, aiohttp.WSMsgType.TEXT))
                del message
                closing = await ws.receive(timeout=10)  # while the frame still goes out
                await asyncio.gather(sending, return_exceptions=True)  # the proxy closed under it
                assert (closing.type, closing.data) == (aiohttp.WSMsgType.CLOSE, 1009), closing
        grown = _peak_rss_mib(serve.proc.pid) - before

        def both_rows() -> list[tuple] | None:
            found = serve.admin.sql("SELECT outcome, error_type, error_message FROM requests ORDER BY started_at")[0][2]
            return found if len(found) >= 2 else None

        found = await wait_until(both_rows, what="the refused message's row")
    assert found[0][:2] == ("ok", None)
    assert found[-1][:2] == ("http_error", "request_too_large") and "1009" in found[-1][2], found
    assert grown < huge / 2**20 / 2, f"peak RSS grew by {grown:.0f} MiB for a refused 64 MiB message"


async def _slow_head(port: int, every_s: float, deadline_s: float) -> bool:
    """A client that sends a request's head one header line at a time, `every_s` apart, for ever:
    True once the proxy closed the connection (within `deadline_s`)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        async with asyncio.timeout(deadline_s):
            while True:
                try:
                    writer.write(b"X-Slow: 1\r\n")
                    await writer.drain()
                    if await asyncio.wait_for(reader.read(65536), every_s) == b"":
                        return True
                except TimeoutError:
                    continue
                except ConnectionError:
                    return True
    except TimeoutError:
        return False
    finally:
        writer.close()


async def test_a_head_that_never_completes_is_closed_and_streams_are_not(sim: Simulator, tmp_path: Path) -> None:
    """`--header-timeout 1`: a client sending one header line every 0.2 s, and one sending nothing, are
    closed; a stream that lasts longer than the timeout is relayed whole."""
    async with RunningProxy(proxy_config(sim.url, tmp_path, header_timeout_s=1.0)) as p:
        assert await _slow_head(p.port, 0.2, 15)  # open for ever, before
        reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
        async with asyncio.timeout(15):
            assert await reader.read(65536) == b""  # nothing sent: closed too
        writer.close()
        body = {"model": "gpt-x", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        async with aiohttp.ClientSession() as s:
            async with s.post(p.url + "/v1/chat/completions", json=body,
                              headers={"x-sim-tokens": "25", "x-sim-itl-ms": "100"}) as r:  # 2.5 s of stream
                text = await r.text()
        assert r.status == 200 and text.count("data: ") >= 25 and "[DONE]" in text


async def test_past_max_connections_a_new_one_gets_a_clear_503(sim: Simulator, tmp_path: Path) -> None:
    async with RunningProxy(proxy_config(sim.url, tmp_path, max_connections=4)) as p:
        held = [await asyncio.open_connection("127.0.0.1", p.port) for _ in range(4)]
        await wait_until(lambda: len(p.runner.server.connections) == 4, what="the four connections accepted")
        answer = await raw_exchange(p.port, b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in answer, answer
        assert orjson.loads(body_of(answer))["error"]["type"] == "too_many_connections"
        held.pop()[1].close()

        async def answered() -> bytes:
            return await raw_exchange(p.port, b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")

        async with asyncio.timeout(15):  # once one closed, a new one is served
            while (again := await answered()).startswith(b"HTTP/1.1 503 "):
                await asyncio.sleep(0.05)
        assert not again.startswith(b"HTTP/1.1 503 "), again
        for _, writer in held:
            writer.close()


LEAKED = "real-upstream-key-0123456789abcdefXYZ"  # no key's shape: only the exact-secret net catches it


async def test_keys_are_redacted_from_every_stored_text_and_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An upstream answers a key llmtap injects (on another route: on its own the relay masks it first)
    as the response's model and as a tool_use name, another spaced out in its error; the client sends
    llmtap's client key in a path and as a `/_tag/`. No row column (lists and structs too) and no log
    line holds either key, spaced or not."""
    monkeypatch.setenv("REAL_KEY", LEAKED)
    monkeypatch.setenv("OK_KEY", "another-injected-key-0123456789")
    echo = orjson.dumps({"id": "msg_1", "type": "message", "role": "assistant", "model": LEAKED,
                         "content": [{"type": "tool_use", "id": "toolu_1", "name": LEAKED, "input": {}}],
                         "stop_reason": "tool_use", "usage": {"input_tokens": 3, "output_tokens": 2}})
    spaced = " ".join(LEAKED)
    error = orjson.dumps({"type": "error", "error": {"type": "invalid_request_error", "message": f"bad key {spaced}"}})
    lines: list[str] = []
    async with ScriptedUpstream(Script(chunks=[echo], headers=[("Content-Type", "application/json")])) as ok, \
            ScriptedUpstream(Script(status=400, chunks=[error], headers=[("Content-Type", "application/json")])) as bad:
        config = proxy_config(None, tmp_path, routes={"/ok": ok.url, "/bad": bad.url},  # type: ignore[arg-type]
                              route_key_env={"/ok": "OK_KEY", "/bad": "REAL_KEY"}, quiet=False)
        async with RunningProxy(config, report=lines.append) as p:
            key = p.state.client_key
            assert key
            body = {"model": "claude-x", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
            async with aiohttp.ClientSession(headers={"x-api-key": key}) as s:
                for path in ("/ok/v1/messages", "/bad/v1/messages", f"/_tag/{key}/ok/v1/messages",
                             f"/ok/v1/{key}/messages", f"/_tag/{' '.join(key)}/ok/v1/messages"):
                    async with s.post(p.url + path, json=body) as r:
                        await r.read()
            found = rows(p, "SELECT * FROM requests")
    assert len(found) == 5, lines
    stored = orjson.dumps(found, default=str).decode() + "\n".join(lines)
    assert any(r["response_model"] == "[REDACTED]" for r in found)
    assert any(r["tool_calls"] and r["tool_calls"][0]["name"] == "[REDACTED]" for r in found)
    for secret in (LEAKED, key):
        assert secret not in stored and " ".join(secret) not in stored
        assert secret not in "".join(stored.split()).replace("%20", "")


async def test_an_upstreams_echo_of_the_injected_key_never_reaches_the_client(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """On a route that injects the key, an upstream that echoes it (in a header, a whole body, a stream
    that splits it across two chunks, a WebSocket frame) gets it to the client masked, the body's length
    unchanged, and the stream's bytes before the split not held back."""
    from aiohttp import web

    monkeypatch.setenv("REAL_KEY", LEAKED)
    half = len(LEAKED) // 2
    first_event = b'data: {"delta": "one"}\n\n'
    go_on = asyncio.Event()
    seen: dict[str, str] = {}

    async def whole(request: web.Request) -> web.Response:
        seen["accept-encoding"] = request.headers.get("Accept-Encoding", "")
        body = orjson.dumps({"error": {"message": f"key {LEAKED} is not allowed"}})
        return web.Response(status=401, body=body, headers={"X-Echo": LEAKED, "Content-Type": "application/json"})

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(first_event + b'data: {"delta": "' + LEAKED[:half].encode())
        await go_on.wait()  # the client has the first event before the key's second half is even sent
        await response.write(LEAKED[half:].encode() + b'"}\n\ndata: [DONE]\n\n')
        return response

    async def frames(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for _ in ws:
            await ws.send_str(orjson.dumps({"type": "error", "message": LEAKED}).decode())
        return ws

    app = web.Application()
    app.router.add_post("/v1/whole", whole)
    app.router.add_post("/v1/stream", stream)
    app.router.add_get("/v1/responses", frames)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    upstream = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        config = proxy_config(None, tmp_path, routes={"/p": upstream}, route_key_env={"/p": "REAL_KEY"})  # type: ignore[arg-type]
        async with RunningProxy(config) as p:
            async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {p.state.client_key}"}) as s:
                async with s.post(p.url + "/p/v1/whole", json={}) as r:
                    body = await r.read()
                    assert r.status == 401 and LEAKED not in str(r.headers) and r.headers["X-Echo"] == "*" * len(LEAKED)
                    assert LEAKED.encode() not in body and int(r.headers["Content-Length"]) == len(body)
                    assert b"*" * len(LEAKED) in body
                assert seen["accept-encoding"] == "identity"
                async with s.post(p.url + "/p/v1/stream", json={}) as r:
                    got = await r.content.readuntil(b"\n\n")
                    assert got == first_event  # not held: only what could begin the key waits
                    go_on.set()
                    rest = got + await r.read()
                assert LEAKED.encode() not in rest and LEAKED[:half].encode() not in rest
                assert b'"' + b"*" * len(LEAKED) + b'"' in rest and rest.endswith(b"data: [DONE]\n\n")
                async with s.ws_connect(p.url + "/p/v1/responses") as ws:
                    await ws.send_str('{"type": "response.create", "model": "m"}')
                    frame = await ws.receive_str(timeout=10)
                assert LEAKED not in frame and "*" * len(LEAKED) in frame
    finally:
        await runner.cleanup()


async def test_full_width_formula_starters_are_quoted_in_every_csv(tmp_path: Path) -> None:
    """A model `＝HYPERLINK(…)` and an upstream error `＠SUM(…)` (full-width = and @) through a real
    proxy, then `sql --format csv` and `export --format csv`: each such cell starts with `'`."""
    import csv
    import io

    from .test_output_files import cells, cli

    model, error = '＝HYPERLINK("http://evil.example/","x")', "＠SUM(1+1)"
    body = orjson.dumps({"error": {"type": "invalid_request_error", "message": error}})
    async with ScriptedUpstream(Script(status=400, headers=[("Content-Type", "application/json")], chunks=[body])) as up:
        async with RunningProxy(proxy_config(up.url, tmp_path)) as p:
            async with aiohttp.ClientSession() as s:
                async with s.post(p.url + "/v1/chat/completions", json={"model": model, "messages": []}) as r:
                    await r.read()
    db = str(tmp_path / "llmtap.duckdb")
    sql = cli("sql", "--db", db, "--format", "csv", "SELECT request_model, error_message FROM requests")
    assert cells(sql)[-2:] == ["'" + model, "'" + error]
    cli("export", "--db", db, "--out", str(tmp_path / "out"), "--format", "csv")
    [exported] = (tmp_path / "out" / "requests").glob("*/*.csv")
    [row] = list(csv.DictReader(io.StringIO(exported.read_text())))
    assert (row["request_model"], row["error_message"]) == ("'" + model, "'" + error)


async def test_a_gap_that_is_not_a_number_of_minutes_is_a_clear_400(sim: Simulator, tmp_path: Path) -> None:
    from analysis.web import WebUi
    from proxy.common.instances import TOKEN_HEADER

    async with RunningProxy(proxy_config(sim.url, tmp_path), ui=WebUi()) as p:
        async with aiohttp.ClientSession(headers={TOKEN_HEADER: p.admin_token}) as s:
            async with s.get(p.url + "/_llmtap/api/sessions", params={"gap": "10"}) as r:
                assert r.status == 200, await r.text()
            for gap in ("nan", "inf", "-inf", "-5", "0", "1e400", "ten"):
                async with s.get(p.url + "/_llmtap/api/sessions", params={"gap": gap}) as r:
                    answer = await r.json()
                assert r.status == 400 and answer["error"].startswith("gap is minutes, above 0"), (gap, answer)
