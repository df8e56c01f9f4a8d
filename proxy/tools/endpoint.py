"""The running proxy, and the base URL each kind of client needs from it.

Anthropic-style clients (Claude Code, the Anthropic SDKs) append `/v1/messages`
themselves, so their base URL has no `/v1`; OpenAI-style clients (the OpenAI
SDKs, Codex) and both of Cline's providers append only `/chat/completions`,
`/responses` or `/messages`, so theirs ends in `/v1`.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from proxy import paths

DEFAULT_URL = "http://127.0.0.1:8787"
TAG_PREFIX = "/_tag/"
HEALTH_PATH = "/_llmtap/health"
TOKEN_HEADER = "X-Llmtap-Admin-Token"


@dataclass(frozen=True)
class LiveProxy:
    """A `llmtap serve` that answered its health check."""

    url: str  # http://host:port, no trailing slash
    pid: int | None
    db: str | None
    admin_token: str | None
    health: dict[str, Any] = field(default_factory=dict)

    @property
    def prefixes(self) -> list[str]:
        """Route prefixes ("/" for the default route); ["/"] when the proxy does not say."""
        routes = self.health.get("routes")
        if isinstance(routes, list) and routes:
            return [str(r.get("prefix", "/")) for r in routes if isinstance(r, dict)]
        return ["/"]

    @property
    def url_tags(self) -> bool:
        """Whether the proxy strips a leading /_tag/<tag> and records it as the tag."""
        return self.health.get("url_tags") is True


def connect_host(host: str | None) -> str:
    """The address to reach a server listening on `host` (wildcards mean this machine)."""
    if not host or host == "0.0.0.0":
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def read_state() -> dict[str, Any] | None:
    """serve.json of a running (or crashed) `llmtap serve`, if readable."""
    try:
        data = json.loads(paths.state_path().read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def health(url: str, token: str | None = None, timeout: float = 2.0) -> dict[str, Any] | None:
    """GET /_llmtap/health; None when nothing (or not llmtap) answers."""
    request = urllib.request.Request(url + HEALTH_PATH, headers={TOKEN_HEADER: token} if token else {})
    try:
        with _no_proxy_opener().open(request, timeout=timeout) as response:
            data = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("ok") is True else None


def _no_proxy_opener() -> urllib.request.OpenerDirector:
    """Loopback checks must not go through HTTP_PROXY."""
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))


def find_running(timeout: float = 2.0) -> LiveProxy | None:
    """The `llmtap serve` named by the state file, if it answers its health check."""
    state = read_state()
    if not state or not state.get("port"):
        return None
    url = f"http://{connect_host(state.get('host'))}:{state['port']}"
    answer = health(url, state.get("admin_token"), timeout)
    if answer is None:
        return None
    pid = state.get("pid")
    return LiveProxy(url=url, pid=pid if isinstance(pid, int) else None, db=state.get("db"),
                     admin_token=state.get("admin_token"), health=answer)


def default_proxy_url() -> str:
    """The running proxy's URL, else llmtap's default address."""
    live = find_running()
    return live.url if live else DEFAULT_URL


@dataclass(frozen=True)
class BaseUrls:
    anthropic: str  # no /v1: Claude Code, the Anthropic SDKs
    openai: str  # with /v1: the OpenAI SDKs, Codex, Cline (both providers)


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
    return BaseUrls(anthropic=root + _pick(prefixes, "anthropic"), openai=root + _pick(prefixes, "openai") + "/v1")


def strip_v1(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url
