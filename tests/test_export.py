"""`llmtap export`: Parquet and CSV partitioned by day, read back with DuckDB."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner, Result

from .analysis_fixture import build_fixture_db, fixture_rows
from proxy.cli import main
from proxy.common.schema import CHUNK_COLUMN_NAMES, REQUEST_COLUMN_NAMES


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("export") / "fixture.duckdb"
    build_fixture_db(path)
    return path


def export(db: Path, out: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["export", "--db", str(db), "--out", str(out), *args])


def expected_days() -> tuple[Counter[str], Counter[str]]:
    """Rows per UTC day, computed from the fixture rows in plain Python."""
    requests, chunks = fixture_rows()
    day_of = {r["id"]: r["started_at"].date().isoformat() for r in requests}
    return Counter(day_of.values()), Counter(day_of[c["request_id"]] for c in chunks)


def read_back(directory: Path, reader: str = "read_parquet", ext: str = "parquet") -> duckdb.DuckDBPyRelation:
    con = duckdb.connect()
    return con.sql(f"SELECT * FROM {reader}('{directory}/*/*.{ext}', hive_partitioning = true)")


def per_day(directory: Path, reader: str = "read_parquet", ext: str = "parquet") -> Counter[str]:
    rows = read_back(directory, reader, ext).aggregate("CAST(day AS VARCHAR) AS day, count(*)").fetchall()
    return Counter({day: n for day, n in rows})


def test_export_parquet(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = export(db, out)
    assert result.exit_code == 0, result.output
    assert result.output == f"""\
requests: 31 rows in 3 days -> {out}/requests (parquet)
  day=2026-11-28      10 rows
  day=2026-11-29      12 rows
  day=2026-11-30       9 rows
chunks: 504 rows in 3 days -> {out}/chunks (parquet)
  day=2026-11-28     133 rows
  day=2026-11-29     225 rows
  day=2026-11-30     146 rows
"""
    requests, chunks = expected_days()
    assert per_day(out / "requests") == requests
    assert per_day(out / "chunks") == chunks
    assert sorted(p.name for p in (out / "requests").iterdir()) == [
        "day=2026-11-28", "day=2026-11-29", "day=2026-11-30"]


def test_exported_files_hold_the_table_columns(db: Path, tmp_path: Path) -> None:
    assert export(db, tmp_path / "out").exit_code == 0
    assert read_back(tmp_path / "out" / "requests").columns == [*REQUEST_COLUMN_NAMES, "day"]
    assert read_back(tmp_path / "out" / "chunks").columns == [*CHUNK_COLUMN_NAMES, "day"]
    first = read_back(tmp_path / "out" / "requests").filter("tool = 'curl'").project("e2e_ms, input_tokens")
    assert first.fetchall() == [(700.0, 50)]


def test_export_csv(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "csv"
    result = export(db, out, "--format", "csv")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == f"requests: 31 rows in 3 days -> {out}/requests (csv)"
    requests, chunks = expected_days()
    assert per_day(out / "requests", "read_csv", "csv") == requests
    assert per_day(out / "chunks", "read_csv", "csv") == chunks


def test_export_since(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "recent"
    result = export(db, out, "--since", "2026-11-30")
    assert result.exit_code == 0, result.output
    assert result.output == f"""\
requests: 9 rows in 1 day -> {out}/requests (parquet)
  day=2026-11-30       9 rows
chunks: 146 rows in 1 day -> {out}/chunks (parquet)
  day=2026-11-30     146 rows
"""


def test_export_refuses_to_overwrite_without_the_flag(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert export(db, out, "--since", "2026-11-30").exit_code == 0
    again = export(db, out)
    assert again.exit_code == 1
    assert again.output == (
        f"Error: {out}/requests and {out}/chunks already exist: pass --overwrite to replace them\n")
    replaced = export(db, out, "--overwrite")
    assert replaced.exit_code == 0, replaced.output
    assert per_day(out / "requests") == expected_days()[0]


def test_export_of_nothing(db: Path, tmp_path: Path) -> None:
    result = export(db, tmp_path / "none", "--since", "2030-01-01")
    assert result.exit_code == 0, result.output
    assert result.output == (
        f"requests: 0 rows in 0 days -> {tmp_path}/none/requests (parquet)\n"
        f"chunks: 0 rows in 0 days -> {tmp_path}/none/chunks (parquet)\n")
