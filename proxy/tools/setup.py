"""The configuration each tool needs to go through llmtap: printed, or merged into its own file.

| tool          | where                                     | base URL ends in /v1 |
|---------------|-------------------------------------------|----------------------|
| codex         | ~/.codex/config.toml model provider       | yes                  |
| codex (ChatGPT login) | ~/.codex/config.toml `openai_base_url` | no (a /chatgpt route) |
| cline         | <data-dir>/settings/providers.json        | yes (both providers) |
| openai-sdk    | OPENAI_BASE_URL                           | yes                  |
| anthropic-sdk | ANTHROPIC_BASE_URL                        | no                   |
| claude-code, gemini-cli, opencode, qwen-code, aider | proxy/tools/agent_setup.py (a table) |  |

Subscription logins stay as they are: Claude Code gets only its base URL (a key
variable would replace a Claude login), and Codex on a ChatGPT login gets only
the built-in provider's base URL (an `env_key` provider would switch it to
API-key auth).

Where the proxy injects the upstream key (`--route-key-env`), each tool gets
llmtap's client key as its API key (proxy/settings/client_key.py): the proxy asks for it
before it spends the real key.
"""

from __future__ import annotations

import copy
import json
import tomllib
import urllib.parse
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from proxy.tools import agent_setup, config_files, toml_edit
from proxy.tools.agent_setup import Locations
from proxy.tools.endpoint import BaseUrls

TOOLS = ("claude-code", "codex", "cline", "gemini-cli", "opencode", "qwen-code", "aider", "openai-sdk", "anthropic-sdk")
CODEX_PROVIDER = "llmtap"
# Where Codex sends a ChatGPT login's requests (codex-rs/model-provider-info: the built-in `openai`
# provider's default base URL when auth is ChatGPT); `openai_base_url` in config.toml overrides it.
CHATGPT_BACKEND = "https://chatgpt.com/backend-api/codex"
CODEX_LOGINS = ("chatgpt", "api-key")
SDKS = {  # the variables' prefix, and the notes
    "openai-sdk": ("OPENAI", ("with /v1: the SDK appends chat/completions and responses to it",
                              "LangChain, LiteLLM and older code read OPENAI_API_BASE instead: set it to the same value")),
    "anthropic-sdk": ("ANTHROPIC", ("no /v1: the SDK appends /v1/messages",)),
}
CLINE_PROVIDERS = ("anthropic", "openai-compatible", "openai-native")
CLINE_AUTH_HINTS = {
    "anthropic": "cline auth -p anthropic -k \"$ANTHROPIC_API_KEY\" -m claude-sonnet-4-5",
    "openai-compatible": "cline auth -p openai-compatible -k \"$OPENAI_API_KEY\" -m gpt-4.1",
    "openai-native": "cline auth -p openai-native -k \"$OPENAI_API_KEY\" -m gpt-5",
}


class SetupError(ValueError):
    """Setup cannot proceed; the message says why and what to do."""


@dataclass(frozen=True)
class Plan:
    """What one tool needs: the text to print, and the file `--write` merges it into."""

    tool: str
    text: str
    file: Path | None = None
    notes: list[str] = field(default_factory=list)
    edits: list[agent_setup.FileEdit] = field(default_factory=list)  # the table's targets: one per file


def codex_login(where: Locations) -> str | None:
    """How Codex signs in, read from $CODEX_HOME/auth.json as Codex reads it: "chatgpt", "api-key", or
    None (no file: not logged in, or the login is in the OS keyring).

    The file (codex-rs/login/src/auth/storage.rs, `AuthDotJson`): `auth_mode` ("chatgpt", "apikey",
    "chatgptAuthTokens", ...), `OPENAI_API_KEY`, `tokens` {id_token, access_token, refresh_token,
    account_id}, `last_refresh`. Without `auth_mode`, an `OPENAI_API_KEY` means API-key auth and
    anything else ChatGPT (`AuthDotJson::resolved_mode`, login/src/auth/manager.rs).
    """
    try:
        data = json.loads(where.codex_auth.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    mode = data.get("auth_mode")
    if isinstance(mode, str):
        if mode == "apikey":
            return "api-key"
        return "chatgpt" if mode.startswith("chatgpt") or mode == "agentIdentity" else None  # the Codex backend
    if data.get("OPENAI_API_KEY") is not None:
        return "api-key"
    return "chatgpt" if isinstance(data.get("tokens"), dict) else None


def _codex_toml(where: Locations) -> dict[str, Any]:
    try:
        return tomllib.loads(where.codex_config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


INJECTED = "llmtap's client key: the proxy puts the real upstream key in its place (--route-key-env)"


def plan(tool: str, urls: BaseUrls, where: Locations, codex_env_key: str = "OPENAI_API_KEY",
         login: str | None = None, client_key: str | None = None) -> Plan:
    """`login` is Codex's ("chatgpt" or "api-key"); None: read from its auth.json. `client_key`:
    the proxy injects the upstream key, so the tool presents llmtap's client key."""
    if tool in agent_setup.TARGETS:
        target, edits = agent_setup.TARGETS[tool], agent_setup.edits(tool, urls, where, client_key)
        text = "".join(f"# {e.path}\n{agent_setup.printed(e)}" for e in edits)
        keys = [f"{target.key_set} is {INJECTED}"] if client_key else target.keyless
        return Plan(tool, text, None, [*target.notes, *keys], edits)
    if tool == "codex":
        detected = codex_login(where)
        if (login or detected) == "chatgpt":
            return _codex_chatgpt_plan(urls, where)
        key = f"experimental_bearer_token is {INJECTED}" if client_key else f"the key comes from ${codex_env_key}"
        notes = [f"base_url ends in /v1 (Codex appends /responses); {key}",
                 "only model_provider and this table are written; the rest of the file is kept byte for byte"]
        if detected == "chatgpt":
            notes.append(f"this switches Codex from its ChatGPT login ({where.codex_auth}) to the API key in "
                         f"${codex_env_key}; without --codex-login api-key, setup keeps the login")
        elif detected is None and _codex_toml(where).get("cli_auth_credentials_store") in ("keyring", "auto"):
            notes.append("Codex keeps its login in the OS keyring here, so setup cannot tell how it signs in: "
                         "on a ChatGPT login, run it with --codex-login chatgpt")
        return Plan(tool, codex_snippet(urls, codex_env_key, client_key), where.codex_config, notes)
    if tool == "cline":
        text = config_files.json_text({"providers": {p: {"settings": cline_settings(p, urls, client_key)}
                                                     for p in CLINE_PROVIDERS}})
        keys = ([f"apiKey is {INJECTED}"] if client_key else
                ["set each provider's key and model with `cline auth` (it keeps the base URL), e.g.:",
                 *(f"  {CLINE_AUTH_HINTS[p]}" for p in CLINE_PROVIDERS)])
        return Plan(tool, text, where.cline_providers, [
            "merged into \"providers\"; both base URLs end in /v1 (Cline appends /messages, /chat/completions, /responses)",
            *keys,
        ])
    if tool in SDKS:
        name, about = SDKS[tool]
        url = urls.openai if name == "OPENAI" else urls.anthropic
        key = f"export {name}_API_KEY={client_key}\n" if client_key else ""
        return Plan(tool, f"export {name}_BASE_URL={url}\n{key}", None,
                    [*about, *([f"{name}_API_KEY is {INJECTED}"] if client_key else [])])
    raise SetupError(f"unknown tool {tool!r}; one of: {', '.join(TOOLS)}")


def _codex_chatgpt_plan(urls: BaseUrls, where: Locations) -> Plan:
    prefix = urllib.parse.urlsplit(urls.chatgpt).path
    notes = [
        f"Codex signs in with ChatGPT ({where.codex_auth}): only the built-in provider's base URL is set, "
        "so it keeps that login (no env_key, no API key)",
        f"llmtap needs the route to the ChatGPT backend: llmtap serve --route {prefix}={CHATGPT_BACKEND}",
        "no /v1: Codex appends /responses (HTTP with SSE, or its Responses WebSocket), /models, ...",
        "only openai_base_url is written; the rest of the file is kept byte for byte",
    ]
    provider = _codex_toml(where).get("model_provider")
    if isinstance(provider, str) and provider != "openai":
        notes.append(f"model_provider = \"{provider}\" in {where.codex_config} wins over the built-in provider "
                     "(and the ChatGPT login): remove that line for these settings to apply")
    return Plan("codex", f"openai_base_url = {toml_edit.toml_string(urls.chatgpt)}\n", where.codex_config, notes)


def codex_provider(urls: BaseUrls, env_key: str, client_key: str | None = None) -> dict[str, str]:
    """Codex's provider table; with a client key, the key itself (`experimental_bearer_token`,
    codex-rs ModelProviderInfo) instead of a variable to read it from."""
    key = {"experimental_bearer_token": client_key} if client_key else {"env_key": env_key}
    return {"name": "llmtap", "base_url": urls.openai, **key, "wire_api": "responses"}


def codex_snippet(urls: BaseUrls, env_key: str, client_key: str | None = None) -> str:
    lines = [f"model_provider = {toml_edit.toml_string(CODEX_PROVIDER)}", "",
             f"[model_providers.{CODEX_PROVIDER}]"]
    lines += [f"{k} = {toml_edit.toml_string(v)}" for k, v in codex_provider(urls, env_key, client_key).items()]
    return "\n".join(lines) + "\n"


def cline_settings(provider: str, urls: BaseUrls, client_key: str | None = None) -> dict[str, str]:
    return {"provider": provider, "baseUrl": urls.openai, **({"apiKey": client_key} if client_key else {})}


def cline_merge(data: dict[str, Any], urls: BaseUrls, now: datetime, client_key: str | None = None) -> dict[str, Any]:
    """Each provider entry gets its base URL; keys, models and other entries are kept.

    Cline ignores the whole file when an entry lacks `updatedAt`, so a changed
    entry gets a fresh one.
    """
    merged = copy.deepcopy(data)
    merged.setdefault("version", 1)
    providers = merged.setdefault("providers", {})
    if not isinstance(providers, dict):
        raise SetupError('"providers" in Cline\'s providers.json is not an object; fix it, then run again')
    stamp = now.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"
    for provider in CLINE_PROVIDERS:
        entry = providers.get(provider)
        if not isinstance(entry, dict):
            entry = providers[provider] = {}
        settings = entry.get("settings")
        if not isinstance(settings, dict):
            settings = entry["settings"] = {}
        wanted = cline_settings(provider, urls, client_key)
        if all(settings.get(k) == v for k, v in wanted.items()) and "updatedAt" in entry:
            continue
        settings.update(wanted)
        entry["updatedAt"] = stamp
        entry.setdefault("tokenSource", "manual")
    return merged


def write(tool: str, urls: BaseUrls, where: Locations, codex_env_key: str = "OPENAI_API_KEY",
          now: datetime | None = None, login: str | None = None, client_key: str | None = None
          ) -> list[config_files.WriteResult]:
    """Merge the tool's configuration into its files (backup first; no change, no write). With
    `client_key`, the file holds a secret: it ends owner-only, and so do its backups."""
    now = now or datetime.now(timezone.utc)
    secret = bool(client_key)
    the_plan = plan(tool, urls, where, codex_env_key, login, client_key)
    if the_plan.edits:
        return [agent_setup.write(edit, now, secret and client_key in edit.set.values()) for edit in the_plan.edits]
    path = the_plan.file
    if path is None:
        raise SetupError(f"{tool} has no config file: it reads the environment variable above; "
                         "put the export line in your shell profile")
    if tool == "codex":
        old = config_files.read_text(path)
        try:
            if (login or codex_login(where)) == "chatgpt":
                new = toml_edit.set_keys(old or "", {"openai_base_url": urls.chatgpt})
            else:
                new = toml_edit.set_keys(old or "", {"model_provider": CODEX_PROVIDER},
                                         ("model_providers", CODEX_PROVIDER),
                                         codex_provider(urls, codex_env_key, client_key))
        except tomllib.TOMLDecodeError as exc:
            raise SetupError(f"{path} is not valid TOML ({exc}); fix it, then run again") from None
        except toml_edit.TomlEditError as exc:
            raise SetupError(f"{path}: {exc}") from None
        return [config_files.replace(path, old, new, now, secret)]
    old_text = config_files.read_text(path)
    data = config_files.read_json_object(path)
    merged = cline_merge(data or {}, urls, now, client_key)
    if data is not None and merged == data:
        return [config_files.WriteResult(path, False, None, config_files.make_private(path) if secret else [])]
    return [config_files.replace(path, old_text, config_files.json_text(merged), now, secret)]
