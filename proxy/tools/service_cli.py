"""`llmtap service install|uninstall|status|logs`: a thin click layer over `service`."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import click

from proxy.settings import config as cfg
from proxy.common import paths, instances as running
from proxy.tools import service as svc
from proxy.common.terminal_text import echo

UP_WITHIN_S = 15.0  # how long `install` waits for the new service's health check


@click.group()
def service() -> None:
    """Keep `llmtap serve` running: a systemd user unit (Linux) or a launchd agent (macOS)."""


def _skipped(the_plan: svc.Plan, why: str, commands: list[list[str]]) -> None:
    manager = "systemd's user manager" if the_plan.platform == "systemd" else "launchd"
    echo(f"{manager} is not running here ({why}): skipped")
    echo("  " + " && ".join(" ".join(c) for c in commands))
    if the_plan.platform == "systemd":
        echo("run them in a login session where it runs (for a machine without logins: loginctl enable-linger $USER)")


@service.command()
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The config file serve reads (default: ~/.config/llmtap/config.toml).")
@click.option("--dry-run", is_flag=True, help="Print the file and the commands; write and run nothing.")
def install(config_path: Path | None, dry_run: bool) -> None:
    """Write the service file, then enable and start it (at every login from now on)."""
    try:
        config = cfg.build(config_path, {})
        config.route_table()
    except cfg.ConfigError as exc:
        where = config_path or paths.default_config_path()
        raise click.ClickException(f"serve would not start with this configuration: {exc}\n"
                                   f"the service runs `llmtap serve` with no flags: put the settings (upstream = "
                                   f"\"https://...\") in {where}, or pass --config FILE") from None
    the_plan = svc.plan(config_path)
    for note in _environment_notes(config):
        echo(f"note: {note}")
    if dry_run:
        echo(f"# {the_plan.path}")
        echo(the_plan.text, nl=False)
        echo("# then: " + " && ".join(" ".join(c) for c in the_plan.load))
        return
    existed = the_plan.path.exists()
    changed = svc.write_file(the_plan.path, the_plan.text)
    echo(f"wrote {the_plan.path}" if changed else f"{the_plan.path} is up to date")
    first: list[list[str]] = []  # may fail: nothing to undo
    commands = the_plan.load
    if the_plan.platform == "launchd" and existed:
        first = the_plan.unload  # an agent loaded already cannot be bootstrapped again
    elif existed and changed:
        commands = [*commands, ["systemctl", "--user", "restart", svc.UNIT]]
    why = svc.manager_why_not(the_plan.platform)
    if why is not None:
        _skipped(the_plan, why, [*first, *commands])
        return
    before = running.find_running()
    try:
        for line in [*svc.run_commands(first, check=False), *svc.run_commands(commands)]:
            echo(line)
    except svc.ServiceError as exc:
        raise click.ClickException(str(exc)) from None
    _await_up(before)


def _environment_notes(config: cfg.ServeConfig) -> list[str]:
    """What the shell has and the service will not: it starts with the service manager's environment."""
    notes = []
    keys = [v for v in (config.upstream_key_env, *config.route_key_env.values()) if v]
    if keys:
        notes.append(f"the service does not see this shell's {', '.join(keys)}: give them to it "
                     "(systemctl --user edit llmtap: [Service] Environment=...; launchd: EnvironmentVariables)")
    proxies = [v for v in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy") if os.environ.get(v)]
    if proxies and not config.upstream_proxy:
        notes.append(f"the service does not see this shell's {proxies[0]}: set upstream_proxy in the config file")
    return notes


def _await_up(before: running.LiveProxy | None) -> None:
    deadline = time.monotonic() + UP_WITHIN_S
    while True:
        live = running.find_running()
        if live is not None and (before is None or live.pid != before.pid):
            echo(f"llmtap serve is up at {live.url} (PID {live.pid}), recording to {live.db}")
            return
        if time.monotonic() > deadline:
            break
        time.sleep(0.25)
    if before is not None:
        echo(f"llmtap serve (PID {before.pid}) already answers at {before.url}, started outside the service: "
                   "stop it, or the service's serve cannot listen on that port (llmtap service logs)")
    else:
        echo(f"llmtap serve does not answer yet after {UP_WITHIN_S:g} s: see llmtap service logs")


@service.command()
def uninstall() -> None:
    """Stop the service and remove its file."""
    the_plan = svc.plan()
    if not the_plan.path.exists():
        echo(f"not installed: no {the_plan.path}")
        return
    why = svc.manager_why_not(the_plan.platform)
    reload = [["systemctl", "--user", "daemon-reload"]] if the_plan.platform == "systemd" else []
    if why is None:
        for line in svc.run_commands(the_plan.unload, check=False):
            echo(line)
    the_plan.path.unlink()
    echo(f"removed {the_plan.path}")
    if why is not None:
        _skipped(the_plan, why, [*the_plan.unload, *reload])
        return
    for line in svc.run_commands(reload, check=False):
        echo(line)


@service.command()
def status() -> None:
    """Whether the service is installed and the proxy up; where it records. Exits 3 when it is down."""
    the_plan = svc.plan()
    kind = "systemd user unit" if the_plan.platform == "systemd" else "launchd agent"
    if not the_plan.path.exists():
        echo(f"service   not installed (no {the_plan.path}): llmtap service install")
    elif (why := svc.manager_why_not(the_plan.platform)) is not None:
        echo(f"service   {kind} {the_plan.path}; its manager is not running here ({why})")
    else:
        echo(f"service   {kind} {the_plan.path}: {svc.manager_state(the_plan.platform)}")
    live = running.find_running()
    if live is None:
        echo("proxy     down: no llmtap serve answers; tools pointed at llmtap fail with connection refused")
        raise SystemExit(3)
    echo(f"proxy     up at {live.url} (PID {live.pid}), recording to {live.db or 'nothing (--no-measure)'}")


@service.command()
@click.option("-n", "--lines", type=click.IntRange(min=0), default=100, show_default=True, help="Lines to show.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines.")
def logs(lines: int, follow: bool) -> None:
    """Show the service's output (the journal on Linux, the log file on macOS)."""
    the_plan = svc.plan()
    if the_plan.log is not None and not the_plan.log.exists():
        raise click.ClickException(f"no log yet at {the_plan.log}")
    argv = svc.logs_command(the_plan.platform, lines, follow, the_plan.log)
    try:
        raise SystemExit(subprocess.call(argv))
    except FileNotFoundError:
        raise click.ClickException(f"{argv[0]} not found: the service's output is where the service manager keeps it") from None
    except KeyboardInterrupt:
        raise SystemExit(0) from None
