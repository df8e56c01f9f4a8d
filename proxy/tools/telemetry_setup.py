"""The agents' own telemetry, pointed at llmtap: what `llmtap setup TOOL` adds to each CLI's settings.

Each CLI exports OpenTelemetry logs over OTLP/HTTP to llmtap's receiver (proxy/relay/otlp.py), with the
telemetry token (`client_key.telemetry_token`) that its settings then hold: a file that carries it is
made owner-only. Data per CLI (docs/tools.md, "The agents' own telemetry"):

| CLI         | where                                  | what                                                    |
|-------------|----------------------------------------|---------------------------------------------------------|
| Claude Code | settings.json `env`                    | CLAUDE_CODE_ENABLE_TELEMETRY and the OTEL_* variables   |
| Codex       | config.toml `[otel.exporter.otlp-http]`| endpoint (the whole logs URL), protocol, headers        |
| Gemini CLI  | settings.json `telemetry`              | enabled, otlpEndpoint (the token as its last segment)   |

A user's own telemetry settings (their collector) are never overwritten: the CLI's part is left out and a
note says how to send to both (docs/tools.md). `--no-telemetry` leaves all of it out.
"""

from __future__ import annotations

import copy
import re
import tomllib
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from proxy.tools import config_files, toml_edit
from proxy.tools.agent_setup import Locations

TOOLS = ("claude-code", "codex", "gemini-cli")  # the CLIs whose telemetry setup sends to llmtap
OTLP_PATH = "/_llmtap/otlp"
EXPORT_INTERVAL_MS = "500"  # Claude Code's logs and spans: each within half a second, not the SDK's 5 s
OWN_COLLECTOR = ("{tool} already sends its telemetry to {where}: left as it is. To send it to llmtap too, "
                 "fan it out in your collector (an `otlphttp` exporter to {endpoint} with the header "
                 "Authorization: Bearer <{token_path}>): docs/tools.md, \"The agents' own telemetry\"")


@dataclass(frozen=True)
class Telemetry:
    """Where llmtap receives telemetry, and the token to send."""

    root: str  # the proxy's URL, no path
    token: str
    token_path: str = "the telemetry-token file"

    @property
    def endpoint(self) -> str:
        return self.root.rstrip("/") + OTLP_PATH

    def own_collector(self, tool: str, where: str) -> str:
        return OWN_COLLECTOR.format(tool=tool, where=where, endpoint=self.endpoint, token_path=self.token_path)


def _ours(url: Any) -> bool:
    return isinstance(url, str) and OTLP_PATH in url


# -- Claude Code: settings.json `env` -------------------------------------------------------------


def claude_env(t: Telemetry) -> dict[str, str]:
    return {
        "CLAUDE_CODE_ENABLE_TELEMETRY": "1",
        "OTEL_LOGS_EXPORTER": "otlp",
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json",
        "OTEL_EXPORTER_OTLP_ENDPOINT": t.endpoint,
        "OTEL_EXPORTER_OTLP_HEADERS": f"Authorization=Bearer {t.token}",
        "OTEL_LOGS_EXPORT_INTERVAL": EXPORT_INTERVAL_MS,
        # its beta traces: a tool's wait for the person and its execution, each timed exactly
        "CLAUDE_CODE_ENHANCED_TELEMETRY_BETA": "1",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_TRACES_EXPORT_INTERVAL": EXPORT_INTERVAL_MS,
    }


def claude_merge(env: dict[str, Any], t: Telemetry) -> str | None:
    """Add Claude Code's telemetry variables to its settings' `env` (in place); a note when its own are kept."""
    theirs = next((env[k] for k in ("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
                   if env.get(k) and not _ours(env[k])), None)
    if theirs is None and env.get("OTEL_LOGS_EXPORTER", "otlp") != "otlp":
        theirs = f"OTEL_LOGS_EXPORTER={env['OTEL_LOGS_EXPORTER']}"
    if theirs is not None:
        return t.own_collector("Claude Code", str(theirs))
    env.update(claude_env(t))
    return None


# -- Codex: config.toml [otel] ----------------------------------------------------------------------


def codex_exporter(t: Telemetry) -> dict[str, Any]:
    """`[otel] exporter = { otlp-http = {...} }`: the endpoint is the whole logs URL (codex-rs/otel config)."""
    return {"endpoint": t.endpoint + "/v1/logs", "protocol": "json",
            "headers": {"Authorization": f"Bearer {t.token}"}}


def codex_snippet(t: Telemetry) -> str:
    values = codex_exporter(t)
    header = "otel.exporter.otlp-http"
    return (f"\n[{header}]\nendpoint = {toml_edit.toml_string(values['endpoint'])}\n"
            f"protocol = \"json\"\n\n[{header}.headers]\n"
            f"Authorization = {toml_edit.toml_string(values['headers']['Authorization'])}\n")


def codex_theirs(doc: dict[str, Any]) -> str | None:
    """Where the user's own `[otel]` exports to, if it is not llmtap."""
    otel = doc.get("otel")
    exporter = otel.get("exporter") if isinstance(otel, dict) else None
    if exporter is None:
        return None
    if isinstance(exporter, dict):
        for kind in ("otlp-http", "otlp-grpc"):
            target = exporter.get(kind)
            if isinstance(target, dict) and not (kind == "otlp-http" and _ours(target.get("endpoint"))):
                return str(target.get("endpoint") or kind)
        return None
    return f"[otel] exporter = {exporter!r}"


_CODEX_HEADER = re.compile(r"""^[ \t]*\[[ \t]*otel[ \t]*\.[ \t]*exporter[ \t]*\.[ \t]*["']?otlp-http["']?"""
                           r"""[ \t]*(\.[ \t]*headers[ \t]*)?\][ \t]*(#.*)?$""")


def codex_edit(text: str, t: Telemetry) -> tuple[str, str | None]:
    """`text` with llmtap's `[otel]` exporter (its two tables, at the end: a setup before wrote them so, and
    they are replaced), or as it was and a note. Checked by parsing: only `otel.exporter` may change."""
    doc = tomllib.loads(text)
    theirs = codex_theirs(doc)
    if theirs is not None:
        return text, t.own_collector("Codex", theirs)
    lines = text.splitlines(keepends=True)
    mine = [i for i, line in enumerate(lines) if _CODEX_HEADER.match(line)]
    if mine:  # ours, from an earlier setup: its lines go, up to the next table of another name
        end = next((i for i in range(mine[0] + 1, len(lines))
                    if lines[i].lstrip().startswith("[") and not _CODEX_HEADER.match(lines[i])), len(lines))
        lines[mine[0]:end] = []
    kept = "".join(lines).rstrip("\n")
    new = (kept + "\n" if kept else "") + codex_snippet(t).lstrip("\n" if not kept else "")
    expected = copy.deepcopy(doc)
    expected.setdefault("otel", {})["exporter"] = {"otlp-http": codex_exporter(t)}
    try:
        ok = tomllib.loads(new) == expected
    except tomllib.TOMLDecodeError:
        ok = False
    if not ok:
        raise ValueError("cannot set [otel] exporter by a text edit (the file defines it in an unusual form): "
                         "edit it by hand, or run setup with --no-telemetry")
    return new, None


# -- Gemini CLI: settings.json `telemetry` ------------------------------------------------------------


def gemini_telemetry(t: Telemetry) -> dict[str, Any]:
    """Its settings send no headers: the token is the endpoint's last segment (proxy/relay/otlp.py)."""
    return {"enabled": True, "target": "local", "otlpEndpoint": f"{t.endpoint}/{t.token}", "otlpProtocol": "http",
            "logPrompts": False}


def gemini_merge(settings: dict[str, Any], t: Telemetry) -> tuple[dict[str, Any], str | None]:
    """Gemini CLI's settings with llmtap's `telemetry`, or as they were and a note."""
    current = settings.get("telemetry")
    if isinstance(current, dict) and (current.get("otlpEndpoint") or current.get("outfile")) \
            and not _ours(current.get("otlpEndpoint")):
        return settings, t.own_collector("Gemini CLI", str(current.get("otlpEndpoint") or current.get("outfile")))
    merged = copy.deepcopy(settings)
    merged["telemetry"] = {**(current if isinstance(current, dict) else {}), **gemini_telemetry(t)}
    return merged, None


# -- the files ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    """What setup adds to one CLI's settings for its telemetry: `new` is the file's new text (None: the
    user's own telemetry is kept, `note` says where), `shown` the part added, as printed."""

    path: Path
    old: str | None
    new: str | None
    shown: str
    note: str


def settings_file(tool: str, where: Locations) -> Path | None:
    """Where `tool` keeps its telemetry settings: the file setup writes for it (Claude Code's settings.json,
    Codex's config.toml), Gemini CLI's settings.json; None for a tool without telemetry."""
    files = {"claude-code": where.claude_settings, "codex": where.codex_config, "gemini-cli": where.gemini_settings}
    return files.get(tool)


def change(tool: str, path: Path, t: Telemetry) -> Change:
    """The telemetry settings `tool`'s file at `path` gets, as it is now (raises config_files' errors,
    ValueError for a file it cannot edit)."""
    old = config_files.read_text(path)
    sent = f"its own OpenTelemetry (tool runs, approvals, API timings; never content) goes to {t.endpoint}"
    if tool == "codex":
        new, note = codex_edit(old or "", t)
        return Change(path, old, None if note else new, codex_snippet(t).lstrip("\n"), note or sent)
    data = config_files.read_json_object(path) or {}
    if tool == "claude-code":
        merged = copy.deepcopy(data)
        env = merged.setdefault("env", {})
        if not isinstance(env, dict):
            raise ValueError(f'"env" in {path} is not an object; fix it, then run again')
        note = claude_merge(env, t)
        shown = config_files.json_text({"env": claude_env(t)})
    else:
        merged, note = gemini_merge(data, t)
        shown = config_files.json_text({"telemetry": gemini_telemetry(t)})
    new = old if merged == data and old is not None else config_files.json_text(merged)
    return Change(path, old, None if note else new, shown, note or sent)


def write(tool: str, path: Path, t: Telemetry, now: datetime | None = None) -> config_files.WriteResult | None:
    """Add the telemetry settings to the file as it is now (after setup wrote the tool's own there), backup
    first, owner-only: it holds the token. None: the user's own telemetry is kept."""
    found = change(tool, path, t)
    if found.new is None:
        return None
    return config_files.replace(path, found.old, found.new, now, secret=True)
