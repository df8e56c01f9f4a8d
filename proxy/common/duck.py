"""Every DuckDB connection llmtap opens: one place for the settings and checks they all need."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

import duckdb


def connect(path: str | Path = ":memory:", *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """llmtap never downloads anything at run time: an extension (httpfs for s3://) loads only
    when it is already installed. Set after opening, not as a connect() config, so that other
    connections to the same file in this process are not refused for a different configuration.

    A file opened for writing must be in a place no other user controls (`refuse_untrusted`)."""
    if not read_only and str(path) != ":memory:":
        refuse_untrusted(path)
    con = duckdb.connect(str(path), read_only=read_only)
    try:
        con.execute("SET autoinstall_known_extensions = false")
    except duckdb.InvalidInputException:  # this process has the file open already, locked down
        pass
    return con


class UntrustedDatabase(duckdb.PermissionException):
    """A database to write is in a place another user controls; the message says what to do."""

    def __init__(self, problem: str, fix: str) -> None:
        self.problem, self.fix = problem, fix
        super().__init__(f"refusing to write to the database: {problem}. {fix}")


SIDE_FILES = (".wal", ".tmp")  # DuckDB's write-ahead log and its spill directory, beside the file


def refuse_untrusted(path: str | Path) -> None:
    """Refuse to write a database another user could have planted, or could read or swap later:
    as OpenSSH's StrictModes does with keys, though a little stricter about the directory itself.

    - the file, its `.wal` and its `.tmp` spill directory, those that exist: owned by this user
      (or root), and not writable by group or others;
    - the directory it is in: the same, sticky or not, since DuckDB creates the `.wal` and `.tmp`
      by name later and anyone who can create files there could have made them first;
    - every directory above, up to `/`: owned by this user or root, and not writable by group or
      others unless sticky (`/tmp`), where no one else can rename or remove what is ours.

    The path is resolved first (symlinks followed), so the check is on the file actually opened."""
    target = Path(os.path.realpath(Path(path).expanduser()))
    uid = os.geteuid()
    for side in ("", *SIDE_FILES):
        _check(target.with_name(target.name + side), uid, sticky_ok=False, what="the database file")
    parent = target.parent
    while not parent.exists() and parent != parent.parent:  # a directory not made yet: the one it goes in
        parent = parent.parent
    _check(parent, uid, sticky_ok=False, what="the database's directory")
    for above in parent.parents:
        _check(above, uid, sticky_ok=True, what="a directory above the database")


def _check(path: Path, uid: int, *, sticky_ok: bool, what: str) -> None:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UntrustedDatabase(f"cannot check {path}: {exc.strerror}", "choose another --db") from None
    if st.st_uid not in (uid, 0):
        problem = f"is owned by another user (uid {st.st_uid})"
        fix = "Move it aside if it is not yours, or choose another --db"
    elif st.st_mode & 0o022 and not (sticky_ok and st.st_mode & stat.S_ISVTX):
        who = "others" if st.st_mode & 0o002 else "its group"
        problem = f"can be written by {who} (mode {st.st_mode & 0o7777:04o})"
        fix = f"Run chmod go-w {path} (and check that what is in it is yours), or choose another --db"
    else:
        return
    raise UntrustedDatabase(
        f"{path} ({what}) {problem}, so another user could have planted the file, or could read or replace it",
        f"{fix}; a directory only you can write is safe (the default, ~/.local/share/llmtap, is one)")


@contextlib.contextmanager
def private_umask() -> Iterator[None]:
    """Files DuckDB creates meanwhile (the database, its .wal) are readable by their owner only.

    The umask is per process: a file another thread creates in this window is private too,
    which errs on the safe side.
    """
    old = os.umask(0o077)
    os.umask(old | 0o077)
    try:
        yield
    finally:
        os.umask(old)


def _sql_list(values: Iterable[str]) -> str:
    return "[" + ", ".join("'" + v.replace("'", "''") + "'" for v in values) + "]"


def lock_down(con: duckdb.DuckDBPyConnection, *, directories: Iterable[str | Path] = (),
              paths: Iterable[str | Path] = ()) -> None:
    """From now on SQL on this database instance touches nothing but its own files: no file or
    network access (`read_text`, `glob`, `COPY ... TO`, `ATTACH`, http), no extension installed
    or loaded, no setting changed — except the `directories` and `paths` named here.

    DuckDB's own controls, not a deny-list of statements: `enable_external_access` cannot be
    turned back on, and `lock_configuration` refuses every later SET. Settings a connection
    needs (TimeZone, memory_limit) must be set before this call."""
    dirs = [str(Path(d).expanduser().resolve()) for d in directories]
    files = [str(Path(p).expanduser().resolve()) for p in paths]
    if dirs:
        con.execute(f"SET allowed_directories = {_sql_list(dirs)}")
    if files:
        con.execute(f"SET allowed_paths = {_sql_list(files)}")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET allow_community_extensions = false")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
