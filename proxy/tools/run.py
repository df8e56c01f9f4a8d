"""`llmtap run -- COMMAND`: one command's traffic through the proxy, tagged, then its summary.

The proxy is the running `llmtap serve` when one answers, else one started
here on a background thread. Tools cannot send an X-Llmtap-Tag header, so the
tag travels in the base URL (`/_tag/<tag>/…`, stripped by the proxy) or, for
a proxy started here, in its `tag` setting.

Environment variables reach the SDKs, but two CLIs need more:
- Claude Code lets `env` in ~/.claude/settings.json win over the variable,
  so it gets `--settings '{"env": {"ANTHROPIC_BASE_URL": …}}'`.
- Codex (0.171) ignores OPENAI_BASE_URL, so it gets `-c openai_base_url=…`
  (or `-c model_providers.<its provider>.base_url=…`).
Cline reads its base URL only from its providers.json (`llmtap setup cline`).
Gemini CLI reads GOOGLE_GEMINI_BASE_URL (no /v1beta), Qwen Code OPENAI_BASE_URL (the exported variable
wins over its .env); aider gets AIDER_OPENAI_API_BASE, which wins over its .aider.conf.yml; opencode,
which has no base-URL variable, gets OPENCODE_CONFIG_CONTENT (merged over its config files) setting
`options.baseURL` of anthropic, openai and each provider its opencode.json files name.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import time
import tomllib
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable

from proxy.settings import config as cfg
from proxy.tools import summary
from proxy.tools.background import BackgroundProxy
from proxy.common.instances import LiveProxy, find_running
from proxy.tools.endpoint import BaseUrls, base_urls
from proxy.tools.setup import Locations, codex_login
from proxy.tools.toml_edit import toml_string

TAG_PATTERN = re.compile(r"^[A-Za-z0-9._:@+=-]{1,100}$")
BASE_URL_VARIABLES = ("ANTHROPIC_BASE_URL", "OPENAI_BASE_URL", "OPENAI_API_BASE", "GOOGLE_GEMINI_BASE_URL")
NO_UPSTREAM = (
    "no running `llmtap serve` and no upstream configured. Give one, for example:\n"
    "  llmtap run --upstream https://api.anthropic.com -- claude -p \"say hi\"\n"
    "  llmtap run --upstream https://api.openai.com -- codex exec \"say hi\"\n"
    "or start `llmtap serve --upstream URL` in another terminal first."
)


class RunError(Exception):
    """The command could not be run through the proxy; the message says why."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def new_tag(now: datetime | None = None) -> str:
    now = now or datetime.now(timezone.utc)
    return f"run-{now.astimezone(timezone.utc):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def check_tag(tag: str) -> str:
    if not TAG_PATTERN.match(tag):
        raise RunError(f"tag {tag!r} must be 1-100 characters of letters, digits and . _ : @ + = -")
    return tag


def child_env(env: dict[str, str], urls: BaseUrls) -> dict[str, str]:
    """The command's environment: base URLs set, loopback kept off any HTTP proxy."""
    out = dict(env)
    out["ANTHROPIC_BASE_URL"] = urls.anthropic
    out["OPENAI_BASE_URL"] = urls.openai
    out["OPENAI_API_BASE"] = urls.openai
    out["GOOGLE_GEMINI_BASE_URL"] = urls.gemini
    for name in ("NO_PROXY", "no_proxy"):
        present = [h.strip() for h in out.get(name, "").split(",") if h.strip()]
        missing = [h for h in ("127.0.0.1", "localhost", "::1") if h not in present]
        if missing or name in out:
            out[name] = ",".join(present + missing)
    return out


def _bare_key(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else toml_string(name)


def codex_base_url_key(env: dict[str, str]) -> tuple[str | None, str | None]:
    """The `-c` key that sets Codex's base URL, from its config.toml; (None, why) if none does."""
    home = Path(env["CODEX_HOME"]) if env.get("CODEX_HOME") else Path(env.get("HOME") or Path.home()) / ".codex"
    try:
        doc = tomllib.loads((home / "config.toml").read_text())
    except (OSError, ValueError):
        doc = {}
    provider = doc.get("model_provider")
    if not provider or provider == "openai":
        return "openai_base_url", None
    custom = doc.get("model_providers")
    if isinstance(custom, dict) and isinstance(custom.get(provider), dict):
        return f"model_providers.{_bare_key(provider)}.base_url", None
    return None, f"codex uses its built-in provider {provider!r}, whose base URL llmtap cannot set"


def tool_arguments(command: list[str], urls: BaseUrls, env: dict[str, str]) -> tuple[list[str], list[str]]:
    """The command with the arguments its tool needs to use `urls`, and notes saying what was added."""
    name = Path(command[0]).name
    if name == "claude":
        settings = json.dumps({"env": {"ANTHROPIC_BASE_URL": urls.anthropic}})
        return [command[0], "--settings", settings, *command[1:]], [f"claude gets --settings {settings}"]
    if name == "codex":
        key, why = codex_base_url_key(env)
        if key is None:
            return command, [why or ""]
        url = urls.openai
        if key == "openai_base_url" and codex_login(Locations.from_env(env)) == "chatgpt":
            url = urls.chatgpt  # a ChatGPT login's backend, through llmtap's /chatgpt route (setup.py)
        option = f"{key}={toml_string(url)}"
        return [command[0], "-c", option, *command[1:]], [f"codex gets -c {option}"]
    if name == "cline":
        return command, ["cline reads its base URL from providers.json only (set it with `llmtap setup cline --write`)"]
    return command, []


def tool_env(command: list[str], urls: BaseUrls, env: dict[str, str], cwd: Path) -> dict[str, str]:
    """Variables a tool needs beyond the base URLs of child_env (module docstring)."""
    name = Path(command[0]).name
    if name == "aider":
        return {"AIDER_OPENAI_API_BASE": urls.openai}
    if name == "opencode":
        providers = {"anthropic", "openai", *opencode_providers(env, cwd)}
        config = {"provider": {p: {"options": {"baseURL": urls.anthropic + "/v1" if p == "anthropic" else urls.openai}}
                               for p in sorted(providers)}}
        return {"OPENCODE_CONFIG_CONTENT": json.dumps(config)}
    return {}


def opencode_providers(env: dict[str, str], cwd: Path) -> list[str]:
    """The providers opencode's global config and the opencode.json files from `cwd` up name."""
    home = Path(env.get("HOME") or Path.home())
    config_home = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else home / ".config"
    files = [config_home / "opencode" / "opencode.json", *(d / "opencode.json" for d in (cwd, *cwd.parents))]
    names: list[str] = []
    for file in files:
        try:
            provider = json.loads(file.read_text()).get("provider")
        except (OSError, ValueError, AttributeError):
            continue
        names += list(provider) if isinstance(provider, dict) else []
    return names


def run_command(command: list[str], env: dict[str, str]) -> int:
    """Run to completion; Ctrl-C goes to the command (it shares the terminal), SIGTERM/SIGHUP are passed on.

    Returns the command's exit code, 128+N when a signal N ended it, 127 when it was not found.
    """
    try:
        proc = subprocess.Popen(command, env=env)
    except FileNotFoundError:
        raise RunError(f"command not found: {command[0]}", 127) from None
    except PermissionError:
        raise RunError(f"cannot execute {command[0]}: permission denied", 126) from None

    def forward(signum: int, frame: Any) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    previous: dict[Any, Any] = {}
    for sig, handler in ((signal.SIGINT, lambda s, f: None), (signal.SIGTERM, forward), (signal.SIGHUP, forward)):
        try:
            previous[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread
            pass
    try:
        code = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return code if code >= 0 else 128 - code


def settle(live: LiveProxy, timeout: float = 5.0) -> None:
    """Wait until the running proxy has written every row it has (bounded)."""
    deadline = time.monotonic() + timeout
    last_seen = None
    while time.monotonic() < deadline:
        answer = live.client.health(timeout=2.0) or {}
        store = answer.get("store") or {}
        seen = answer.get("requests_seen")
        if store.get("pending_requests", 0) == 0 and seen == last_seen:
            return
        last_seen = seen
        time.sleep(0.15)


@dataclass
class Outcome:
    exit_code: int
    tag: str
    summary: str


def own_config(config_path: Path | None, upstream: str | None, db: str | None, port: int | None, tag: str,
               verbose: bool) -> cfg.ServeConfig:
    overrides: dict[str, Any] = {"upstream": upstream, "db": db, "port": port, "tag": tag, "host": "127.0.0.1",
                                 "quiet": not verbose}
    try:
        config = cfg.build(config_path, overrides)
        config.route_table()
    except cfg.ConfigError as exc:
        if "no upstream configured" in str(exc):
            raise RunError(NO_UPSTREAM) from None
        raise RunError(str(exc)) from None
    return config


def execute(command: list[str], *, tag: str | None = None, upstream: str | None = None,
            config_path: Path | None = None, db: str | None = None, port: int | None = None, verbose: bool = False,
            env: dict[str, str] | None = None, report: Callable[[str], None]) -> Outcome:
    """Run `command` through the proxy and summarize its requests."""
    if not command:
        raise RunError("give the command to run after --, e.g. llmtap run -- claude -p \"say hi\"", 2)
    tag = check_tag(tag) if tag else new_tag()
    env = dict(os.environ) if env is None else env
    live = find_running()
    if live is not None:
        if upstream:
            report(f"llmtap run: using the running llmtap serve at {live.url}; --upstream is ignored")
        url_tag = tag if live.url_tags else None
        if url_tag is None:
            report("llmtap run: the running proxy does not take /_tag/ URLs; its rows will not be tagged")
        urls = base_urls(live.url, live.prefixes, url_tag)
        return _launch(command, env, urls, tag, report, query=summary.Query(live.db, live.client),
                       after=lambda: settle(live), tagged=url_tag is not None)
    config = own_config(config_path, upstream, db, port, tag, verbose)
    try:
        proxy = _start(config, report)
    except OSError as exc:
        raise RunError(f"cannot start the proxy: {exc}") from None
    except Exception as exc:  # the store's errors (database locked, ...) carry their own message
        raise RunError(f"cannot start the proxy: {exc}") from None
    prefixes = [r.label for r in config.route_table().routes]
    urls = base_urls(proxy.url, prefixes)
    try:
        return _launch(command, env, urls, tag, report, query=summary.Query(config.db_path), after=proxy.stop, tagged=True)
    finally:
        proxy.stop()


def _start(config: cfg.ServeConfig, report: Callable[[str], None]) -> "BackgroundProxy":
    """On the configured port (so tools set up for it reach it), else any free port."""
    try:
        return BackgroundProxy(config, report).start()
    except OSError:
        if config.port == 0:
            raise
    return BackgroundProxy(replace(config, port=0), report).start()


def _launch(command: list[str], env: dict[str, str], urls: BaseUrls, tag: str, report: Callable[[str], None], *,
            query: summary.Query, after: Callable[[], None], tagged: bool) -> Outcome:
    argv, notes = tool_arguments(command, urls, env)
    extra = tool_env(command, urls, env, Path.cwd())
    notes += [f"{Path(command[0]).name} gets {k}={v}" for k, v in extra.items()]
    for note in notes:
        report(f"llmtap run: {note}")
    report(f"llmtap run: tag {tag}; ANTHROPIC_BASE_URL={urls.anthropic} OPENAI_BASE_URL={urls.openai} "
           f"GOOGLE_GEMINI_BASE_URL={urls.gemini}")
    start = datetime.now(timezone.utc) - timedelta(seconds=1)
    code = run_command(argv, child_env(env, urls) | extra)
    after()
    end = datetime.now(timezone.utc) + timedelta(seconds=1)
    try:
        text = _summarize(query, tag, start, end, tagged)
    except summary.SummaryError as exc:
        text = f"llmtap run: no summary: {exc}"
    return Outcome(code, tag, text)


def _summarize(query: summary.Query, tag: str, start: datetime, end: datetime, tagged: bool) -> str:
    parts = []
    if tagged:
        where = summary.tag_filter(tag)
        totals = summary.totals(query, where)
        if totals.requests:
            errors = summary.error_rows(query, where) if totals.errors else []
            return (summary.render(f"tag {tag}", totals, errors)
                    + f"\n  more: llmtap report --tag {tag}")
        parts.append(f"llmtap run: no request carried the tag {tag}")
    where = summary.window_filter(start, end)
    totals = summary.totals(query, where)
    if not totals.requests:
        parts.append("llmtap run: no request reached the proxy while the command ran "
                     "(is the tool set up for it? see `llmtap setup` and `llmtap doctor`)")
        return "\n".join(parts)
    errors = summary.error_rows(query, where) if totals.errors else []
    parts.append(summary.render("untagged requests that arrived meanwhile (perhaps not all this command's)",
                                totals, errors))
    return "\n".join(parts)
