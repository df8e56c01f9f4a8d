"""Reaching the upstreams on any network: a forward proxy (HTTPS_PROXY/NO_PROXY, --upstream-proxy,
per route) and extra CAs added to the system store. A real proxy (proxy.py) and real TLS upstreams
signed by private CAs, all on loopback."""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path
from typing import AsyncIterator, Iterator

import aiohttp
import pytest
from click.testing import CliRunner

from proxy.settings import egress
from proxy.relay.app import routes_banner
from proxy.cli import main
from proxy.settings.config import ConfigError, ServeConfig, build
from proxy.relay.app_state import AppState
from .serving import RunningProxy
from proxy.simulator.app import Simulator
from proxy.simulator.config import SimConfig
from proxy.tools.doctor import Options, diagnose, forward_proxy

from .conftest import proxy_config, rows
from .forward_proxy import ForwardProxy, needs_forward_proxy

trustme = pytest.importorskip("trustme")
SECRET = "s3cret-proxy-pass"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
FAST = SimConfig(ttft_ms=1, itl_ms=1, tokens=4, prefill_us_per_token=0)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- which proxy a route takes (no network) ---------------------------------------------------------


@pytest.mark.parametrize("host, port, no_proxy, expected", [
    ("api.openai.com", 443, "*", True),
    ("api.openai.com", 443, "openai.com", True),
    ("api.openai.com", 443, ".openai.com", True),
    ("api.openai.com", 443, "*.openai.com", True),
    ("openai.com.evil.net", 443, "openai.com", False),
    ("notopenai.com", 443, "openai.com", False),
    ("api.openai.com", 443, "api.openai.com:443", True),
    ("api.openai.com", 443, "api.openai.com:8443", False),
    ("127.0.0.1", 8788, "localhost, 127.0.0.1", True),
    ("10.1.2.3", 80, "10.0.0.0/8", True),
    ("11.1.2.3", 80, "10.0.0.0/8", False),
    ("::1", 80, "::1", True),
    ("::1", 8080, "[::1]:8080", True),
    ("127.0.0.2", 80, "127.0.0.1", False),
    ("example.org", 80, "", False),
])
def test_no_proxy_forms(host: str, port: int, no_proxy: str, expected: bool) -> None:
    assert egress.bypassed(host, port, no_proxy) is expected


def test_which_proxy_each_setting_gives() -> None:
    env = {"HTTPS_PROXY": "http://upper:3128", "https_proxy": "http://lower:3128", "HTTP_PROXY": "plain:8080",
           "ALL_PROXY": "socks5://ignored:1080", "NO_PROXY": "internal.example"}
    found = egress.proxy_for("https://api.openai.com", env)
    assert found is not None and (found.url, found.source) == ("http://lower:3128", "https_proxy")  # lower case first
    found = egress.proxy_for("http://10.0.0.5:8000", env)
    assert found is not None and (found.url, found.source) == ("http://plain:8080", "HTTP_PROXY")  # no scheme: http
    assert egress.proxy_for("https://llm.internal.example", env) is None  # NO_PROXY
    assert egress.proxy_for("https://api.openai.com", {"ALL_PROXY": "socks5://x:1080"}) is None  # not read
    flag = egress.proxy_for("https://api.openai.com", env, upstream_proxy="http://flag:1")
    assert flag is not None and (flag.url, flag.source) == ("http://flag:1", "upstream_proxy")
    assert egress.proxy_for("https://llm.internal.example", env, upstream_proxy="http://flag:1") is None
    assert egress.proxy_for("https://api.openai.com", env, upstream_proxy="none") is None
    route = egress.proxy_for("https://llm.internal.example", env, "http://flag:1", "http://r:2", "/x")
    assert route is not None and (route.url, route.source) == ("http://r:2", "route_proxy /x")  # wins over NO_PROXY
    assert egress.proxy_for("https://api.openai.com", env, "http://flag:1", "NONE", "/x") is None


def test_proxy_credentials_are_parsed_and_never_shown() -> None:
    found = egress.parse_proxy(f"http://me%40corp:{SECRET}@proxy.corp:3128", "HTTPS_PROXY")
    assert (found.url, found.user, found.password, found.label) == ("http://proxy.corp:3128", "me@corp", SECRET,
                                                                   "proxy.corp:3128")
    assert SECRET not in repr(found) and SECRET not in found.url
    assert egress.hide_credentials(f"http://me:{SECRET}@proxy.corp:3128") == "http://***@proxy.corp:3128"
    with pytest.raises(egress.EgressError) as bad:
        egress.parse_proxy(f"socks5://me:{SECRET}@proxy.corp:1080", "ALL_PROXY")
    assert "socks5:// proxy is not supported" in str(bad.value) and SECRET not in str(bad.value)


def test_route_table_puts_the_proxy_on_each_route(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", f"http://me:{SECRET}@proxy.corp:3128")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    config = ServeConfig(upstream="https://api.openai.com",
                         routes={"/local": "https://127.0.0.1:9000", "/direct": "https://api.anthropic.com",
                                 "/other": "https://api.mistral.ai"},
                         route_proxy={"/direct": "none", "other": "http://other.corp:8080"})
    by_prefix = {r.prefix: r for r in config.route_table().routes}
    assert str(by_prefix[""].proxy) == "http://proxy.corp:3128"
    assert by_prefix[""].proxy_headers == {"Proxy-Authorization": aiohttp.encode_basic_auth("me", SECRET)}
    assert by_prefix["/local"].proxy is None and by_prefix["/direct"].proxy is None
    assert str(by_prefix["/other"].proxy) == "http://other.corp:8080" and by_prefix["/other"].proxy_headers is None
    assert SECRET not in repr(by_prefix[""])
    banner = routes_banner(AppState(config=config, routes=config.route_table()), "http://127.0.0.1:8787")
    assert ("  http://127.0.0.1:8787  ->  https://api.openai.com  (through the forward proxy proxy.corp:3128)"
            in banner.splitlines())
    assert "  http://127.0.0.1:8787/direct  ->  https://api.anthropic.com" in banner.splitlines()
    assert SECRET not in banner
    with pytest.raises(ConfigError, match="a proxy is configured for route.* that do not exist: /nope"):
        ServeConfig(upstream="https://api.openai.com", route_proxy={"/nope": "none"}).route_table()


def test_config_file_keys_and_doctor_resolve_the_same_proxy(tmp_path: Path) -> None:
    path = tmp_path / "llmtap.toml"
    path.write_text('upstream = "https://api.openai.com"\nupstream_proxy = "http://proxy.corp:3128"\n'
                    '[routes]\n"/local" = "http://10.0.0.5:8000"\n"/eu" = "https://eu.example.com"\n'
                    '[route_proxy]\n"/local" = "none"\n')
    config = build(path, {"route_proxy": {"/eu": "http://eu-proxy.corp:8080"}})  # flags merge into the table
    assert config.route_proxy == {"/local": "none", "/eu": "http://eu-proxy.corp:8080"}
    by_prefix = {r.prefix: r.proxy for r in config.route_table().routes}
    assert {k: str(v) if v else None for k, v in by_prefix.items()} == {
        "": "http://proxy.corp:3128", "/local": None, "/eu": "http://eu-proxy.corp:8080"}
    found = {url: forward_proxy(url, {}, config) for url in ("https://api.openai.com", "http://10.0.0.5:8000",
                                                              "https://eu.example.com")}
    assert {url: (p.url, p.source) if p else None for url, p in found.items()} == {
        "https://api.openai.com": ("http://proxy.corp:3128", "upstream_proxy"), "http://10.0.0.5:8000": None,
        "https://eu.example.com": ("http://eu-proxy.corp:8080", "route_proxy /eu")}


def test_print_config_hides_proxy_credentials(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["serve", "--upstream", "https://api.openai.com", "--route",
                                       "/a=https://api.anthropic.com", "--upstream-proxy",
                                       f"http://me:{SECRET}@proxy.corp:3128", "--route-proxy",
                                       f"/a=http://you:{SECRET}@other.corp:8080", "--print-config"])
    assert result.exit_code == 0, result.output
    assert SECRET not in result.output
    assert 'upstream_proxy = "http://***@proxy.corp:3128"' in result.output.splitlines()
    assert '[route_proxy]\n"/a" = "http://***@other.corp:8080"' in result.output


# -- through a real forward proxy ---------------------------------------------------------------------


@pytest.fixture
async def tls_sim(tls: tuple[ssl.SSLContext, Path]) -> AsyncIterator[Simulator]:
    async with Simulator(FAST, ssl_context=tls[0]) as s:
        yield s


@pytest.fixture
def forward(tmp_path: Path) -> Iterator[ForwardProxy]:
    with ForwardProxy(tmp_path / "forward-proxy", basic_auth=f"me:{SECRET}") as fp:
        yield fp


def reports(into: list[str]):
    return lambda line: into.append(line)


def everything(p: RunningProxy) -> str:
    return repr(rows(p)) + repr(rows(p, "SELECT * FROM chunks"))


@needs_forward_proxy
async def test_http_and_https_upstreams_go_through_the_proxy_from_the_environment(
        sim: Simulator, tls_sim: Simulator, tls: tuple[ssl.SSLContext, Path], forward: ForwardProxy,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proxy_url = f"http://me:{SECRET}@127.0.0.1:{forward.port}"
    monkeypatch.setenv("HTTP_PROXY", proxy_url)
    monkeypatch.setenv("https_proxy", proxy_url)
    lines: list[str] = []
    config = proxy_config(sim.url, tmp_path, routes={"/tls": tls_sim.url}, ca_bundle=str(tls[1]), quiet=False)
    async with RunningProxy(config, report=reports(lines)) as p:
        async with aiohttp.ClientSession() as s:
            for base in ("", "/tls"):
                async with s.post(p.url + base + "/v1/chat/completions", json=CHAT,
                                  headers={"Authorization": "Bearer sk-test"}) as r:
                    assert r.status == 200, await r.text()
            async with s.ws_connect(p.url + "/tls/v1/responses", headers={"Authorization": "Bearer sk-test"}) as ws:
                await ws.send_json({"type": "response.create", "model": "m", "input": "hi"})
                while (await ws.receive_json(timeout=10))["type"] != "response.completed":
                    pass
        recorded = rows(p)
        stored = everything(p)
    seen = forward.wait_for(f"CONNECT 127.0.0.1:{tls_sim.port}")
    assert f"POST 127.0.0.1:{sim.port}/v1/chat/completions" in seen
    assert f"CONNECT 127.0.0.1:{tls_sim.port}" in seen
    assert [(r["route"], r["status"], r["outcome"]) for r in recorded] == [("/", 200, "ok"), ("/tls", 200, "ok"),
                                                                          ("/tls", 101, "ok")]
    assert all("proxy-authorization" not in headers for _m, _p, headers, _b in sim.requests + tls_sim.requests)
    assert SECRET not in stored and SECRET not in "\n".join(lines)


@needs_forward_proxy
async def test_no_proxy_goes_direct_and_routes_choose_their_own(
        sim: Simulator, forward: ForwardProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dead = closed_port()
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{dead}")  # nothing listens: a request through it fails
    monkeypatch.setenv("NO_PROXY", "localhost,127.0.0.1")
    async with Simulator(FAST) as other:
        config = proxy_config(sim.url, tmp_path, routes={"/via": other.url, "/off": other.url},
                              route_proxy={"/via": f"http://me:{SECRET}@127.0.0.1:{forward.port}",
                                           "/off": "none"})
        async with RunningProxy(config) as p:
            async with aiohttp.ClientSession() as s:
                for base in ("", "/via", "/off"):
                    async with s.post(p.url + base + "/v1/chat/completions", json=CHAT) as r:
                        assert r.status == 200, (base, await r.text())
            assert [r["outcome"] for r in rows(p)] == ["ok"] * 3
    seen = forward.wait_for("POST")
    assert seen == [f"POST 127.0.0.1:{other.port}/v1/chat/completions"]  # the /via request, and only it


@needs_forward_proxy
async def test_proxy_down_or_refusing_is_named_in_the_api_shape(
        sim: Simulator, tls_sim: Simulator, tls: tuple[ssl.SSLContext, Path], forward: ForwardProxy,
        tmp_path: Path) -> None:
    dead = closed_port()
    wrong = f"http://me:wrong-{SECRET}@127.0.0.1:{forward.port}"
    lines: list[str] = []
    config = proxy_config(sim.url, tmp_path, ca_bundle=str(tls[1]), quiet=False,
                          upstream_proxy=f"http://me:{SECRET}@127.0.0.1:{dead}",
                          routes={"/tls": tls_sim.url, "/plain": sim.url, "/wss": tls_sim.url},
                          route_proxy={"/tls": wrong, "/plain": wrong, "/wss": wrong})
    async with RunningProxy(config, report=reports(lines)) as p:
        async with aiohttp.ClientSession() as s:
            async with s.post(p.url + "/v1/messages", json={"model": "m", "max_tokens": 5, "messages": []}) as r:
                down = (r.status, await r.json())
            answers = []
            for base in ("/tls", "/plain"):
                async with s.post(p.url + base + "/v1/chat/completions", json=CHAT) as r:
                    answers.append((r.status, (await r.json())["error"]))
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused_ws:
                await s.ws_connect(p.url + "/wss/v1/responses")
        recorded = rows(p)
        stored = everything(p)
    assert down[0] == 502 and down[1]["type"] == "error" and down[1]["error"]["type"] == "api_error"
    assert down[1]["error"]["message"].startswith(
        f"llmtap: cannot reach the forward proxy 127.0.0.1:{dead} (used for upstream 127.0.0.1): "
        "ConnectionRefusedError")
    for status, error in answers:  # CONNECT answered 407 (https), a plain 407 (http): both the proxy's
        assert status == 502 and error["code"] == "upstream_proxy_auth"
        assert error["message"].startswith(f"llmtap: the forward proxy 127.0.0.1:{forward.port} refused llmtap's "
                                           "credentials (HTTP 407 Proxy Authentication Required)")
    assert refused_ws.value.status == 502
    assert [(r["status"], r["outcome"], r["error_type"]) for r in recorded] == [
        (502, "upstream_unreachable", "upstream_proxy_unreachable"),
        (502, "upstream_unreachable", "upstream_proxy_auth"),
        (502, "upstream_unreachable", "upstream_proxy_auth"),
        (502, "upstream_unreachable", "upstream_proxy_auth")]
    assert SECRET not in stored and SECRET not in "\n".join(lines) and SECRET not in repr(answers + [down])
    assert sim.requests == [] and tls_sim.requests == []


# -- extra CAs added to the system store ----------------------------------------------------------------


@pytest.fixture
def two_cas(tmp_path: Path) -> tuple[list[ssl.SSLContext], list[Path]]:
    """Two private CAs, each with a server context for 127.0.0.1 and its CA file."""
    contexts, paths = [], []
    for n in (1, 2):
        ca = trustme.CA()
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert("127.0.0.1").configure_cert(context)
        path = tmp_path / f"ca{n}.pem"
        ca.cert_pem.write_to_path(str(path))
        contexts.append(context)
        paths.append(path)
    return contexts, paths


async def statuses(config: ServeConfig) -> dict[str, tuple[int, str | None]]:
    async with RunningProxy(config) as p:
        async with aiohttp.ClientSession() as s:
            for base in ("/one", "/two"):
                async with s.post(p.url + base + "/v1/chat/completions", json=CHAT) as r:
                    await r.read()
        return {r["route"]: (r["status"], r["error_message"]) for r in rows(p)}


@pytest.mark.parametrize("how", ["--ca-bundle", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS"])
async def test_an_extra_ca_is_added_to_the_system_store(
        how: str, two_cas: tuple[list[ssl.SSLContext], list[Path]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    (ctx1, ctx2), (ca1, ca2) = two_cas
    monkeypatch.setenv("SSL_CERT_FILE", str(ca2))  # CA2 is "the system's" (OpenSSL reads it per context)
    async with Simulator(FAST, ssl_context=ctx1) as one, Simulator(FAST, ssl_context=ctx2) as two:
        routes = {"/one": one.url, "/two": two.url}
        without = await statuses(proxy_config(one.url, tmp_path / "a", routes=routes))
        if how == "--ca-bundle":
            config = proxy_config(one.url, tmp_path / "b", routes=routes, ca_bundle=str(ca1))
        else:
            monkeypatch.setenv(how, str(ca1))
            config = proxy_config(one.url, tmp_path / "b", routes=routes)
        with_ca1 = await statuses(config)
    assert without["/two"] == (200, None)
    assert without["/one"][0] == 502 and "TLS certificate verification failed" in without["/one"][1]
    assert with_ca1 == {"/one": (200, None), "/two": (200, None)}  # CA1 added, CA2 (the system's) kept


def test_an_unreadable_extra_bundle_refuses_to_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty.pem"
    empty.write_text("")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(empty))
    with pytest.raises(ConfigError, match=f"REQUESTS_CA_BUNDLE {empty}: cannot load CA certificates from it "
                                          r"\(.*\); fix it, or unset REQUESTS_CA_BUNDLE"):
        ServeConfig(upstream="https://api.openai.com").route_table()
    monkeypatch.delenv("REQUESTS_CA_BUNDLE")
    monkeypatch.setenv("CURL_CA_BUNDLE", "")  # empty: not set
    ServeConfig(upstream="https://api.openai.com").route_table()


# -- doctor takes the same path -----------------------------------------------------------------------


@needs_forward_proxy
async def test_doctor_checks_the_upstream_through_the_proxy_with_the_same_cas(
        tls_sim: Simulator, tls: tuple[ssl.SSLContext, Path], forward: ForwardProxy, tmp_path: Path) -> None:
    config_file = tmp_path / "llmtap.toml"
    config_file.write_text(f'upstream = "{tls_sim.url}"\nca_bundle = "{tls[1]}"\n')
    env = {"HTTPS_PROXY": f"http://me:{SECRET}@127.0.0.1:{forward.port}", "OPENAI_API_KEY": "sk-test"}
    checks = [c for c in await asyncio.to_thread(diagnose, Options(env=dict(env), config_path=config_file, timeout=10))
              if c.subject.startswith("upstream")]
    text = "\n".join(c.render() for c in checks)
    subject = f"upstream {tls_sim.url}"
    assert [c.render() for c in checks] == [
        f"OK    {subject}: through the forward proxy 127.0.0.1:{forward.port} (from HTTPS_PROXY), as llmtap serve goes",
        f"OK    {subject}: TCP: connected to the forward proxy 127.0.0.1:{forward.port}",
        f"OK    {subject}: TLS: TLSv1.3 through the forward proxy 127.0.0.1:{forward.port}'s tunnel, "
        "certificate valid for 127.0.0.1",
        f"OK    {subject}: GET /v1/models with OPENAI_API_KEY: 200 (key accepted)",
    ], text
    assert f"CONNECT 127.0.0.1:{tls_sim.port}" in forward.wait_for("CONNECT")
    assert [path for _m, path, _h, _b in tls_sim.requests] == ["/v1/models"]

    env["HTTPS_PROXY"] = f"http://me:wrong@127.0.0.1:{forward.port}"
    refused = [c.render() for c in await asyncio.to_thread(diagnose, Options(env=dict(env), config_path=config_file, timeout=10))
               if c.subject == subject]
    assert refused[-1] == (f"FAIL  {subject}: CONNECT 127.0.0.1:{tls_sim.port}: the forward proxy "
                           f"127.0.0.1:{forward.port} wants credentials, or refused them (HTTP 407)\n"
                           f"      fix: give them in the proxy URL (HTTPS_PROXY): "
                           f"http://USER:PASSWORD@127.0.0.1:{forward.port}")
    dead = closed_port()
    env["HTTPS_PROXY"] = f"http://127.0.0.1:{dead}"
    down = [c.render() for c in await asyncio.to_thread(diagnose, Options(env=dict(env), config_path=config_file, timeout=10))
            if c.subject == subject]
    assert down[-1].startswith(f"FAIL  {subject}: TCP: cannot connect to the forward proxy 127.0.0.1:{dead}: ")
    assert SECRET not in text
