"""`llmtap setup`, `llmtap run`, `llmtap doctor`: a thin click layer; `register(group)` adds them."""

from __future__ import annotations

from pathlib import Path

import click

from proxy.settings.cli_options import config_option, db_option
from proxy.common.instances import DEFAULT_URL, LiveProxy, find_running
from proxy.common.terminal_text import echo
from proxy.tools.endpoint import base_urls, strip_v1
from proxy.tools.setup import CODEX_LOGINS, TOOLS
from proxy.tools import telemetry_setup
from proxy.tools.telemetry_setup import Telemetry


@click.command()
@click.argument("tool", type=click.Choice(TOOLS))
@click.option("--base-url", metavar="URL",
              help="The proxy's address (default: the running proxy, else http://127.0.0.1:8787).")
@click.option("--write", is_flag=True, help="Merge it into the tool's config file (after a timestamped backup).")
@click.option("--codex-home", type=click.Path(file_okay=False, path_type=Path),
              help="Codex's directory (default: $CODEX_HOME, else ~/.codex).")
@click.option("--env-key", default="OPENAI_API_KEY", show_default=True,
              help="Codex: the variable holding the API key.")
@click.option("--codex-login", type=click.Choice(CODEX_LOGINS),
              help="Codex: how it signs in (default: read from its auth.json; a ChatGPT login is kept).")
@click.option("--data-dir", "cline_data_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Cline's --data-dir (default: $CLINE_DATA_DIR, else ~/.cline/data).")
@click.option("--no-telemetry", is_flag=True,
              help="Leave out the tool's own OpenTelemetry to llmtap (Claude Code, Codex: its tool runs and approvals).")
def setup(tool: str, base_url: str | None, write: bool, codex_home: Path | None, env_key: str,
          codex_login: str | None, cline_data_dir: Path | None, no_telemetry: bool) -> None:
    """Print (or --write) the config that points TOOL at llmtap."""
    from proxy.settings.client_key import SecretFileError
    from proxy.tools import config_files
    from proxy.tools.setup import Locations, plan
    from proxy.tools.setup import write as write_config

    live = find_running()
    if base_url:
        urls = base_urls(strip_v1(base_url))
    else:
        urls = base_urls(live.url, live.prefixes) if live else base_urls(DEFAULT_URL)
    where = Locations.from_env(codex_home=codex_home, cline_data_dir=cline_data_dir)
    try:
        key = _client_key(live)
        the_plan = plan(tool, urls, where, env_key, codex_login, key)
        if the_plan.file is not None:
            echo(f"# {the_plan.file}")
        echo(the_plan.text, nl=False)
        for note in the_plan.notes:
            echo(f"# {note}")
        telemetry = None if no_telemetry else _telemetry(tool, live.url if live else base_url or DEFAULT_URL)
        agent_file = telemetry_setup.settings_file(tool, where) if telemetry else None
        if telemetry is not None and agent_file is not None:
            change = telemetry_setup.change(tool, agent_file, telemetry)
            echo(f"# and in {agent_file}, its own telemetry (--no-telemetry: not):\n{change.shown}# {change.note}")
        if not write:
            if the_plan.file is not None or the_plan.edits:
                echo(f"# write it there with: llmtap setup {tool} --write")
            return
        results = write_config(tool, urls, where, env_key, login=codex_login, client_key=key)
        extra = (telemetry_setup.write(tool, agent_file, telemetry)
                 if telemetry is not None and agent_file is not None else None)
    except (ValueError, config_files.ConfigFileError, SecretFileError) as exc:  # SetupError, TOML's too
        raise click.ClickException(str(exc)) from None
    for written in (*results, extra):
        if written is None:
            continue
        if not written.changed:
            echo(f"{written.path} already has this configuration: nothing written")
        else:
            echo(f"wrote {written.path}" + (f" (owner-only backup: {written.backup})" if written.backup
                                            else " (new file, owner-only)"))
        for line in written.tightened_lines():
            echo(line)


def _telemetry(tool: str, url: str) -> Telemetry | None:
    """Where the tool's own OpenTelemetry goes (the proxy's root URL), with the token; None for a tool without."""
    import urllib.parse

    from proxy.common import paths
    from proxy.settings.client_key import telemetry_token

    if tool not in telemetry_setup.TOOLS:
        return None
    parts = urllib.parse.urlsplit(url)
    return Telemetry(f"{parts.scheme}://{parts.netloc}", telemetry_token(), str(paths.telemetry_token_path()))


def _client_key(live: LiveProxy | None) -> str | None:
    """llmtap's client key when the proxy injects the upstream key: the running one says so in its
    health answer; without one running, the config file's key settings do."""
    from proxy.settings import config as cfg
    from proxy.settings.client_key import client_key

    if live is not None:
        return client_key() if live.injects_keys else None
    try:
        config = cfg.build(None, {})
    except cfg.ConfigError:
        return None
    return client_key() if config.upstream_key_env or config.route_key_env else None


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--tag", help="Tag for this run's rows (default: run-<time>-<random>).")
@click.option("--upstream", help="Upstream for a proxy started here (default: the config file's).")
@config_option
@db_option("db", "DuckDB file for a proxy started here", resolve=False)
@click.option("--port", type=click.IntRange(0, 65535),
              help="Port for a proxy started here (default: the config's, else 8787; any free port if taken).")
@click.option("--verbose", is_flag=True, help="Print a line per request (proxy started here).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def run(command: tuple[str, ...], tag: str | None, upstream: str | None, config_path: Path | None,
        db: str | None, port: int | None, verbose: bool) -> None:
    """Run COMMAND through llmtap, then summarize its requests.

    Uses the running `llmtap serve`, else starts a proxy for the command's
    duration. Exits with the command's exit code. Examples:

    \b
      llmtap run --tag try1 -- claude -p "say hi"
      llmtap run --upstream https://api.openai.com -- codex exec "say hi"
    """
    from proxy.tools.run import RunError, execute

    def report(line: str) -> None:
        echo(line, err=True)

    try:
        outcome = execute(list(command), tag=tag, upstream=upstream, config_path=config_path, db=db,
                          port=port, verbose=verbose, report=report)
    except RunError as exc:
        echo(f"Error: {exc}", err=True)
        raise SystemExit(exc.exit_code) from None
    echo(outcome.summary, err=True)
    raise SystemExit(outcome.exit_code)


@click.command()
@click.option("--upstream", "upstreams", multiple=True, metavar="URL",
              help="Check this upstream (repeatable; default: the running proxy's, else the config file's).")
@config_option
@db_option("db", "DuckDB file to check", resolve=False)
@click.option("--port", type=int, help="Port to check (default: the config's, else 8787).")
@click.option("--timeout", type=click.FloatRange(min=0.1, max=60), default=5.0, show_default=True,
              help="Seconds for each network step.")
def doctor(upstreams: tuple[str, ...], config_path: Path | None, db: str | None, port: int | None,
           timeout: float) -> None:
    """Check proxies, keys, base URLs, port, database, upstream.

    Prints OK, WARN or FAIL with the fix for each; exits 1 on any FAIL.
    """
    import os

    from proxy.tools.doctor import Options, diagnose, exit_code, render

    checks = diagnose(Options(env=dict(os.environ), config_path=config_path, upstreams=upstreams, db=db,
                              port=port, timeout=timeout))
    echo(render(checks), nl=False)
    raise SystemExit(exit_code(checks))


def register(group: click.Group) -> None:
    """Add setup, run and doctor to the `llmtap` group."""
    group.add_command(setup)
    group.add_command(run)
    group.add_command(doctor)
