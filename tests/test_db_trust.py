"""A database another user could have planted, or could read or swap, is never written to.

`serve --db` in a world-writable directory used to open a valid DuckDB file another user had put
there (mode 0666) and write prompts into it. Every open for writing now goes through
proxy/common/duck.py's `refuse_untrusted`; these tests plant the files as a real second Unix user would
(owned by that user) and check that serve, prune and compact refuse them and leave them
byte for byte as they were.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from .state_files import state_of
from proxy.cli import main
from proxy.record.store import Store
from proxy.record.store_reader import StoreError

from .other_user import open_dir, other_user  # noqa: F401 (fixtures)

REFUSED = "refusing to write to the database"


def plant(path: Path, owner: pwd.struct_passwd | None, mode: int) -> str:
    """A valid DuckDB database at `path`, as another user would leave it; its bytes' digest."""
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE planted AS SELECT 42 AS x")
    con.close()
    if owner is not None:
        os.chown(path, owner.pw_uid, owner.pw_gid)
    path.chmod(mode)
    return digest(path)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def serve_refuses(db: Path) -> str:
    """Start a real `llmtap serve --db db --capture-bodies`; its error when it refuses to start.
    Fails the test when serve starts instead."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--port", "0", "--upstream", "http://127.0.0.1:9",
         "--db", str(db), "--capture-bodies"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return proc.stderr.read() if proc.stderr else ""
        if state_of(proc.pid) is not None:
            proc.kill()
            proc.wait()
            raise AssertionError(f"serve started on {db}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("serve neither started nor stopped in 30 s")


def sticky_world_dir(parent: Path) -> Path:
    d = parent / "shared"
    d.mkdir()
    d.chmod(0o1777)
    return d


@pytest.mark.parametrize("case", ["planted by another user, 0666, in a sticky world-writable directory",
                                  "ours but 0666", "in a 0777 directory that is not sticky",
                                  "a .wal another user planted"])
def test_serve_refuses_a_database_another_user_could_have_planted(
        case: str, other_user: pwd.struct_passwd, open_dir: Path) -> None:
    if case.startswith("planted"):
        db = sticky_world_dir(open_dir) / "llmtap.duckdb"
        before = plant(db, other_user, 0o666)
        culprit = f"{db} (the database file) is owned by another user (uid {other_user.pw_uid})"
    elif case == "ours but 0666":
        db = open_dir / "llmtap.duckdb"
        before = plant(db, None, 0o666)
        culprit = f"{db} (the database file) can be written by others (mode 0666)"
    elif case.startswith("in a 0777"):
        (open_dir / "loose").mkdir()
        (open_dir / "loose").chmod(0o777)
        db = open_dir / "loose" / "llmtap.duckdb"
        before = plant(db, None, 0o600)
        culprit = f"{db.parent} (the database's directory) can be written by others (mode 0777)"
    else:
        db = open_dir / "llmtap.duckdb"
        before = plant(db, None, 0o600)
        wal = db.with_name(db.name + ".wal")
        wal.write_bytes(b"")
        os.chown(wal, other_user.pw_uid, other_user.pw_gid)
        culprit = f"{wal} (the database file) is owned by another user"
    err = serve_refuses(db)
    assert REFUSED in err and culprit in err, err
    assert digest(db) == before  # not a byte written
    assert not db.with_name(db.name + ".wal").exists() or case.startswith("a .wal")
    for command in (["prune", "--older-than", "30d"], ["compact"]):
        result = CliRunner().invoke(main, [*command, "--db", str(db)])
        assert result.exit_code != 0 and REFUSED in result.output and culprit in result.output, result.output
        assert digest(db) == before
    result = CliRunner().invoke(main, ["doctor", "--db", str(db)])
    assert f"FAIL  database {db}: not safe to write: {culprit}" in result.output, result.output
    assert digest(db) == before


def test_a_world_writable_directory_above_is_refused_unless_sticky(open_dir: Path) -> None:
    """/tmp (sticky) above our own 0700 directory is fine; a 0777 directory above it is not, since
    anyone could rename our directory away and put their own in its place."""
    loose = open_dir / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    (loose / "mine").mkdir(mode=0o700)
    with pytest.raises(StoreError, match=f"{loose} \\(a directory above the database\\) can be written by others"):
        Store(loose / "mine" / "llmtap.duckdb").start()
    assert not (loose / "mine" / "llmtap.duckdb").exists()
    loose.chmod(0o1777)
    store = Store(loose / "mine" / "llmtap.duckdb")
    store.start()
    store.close()
    assert (loose / "mine" / "llmtap.duckdb").stat().st_mode & 0o777 == 0o600


def test_a_database_of_ours_in_our_own_directory_opens(tmp_path: Path) -> None:
    db = tmp_path / "data" / "llmtap.duckdb"
    store = Store(db)
    store.start()
    store.close()
    result = CliRunner().invoke(main, ["prune", "--older-than", "30d", "--db", str(db)])
    assert result.exit_code == 0, result.output


def test_reading_commands_still_read_a_database_others_can_write(open_dir: Path) -> None:
    """Read-only opens write nothing, so `sql`, `report`, `show` and `export` are not refused."""
    db = open_dir / "llmtap.duckdb"
    store = Store(db)
    store.start()
    store.close()
    db.chmod(0o666)
    result = CliRunner().invoke(main, ["sql", "--db", str(db), "SELECT count(*) AS n FROM requests"])
    assert result.exit_code == 0 and "0" in result.output, result.output
