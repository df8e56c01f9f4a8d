"""Which tool sent a request, from its User-Agent and the headers CLIs add.

The names are stable labels for grouping (`tool` column). UA shapes, as built:
Claude Code `claude-cli/2.1.197 (external, sdk-cli)` (and `Bun/1.x` for its
startup probes), Codex `codex_exec/0.171.0 (Debian 12.0.0; x86_64) ...` with
`originator: codex_exec`, Cline through the Vercel AI SDK
`ai-sdk/openai-compatible/1.0.0 ai-sdk/provider-utils/3.0.0 runtime/node.js/v20`,
the Stainless SDKs `{ClientClass}/Python {version}` and `OpenAI/JS {version}`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping

from proxy.common.headers import header_getter

# First match wins; patterns are matched against the whole User-Agent.
_UA_RULES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), tool)
    for pattern, tool in (
        (r"^claude-cli/", "claude-code"),
        (r"^bun/", "claude-code"),
        (r"^codex", "codex"),
        (r"ai-sdk/|\bcline\b", "cline"),
        (r"^(async)?(azure)?openai/python\b", "openai-python"),
        (r"^(async)?anthropic\w*/python\b", "anthropic-python"),
        (r"^openai/js\b", "openai-node"),
        (r"^anthropic/js\b", "anthropic-node"),
        (r"^curl/", "curl"),
        (r"^python-requests/", "python-requests"),
        (r"^python/[\d.]+ aiohttp/", "aiohttp"),
        (r"^python-httpx2?/", "httpx"),
        (r"^llmtap-bench/", "llmtap-bench"),
    )
)
_FIRST_TOKEN = re.compile(r"[^\s/;(]+")


def tool_from_headers(headers: Mapping[str, str]) -> str | None:
    get = header_getter(headers)
    return _tool(get("user-agent", ""), get("originator", ""), get("x-app", ""))


@functools.lru_cache(maxsize=1024)  # a machine sees a handful of distinct clients
def _tool(user_agent: str, originator: str, x_app: str) -> str | None:
    ua = user_agent.strip()
    if originator.lower().startswith("codex"):
        return "codex"
    for pattern, tool in _UA_RULES:
        if pattern.search(ua):
            return tool
    if x_app.lower() == "cli":  # Claude Code with a custom UA
        return "claude-code"
    match = _FIRST_TOKEN.match(ua)
    return match.group(0).lower() if match else None
