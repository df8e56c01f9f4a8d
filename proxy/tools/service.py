"""`llmtap service`: `llmtap serve` kept running by the user's service manager.

- Linux: a systemd **user** unit, `~/.config/systemd/user/llmtap.service` (or under
  $XDG_CONFIG_HOME), enabled with `systemctl --user enable --now llmtap`; its output goes to the
  journal (`journalctl --user -u llmtap`).
- macOS: a launchd agent, `~/Library/LaunchAgents/dev.llmtap.serve.plist`, loaded with
  `launchctl bootstrap gui/$UID …`; its output goes to `~/Library/Logs/llmtap/serve.log`.

Both run this very llmtap (the `llmtap` script beside this Python, else `python -m proxy`) with
the environment variables that decide where llmtap keeps its files, so the service records where
every other llmtap command of this account looks. Where the service manager is not running (a
container, CI, a login without a user session), the file is written and the commands that would
load it are skipped and shown. Whether the proxy is up is always asked of the proxy itself
(proxy.common.instances: its state file and health check), not of the service manager.
"""

from __future__ import annotations

import os
import plistlib
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

UNIT = "llmtap"  # llmtap.service
LABEL = "dev.llmtap.serve"
RESTART_SEC = 5
# Environment that moves llmtap's files: the service gets the values this shell has.
ENV_VARS = ("LLMTAP_HOME", "LLMTAP_CONFIG", "XDG_DATA_HOME", "XDG_CONFIG_HOME")


class ServiceError(Exception):
    """The service cannot be installed or asked about; the message says why."""


def serve_command(config_path: Path | None = None) -> list[str]:
    """The command line that runs `llmtap serve`: the `llmtap` script of this installation (beside
    its Python, as in a venv or pipx), else this Python with `-m proxy`."""
    python = Path(os.path.abspath(sys.executable))  # not resolved: a venv's python is a symlink
    script = python.with_name("llmtap")
    argv = [str(script)] if script.is_file() and os.access(script, os.X_OK) else [str(python), "-m", "proxy"]
    argv.append("serve")
    if config_path is not None:
        argv += ["--config", os.path.abspath(Path(config_path).expanduser())]
    return argv


def service_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    environ = dict(os.environ) if environ is None else environ
    return {var: environ[var] for var in ENV_VARS if environ.get(var)}


# -- systemd (Linux) -------------------------------------------------------------------------------


def unit_path(home: Path | None = None, environ: dict[str, str] | None = None) -> Path:
    environ = dict(os.environ) if environ is None else environ
    base = environ.get("XDG_CONFIG_HOME") or (home or Path.home()) / ".config"
    return Path(base) / "systemd" / "user" / f"{UNIT}.service"


def unit_text(argv: list[str], env: dict[str, str]) -> str:
    """The systemd user unit: restarted on failure, stopped with SIGTERM (serve then flushes its rows)."""
    lines = [
        "# Written by `llmtap service install`; remove with `llmtap service uninstall`.",
        "[Unit]",
        "Description=llmtap: measuring reverse proxy for LLM APIs",
        # Five failed starts in two minutes (a bad config, a port taken) and systemd stops trying:
        # `llmtap service status` and `llmtap service logs` say why.
        "StartLimitIntervalSec=120",
        "StartLimitBurst=5",
        "",
        "[Service]",
        "Type=simple",
        "ExecStart=" + " ".join(systemd_quote(arg) for arg in argv),
        *(f"Environment={systemd_quote(f'{k}={v}')}" for k, v in env.items()),
        "Restart=on-failure",
        f"RestartSec={RESTART_SEC}",
        "KillSignal=SIGTERM",
        "TimeoutStopSec=30",
        "",
        "[Install]",
        "WantedBy=default.target",
    ]
    return "\n".join(lines) + "\n"


_PLAIN = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def systemd_quote(arg: str) -> str:
    """One word of a systemd command line or assignment: `%` and `$` doubled (no specifiers, no
    variables), double-quoted with backslash escapes when it holds anything else."""
    arg = arg.replace("%", "%%").replace("$", "$$")
    if _PLAIN.match(arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class Systemd:
    """Whether this account's systemd user manager runs (`systemctl --user is-system-running`)."""

    available: bool
    why: str = ""  # when not available

    @classmethod
    def probe(cls) -> "Systemd":
        if shutil.which("systemctl") is None:
            return cls(False, "systemctl not found")
        try:
            done = subprocess.run(["systemctl", "--user", "is-system-running"], capture_output=True,
                                  text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return cls(False, f"systemctl --user: {exc}")
        state = done.stdout.strip()
        if state in ("running", "degraded", "starting", "initializing", "maintenance"):
            return cls(True)
        said = state or " ".join(done.stderr.split()) or f"exit {done.returncode}"
        return cls(False, f"`systemctl --user is-system-running` says {said}")


# -- launchd (macOS) -------------------------------------------------------------------------------


def plist_path(home: Path | None = None) -> Path:
    return (home or Path.home()) / "Library" / "LaunchAgents" / f"{LABEL}.plist"


def launchd_log(home: Path | None = None) -> Path:
    return (home or Path.home()) / "Library" / "Logs" / "llmtap" / "serve.log"


def plist_text(argv: list[str], env: dict[str, str], log: Path) -> str:
    """The launchd agent: started at login, started again when it exits with a failure."""
    agent: dict[str, object] = {
        "Label": LABEL,
        "ProgramArguments": argv,
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},
        "ThrottleInterval": RESTART_SEC * 2,
        "ExitTimeOut": 30,
        "ProcessType": "Background",
        "StandardOutPath": str(log),
        "StandardErrorPath": str(log),
    }
    if env:
        agent["EnvironmentVariables"] = env
    return plistlib.dumps(agent, fmt=plistlib.FMT_XML, sort_keys=False).decode()


def launchd_domain() -> str:
    return f"gui/{os.getuid()}"


# -- the plan: what install writes and runs ---------------------------------------------------------


@dataclass
class Plan:
    """A service definition for this platform: the file, its text, and the commands that load it."""

    platform: str  # "systemd" or "launchd"
    path: Path
    text: str
    load: list[list[str]]  # run after writing the file
    unload: list[list[str]]  # run before removing it
    log: Path | None = None  # launchd's log file
    notes: list[str] = field(default_factory=list)


def plan(config_path: Path | None = None, *, platform: str | None = None, home: Path | None = None,
         environ: dict[str, str] | None = None) -> Plan:
    """The service for `platform` (default: this machine's: launchd on macOS, systemd elsewhere)."""
    platform = platform or ("launchd" if sys.platform == "darwin" else "systemd")
    argv, env = serve_command(config_path), service_env(environ)
    if platform == "launchd":
        path, log = plist_path(home), launchd_log(home)
        target = f"{launchd_domain()}/{LABEL}"
        return Plan("launchd", path, plist_text(argv, env, log),
                    load=[["launchctl", "bootstrap", launchd_domain(), str(path)]],
                    unload=[["launchctl", "bootout", target]], log=log)
    if platform != "systemd":
        raise ServiceError(f"no service manager llmtap knows on {platform}")
    return Plan("systemd", unit_path(home, environ), unit_text(argv, env),
                load=[["systemctl", "--user", "daemon-reload"], ["systemctl", "--user", "enable", "--now", UNIT]],
                unload=[["systemctl", "--user", "disable", "--now", UNIT]])


def manager_why_not(platform: str) -> str | None:
    """Why the service manager cannot be asked here (None when it can)."""
    if platform == "launchd":
        return None if shutil.which("launchctl") else "launchctl not found"
    found = Systemd.probe()
    return None if found.available else found.why


def run_commands(commands: list[list[str]], *, check: bool = True) -> list[str]:
    """Run each command; the lines to show (the command, and its error output when it failed)."""
    said = []
    for argv in commands:
        said.append("$ " + " ".join(argv))
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ServiceError(f"{' '.join(argv)}: {exc}") from None
        output = (done.stdout + done.stderr).strip()
        if done.returncode != 0 and check:
            raise ServiceError(f"{' '.join(argv)} failed (exit {done.returncode}): {output}")
        if output:
            said.append(output)
    return said


def write_file(path: Path, text: str) -> bool:
    """Write `text` to `path` (its directory made if needed); False when it already says exactly that."""
    try:
        if path.read_text() == text:
            return False
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return True


def manager_state(platform: str) -> str:
    """What the service manager says of the service: systemd's `is-active` and `is-enabled`
    (active, inactive, failed, ...), launchd's state from `launchctl print`."""
    if platform == "launchd":
        done = subprocess.run(["launchctl", "print", f"{launchd_domain()}/{LABEL}"], capture_output=True,
                              text=True, timeout=10)
        if done.returncode != 0:
            return "not loaded"
        match = re.search(r"^\s*state = (.+)$", done.stdout, re.MULTILINE)
        return f"loaded, {match[1].strip()}" if match else "loaded"
    answers = []
    for verb in ("is-active", "is-enabled"):
        done = subprocess.run(["systemctl", "--user", verb, UNIT], capture_output=True, text=True, timeout=10)
        answers.append(done.stdout.strip() or " ".join(done.stderr.split()) or f"exit {done.returncode}")
    return f"{answers[0]} ({answers[1]})"


def logs_command(platform: str, lines: int, follow: bool, log: Path | None = None) -> list[str]:
    """The command that shows the service's output."""
    if platform == "launchd":
        assert log is not None
        return ["tail", "-n", str(lines), *(["-F"] if follow else []), str(log)]
    return ["journalctl", "--user", "-u", UNIT, "-n", str(lines), "--no-pager", *(["-f"] if follow else [])]
