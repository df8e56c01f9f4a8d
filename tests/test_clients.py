import hashlib

import aiohttp.http
import anthropic
import openai
import pytest

from proxy.meter.clients import Client, client_from_headers, client_of, tool_from_headers
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


# --- the agents of #41, with the exact User-Agents they sent (shared/reference/real-clis.md) ---------------

@pytest.mark.parametrize(("headers", "client"), [
    ({"User-Agent": "GeminiCLI-tui/0.61.0/gemini-2.5-pro (linux; x64; terminal)",
      "x-goog-api-client": "google-genai-sdk/1.30.0 gl-node/v20.20.2"},
     Client("gemini-cli", "0.61.0", "tui", "gemini-2.5-pro")),
    ({"User-Agent": "GeminiCLI/0.1.5 (linux; x64)"}, Client("gemini-cli", "0.1.5")),
    # its own token before the AI SDK's (the same UA over its OpenAI-compatible and Anthropic providers)
    ({"User-Agent": "opencode/1.18.33 ai-sdk/provider-utils/4.0.23 runtime/bun/1.3.14",
      "x-session-id": "ses_dba524c95ffeupiIiByDVPCpkB"}, Client("opencode", "1.18.33")),
    ({"User-Agent": "QwenCode/0.24.4 (linux; x64)", "x-stainless-lang": "js"}, Client("qwen-code", "0.24.4")),
    ({"User-Agent": "claude-cli/2.1.197 (external, sdk-cli)"}, Client("claude-code", "2.1.197")),
    ({"user-agent": "codex_exec/0.171.0 (Debian 12.0.0; x86_64) dumb (unknown)", "originator": "codex_exec"},
     Client("codex", "0.171.0")),
    ({"User-Agent": "OpenAI/Python 2.20.0"}, Client("openai-python", "2.20.0")),
    # aider through OpenRouter: litellm sends the title and referer aider sets
    ({"User-Agent": "OpenAI/Python 2.20.0", "X-Title": "Aider", "HTTP-Referer": "https://aider.chat"}, Client("aider")),
])
def test_agents_and_their_versions(headers, client):
    assert client_from_headers(headers) == client


AIDER_SYSTEM = "Act as an expert software developer.\nTake requests for changes to the supplied code."


@pytest.mark.parametrize(("ua", "body", "tool"), [
    ("OpenAI/Python 2.20.0", {"messages": [{"role": "system", "content": AIDER_SYSTEM}]}, "aider"),
    ("python-httpx/0.28.1", {"system": [{"type": "text", "text": AIDER_SYSTEM}]}, "aider"),
    ("OpenAI/Python 2.20.0", {"messages": [{"role": "system", "content": "You are helpful."}]}, "openai-python"),
    ("OpenAI/Python 2.20.0", {"messages": [{"role": "user", "content": AIDER_SYSTEM}]}, "openai-python"),
    # a product that names itself keeps its name whatever its prompt
    ("QwenCode/0.24.4 (linux; x64)", {"messages": [{"role": "system", "content": AIDER_SYSTEM}]}, "qwen-code"),
])
def test_aider_is_known_by_its_system_prompt(ua, body, tool):
    assert client_of({"User-Agent": ua}, body).tool == tool
