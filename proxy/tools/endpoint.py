"""The base URL each kind of client needs from the running proxy (proxy/common/instances.py finds it).

Anthropic-style clients (Claude Code, the Anthropic SDKs) append `/v1/messages`
themselves, so their base URL has no `/v1`; OpenAI-style clients (the OpenAI
SDKs, Codex) and both of Cline's providers append only `/chat/completions`,
`/responses` or `/messages`, so theirs ends in `/v1`.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass

from proxy.common.instances import TAG_PREFIX


@dataclass(frozen=True)
class BaseUrls:
    anthropic: str  # no /v1: Claude Code, the Anthropic SDKs
    openai: str  # with /v1: the OpenAI SDKs, Codex, Cline (both providers)
    # Codex on a ChatGPT login: a route to https://chatgpt.com/backend-api/codex, a base without /v1
    chatgpt: str = ""
    gemini: str = ""  # no /v1beta: Gemini CLI and the Gemini SDKs append /v1beta/models/...


def _pick(prefixes: list[str], word: str) -> str:
    for prefix in prefixes:
        if word in prefix.lower():
            return prefix.rstrip("/")
    if "/" in prefixes or "" in prefixes or not prefixes:
        return ""
    return prefixes[0].rstrip("/")


def base_urls(proxy_url: str, prefixes: list[str] | None = None, tag: str | None = None) -> BaseUrls:
    """The base URLs for a proxy at `proxy_url` with these route prefixes.

    A route whose prefix names the API (`/anthropic`, `/openai`) is used for
    it, else the default route. With `tag`, the URL starts with /_tag/<tag>,
    which the proxy strips and records as the request's tag.
    """
    prefixes = prefixes or ["/"]
    root = proxy_url.rstrip("/")
    if tag:
        root += TAG_PREFIX + urllib.parse.quote(tag, safe="")
    chatgpt = next((p.rstrip("/") for p in prefixes if "chatgpt" in p.lower()), "/chatgpt")
    return BaseUrls(anthropic=root + _pick(prefixes, "anthropic"), openai=root + _pick(prefixes, "openai") + "/v1",
                    chatgpt=root + chatgpt, gemini=root + _pick(prefixes, "gemini"))


def strip_v1(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url
