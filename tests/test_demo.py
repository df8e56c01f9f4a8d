"""`llmtap demo`, the README's first command, then what a new user types next, in a fresh HOME."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import duckdb

LLMTAP = Path(sys.executable).with_name("llmtap")  # the console script of the README's venv install


def llmtap(*args: str, home: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [str(LLMTAP)] if LLMTAP.exists() else [sys.executable, "-m", "proxy"]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8"}  # no LLMTAP_HOME, no venv on PATH
    return subprocess.run([*command, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=180)


def test_demo_then_report_show_and_sql_as_a_new_user_would(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    demo = llmtap("demo", home=home, cwd=tmp_path)
    assert demo.returncode == 0, demo.stderr
    db = home / ".local/share/llmtap/demo.duckdb"
    assert f"56 requests recorded in {db}" in demo.stdout
    assert "generations from" in demo.stdout and "5 slowest requests" in demo.stdout
    assert "not shown: 4 probe, 4 token_count, 3 prewarm, 2 model_list" in demo.stdout

    con = duckdb.connect(str(db), read_only=True)
    kinds = dict(con.execute("SELECT kind, count(*) FROM requests GROUP BY ALL").fetchall())
    outcomes = dict(con.execute("SELECT outcome, count(*) FROM requests GROUP BY ALL").fetchall())
    tools = {r[0] for r in con.execute("SELECT DISTINCT tool FROM requests").fetchall()}
    codex_ttft = con.execute("SELECT count(ttft_ms) FROM requests WHERE tool = 'codex' AND kind = 'generation'"
                             " AND stream").fetchone()[0]
    con.close()
    assert kinds == {"generation": 43, "token_count": 4, "probe": 4, "prewarm": 3, "model_list": 2}
    assert outcomes["ok"] == 52 and outcomes["http_error"] == 3 and outcomes["stream_truncated"] == 1
    assert tools == {"openai-python", "anthropic-python", "claude-code", "codex"}
    assert codex_ttft == 3  # Codex's WebSocket turns streamed, so they have a TTFT

    # `llmtap report` with no --db reads the demo's database until serve has recorded one, and says so
    report = llmtap("report", home=home, cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert "reading the demo's" in report.stderr and str(db) in report.stderr
    assert report.stdout.startswith("43 generations from ")

    # every "Try next" line works as printed (serve aside: it would run until stopped)
    hints = demo.stdout.split("Try next:\n", 1)[1].splitlines()
    commands = [shlex.split(line.split("#", 1)[0]) for line in hints if line.startswith("  ")]
    assert [c[1] for c in commands] == ["report", "show", "sql", "serve"]
    assert all(c[0] == str(LLMTAP) for c in commands)  # not a bare `llmtap`: the venv is not on PATH
    assert "source " in hints[-1] and "activate" in hints[-1]
    for command in commands[:3]:
        done = llmtap(*command[1:], home=home, cwd=tmp_path)
        assert done.returncode == 0, (command, done.stderr)
        assert done.stdout.strip()
    by_kind = llmtap("report", "--by", "kind", home=home, cwd=tmp_path).stdout
    assert "56 requests from" in by_kind and all(k in by_kind for k in ("token_count", "probe", "prewarm"))


def test_report_says_where_to_look_when_there_is_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    done = llmtap("report", home=home, cwd=tmp_path)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "llmtap demo" in done.stderr or "llmtap serve" in done.stderr
    assert not os.path.exists(home / ".local/share/llmtap/llmtap.duckdb")


def test_demo_port_try_next_with_db_then_status_and_show_after_serve(tmp_path: Path) -> None:
    """In-process (this worktree's code): --port, "Try next" always with --db, `status` before serve
    reads the demo's database, and `show ID` on the default database points to the demo's."""
    import re
    import socket

    from click.testing import CliRunner

    from proxy.common import paths
    from proxy.cli import main
    from .analysis_fixture import build_fixture_db

    with socket.socket() as probe:  # a free port for --port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    demo = CliRunner().invoke(main, ["demo", "--port", str(port)])
    assert demo.exit_code == 0, demo.output
    assert f"proxy http://localhost:{port}" in demo.output or f":{port}," in demo.output
    db = paths.data_dir() / "demo.duckdb"
    hints = demo.output.split("Try next:\n", 1)[1].splitlines()
    commands = [shlex.split(line.split("#", 1)[0]) for line in hints if line.startswith("  ")]
    assert [c[c.index("--db") + 1] for c in commands[:3]] == [str(db)] * 3  # report, show, sql

    status = CliRunner().invoke(main, ["status"])
    assert status.exit_code == 0, status.output
    assert "reading the demo's" in status.output and str(db) in status.output
    assert "run `llmtap serve` or `llmtap demo` first" not in status.output

    slowest = commands[1][-1]
    build_fixture_db(paths.default_db_path())  # what `serve` leaves: a database without the demo's rows
    shown = CliRunner().invoke(main, ["show", slowest])
    assert shown.exit_code == 1
    assert re.search(rf"no request id starts with {slowest} in .*llmtap.duckdb; the demo's database has it:"
                     rf" `llmtap show --db {re.escape(str(db))} {slowest}`", " ".join(shown.output.split()))
    assert CliRunner().invoke(main, ["show", "--db", str(db), slowest]).exit_code == 0
    missing = CliRunner().invoke(main, ["show", "ffffffff"])
    assert missing.exit_code == 1 and "demo" not in missing.output


def test_demo_into_a_directory_others_can_write_says_why_without_a_traceback(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from proxy.cli import main

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # as /tmp is: the old README's `demo --db /tmp/readme-demo.duckdb`
    result = CliRunner().invoke(main, ["demo", "--db", str(shared / "demo.duckdb"), "--port", "0"])
    assert result.exit_code == 1 and result.exception is not None and isinstance(result.exception, SystemExit)
    assert "refusing to write to the database" in result.output and "chmod go-w" in result.output
