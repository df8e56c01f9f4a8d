"""Doctor checks on this machine: the running proxy, its port, its database."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

import duckdb

from proxy.relay import fast_paths as fast
from proxy.settings.config import ServeConfig
from proxy.tools.check import Check, fail, ok, warn
from proxy.common import instances as running
from proxy.common.instances import LiveProxy
from proxy.common import duck


def running_proxy(live: LiveProxy | None) -> Check:
    if live is not None:
        where = f", recording to {live.db}" if live.db else ", not recording"
        return ok("llmtap serve", f"running at {live.url} (pid {live.pid}){where}")
    stale = running.stale_states() or running.states()  # dead, or alive but not answering
    if stale:
        state = stale[0]
        return warn("llmtap serve", f"{state.path} names pid {state.pid} on port {state.port}, "
                    "but no llmtap answers there (it crashed or was killed)",
                    f"start it again, or remove {state.path}")
    return ok("llmtap serve", "not running (start it with llmtap serve, or use llmtap run -- COMMAND)")


def fast_paths(live: LiveProxy | None, env: dict[str, str]) -> Check:
    """Which of aiohttp's internals llmtap uses (proxy/relay/fast_paths.py): the running proxy's health
    says; without one, the probe of this installation and environment."""
    summary = live.health.get("fast_paths") if live is not None else None
    where = "the running llmtap serve"
    if not isinstance(summary, dict):
        try:
            summary = fast.probe(env).summary()
        except ValueError as exc:
            return fail("fast paths", str(exc), f"unset {fast.ENV}, or give it one of those values")
        where = "llmtap serve here"
    on, off = summary.get("on") or [], summary.get("off") or {}
    detail = f"{', '.join(on) or 'none'} on in {where} (aiohttp {summary.get('aiohttp')})"
    if not off:
        return ok("fast paths", detail)
    detail += "; off, the public path runs (slower, as correct): " + "; ".join(f"{n}: {why}" for n, why in off.items())
    if all(fast.expected(why) for why in off.values()):
        return ok("fast paths", detail)
    return warn("fast paths", detail, f"for them all: pip install 'aiohttp=={'.'.join(map(str, fast.NEWEST))}', "
                "or an llmtap release tested with this aiohttp")


def port(config: ServeConfig, live: LiveProxy | None) -> Check:
    subject = f"port {config.port} on {config.main_host}"
    if live is not None and live.url.endswith(f":{config.port}"):
        return ok(subject, "used by the running llmtap serve")
    family = socket.AF_INET6 if ":" in config.main_host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((config.main_host, config.port))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            client = running.find_client(f"http://{running.connect_host(config.main_host)}:{config.port}")
            if client is not None and client.health() is not None:
                return ok(subject, "used by an llmtap proxy (its state file is elsewhere: another LLMTAP_HOME?)")
            return fail(subject, "in use by another process",
                        f"stop it, or use another port: llmtap serve --port {config.port + 1}, then\n"
                        f"llmtap setup TOOL --base-url http://127.0.0.1:{config.port + 1}")
        return fail(subject, f"cannot listen there: {exc.strerror or exc}",
                    "use a port above 1023 and a local address (--host 127.0.0.1)")
    return ok(subject, "free")


def database(db_path: Path, live: LiveProxy | None) -> Check:
    subject = f"database {db_path}"
    if live is not None and live.db and running.same_file(live.db, db_path):
        if warnings := live.warnings:
            return fail(subject, f"the running llmtap serve (pid {live.pid}) reports: {warnings[0]}",
                        "free space on its disk (or fix what the message names): the waiting rows are written then")
        return ok(subject, f"held by the running llmtap serve (pid {live.pid}); llmtap sql/report query it through it")
    try:
        duck.refuse_untrusted(db_path)
    except duck.UntrustedDatabase as exc:
        return fail(subject, f"not safe to write: {exc.problem}", exc.fix)
    if not db_path.exists():
        parent = next((p for p in db_path.parents if p.exists()), None)
        if parent is not None and os.access(parent, os.W_OK | os.X_OK):
            return ok(subject, "does not exist yet; it will be created")
        return fail(subject, f"cannot be created: {parent} is not writable",
                    "choose another file with --db, or set LLMTAP_HOME to a writable directory")
    if not os.access(db_path, os.W_OK):
        return fail(subject, "is not writable by this user", f"fix its permissions (chmod u+w {db_path}) or use --db")
    try:
        duck.connect(db_path).close()
    except duckdb.Error as exc:
        message = str(exc).splitlines()[0]
        if "lock" in message.lower():
            return fail(subject, f"locked by another process: {message}",
                        "stop that process (DuckDB lets one process write a file), or use another --db")
        return fail(subject, f"cannot be opened: {message}", "move it aside, or use another --db")
    return ok(subject, "writable")
