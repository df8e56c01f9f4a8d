"""Where each tool keeps its config (`Locations`), and `llmtap setup` for the tools whose settings are keys to
set: each target is data, a list of file edits (Codex and Cline: proxy/tools/setup.py).

| tool       | where                                               | base URL                        |
|------------|-----------------------------------------------------|---------------------------------|
| claude-code | ~/.claude/settings.json `env.ANTHROPIC_BASE_URL`   | no /v1 (it appends /v1/messages) |
| gemini-cli | ~/.gemini/.env `GOOGLE_GEMINI_BASE_URL`; settings.json `security.auth.selectedType` | no /v1beta (its SDK appends it) |
| opencode   | ~/.config/opencode/opencode.json `provider.{anthropic,openai}.options.baseURL` | with /v1 |
| qwen-code  | ~/.qwen/.env `OPENAI_BASE_URL`; settings.json `security.auth.selectedType` | with /v1 |
| aider      | ~/.aider.conf.yml `openai-api-base`                 | with /v1                        |

Logins are kept: Claude Code gets no key variable (one would replace a Claude login), `selectedType` is
set only where none is (a Google or Qwen login stays, and says so in a note: it does not use these base
URLs), opencode's keys stay in its auth.json. A key is written only when the proxy injects the upstream
key (llmtap's client key): then the file ends owner-only.
"""

from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from proxy.tools import config_files
from proxy.tools.endpoint import BaseUrls


@dataclass(frozen=True)
class Locations:
    """Where each tool keeps its config; the defaults follow each tool's own rules."""

    claude_settings: Path
    codex_config: Path
    cline_providers: Path
    home: Path = Path.home()
    config_home: Path = Path.home() / ".config"  # $XDG_CONFIG_HOME (opencode)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, codex_home: Path | None = None,
                 cline_data_dir: Path | None = None) -> "Locations":
        env = dict(os.environ) if env is None else env
        home = Path(env.get("HOME") or Path.home())
        claude_dir = Path(env["CLAUDE_CONFIG_DIR"]) if env.get("CLAUDE_CONFIG_DIR") else home / ".claude"
        codex_dir = codex_home or (Path(env["CODEX_HOME"]) if env.get("CODEX_HOME") else home / ".codex")
        return cls(claude_settings=claude_dir / "settings.json", codex_config=codex_dir / "config.toml",
                   cline_providers=_cline_providers(env, home, cline_data_dir), home=home,
                   config_home=Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else home / ".config")

    @property
    def codex_auth(self) -> Path:
        return self.codex_config.parent / "auth.json"

    @property
    def gemini_settings(self) -> Path:
        return self.home / ".gemini" / "settings.json"


def _cline_providers(env: dict[str, str], home: Path, data_dir: Path | None) -> Path:
    """Cline 3.x: --data-dir, else $CLINE_PROVIDER_SETTINGS_PATH, $CLINE_DATA_DIR, $CLINE_DIR/data, ~/.cline/data."""
    if data_dir is not None:
        return data_dir / "settings" / "providers.json"
    if env.get("CLINE_PROVIDER_SETTINGS_PATH", "").strip():
        return Path(env["CLINE_PROVIDER_SETTINGS_PATH"].strip())
    if env.get("CLINE_DATA_DIR", "").strip():
        return Path(env["CLINE_DATA_DIR"].strip()) / "settings" / "providers.json"
    cline_dir = Path(env["CLINE_DIR"].strip()) if env.get("CLINE_DIR", "").strip() else home / ".cline"
    return cline_dir / "data" / "settings" / "providers.json"


@dataclass(frozen=True)
class FileEdit:
    """Values for one file: `set` always, `default` only where the file has none (a login's choice).
    JSON keys are dotted paths; `.env` and YAML keys are top-level names."""

    path: Path
    format: str  # "json", "env" or "yaml"
    set: dict[str, str]
    default: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Target:
    edits: Callable[[BaseUrls, Locations, str | None], list[FileEdit]]  # (urls, where, key)
    notes: tuple[str, ...]
    key_set: str = "the key set"  # the note's name for the key, when one is written
    keyless: tuple[str, ...] = ()  # the notes when none is


def _claude(urls: BaseUrls, where: Locations, key: str | None) -> list[FileEdit]:
    # the key, sent as Authorization: Bearer (no approval prompt), only where the proxy injects the real one
    return [FileEdit(where.claude_settings, "json", {"env.ANTHROPIC_BASE_URL": urls.anthropic,
                                                     **({"env.ANTHROPIC_AUTH_TOKEN": key} if key else {})})]


def _gemini(urls: BaseUrls, where: Locations, key: str | None) -> list[FileEdit]:
    return [FileEdit(where.home / ".gemini" / ".env", "env",
                     {"GOOGLE_GEMINI_BASE_URL": urls.gemini, **({"GEMINI_API_KEY": key} if key else {})}),
            FileEdit(where.gemini_settings, "json", {}, {"security.auth.selectedType": "gemini-api-key"})]


def _opencode(urls: BaseUrls, where: Locations, key: str | None) -> list[FileEdit]:
    values = {"provider.anthropic.options.baseURL": urls.anthropic + "/v1",
              "provider.openai.options.baseURL": urls.openai}
    if key:
        values |= {"provider.anthropic.options.apiKey": key, "provider.openai.options.apiKey": key}
    return [FileEdit(where.config_home / "opencode" / "opencode.json", "json", values)]


def _qwen(urls: BaseUrls, where: Locations, key: str | None) -> list[FileEdit]:
    return [FileEdit(where.home / ".qwen" / ".env", "env",
                     {"OPENAI_BASE_URL": urls.openai, **({"OPENAI_API_KEY": key} if key else {})}),
            FileEdit(where.home / ".qwen" / "settings.json", "json", {}, {"security.auth.selectedType": "openai"})]


def _aider(urls: BaseUrls, where: Locations, key: str | None) -> list[FileEdit]:
    return [FileEdit(where.home / ".aider.conf.yml", "yaml",
                     {"openai-api-base": urls.openai, **({"openai-api-key": key} if key else {})})]


TARGETS: dict[str, Target] = {
    "claude-code": Target(_claude, (
        "merged into the \"env\" object; ANTHROPIC_BASE_URL has no /v1 (Claude Code appends /v1/messages)",
        "it applies however claude is started, and wins over the ANTHROPIC_BASE_URL variable",
    ), "ANTHROPIC_AUTH_TOKEN", ("no key is set: a Claude subscription login keeps working (ANTHROPIC_API_KEY or "
                                "ANTHROPIC_AUTH_TOKEN would replace it)",)),
    "gemini-cli": Target(_gemini, (
        "GOOGLE_GEMINI_BASE_URL has no /v1beta: Gemini CLI's SDK appends /v1beta/models/M:streamGenerateContent",
        "Gemini CLI reads ~/.gemini/.env only in a trusted folder, and a .gemini/.env or .env found from the "
        "working directory up wins over it: else export the variable in your shell profile",
        "selectedType is set only where none is: without one Gemini CLI exits 41; a Google login "
        "(oauth-personal) goes to Code Assist, not to this base URL",
        "--yolo in an untrusted folder needs GEMINI_CLI_TRUST_WORKSPACE=true (or trust the folder)",
    )),
    "opencode": Target(_opencode, (
        "both base URLs end in /v1 (opencode's AI SDK appends /messages, /responses, /chat/completions)",
        "a provider of your own (\"npm\": \"@ai-sdk/openai-compatible\") takes the same options.baseURL",
        "keys stay where `opencode auth login` put them; a project's opencode.json wins over this file",
    )),
    "qwen-code": Target(_qwen, (
        "OPENAI_BASE_URL ends in /v1; ~/.qwen/.env is read in any folder, an exported variable wins over it",
        "selectedType is set only where none is: a Qwen OAuth login (qwen-oauth) does not use this base URL",
    )),
    "aider": Target(_aider, (
        "openai-api-base ends in /v1 (litellm and the OpenAI SDK append /chat/completions); use --model "
        "openai/<model> for models behind it",
        "--openai-api-base or AIDER_OPENAI_API_BASE win over the file",
    )),
}


def edits(tool: str, urls: BaseUrls, where: Locations, key: str | None) -> list[FileEdit]:
    return TARGETS[tool].edits(urls, where, key)


def printed(edit: FileEdit) -> str:
    """The edit as its file would show it."""
    if edit.format == "json":
        return config_files.json_text(_json_merge({}, {**edit.default, **edit.set}, {}))
    return "".join(f"{_line(edit.format, k, v)}\n" for k, v in {**edit.default, **edit.set}.items())


def write(edit: FileEdit, now: datetime, secret: bool) -> config_files.WriteResult:
    """Merge the edit into its file (config_files.replace: backup first, no change no write)."""
    old = config_files.read_text(edit.path)
    if edit.format == "json":
        data = config_files.read_json_object(edit.path) or {}
        merged = _json_merge(data, edit.set, edit.default)
        new = old if old is not None and merged == data else config_files.json_text(merged)
    else:
        new = _set_lines(old or "", edit.format, {**edit.default, **edit.set}, set(edit.default))
    return config_files.replace(edit.path, old, new or "", now, secret)


def _json_merge(data: dict[str, Any], values: dict[str, str], defaults: dict[str, str]) -> dict[str, Any]:
    merged = copy.deepcopy(data)
    for dotted, value in [*((k, (v, True)) for k, v in values.items()), *((k, (v, False)) for k, v in defaults.items())]:
        *parents, last = dotted.split(".")
        node = merged
        for name in parents:
            child = node.setdefault(name, {})
            if not isinstance(child, dict):
                raise config_files.ConfigFileError(f'"{name}" is not an object where {dotted} goes; fix it, then run again')
            node = child
        text, always = value
        if always or node.get(last) in (None, ""):
            node[last] = text
    return merged


def _line(fmt: str, key: str, value: str) -> str:
    return f"{key}={value}" if fmt == "env" else f"{key}: {json.dumps(value)}"


def _set_lines(text: str, fmt: str, values: dict[str, str], defaults: set[str]) -> str:
    """Each key's line replaced, or added at the end; a default key's line is left as it is."""
    lines = text.splitlines()
    for key, value in values.items():
        pattern = re.compile(rf"^(?:export\s+)?{re.escape(key)}\s*=" if fmt == "env" else rf"^{re.escape(key)}\s*:")
        at = next((i for i, line in enumerate(lines) if pattern.match(line)), None)
        if at is None:
            lines.append(_line(fmt, key, value))
        elif key not in defaults:
            lines[at] = _line(fmt, key, value)
    return "\n".join(lines) + "\n"


def configured_base_urls(where: Locations, tools: Iterable[str]) -> list[tuple[str, str, bool]]:
    """The base URLs the `tools`' files hold now, for `doctor`: (label, value, whether it wants /v1)."""
    probe = BaseUrls("http://h", "http://h/v1", gemini="http://h")
    found = []
    for tool in tools:
        for edit in edits(tool, probe, where, None):
            for key, wanted in edit.set.items():
                value = _read(edit, key) if "base" in key.lower() else None
                if isinstance(value, str):
                    found.append((f"{edit.path} {key}", value, wanted.endswith("/v1")))
    return found


def _read(edit: FileEdit, key: str) -> Any:
    try:
        if edit.format == "json":
            node: Any = config_files.read_json_object(edit.path)
            for name in key.split("."):
                node = node.get(name) if isinstance(node, dict) else None
            return node
        text = config_files.read_text(edit.path) or ""
    except config_files.ConfigFileError:
        return None
    sep = "=" if edit.format == "env" else ":"
    for line in text.splitlines():
        name, found, value = line.removeprefix("export ").partition(sep)
        if found and name.strip() == key:
            return value.strip().strip("'\"")
    return None
