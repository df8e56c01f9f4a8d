"""Subscription logins are first-class: setup never switches Codex's ChatGPT login or Claude Code's Claude
login to an API key, and Codex's ChatGPT-backend traffic (a base without /v1, SSE and WebSocket) goes
through a route byte for byte, its token never stored."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import aiohttp
from click.testing import CliRunner

from .serving import RunningProxy
from proxy.simulator.app import Simulator
from proxy.tools.cli import setup
from proxy.tools.endpoint import base_urls
from proxy.tools.run import tool_arguments
from proxy.tools.setup import Locations, codex_login

from .conftest import proxy_config, rows
from .upstreams import Script, ScriptedUpstream

URL = "http://127.0.0.1:9911"
JWT = ("eyJhbGciOiJSUzI1NiIsImtpZCI6InRlc3QifQ.eyJodHRwczovL2FwaS5vcGVuYWkuY29tL2F1dGgiOnsiY2hhdGdwdF9hY2NvdW50"
       "X2lkIjoiYWNjdC0xIn19.c2lnbmF0dXJlLW5vdC1yZWFs")
ACCOUNT = "6f1c0a7e-0000-4000-8000-000000000001"
CHATGPT_AUTH = {"auth_mode": "chatgpt", "OPENAI_API_KEY": None,
                "tokens": {"id_token": JWT, "access_token": JWT, "refresh_token": "rt-not-real", "account_id": ACCOUNT},
                "last_refresh": "2026-11-30T00:00:00Z"}


def invoke(home: Path, *args: str) -> tuple[int, str]:
    clean = {"HOME": str(home), "CODEX_HOME": None, "CLAUDE_CONFIG_DIR": None, "CLINE_DATA_DIR": None,
             "CLINE_DIR": None, "CLINE_PROVIDER_SETTINGS_PATH": None}
    result = CliRunner().invoke(setup, [*args, "--no-telemetry"], env=clean)  # tests/test_telemetry_setup.py's
    return result.exit_code, result.output


def codex_home(home: Path, auth: dict | None = None, config: str | None = None) -> Path:
    directory = home / ".codex"
    directory.mkdir(parents=True, exist_ok=True)
    if auth is not None:
        (directory / "auth.json").write_text(json.dumps(auth, indent=2))
    if config is not None:
        (directory / "config.toml").write_text(config)
    return directory


def test_codex_login_is_read_as_codex_reads_auth_json(tmp_path: Path) -> None:
    def login(auth: object) -> str | None:
        home = tmp_path / str(len(list(tmp_path.iterdir())))
        directory = codex_home(home)
        if auth is not None:
            (directory / "auth.json").write_text(auth if isinstance(auth, str) else json.dumps(auth))
        return codex_login(Locations.from_env({"HOME": str(home)}))

    tokens = CHATGPT_AUTH["tokens"]
    assert login(CHATGPT_AUTH) == "chatgpt"
    assert login({"tokens": tokens, "last_refresh": "2026-11-30T00:00:00Z"}) == "chatgpt"  # older files: no auth_mode
    assert login({"OPENAI_API_KEY": None, "tokens": tokens}) == "chatgpt"
    assert login({"auth_mode": "chatgptAuthTokens", "tokens": tokens}) == "chatgpt"
    assert login({"OPENAI_API_KEY": "sk-proj-1"}) == "api-key"
    assert login({"auth_mode": "apikey", "OPENAI_API_KEY": "sk-proj-1", "tokens": tokens}) == "api-key"
    assert login({"OPENAI_API_KEY": "sk-proj-1", "tokens": tokens}) == "api-key"  # the key wins without auth_mode
    assert login(None) is None and login("not json") is None and login({}) is None


def test_codex_on_a_chatgpt_login_gets_only_the_base_url(tmp_path: Path) -> None:
    codex_home(tmp_path, CHATGPT_AUTH)
    code, out = invoke(tmp_path, "codex", "--base-url", URL)
    assert code == 0, out
    assert out == (
        f"# {tmp_path}/.codex/config.toml\n"
        f'openai_base_url = "{URL}/chatgpt"\n'
        f"# Codex signs in with ChatGPT ({tmp_path}/.codex/auth.json): only the built-in provider's base URL "
        "is set, so it keeps that login (no env_key, no API key)\n"
        "# llmtap needs the route to the ChatGPT backend: llmtap serve --route "
        "/chatgpt=https://chatgpt.com/backend-api/codex\n"
        "# no /v1: Codex appends /responses (HTTP with SSE, or its Responses WebSocket), /models, ...\n"
        "# only openai_base_url is written; the rest of the file is kept byte for byte\n"
        "# write it there with: llmtap setup codex --write\n"
    )


def test_codex_write_on_a_chatgpt_login_never_switches_to_an_api_key(tmp_path: Path) -> None:
    before = ('# my settings\nmodel = "gpt-5-codex"\n\n[features]\nplugins = false\n\n'
              '[projects."/src/app"]\ntrust_level = "trusted"\n')
    directory = codex_home(tmp_path, CHATGPT_AUTH, before)
    auth_bytes = (directory / "auth.json").read_bytes()
    code, out = invoke(tmp_path, "codex", "--base-url", URL, "--write")
    assert code == 0, out
    after = (directory / "config.toml").read_text()
    assert after == ('# my settings\nmodel = "gpt-5-codex"\n'
                     f'openai_base_url = "{URL}/chatgpt"\n\n[features]\nplugins = false\n\n'
                     '[projects."/src/app"]\ntrust_level = "trusted"\n')
    doc = tomllib.loads(after)
    assert "model_provider" not in doc and "model_providers" not in doc and "env_key" not in after
    assert (directory / "auth.json").read_bytes() == auth_bytes
    assert invoke(tmp_path, "codex", "--base-url", URL, "--write")[1].endswith("nothing written\n")

    fresh = tmp_path / "fresh"
    codex_home(fresh, CHATGPT_AUTH)
    assert invoke(fresh, "codex", "--base-url", URL, "--write")[0] == 0
    assert (fresh / ".codex" / "config.toml").read_text() == f'openai_base_url = "{URL}/chatgpt"\n'


def test_codex_setup_says_what_overrides_or_switches_the_login(tmp_path: Path) -> None:
    codex_home(tmp_path, CHATGPT_AUTH, 'model_provider = "llmtap"\n[model_providers.llmtap]\nenv_key = "X"\n')
    code, out = invoke(tmp_path, "codex", "--base-url", URL)
    assert code == 0 and (f'# model_provider = "llmtap" in {tmp_path}/.codex/config.toml wins over the built-in '
                          "provider (and the ChatGPT login): remove that line for these settings to apply") in out
    code, out = invoke(tmp_path, "codex", "--base-url", URL, "--codex-login", "api-key")
    assert code == 0 and f'base_url = "{URL}/v1"' in out
    assert (f"# this switches Codex from its ChatGPT login ({tmp_path}/.codex/auth.json) to the API key in "
            "$OPENAI_API_KEY; without --codex-login api-key, setup keeps the login") in out
    keyring = tmp_path / "keyring"
    codex_home(keyring, None, 'cli_auth_credentials_store = "keyring"\n')
    code, out = invoke(keyring, "codex", "--base-url", URL)
    assert code == 0 and "on a ChatGPT login, run it with --codex-login chatgpt" in out
    code, out = invoke(keyring, "codex", "--base-url", URL, "--codex-login", "chatgpt", "--write")
    assert code == 0, out
    assert tomllib.loads((keyring / ".codex" / "config.toml").read_text()) == {
        "cli_auth_credentials_store": "keyring", "openai_base_url": f"{URL}/chatgpt"}


def test_claude_code_on_a_subscription_login_gets_no_key(tmp_path: Path) -> None:
    claude = tmp_path / ".claude"
    claude.mkdir()
    credentials = json.dumps({"claudeAiOauth": {"accessToken": "sk-ant-oat01-not-real", "refreshToken": "x",
                                                "expiresAt": 1796000000000, "scopes": ["user:inference"],
                                                "subscriptionType": "max"}})
    (claude / ".credentials.json").write_text(credentials)
    (claude / "settings.json").write_text(json.dumps({"env": {"DISABLE_TELEMETRY": "1"}, "model": "opus"}))
    code, out = invoke(tmp_path, "claude-code", "--base-url", URL, "--write")
    assert code == 0, out
    assert json.loads((claude / "settings.json").read_text()) == {
        "env": {"DISABLE_TELEMETRY": "1", "ANTHROPIC_BASE_URL": URL}, "model": "opus"}
    assert (claude / ".credentials.json").read_text() == credentials


# -- the relay, for Codex on a ChatGPT login --------------------------------------------------------------

CODEX_HEADERS = [  # as Codex sends them on a ChatGPT login (shared/reference/real-clis.md), one turn
    ("Authorization", f"Bearer {JWT}"),
    ("chatgpt-account-id", ACCOUNT),
    ("session_id", "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"),
    ("conversation_id", "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"),
    ("originator", "codex_cli_rs"),
    ("version", "0.171.0"),
    ("OpenAI-Beta", "responses=experimental"),
    ("x-codex-turn-metadata", '{"request_kind":"turn","turn_id":"t-1"}'),
    ("User-Agent", "codex_cli_rs/0.171.0 (Debian 12; x86_64) xterm"),
    ("Accept", "text/event-stream"),
    ("Accept-Encoding", "zstd,gzip"),
    ("Content-Type", "application/json"),
]
CODEX_BODY = (b'{"model":"gpt-5-codex","instructions":"You are Codex.","input":[{"type":"message","role":"user",'
              b'"content":[{"type":"input_text","text":"say hi"}]}],"tools":[],"tool_choice":"auto",'
              b'"parallel_tool_calls":false,"reasoning":{"effort":"medium","summary":"auto"},"store":false,'
              b'"stream":true,"include":["reasoning.encrypted_content"],"prompt_cache_key":"0199a1b2"}')
CODEX_SSE = [
    b'event: response.created\ndata: {"type":"response.created","response":{"id":"resp_1","model":"gpt-5-codex",'
    b'"status":"in_progress"}}\n\n',
    b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","item_id":"msg_1",'
    b'"output_index":0,"content_index":0,"delta":"Hi"}\n\n',
    b'event: response.completed\ndata: {"type":"response.completed","response":{"id":"resp_1",'
    b'"model":"gpt-5-codex","status":"completed","usage":{"input_tokens":41,"output_tokens":2,'
    b'"total_tokens":43}}}\n\n',
]


async def test_codex_chatgpt_turn_is_relayed_byte_for_byte_and_its_token_never_stored(tmp_path: Path) -> None:
    script = Script(headers=[("Content-Type", "text/event-stream"), ("x-codex-primary-used-percent", "12")],
                    chunks=CODEX_SSE)
    async with ScriptedUpstream(script) as up:
        config = proxy_config(up.url, tmp_path, routes={"/chatgpt": up.url + "/backend-api/codex"})
        async with RunningProxy(config) as p:
            async with aiohttp.ClientSession(auto_decompress=False) as s:
                # openai_base_url = "<llmtap>/chatgpt": Codex appends /responses
                async with s.post(p.url + "/chatgpt/responses", data=CODEX_BODY, headers=CODEX_HEADERS,
                                  skip_auto_headers=("User-Agent", "Content-Type")) as r:
                    status, answer = r.status, await r.read()
                    used = r.headers.get("x-codex-primary-used-percent")
            recorded = rows(p)
            stored = repr(recorded) + repr(rows(p, "SELECT * FROM chunks"))
    got = up.received[0]
    assert (got.method, got.path_qs) == ("POST", "/backend-api/codex/responses")
    assert [(k, v) for k, v in got.headers if k.lower() not in ("host", "content-length")] == CODEX_HEADERS
    assert got.body == CODEX_BODY
    assert (status, answer, used) == (200, b"".join(CODEX_SSE), "12")
    (row,) = recorded
    assert (row["route"], row["dialect"], row["outcome"], row["input_tokens"], row["output_tokens"]) == (
        "/chatgpt", "openai_responses", "ok", 41, 2)
    assert row["key_fingerprint"] and JWT not in stored and JWT[-20:] not in stored


async def test_codex_chatgpt_websocket_goes_through_the_route(sim: Simulator, tmp_path: Path) -> None:
    config = proxy_config(sim.url, tmp_path, routes={"/chatgpt": sim.url + "/backend-api/codex"})
    create = {"type": "response.create", "model": "gpt-5-codex", "input": [{"type": "message", "role": "user",
                                                                             "content": [{"type": "input_text",
                                                                                          "text": "say hi"}]}]}
    headers = {"Authorization": f"Bearer {JWT}", "chatgpt-account-id": ACCOUNT,
               "OpenAI-Beta": "responses_websockets=2026-02-06", "session_id": "0199a1b2"}
    async with RunningProxy(config) as p:
        async with aiohttp.ClientSession() as s:
            async with s.ws_connect(p.url + "/chatgpt/responses", headers=headers) as ws:
                await ws.send_json(create)
                kinds = []
                while not kinds or kinds[-1] != "response.completed":
                    kinds.append((await ws.receive_json(timeout=10))["type"])
        recorded = rows(p)
        stored = repr(recorded) + repr(rows(p, "SELECT * FROM chunks"))
    method, path, upstream_headers, _body = sim.requests[0]
    assert (method, path) == ("GET", "/backend-api/codex/responses")
    assert {k: upstream_headers[k.lower()] for k in headers} == headers
    assert "response.output_text.delta" in kinds
    (row,) = recorded
    assert (row["route"], row["dialect"], row["outcome"], row["output_tokens"]) == ("/chatgpt", "openai_responses",
                                                                                    "ok", 8)
    assert JWT not in stored


def test_llmtap_run_gives_codex_on_a_chatgpt_login_the_chatgpt_route(tmp_path: Path) -> None:
    codex_home(tmp_path, CHATGPT_AUTH)
    urls = base_urls("http://127.0.0.1:8787", ["/", "/chatgpt"], "t1")
    argv, notes = tool_arguments(["codex", "exec", "hi"], urls, {"HOME": str(tmp_path)})
    assert argv == ["codex", "-c", 'openai_base_url="http://127.0.0.1:8787/_tag/t1/chatgpt"', "exec", "hi"]
