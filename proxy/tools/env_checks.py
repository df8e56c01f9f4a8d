"""Doctor checks on the shell's environment: HTTP proxies, API keys, base URLs.

Keys are never printed: only their length and the fingerprint the proxy
records in `key_fingerprint`, so a row can be matched to a variable.
"""

from __future__ import annotations

import socket
import tomllib
import urllib.parse

from proxy.meter.fingerprint import key_fingerprint
from proxy.tools import agent_setup, reach
from proxy.tools.agent_setup import Locations
from proxy.tools.check import Check, fail, ok, warn
from proxy.common.instances import LiveProxy

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
# variable -> (expected prefixes, what carries that prefix); None: any shape is fine
KEY_VARIABLES: dict[str, tuple[tuple[str, ...], str] | None] = {
    "OPENAI_API_KEY": (("sk-",), "an OpenAI API key"),
    "ANTHROPIC_API_KEY": (("sk-ant-",), "an Anthropic API key"),
    "ANTHROPIC_AUTH_TOKEN": None,
    "CLAUDE_CODE_OAUTH_TOKEN": (("sk-ant-oat",), "a Claude subscription token"),
    "GEMINI_API_KEY": (("AIza",), "a Gemini API key"),
    "GOOGLE_API_KEY": (("AIza",), "a Google API key"),
    "OPENROUTER_API_KEY": (("sk-or-",), "an OpenRouter key"),
    "AZURE_OPENAI_API_KEY": None,
}
# variable -> whether its base URL must end in /v1
BASE_URL_VARIABLES = {"ANTHROPIC_BASE_URL": False, "OPENAI_BASE_URL": True, "OPENAI_API_BASE": True,
                      "GOOGLE_GEMINI_BASE_URL": False, "AIDER_OPENAI_API_BASE": True}


def _redact(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.username or parts.password:
        host = parts.hostname or ""
        netloc = f"***@{host}" + (f":{parts.port}" if parts.port else "")
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    return url


def _host_port(url: str, default_port: int) -> tuple[str | None, int | None]:
    parts = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
    try:
        return parts.hostname, parts.port or default_port
    except ValueError:
        return parts.hostname, None


def proxy_variables(env: dict[str, str], live: LiveProxy | None) -> list[Check]:
    found = [(name, env[name]) for base in PROXY_VARIABLES for name in (base, base.lower()) if env.get(name)]
    if not found:
        return [ok("HTTP proxy variables", "none set")]
    checks = []
    for name, value in found:
        shown = f"{name}={_redact(value)}"
        host, port = _host_port(value.strip(), 1080 if value.lower().startswith("socks") else 80)
        if host is None or port is None:
            checks.append(fail(shown, "not a URL a client can use", f"unset {name}, or give it as http://HOST:PORT"))
        elif not reach.is_loopback(host):
            checks.append(ok(shown, "a remote proxy (not checked)"))
        elif live is not None and _same_port(live.url, port):
            checks.append(fail(shown, "points at llmtap, which is a reverse proxy, not an HTTP proxy: "
                               "requests sent through it fail", f"unset {name}; point each tool at llmtap with its base URL "
                               "(llmtap setup TOOL)"))
        elif not reach.listening(host, port):
            checks.append(fail(shown, f"nothing listens on {host}:{port}, so every request through it fails",
                               f"unset {name} (and {_twin(name)}), or start the proxy it names"))
        else:
            checks.append(ok(shown, f"a local proxy listens on {host}:{port}"))
    checks.extend(_no_proxy(env, [n for n, _ in found]))
    return checks


def _twin(name: str) -> str:
    return name.lower() if name.isupper() else name.upper()


def _same_port(url: str, port: int) -> bool:
    return urllib.parse.urlsplit(url).port == port


def _no_proxy(env: dict[str, str], names: list[str]) -> list[Check]:
    if not any(n.upper() in ("HTTP_PROXY", "ALL_PROXY") for n in names):
        return []  # the proxy's own URL is plain http: only these apply to it
    bypass = ",".join(env.get(n, "") for n in ("NO_PROXY", "no_proxy")).replace(" ", "").split(",")
    if {"127.0.0.1", "localhost"} <= set(bypass) or "*" in bypass:
        return [ok("NO_PROXY", "covers 127.0.0.1 and localhost")]
    return [warn("NO_PROXY", "does not cover 127.0.0.1 and localhost: some clients would send their requests "
                 "for http://127.0.0.1:8787 to the HTTP proxy", "export NO_PROXY=127.0.0.1,localhost,::1")]


def api_keys(env: dict[str, str]) -> list[Check]:
    present = [name for name in KEY_VARIABLES if name in env]
    if not present:
        return [ok("API keys", "no key variables set (the tools may use their own login)")]
    checks = [_key(name, env[name]) for name in present]
    if env.get("ANTHROPIC_API_KEY") and env.get("ANTHROPIC_AUTH_TOKEN"):
        checks.append(warn("ANTHROPIC_API_KEY and ANTHROPIC_AUTH_TOKEN", "both set: Claude Code sends both "
                           "(x-api-key and Authorization) and warns of an auth conflict",
                           "unset the one you do not use"))
    return checks


def _key(name: str, value: str) -> Check:
    stripped = value.strip()
    fp = key_fingerprint({"x-api-key": value}) or "-"
    subject = f"{name} ({len(value)} chars, {fp})"
    clean = f'export {name}="$(printf %s "${name}" | tr -d \'[:space:]\')"'
    if not stripped:
        return warn(subject, "set but empty: clients send an empty key", f"unset {name}, or set the key")
    if value != stripped:
        where = "a trailing newline" if value.endswith(("\n", "\r")) else "leading or trailing whitespace"
        return fail(subject, f"has {where}: the header the client sends is invalid, or the key is wrong", clean)
    if any(c.isspace() for c in stripped):
        return fail(subject, "has a space or line break inside: two keys pasted together?", f"set {name} to one key")
    if stripped[0] in "\"'" or stripped[-1] in "\"'":
        return fail(subject, "has quote characters: the quotes became part of the key",
                    f"set it without the quotes: export {name}=sk-...")
    if not stripped.isascii() or not stripped.isprintable():
        return fail(subject, "has non-ASCII or control characters: a copy-paste artefact?", f"set {name} again")
    return _prefix(name, stripped, subject)


def _prefix(name: str, key: str, subject: str) -> Check:
    if name == "OPENAI_API_KEY" and key.startswith("sk-ant-"):
        return fail(subject, "holds an Anthropic key", "put it in ANTHROPIC_API_KEY and set the OpenAI key here")
    if name == "ANTHROPIC_API_KEY" and key.startswith("sk-ant-oat"):
        return warn(subject, "holds a subscription OAuth token, not an API key",
                    "move it to CLAUDE_CODE_OAUTH_TOKEN (or ANTHROPIC_AUTH_TOKEN)")
    if name == "ANTHROPIC_API_KEY" and key.startswith("sk-") and not key.startswith("sk-ant-"):
        return fail(subject, "looks like an OpenAI key (sk- without ant-)", "set ANTHROPIC_API_KEY to an Anthropic key")
    rule = KEY_VARIABLES[name]
    if rule is not None and not key.startswith(rule[0]):
        return warn(subject, f"does not start with {' or '.join(rule[0])} as {rule[1]} does",
                    "fine for a gateway's own key; otherwise check which key this is")
    return ok(subject, "well formed")


def base_urls(env: dict[str, str], live: LiveProxy | None) -> list[Check]:
    """The base-URL variables, and the settings files that win over them."""
    sources: list[tuple[str, str, bool]] = [(name, env[name], v1) for name, v1 in BASE_URL_VARIABLES.items()
                                            if name in env]
    sources += _tool_files(env)
    if not sources:
        return [ok("base URLs", "no base-URL variables set: tools talk to their vendor directly "
                   "(llmtap setup TOOL, or llmtap run -- COMMAND)")]
    return [_base_url(label, value, v1, live) for label, value, v1 in sources]


def _tool_files(env: dict[str, str]) -> list[tuple[str, str, bool]]:
    """Claude Code's settings.json env (it wins over the variable) and Codex's provider base_url."""
    where = Locations.from_env(env)
    found = agent_setup.configured_base_urls(where, ["claude-code"])
    try:
        doc = tomllib.loads(where.codex_config.read_text())
        provider = doc.get("model_provider")
        table = doc.get("model_providers", {}).get(provider) if provider else None
        if isinstance(table, dict) and isinstance(table.get("base_url"), str):
            found.append((f"{where.codex_config} [model_providers.{provider}] base_url", table["base_url"], True))
        if isinstance(doc.get("openai_base_url"), str):
            found.append((f"{where.codex_config} openai_base_url", doc["openai_base_url"], True))
    except (OSError, ValueError, AttributeError):
        pass
    return found + agent_setup.configured_base_urls(where, ["gemini-cli", "opencode", "qwen-code", "aider"])


def _base_url(label: str, value: str, wants_v1: bool, live: LiveProxy | None) -> Check:
    subject = f"{label}={value.strip()}"
    if value != value.strip():
        return fail(subject, "has whitespace around it", "set it again without spaces or a newline")
    parts = urllib.parse.urlsplit(value.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return fail(subject, "is not an http:// or https:// URL", "set it to the proxy's URL, e.g. http://127.0.0.1:8787")
    path = parts.path.rstrip("/")
    root = urllib.parse.urlunsplit(parts._replace(path="", query="", fragment=""))
    if path.endswith(("/chat/completions", "/responses", "/messages")):
        return fail(subject, "is a full endpoint, not a base URL: the client appends the endpoint itself",
                    f"set it to {root}{'/v1' if wants_v1 else ''}")
    if path.endswith("/v1beta"):
        return fail(subject, "ends in /v1beta, but Gemini CLI's SDK appends /v1beta/models/…: requests go to "
                    "…/v1beta/v1beta/… and get 404", f"set it to {value.strip().rstrip('/')[:-7]}")
    if not wants_v1 and path.endswith("/v1"):
        return fail(subject, "ends in /v1, but Claude Code and the Anthropic SDK append /v1/messages: "
                    "requests go to …/v1/v1/messages and get 404", f"set it to {value.strip().rstrip('/')[:-3]}")
    if wants_v1 and path.endswith("/v1/v1"):
        return fail(subject, "ends in /v1/v1", f"set it to {value.strip().rstrip('/')[:-3]}")
    if wants_v1 and not path:
        return fail(subject, "lacks /v1: OpenAI-style clients append only chat/completions or responses, "
                    "so requests go to /chat/completions instead of /v1/chat/completions",
                    f"set it to {value.strip().rstrip('/')}/v1")
    if wants_v1 and not path.endswith("/v1"):
        return warn(subject, "does not end in /v1", "fine if this API's base path is different; "
                    "through llmtap it is usually http://127.0.0.1:8787/v1")
    return _target(subject, parts, live)


def _localhost_gaps(host: str, port: int) -> list[str]:
    """The addresses `localhost` resolves to where nothing listens on `port`, when another does."""
    if host.lower() != "localhost":
        return []
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return []
    addresses = list(dict.fromkeys(str(info[4][0]) for info in found))
    gaps = [a for a in addresses if not reach.listening(a, port)]
    return gaps if len(gaps) < len(addresses) else []


def _target(subject: str, parts: urllib.parse.SplitResult, live: LiveProxy | None) -> Check:
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if not reach.is_loopback(host):
        return warn(subject, f"goes to {host} directly, not through llmtap: these requests are not measured",
                    "point it at llmtap (llmtap setup TOOL prints the value)")
    if gaps := _localhost_gaps(host, port):
        return warn(subject, f"localhost resolves to {', '.join(gaps)} too, where nothing listens on port {port}: "
                    "clients that try one address only (Node with family autoselection off, curl -6) fail",
                    f"use http://127.0.0.1:{port} in the base URL, or listen there too (llmtap serve listens on "
                    "127.0.0.1 and ::1 by default)")
    if live is not None and _same_port(live.url, port):
        return ok(subject, "goes through the running llmtap serve")
    if not reach.listening(host, port):
        return fail(subject, f"nothing listens on {host}:{port}",
                    "start the proxy (llmtap serve), or run the tool with llmtap run -- COMMAND")
    return ok(subject, f"something listens on {host}:{port}")
