"""`llmtap doctor`: per CLI set up to send its own OpenTelemetry to llmtap, whether it reaches it.

A CLI whose settings point its telemetry at llmtap (proxy/tools/telemetry_setup.py) is checked: that
its settings carry llmtap's current telemetry token, and that the running proxy has received events from
it (the newest `agent_events` row of its `source`). A CLI without settings is not mentioned.
"""

from __future__ import annotations

import json
import tomllib
from datetime import datetime, timezone
from pathlib import Path

from proxy.common import paths
from proxy.common.instances import AdminError, LiveProxy
from proxy.settings.client_key import SecretFileError, read_secret_file
from proxy.tools.check import Check, ok, warn
from proxy.tools.agent_setup import Locations
from proxy.tools.telemetry_setup import OTLP_PATH, TOOLS, settings_file

# each CLI: its `service.name` in agent_events (a LIKE pattern); where its settings are: telemetry_setup
SOURCES = {"claude-code": "claude-code", "codex": "codex%", "gemini-cli": "gemini-cli"}
NEWEST_SQL = "SELECT source, max(received_at) AS newest, count(*) AS events FROM agent_events GROUP BY source"


def _text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def configured(env: dict[str, str]) -> dict[str, str]:
    """Each CLI whose settings send its telemetry to llmtap: the settings' text (it holds the token)."""
    where = Locations.from_env(env)
    found: dict[str, str] = {}
    for tool in TOOLS:
        path = settings_file(tool, where)
        text = _text(path) if path is not None else None
        parse = tomllib.loads if tool == "codex" else json.loads
        try:
            if text is not None and OTLP_PATH in json.dumps(parse(text)):
                found[tool] = text
        except ValueError:  # JSON's and TOML's errors: another check's business
            continue
    return found


def telemetry(env: dict[str, str], live: LiveProxy | None) -> list[Check]:
    wanted = configured(env)
    if not wanted:
        return []
    try:
        token: str | None = read_secret_file(paths.telemetry_token_path())
    except SecretFileError:
        token = None
    newest = _newest(live) if live is not None else None
    return [_check(tool, text, token, newest) for tool, text in wanted.items()]


def _newest(live: LiveProxy) -> dict[str, tuple[datetime, int]] | None:
    try:
        (_, _, rows), _ = live.client.sql(NEWEST_SQL, timeout=10)
    except AdminError:
        return None
    return {str(r[0]): (datetime.fromisoformat(str(r[1])), int(r[2])) for r in rows if r[0] and r[1]}


def _check(tool: str, settings: str, token: str | None, newest: dict[str, tuple[datetime, int]] | None) -> Check:
    subject = f"{tool} telemetry"
    again = f"llmtap setup {tool} --write"
    if token is None or token not in settings:
        return warn(subject, "its settings send it to llmtap with a token that is not llmtap's current one",
                    f"{again} (llmtap's token: {paths.telemetry_token_path()})")
    if newest is None:
        return ok(subject, "set up to reach llmtap (no running proxy to ask whether it has)")
    pattern = SOURCES[tool]
    seen = [v for source, v in newest.items()
            if source == pattern or (pattern.endswith("%") and source.startswith(pattern[:-1]))]
    if not seen:
        return warn(subject, "set up, but llmtap has received none of its events yet",
                    f"run {tool} once through llmtap; if still none, see docs/tools.md, \"The agents' own telemetry\"")
    at, count = max(seen)
    ago = (datetime.now(timezone.utc) - at).total_seconds()
    return ok(subject, f"reaches llmtap: {count:,} event(s), the newest {_ago(ago)} ago")


def _ago(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{max(seconds, 0):.0f} s"
