"""`llmtap service`: the systemd unit and launchd agent it writes, install without a service manager,
and the unit's own ExecStart, run as a process, serving. Nothing here talks to a real systemd or
launchd: PATH holds neither systemctl nor launchctl."""

from __future__ import annotations

import asyncio
import os
import plistlib
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from click.testing import CliRunner

from proxy.common import instances as running
from .state_files import state_of
from proxy.cli import main
from proxy.simulator.app import Simulator
from proxy.tools import service as svc

LLMTAP = Path(sys.executable).with_name("llmtap")  # the console script of this venv


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME of its own, and a PATH without systemctl or launchctl (nor anything else)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    empty = tmp_path / "no-tools"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    return home


def config_file(tmp_path: Path, upstream: str = "http://127.0.0.1:9") -> Path:
    path = tmp_path / "config.toml"
    path.write_text(f'upstream = "{upstream}"\nport = 0\ndb = "{tmp_path / "svc.duckdb"}"\nquiet = true\n')
    return path


def test_unit_text(tmp_path: Path):
    config = config_file(tmp_path)
    plan = svc.plan(config, platform="systemd", home=tmp_path, environ={"LLMTAP_HOME": "/data/my llmtap", "OTHER": "x"})
    assert plan.path == tmp_path / ".config/systemd/user/llmtap.service"
    lines = plan.text.splitlines()
    assert f"ExecStart={LLMTAP} serve --config {config}" in lines
    assert 'Environment="LLMTAP_HOME=/data/my llmtap"' in lines
    assert not any("OTHER" in line for line in lines)
    for line in ("[Service]", "Restart=on-failure", "RestartSec=5", "KillSignal=SIGTERM", "[Install]",
                 "WantedBy=default.target"):
        assert line in lines
    assert plan.load == [["systemctl", "--user", "daemon-reload"], ["systemctl", "--user", "enable", "--now", "llmtap"]]


def test_systemd_quoting():
    assert svc.systemd_quote("/usr/bin/llmtap") == "/usr/bin/llmtap"
    assert svc.systemd_quote("/a b/c") == '"/a b/c"'
    assert svc.systemd_quote('say "hi" \\ 100% $HOME') == '"say \\"hi\\" \\\\ 100%% $$HOME"'
    assert svc.systemd_quote("50%") == "50%%"


def test_plist_text(tmp_path: Path):
    config = config_file(tmp_path)
    plan = svc.plan(config, platform="launchd", home=tmp_path, environ={"LLMTAP_HOME": "/data/h"})
    assert plan.path == tmp_path / "Library/LaunchAgents/dev.llmtap.serve.plist"
    agent = plistlib.loads(plan.text.encode())
    assert agent["Label"] == "dev.llmtap.serve"
    assert agent["ProgramArguments"] == [str(LLMTAP), "serve", "--config", str(config)]
    assert agent["RunAtLoad"] is True and agent["KeepAlive"] == {"SuccessfulExit": False}
    assert agent["StandardOutPath"] == agent["StandardErrorPath"] == str(tmp_path / "Library/Logs/llmtap/serve.log")
    assert agent["EnvironmentVariables"] == {"LLMTAP_HOME": "/data/h"}
    assert plan.load == [["launchctl", "bootstrap", f"gui/{os.getuid()}", str(plan.path)]]
    assert plan.unload == [["launchctl", "bootout", f"gui/{os.getuid()}/dev.llmtap.serve"]]


def test_serve_command_without_the_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python3"))  # no llmtap beside it
    assert svc.serve_command() == [str(tmp_path / "python3"), "-m", "proxy", "serve"]


def test_install_dry_run_writes_nothing(home: Path, tmp_path: Path):
    config = config_file(tmp_path)
    done = CliRunner().invoke(main, ["service", "install", "--config", str(config), "--dry-run"])
    assert done.exit_code == 0, done.output
    unit = home / ".config/systemd/user/llmtap.service"
    assert done.output.startswith(f"# {unit}\n# Written by `llmtap service install`")
    assert f"ExecStart={LLMTAP} serve --config {config}\n" in done.output
    assert done.output.endswith("# then: systemctl --user daemon-reload && systemctl --user enable --now llmtap\n")
    assert not unit.exists()


def test_install_refuses_a_config_serve_cannot_start_with(home: Path):
    done = CliRunner().invoke(main, ["service", "install"])
    assert done.exit_code == 1
    assert "serve would not start with this configuration: no upstream configured" in done.output
    assert not (home / ".config/systemd/user/llmtap.service").exists()


def test_install_without_systemd_writes_the_unit_and_says_what_it_skipped(home: Path, tmp_path: Path):
    config = config_file(tmp_path)
    runner = CliRunner()
    done = runner.invoke(main, ["service", "install", "--config", str(config)])
    assert done.exit_code == 0, done.output
    unit = home / ".config/systemd/user/llmtap.service"
    assert done.output == (
        f"wrote {unit}\n"
        "systemd's user manager is not running here (systemctl not found): skipped\n"
        "  systemctl --user daemon-reload && systemctl --user enable --now llmtap\n"
        "run them in a login session where it runs (for a machine without logins: loginctl enable-linger $USER)\n")
    assert unit.read_text() == svc.plan(config).text
    assert runner.invoke(main, ["service", "install", "--config", str(config)]).output.startswith(f"{unit} is up to date\n")

    done = runner.invoke(main, ["service", "status"])
    assert done.exit_code == 3
    assert done.output == (
        f"service   systemd user unit {unit}; its manager is not running here (systemctl not found)\n"
        "proxy     down: no llmtap serve answers; tools pointed at llmtap fail with connection refused\n")

    done = runner.invoke(main, ["service", "uninstall"])
    assert done.exit_code == 0, done.output
    assert done.output.startswith(f"removed {unit}\nsystemd's user manager is not running here")
    assert not unit.exists()


def unit_command(unit: Path) -> tuple[list[str], dict[str, str]]:
    """ExecStart's command line and the Environment= of a unit (llmtap's own quoting, which shlex reads)."""
    argv: list[str] = []
    env: dict[str, str] = {}
    for line in unit.read_text().splitlines():
        if line.startswith("ExecStart="):
            argv = shlex.split(line.removeprefix("ExecStart="))
        elif line.startswith("Environment="):
            key, _, value = shlex.split(line.removeprefix("Environment="))[0].partition("=")
            env[key] = value
    return argv, env


async def test_the_units_exec_start_serves(home: Path, tmp_path: Path, sim: Simulator,
                                           llmtap_home: Path):
    config = config_file(tmp_path, sim.url)
    done = await asyncio.to_thread(CliRunner().invoke, main, ["service", "install", "--config", str(config)])
    assert done.exit_code == 0, done.output
    argv, env = unit_command(home / ".config/systemd/user/llmtap.service")
    assert argv == [str(LLMTAP), "serve", "--config", str(config)] and env["LLMTAP_HOME"] == str(llmtap_home)
    log = tmp_path / "service.log"
    with open(log, "wb") as out:
        # as systemd would start it: that command line, that environment (and a PATH with the basics)
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                env={"PATH": "/usr/bin:/bin", "HOME": str(home), **env})
    try:
        for _ in range(400):  # bounded: until its state file appears and it answers its health check
            assert proc.poll() is None, log.read_text()
            live = await asyncio.to_thread(running.find_running, tmp_path / "svc.duckdb")
            if live is not None:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError(f"no health answer: {log.read_text()}")
        assert live.pid == proc.pid and state_of(proc.pid) is not None
        async with aiohttp.ClientSession() as session:
            async with session.post(live.url + "/v1/chat/completions",
                                    json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}) as r:
                assert r.status == 200
        status = await asyncio.to_thread(CliRunner().invoke, main, ["service", "status"])
        assert status.exit_code == 0, status.output
        assert f"proxy     up at {live.url} (PID {proc.pid}), recording to {tmp_path / 'svc.duckdb'}" in status.output
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 30)
    assert code == 0, log.read_text()
    assert state_of(proc.pid) is None  # its state file went with it


def test_logs_without_journalctl(home: Path):
    done = CliRunner().invoke(main, ["service", "logs", "-n", "5"])
    assert done.exit_code == 1
    assert "journalctl not found" in done.output
    assert svc.logs_command("systemd", 5, True) == ["journalctl", "--user", "-u", "llmtap", "-n", "5", "--no-pager", "-f"]
    assert svc.logs_command("launchd", 5, False, home / "serve.log") == ["tail", "-n", "5", str(home / "serve.log")]
