"""Credential injection per route, the /_tag/ base URL, and the admin token."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import orjson
import pytest

from proxy.settings.config import ConfigError, ServeConfig
from proxy.meter.fingerprint import secret_fingerprint
from .serving import RunningProxy

from .conftest import proxy_config, rows
from .faultkit import body_of, raw_exchange, status_of
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
    assert found[1]["error_type"] == "invalid_client_key" and found[1]["route"] == "/p"  # the route it was for
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


# -- bytes that are not UTF-8 where a secret goes; the client key in the query -----------------------------


@pytest.mark.parametrize("path,header,shape", [
    ("/v1/chat/completions", b"Authorization: Bearer sk-\xff\xfe", "openai"),
    ("/v1/messages", b"x-api-key: \xc3\x28\xff", "anthropic"),
    ("/v1beta/models/g:generateContent", b"x-goog-api-key: \x80key", "gemini"),
])
async def test_a_credential_that_is_not_utf8_gets_the_apis_401_with_a_row(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str, header: bytes, shape: str) -> None:
    """Raw bytes (aiohttp's clients would not send them): a 401 in the API's shape, never a 500."""
    monkeypatch.setenv("REAL_KEY", REAL)
    async with ScriptedUpstream(Script(chunks=[b"{}"])) as up:
        config = proxy_config(None, tmp_path, routes={"/p": up.url}, route_key_env={"/p": "REAL_KEY"})  # type: ignore[arg-type]
        async with RunningProxy(config) as p:
            request = (b"POST /p" + path.encode() + b" HTTP/1.1\r\nHost: localhost\r\n" + header
                       + b"\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
            response = await raw_exchange(p.port, request)
            found = rows(p)
    assert status_of(response) == 401, response
    error = orjson.loads(body_of(response))
    if shape == "anthropic":
        assert error["type"] == "error" and error["error"]["type"] == "authentication_error"
    elif shape == "gemini":
        assert error["error"]["code"] == 401 and error["error"]["status"] == "UNAUTHENTICATED"
    else:
        assert error["error"]["code"] == "invalid_client_key"
    assert up.received == []
    assert [(r["status"], r["error_type"], r["route"]) for r in found] == [(401, "invalid_client_key", "/p")]


@pytest.mark.parametrize("header", [b"X-Llmtap-Admin-Token: \xff\xfe", b"Authorization: Bearer t0k\xff"])
async def test_an_admin_token_that_is_not_utf8_gets_a_403_with_a_row(tmp_path: Path, header: bytes) -> None:
    async with RunningProxy(proxy_config("http://127.0.0.1:9", tmp_path, admin_token="t0k")) as p:
        request = b"GET /_llmtap/health HTTP/1.1\r\nHost: localhost\r\n" + header + b"\r\nConnection: close\r\n\r\n"
        response = await raw_exchange(p.port, request)
        found = rows(p)
    assert status_of(response) == 403, response
    assert "forbidden" in orjson.loads(body_of(response))["error"]
    assert [(r["status"], r["error_type"], r["path"]) for r in found] == [(403, "admin_forbidden", "/_llmtap/health")]


async def test_the_client_key_given_as_key_in_the_query_is_not_sent_upstream(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Gemini's `?key=`: accepted as the client key, and the upstream gets only the injected key, the rest
    of the query byte for byte."""
    monkeypatch.setenv("REAL_KEY", REAL)
    async with ScriptedUpstream(Script(chunks=[b"{}"])) as up:
        config = proxy_config(None, tmp_path, routes={"/p": up.url}, route_key_env={"/p": "REAL_KEY"})  # type: ignore[arg-type]
        async with RunningProxy(config) as p:
            client_key = p.state.client_key
            path = "/v1beta/models/g:streamGenerateContent"
            for query in (f"alt=sse&key={client_key}&x=%2F+y", f"key={client_key}", f"k%65y={client_key}&alt=sse"):
                request = (f"POST /p{path}?{query} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n"
                           "Connection: close\r\n\r\n{}").encode()
                assert status_of(await raw_exchange(p.port, request)) == 200
            found = rows(p)
    assert [r.path_qs for r in up.received] == [f"{path}?alt=sse&x=%2F+y", path, f"{path}?alt=sse"]
    for received in up.received:
        assert client_key not in str(received.headers) and client_key not in received.path_qs
        assert ("x-goog-api-key", REAL) in [(k.lower(), v) for k, v in received.headers]
    assert [r["status"] for r in found] == [200, 200, 200]
