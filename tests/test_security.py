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
import pytest

from proxy import paths
from proxy.server import RunningProxy

from .conftest import proxy_config, rows
from .faultkit import Serve, raw_exchange, status_of
from .upstreams import Script, ScriptedUpstream


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


def test_a_wider_address_needs_allow_remote_and_an_admin_token(tmp_path: Path) -> None:
    refused = serve_cli("--host", "0.0.0.0", "--db", str(tmp_path / "a.duckdb"))
    assert refused.returncode == 1 and "--allow-remote" in refused.stderr and "Traceback" not in refused.stderr
    no_token = serve_cli("--host", "0.0.0.0", "--allow-remote", "--db", str(tmp_path / "b.duckdb"))
    assert no_token.returncode == 1 and "needs --admin-token" in no_token.stderr
    assert not (tmp_path / "a.duckdb").exists() and not (tmp_path / "b.duckdb").exists()


async def test_allow_remote_with_a_token_starts_and_warns(tmp_path: Path) -> None:
    serve = await Serve(None, tmp_path / "r.duckdb", "--upstream", "http://127.0.0.1:9", "--host", "0.0.0.0",
                        "--allow-remote", "--admin-token", "t0ken-for-the-test").started()
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
        assert await get_from("127.0.0.1", serve.port, "/_llmtap/health") == 200
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
        assert await get_from("127.0.0.1", p.port, "/_llmtap/health") == 200
        assert await get_from(OWN, p.port, "/_llmtap/health", source=OWN) == 403  # type: ignore[arg-type]
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
    ({"Origin": "http://localhost:3000"}, 200),
    ({"Host": "attacker.example:8787"}, 403),  # DNS rebinding: the page's own name, resolved to 127.0.0.1
    ({"Origin": "https://attacker.example"}, 403),  # a page elsewhere posting to 127.0.0.1
    ({"Origin": "null"}, 403),
])
async def test_admin_without_a_token_refuses_browsers_of_other_sites(tmp_path: Path, headers: dict, status: int) -> None:
    async with RunningProxy(proxy_config("http://127.0.0.1:9", tmp_path)) as p:
        async with aiohttp.ClientSession() as s:
            async with s.post(p.url + "/_llmtap/sql", json={"sql": "SELECT 1"}, headers=headers) as r:
                assert r.status == status


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
                assert stat.S_IMODE(paths.state_path().stat().st_mode) == 0o600
            finally:
                assert serve.stop() == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700
