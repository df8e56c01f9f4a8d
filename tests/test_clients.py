import hashlib

import aiohttp.http
import anthropic
import openai
import pytest

from proxy.meter.clients import tool_from_headers
from proxy.meter.fingerprint import key_fingerprint


def sdk_user_agent(client) -> str:
    """The User-Agent header the installed SDK really sends."""
    return client.default_headers["User-Agent"]


@pytest.mark.parametrize(("client", "tool"), [
    (openai.OpenAI(api_key="sk-test"), "openai-python"),
    (openai.AsyncOpenAI(api_key="sk-test"), "openai-python"),
    (openai.AzureOpenAI(api_key="k", api_version="2024-10-21", azure_endpoint="http://127.0.0.1"), "openai-python"),
    (anthropic.Anthropic(api_key="sk-test"), "anthropic-python"),
    (anthropic.AsyncAnthropic(api_key="sk-test"), "anthropic-python"),
])
def test_python_sdks(client, tool):
    assert tool_from_headers({"User-Agent": sdk_user_agent(client)}) == tool


@pytest.mark.parametrize(("headers", "tool"), [
    # as seen from the CLIs (real-clis.md)
    ({"User-Agent": "claude-cli/2.1.197 (external, sdk-cli)", "x-app": "cli"}, "claude-code"),
    ({"User-Agent": "Bun/1.3.1"}, "claude-code"),
    ({"user-agent": "codex_exec/0.171.0 (Debian 12.0.0; x86_64) dumb (unknown)", "originator": "codex_exec"}, "codex"),
    ({"user-agent": "codex_cli_rs/0.38.0 (Ubuntu 24.04.2 LTS; x86_64) WindowsTerminal"}, "codex"),
    ({"user-agent": "Mozilla/5.0", "originator": "codex_vscode"}, "codex"),
    ({"User-Agent": "ai-sdk/openai-compatible/1.0.19 ai-sdk/provider-utils/3.0.10 runtime/node.js/v20.19.2"}, "cline"),
    ({"User-Agent": "ai/5.0.30 @ai-sdk/provider/2.0.0 @ai-sdk/provider-utils/3.0.7 node/20.11.1"}, "cline"),
    ({"User-Agent": "Cline/3.0.65"}, "cline"),
    # the JS SDKs (Stainless: `OpenAI/JS ${VERSION}`)
    ({"User-Agent": "OpenAI/JS 5.23.1"}, "openai-node"),
    ({"User-Agent": "Anthropic/JS 0.65.0"}, "anthropic-node"),
    # plain HTTP clients
    ({"User-Agent": "curl/7.88.1"}, "curl"),
    ({"User-Agent": "python-requests/2.32.3"}, "python-requests"),
    ({"User-Agent": aiohttp.http.SERVER_SOFTWARE}, "aiohttp"),
    ({"User-Agent": "python-httpx/0.28.1"}, "httpx"),
    ({"User-Agent": "llmtap-bench/0.1.0"}, "llmtap-bench"),
    # anything else: the first product token
    ({"User-Agent": "Mozilla/5.0 (X11; Linux x86_64)"}, "mozilla"),
    ({"User-Agent": "Go-http-client/1.1"}, "go-http-client"),
    ({"User-Agent": "SomeTool"}, "sometool"),
    ({"x-app": "cli", "User-Agent": "custom"}, "claude-code"),
    ({"x-app": "cli"}, "claude-code"),
    ({"User-Agent": "  "}, None),
    ({}, None),
])
def test_tools(headers, tool):
    assert tool_from_headers(headers) == tool


# --- key fingerprints --------------------------------------------------------------

def test_fingerprint_shape_and_stability():
    fp = key_fingerprint({"Authorization": "Bearer sk-test-123"})
    assert fp == "k:" + hashlib.sha256(b"sk-test-123").hexdigest()[:12]
    assert fp == key_fingerprint({"authorization": "bearer sk-test-123"})
    assert fp == key_fingerprint({"x-api-key": "sk-test-123"})
    assert fp == key_fingerprint({"x-goog-api-key": "sk-test-123"})
    assert fp == key_fingerprint({}, {"key": "sk-test-123"})
    assert fp != key_fingerprint({"x-api-key": "sk-test-124"})
    assert "sk-test" not in fp


def test_fingerprint_precedence():
    both = {"Authorization": "Bearer a", "x-api-key": "b", "x-goog-api-key": "c"}
    assert key_fingerprint(both) == key_fingerprint({"x-api-key": "a"})
    assert key_fingerprint({"x-api-key": "b", "x-goog-api-key": "c"}, {"key": "d"}) == key_fingerprint({"x-api-key": "b"})
    assert key_fingerprint({"Authorization": "Basic dXNlcjpwYXNz"}) == key_fingerprint({"x-api-key": "Basic dXNlcjpwYXNz"})


def test_no_credential():
    assert key_fingerprint({}) is None
    assert key_fingerprint({"Authorization": ""}, {"alt": "sse"}) is None
    assert key_fingerprint({"x-api-key": "  "}, None) is None
