"""Credential injection per route, the /_tag/ base URL, and the admin token."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from proxy.config import ConfigError, ServeConfig
from proxy.fingerprint import secret_fingerprint
from proxy.server import RunningProxy

from .conftest import proxy_config, rows
from .upstreams import Script, ScriptedUpstream

REAL = "sk-real-upstream-key-0123456789"


@pytest.mark.parametrize("path,header,value", [
    ("/v1/chat/completions", "authorization", f"Bearer {REAL}"),
    ("/v1/messages", "x-api-key", REAL),
    ("/v1beta/models/g:generateContent", "x-goog-api-key", REAL),
])
async def test_injected_key_replaces_the_clients(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  path: str, header: str, value: str) -> None:
    monkeypatch.setenv("REAL_KEY", REAL + "\n")  # stray newline from a file: stripped
    async with ScriptedUpstream(Script(chunks=[b"{}"])) as up:
        config = proxy_config(None, tmp_path, routes={"/p": up.url}, route_key_env={"/p": "REAL_KEY"})  # type: ignore[arg-type]
        async with RunningProxy(config) as p:
            client_key = p.state.client_key
            assert client_key and client_key.startswith("sk-llmtap-")
            async with aiohttp.ClientSession() as s:
                async with s.post(p.url + "/p" + path, data=b"{}",
                                  headers={"Authorization": "Bearer placeholder", "x-api-key": "placeholder"}) as r:
                    assert r.status == 401  # not llmtap's client key: the real key is not spent
                    assert "client key" in (await r.text())
                assert up.received == []
                sent_as = {"authorization": f"Bearer {client_key}", "x-api-key": client_key,
                           "x-goog-api-key": client_key}[header]
                async with s.post(p.url + "/p" + path, data=b"{}", headers={header: sent_as}) as r:
                    assert r.status == 200
            found = rows(p, "SELECT * FROM requests ORDER BY status")
    sent = {k.lower(): v for k, v in up.received[0].headers}
    assert sent[header] == value
    assert client_key not in str(up.received[0].headers)
    assert [r["status"] for r in found] == [200, 401]
    assert found[1]["error_type"] == "invalid_client_key" and found[1]["route"] == ""
    assert found[0]["key_fingerprint"] == secret_fingerprint(REAL)


def test_missing_key_variable_refuses_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOPE_KEY", raising=False)
    with pytest.raises(ConfigError, match="NOPE_KEY is not set"):
        ServeConfig(upstream="http://u", upstream_key_env="NOPE_KEY").route_table()
    with pytest.raises(ConfigError, match="do not exist"):
        ServeConfig(upstream="http://u", route_key_env={"/x": "HOME"}).route_table()


def test_key_never_in_route_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REAL_KEY", REAL)
    table = ServeConfig(upstream="http://u", upstream_key_env="REAL_KEY").route_table()
    assert REAL not in repr(table.routes) and table.routes[0].credential == REAL


async def test_tag_path_prefix(tmp_path: Path) -> None:
    async with ScriptedUpstream(Script(chunks=[b"{}"])) as up:
        async with RunningProxy(proxy_config(up.url, tmp_path)) as p:
            async with aiohttp.ClientSession() as s:
                async with s.post(p.url + "/_tag/run%201/v1/chat/completions?x=1", data=b"{}") as r:
                    assert r.status == 200
            row = rows(p)[0]
    assert up.received[0].path_qs == "/v1/chat/completions?x=1"
    assert (row["tag"], row["path"]) == ("run 1", "/v1/chat/completions")


async def test_admin_token_required_when_set(tmp_path: Path) -> None:
    async with ScriptedUpstream(Script(chunks=[b"{}"])) as up:
        async with RunningProxy(proxy_config(up.url, tmp_path, admin_token="t0k")) as p:
            async with aiohttp.ClientSession() as s:
                async with s.get(p.url + "/_llmtap/health") as r:
                    assert r.status == 403
                async with s.get(p.url + "/_llmtap/health", headers={"X-Llmtap-Admin-Token": "t0k"}) as r:
                    assert r.status == 200
                async with s.get(p.url + "/_llmtap/health", headers={"Authorization": "Bearer t0k"}) as r:
                    assert r.status == 200
