"""What `llmtap` imports to start: each command loads only what it runs (no timing: the modules)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click

from proxy.cli import COMMANDS, main

from .analysis_fixture import build_fixture_db

# The proxy's server, the simulator and the bench pull in aiohttp's server and most of the proxy.
HEAVY = ("aiohttp", "proxy.serve.server", "proxy.relay.app", "proxy.simulator", "analysis.bench", "analysis.top",
         "analysis.html.report", "uvloop", "opentelemetry", "prometheus_client")


def loaded_after(code: str, tmp_path: Path) -> list[str]:
    """The modules a fresh interpreter has loaded after running `code`."""
    script = code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LLMTAP_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if m.startswith(HEAVY)]


def test_importing_the_cli_loads_no_command(tmp_path: Path) -> None:
    modules = loaded_after("import proxy.cli", tmp_path)
    assert heavy(modules) == []
    assert not [m for m in modules if m.startswith("analysis") or m == "duckdb"]


def test_version_sql_and_report_load_neither_server_nor_bench(tmp_path: Path) -> None:
    run = "from proxy.cli import main\ntry:\n    main({args}, standalone_mode=False)\nexcept (SystemExit, Exception):\n    pass"
    assert heavy(loaded_after(run.format(args=["--version"]), tmp_path)) == []
    db = str(tmp_path / "fixture.duckdb")
    build_fixture_db(Path(db))
    for args in (["sql", "--db", db, "SELECT 1"], ["report", "--db", db], ["errors", "--db", db],
                 ["show", "--db", db, "abc"], ["report", "--db", str(tmp_path / "none.duckdb")]):
        assert heavy(loaded_after(run.format(args=args), tmp_path)) == [], args


def test_every_command_is_listed_and_loads() -> None:
    ctx = click.Context(main)
    assert set(main.list_commands(ctx)) == {"serve", *COMMANDS}
    for name in COMMANDS:
        command = main.get_command(ctx, name)
        assert command is not None and command.name == name


def test_a_typo_gets_did_you_mean() -> None:
    from click.testing import CliRunner

    typo = CliRunner().invoke(main, ["reprot", "--by", "tool"])
    assert typo.exit_code == 2
    assert "No such command 'reprot'. Did you mean 'report' or 'export'?" in typo.output
    assert "Did you mean 'sessions' or 'session'?" in CliRunner().invoke(main, ["sesions"]).output
    unknown = CliRunner().invoke(main, ["xyzzy"])
    assert unknown.exit_code == 2 and "No such command 'xyzzy'." in unknown.output
    assert "Did you mean" not in unknown.output
