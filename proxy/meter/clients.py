"""Which tool sent a request, from its User-Agent and the headers CLIs add (and for aider, its prompt).

The names are stable labels for grouping (`tool` column); the version and mode the client states go to
`tool_version` and `tool_mode`. UA shapes, as built:
- Claude Code `claude-cli/2.1.197 (external, sdk-cli)` (and `Bun/1.x` for its startup probes);
- Codex `codex_exec/0.171.0 (Debian 12.0.0; x86_64) ...` with `originator: codex_exec`;
- Gemini CLI `GeminiCLI-tui/0.61.0/gemini-2.5-pro (linux; x64; terminal)`: mode, version, main model;
- opencode `opencode/1.18.33 ai-sdk/provider-utils/4.0.23 runtime/bun/1.3.14` (built on the AI SDK:
  its own token comes first, so it is matched before the SDK's);
- Qwen Code `QwenCode/0.24.4 (linux; x64)`;
- Cline through the Vercel AI SDK `ai-sdk/openai-compatible/1.0.0 ai-sdk/provider-utils/3.0.0 runtime/node.js/v20`;
- the Stainless SDKs `{ClientClass}/Python {version}` and `OpenAI/JS {version}`.

aider talks through litellm and the OpenAI SDK (`OpenAI/Python 2.20.0`) and adds no header of its own
except for OpenRouter (`X-Title: Aider`, `HTTP-Referer: https://aider.chat`): what marks it otherwise is
its system prompt, which opens with `Act as an expert ` (every edit format's, aider/coders/*_prompts.py).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from proxy.common.headers import header_getter

_VERSION = r"(?P<version>\d[\w.+-]*)"
# First match wins; patterns are matched against the whole User-Agent.
_UA_RULES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), tool)
    for pattern, tool in (
        (rf"^claude-cli/{_VERSION}?", "claude-code"),
        (r"^bun/", "claude-code"),
        (rf"^codex(?:\w*/{_VERSION})?", "codex"),
        (rf"^GeminiCLI(?:-(?P<mode>[\w-]+))?/{_VERSION}(?:/(?P<model>[^\s(]+))?", "gemini-cli"),
        (rf"^opencode/{_VERSION}", "opencode"),
        (rf"^QwenCode/{_VERSION}", "qwen-code"),
        (r"ai-sdk/|\bcline\b", "cline"),
        (rf"^(async)?(azure)?openai/python {_VERSION}?", "openai-python"),
        (rf"^(async)?anthropic\w*/python {_VERSION}?", "anthropic-python"),
        (rf"^openai/js {_VERSION}?", "openai-node"),
        (rf"^anthropic/js {_VERSION}?", "anthropic-node"),
        (rf"^curl/{_VERSION}?", "curl"),
        (r"^python-requests/", "python-requests"),
        (r"^python/[\d.]+ aiohttp/", "aiohttp"),
        (r"^python-httpx2?/", "httpx"),
        (r"^llmtap-bench/", "llmtap-bench"),
    )
)
_FIRST_TOKEN = re.compile(r"[^\s/;(]+")
# what aider runs on, when it says nothing itself (litellm's own httpx for some providers)
_AIDER_CARRIERS = frozenset({"openai-python", "anthropic-python", "httpx", "litellm", None})
_AIDER_PROMPT = "Act as an expert "


class Client(NamedTuple):
    tool: str | None
    version: str | None = None
    mode: str | None = None  # Gemini CLI's `tui`, `a2a-server`, ...
    model: str | None = None  # the main model Gemini CLI's UA names (a side request may use another)


def tool_from_headers(headers: Mapping[str, str]) -> str | None:
    return client_from_headers(headers).tool


def client_from_headers(headers: Mapping[str, str]) -> Client:
    get = header_getter(headers)
    if get("x-title", "") == "Aider" or get("http-referer", "").startswith("https://aider.chat"):
        return Client("aider")  # litellm's OpenRouter headers, which aider sets
    return _client(get("user-agent", ""), get("originator", ""), get("x-app", ""))


def client_of(headers: Mapping[str, str], body: Any) -> Client:
    """The client from its headers, and aider from its system prompt (parsed `body`) when they say no more
    than the SDK it runs on."""
    client = client_from_headers(headers)
    if client.tool in _AIDER_CARRIERS and _first_system_text(body).startswith(_AIDER_PROMPT):
        return Client("aider")
    return client


def _first_system_text(body: Any) -> str:
    if not isinstance(body, dict):
        return ""
    system = body.get("system")  # Anthropic
    if isinstance(system, list) and system and isinstance(system[0], dict):
        system = system[0].get("text")
    if isinstance(system, str):
        return system
    messages = body.get("messages")
    first = messages[0] if isinstance(messages, list) and messages else None
    if isinstance(first, dict) and first.get("role") == "system" and isinstance(first.get("content"), str):
        return first["content"]
    return ""


@functools.lru_cache(maxsize=1024)  # a machine sees a handful of distinct clients
def _client(user_agent: str, originator: str, x_app: str) -> Client:
    ua = user_agent.strip()
    for pattern, tool in _UA_RULES:
        match = pattern.search(ua)
        if match:
            found = match.groupdict()
            mode, model = found.get("mode"), found.get("model")
            client = Client(tool, found.get("version"), mode.lower() if mode else None, model)
            break
    else:
        client = Client(None)
    if originator.lower().startswith("codex") and client.tool != "codex":
        return Client("codex")
    if client.tool is not None:
        return client
    if x_app.lower() == "cli":  # Claude Code with a custom UA
        return Client("claude-code")
    match = _FIRST_TOKEN.match(ua)
    return Client(match.group(0).lower() if match else None)
