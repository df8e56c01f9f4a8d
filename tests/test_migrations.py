from __future__ import annotations

import duckdb
import pytest

from proxy.record.migrations import MIGRATIONS, m001_initial, migrate
from proxy.common.schema import AGENT_EVENT_COLUMNS, CHUNK_COLUMNS, REQUEST_COLUMNS


def columns(con: duckdb.DuckDBPyConnection, table: str) -> list[tuple[str, str]]:
    return [(row[0], row[1]) for row in con.execute(f"DESCRIBE {table}").fetchall()]


def expected(cols: tuple[tuple[str, str], ...]) -> list[tuple[str, str]]:
    """schema.py's types as DuckDB spells them back (TIMESTAMPTZ -> TIMESTAMP WITH TIME ZONE)."""
    return [(name, str(duckdb.sqltype(type_))) for name, type_ in cols]


def recorded(con: duckdb.DuckDBPyConnection) -> list[str]:
    return [n for (n,) in con.execute("SELECT name FROM _llmtap_migrations ORDER BY name").fetchall()]


def test_final_schema_is_the_column_contract():
    con = duckdb.connect()
    migrate(con)
    assert columns(con, "requests") == expected(REQUEST_COLUMNS)
    assert columns(con, "chunks") == expected(CHUNK_COLUMNS)
    assert columns(con, "agent_events") == expected(AGENT_EVENT_COLUMNS)


def test_migrations_are_named_in_order():
    names = [fn.__name__ for fn in MIGRATIONS]
    assert names[0] == "m001_initial"
    assert names == sorted(names) and len(set(names)) == len(names)
    assert all(n[0] == "m" and n[1:4].isdigit() for n in names)


@pytest.mark.parametrize("prefix", range(1, len(MIGRATIONS) + 1))
def test_a_database_at_any_earlier_version_is_brought_up_to_date(tmp_path, prefix):
    path = str(tmp_path / "old.duckdb")
    con = duckdb.connect(path)
    assert migrate(con, MIGRATIONS[:prefix]) == [fn.__name__ for fn in MIGRATIONS[:prefix]]
    con.execute("INSERT INTO requests (id, status) VALUES ('old', 200)")
    con.close()

    con = duckdb.connect(path)
    assert migrate(con) == [fn.__name__ for fn in MIGRATIONS[prefix:]]
    assert migrate(con) == []
    assert recorded(con) == sorted(fn.__name__ for fn in MIGRATIONS)
    assert columns(con, "requests") == expected(REQUEST_COLUMNS)
    assert columns(con, "chunks") == expected(CHUNK_COLUMNS)
    assert con.execute("SELECT id, status FROM requests").fetchall() == [("old", 200)]


def test_applied_at_is_recorded():
    con = duckdb.connect()
    migrate(con)
    (ts,) = con.execute("SELECT applied_at FROM _llmtap_migrations WHERE name = 'm001_initial'").fetchone()
    assert ts is not None and ts.utcoffset() is not None


def test_a_failing_migration_leaves_neither_its_changes_nor_its_record():
    def m002_broken(con: duckdb.DuckDBPyConnection) -> None:
        con.execute("ALTER TABLE requests ADD COLUMN half_done INTEGER")
        raise RuntimeError("boom")

    con = duckdb.connect()
    with pytest.raises(RuntimeError, match="boom"):
        migrate(con, [m001_initial, m002_broken])
    assert recorded(con) == ["m001_initial"]
    assert "half_done" not in [name for name, _ in columns(con, "requests")]
    assert migrate(con, [m001_initial]) == []
