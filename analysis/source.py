"""Where queries run: the database file, or the running proxy that holds it.

DuckDB lets one process write a file and locks it against every other
process, readers included. So `open_source` first opens the file read-only;
when a running `llmtap serve` holds the lock, it finds the proxy through its
state file and sends each query to `POST /_llmtap/sql` instead. Either way a
query answers `(columns, type names, rows)` and sees the views of `views.py`
(the proxy creates them on its query cursor too). Over HTTP, timestamps
arrive as ISO strings.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Protocol

import duckdb

from proxy import paths

from .views import create_views
from proxy import duck

TOKEN_HEADER = "X-Llmtap-Admin-Token"
# The proxy listens on this machine: never send its admin queries through HTTP(S)_PROXY.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
Result = tuple[list[str], list[str], list[tuple[Any, ...]]]


class SourceError(Exception):
    """A query or a connection failed; the message is for the user."""


class Source(Protocol):
    def query(self, sql: str) -> Result: ...

    def close(self) -> None: ...


class FileSource:
    """A read-only DuckDB connection to the database file."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con
        create_views(con)

    def query(self, sql: str) -> Result:
        try:
            cursor = self.con.execute(sql)
            if cursor.description is None:
                return [], [], []
            rows = cursor.fetchall()
        except duckdb.Error as exc:
            raise SourceError(str(exc)) from None
        columns = [d[0] for d in cursor.description]
        types = [str(d[1]) for d in cursor.description]
        return columns, types, rows

    def close(self) -> None:
        self.con.close()


class ServeSource:
    """Queries sent to a running `llmtap serve` (its admin SQL endpoint)."""

    def __init__(self, url: str, token: str | None, timeout: float = 300.0) -> None:
        self.url, self.token, self.timeout = url, token, timeout

    def query(self, sql: str) -> Result:
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers[TOKEN_HEADER] = self.token
        request = urllib.request.Request(
            self.url, data=json.dumps({"sql": sql}).encode(), headers=headers, method="POST"
        )
        try:
            with _DIRECT.open(request, timeout=self.timeout) as response:
                answer = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise SourceError(_http_error_message(exc)) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise SourceError(f"cannot reach llmtap serve at {self.url}: {reason}") from None
        if answer.get("truncated"):
            print("llmtap: the running proxy returned only the first 100,000 rows; "
                  "add a LIMIT or use `llmtap export`", file=sys.stderr)
        return answer["columns"], answer["types"], [tuple(row) for row in answer["rows"]]

    def close(self) -> None:
        pass


def _http_error_message(exc: urllib.error.HTTPError) -> str:
    try:
        message = json.loads(exc.read())["error"]
    except (ValueError, KeyError, TypeError):
        message = f"HTTP {exc.code} {exc.reason}"
    if exc.code in (401, 403):
        return f"llmtap serve refused the query: {message}"
    return message


def open_source(db_path: str | Path) -> Source:
    """The file itself when we can open it, else the `llmtap serve` holding it."""
    path = Path(db_path).expanduser()
    if not path.exists():
        raise SourceError(f"no database at {path} yet: run `llmtap serve` or `llmtap demo` first")
    try:
        con = duck.connect(path, read_only=True)
    except (duckdb.IOException, duckdb.ConnectionException) as exc:
        if not _is_lock_error(exc):
            raise SourceError(f"cannot open {path}: {exc}") from None
        return _serve_source(path, str(exc))
    except duckdb.Error as exc:
        raise SourceError(f"cannot open {path}: {exc}") from None
    try:
        return FileSource(con)
    except duckdb.Error as exc:
        con.close()
        raise SourceError(f"cannot read {path}: {exc}") from None


def _is_lock_error(exc: duckdb.Error) -> bool:
    """Another process holds the file, or this one holds it read-write."""
    return isinstance(exc, duckdb.ConnectionException) or "lock" in str(exc).lower()


def _serve_source(path: Path, lock_message: str) -> ServeSource:
    state_file = paths.state_path()
    try:
        state = json.loads(state_file.read_text())
        port = int(state["port"])
    except (OSError, ValueError, KeyError, TypeError):
        raise SourceError(
            f"{path} is in use by another process and no running `llmtap serve` was found"
            f" ({state_file} is missing or unreadable): {lock_message}"
        ) from None
    if _same_file(state.get("db"), path) is False:
        raise SourceError(
            f"{path} is in use by another process, and the running `llmtap serve` records to"
            f" {state.get('db')}, not to this file: {lock_message}"
        )
    return ServeSource(f"http://{_connect_host(state.get('host'))}:{port}/_llmtap/sql",
                       state.get("admin_token"))


def _same_file(recorded: str | None, path: Path) -> bool | None:
    if not recorded:
        return None
    return Path(recorded).expanduser().resolve() == path.resolve()


def _connect_host(host: str | None) -> str:
    """The address to reach a server listening on `host` (wildcards mean this machine)."""
    if not host or host == "0.0.0.0":
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host
