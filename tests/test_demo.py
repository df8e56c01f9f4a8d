"""`llmtap demo`, the README's first command, runs end to end and leaves a useful database."""

from __future__ import annotations

from pathlib import Path

import duckdb
from click.testing import CliRunner

from proxy.cli import main


def test_demo_records_a_realistic_mix(tmp_path: Path) -> None:
    db = tmp_path / "demo.duckdb"
    result = CliRunner().invoke(main, ["demo", "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert "by model" in result.output and "5 slowest requests" in result.output
    assert f"36 requests recorded in {db}" in result.output
    con = duckdb.connect(str(db), read_only=True)
    dialects = {r[0] for r in con.execute("SELECT DISTINCT dialect FROM requests").fetchall()}
    outcomes = dict(con.execute("SELECT outcome, count(*) FROM requests GROUP BY ALL").fetchall())
    tools = {r[0] for r in con.execute("SELECT DISTINCT tool FROM requests").fetchall()}
    assert dialects == {"openai_chat", "openai_responses", "anthropic"}
    assert outcomes["ok"] == 32 and outcomes["http_error"] == 3 and outcomes["stream_truncated"] == 1
    assert tools == {"openai-python", "anthropic-python"}
    assert con.execute("SELECT count(*) FROM requests WHERE tag = 'demo' AND ttft_ms IS NOT NULL").fetchone()[0] >= 25
