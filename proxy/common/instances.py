"""A running `llmtap serve`, as other processes find it and talk to it.

Each `llmtap serve` writes its own state file, `<data dir>/run/<port>.json` (directory 0700,
file 0600): pid, listening address, port, database and its admin token. Every other llmtap
command of the same account on this machine finds the proxy there — the one that holds the
database it asks about — and sends its admin requests (`/_llmtap/health`, `/sql`, `/live`,
`/metrics`) with that token. Other Unix users cannot read the file, and web pages cannot
read files at all, so neither can use the admin endpoint.

One owner for all of it: the state file (`write_state`, `states`), the address to connect to
(`connect_host`), and the admin client (`AdminClient`: token, health, SQL, the live feed's URL).
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import stat
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.common import paths

TOKEN_HEADER = "X-Llmtap-Admin-Token"
ADMIN_PREFIX = "/_llmtap/"
TAG_PREFIX = "/_tag/"  # a base URL /_tag/<tag>/... tags the rows of a tool that sends no custom header
DEFAULT_URL = "http://127.0.0.1:8787"
Result = tuple[list[str], list[str], list[tuple[Any, ...]]]
# The proxy listens on this machine: never send admin requests through HTTP(S)_PROXY.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class AdminError(Exception):
    """The proxy refused an admin request or could not be reached; the message is for the user."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def connect_host(host: str | None) -> str:
    """The address to reach a server listening on `host` (wildcards mean this machine), bracketed
    when it is an IPv6 literal."""
    if not host or host == "0.0.0.0":
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


# -- the state file ------------------------------------------------------------------------------


@dataclass(frozen=True)
class State:
    """One running (or crashed) proxy's state file."""

    path: Path
    pid: int | None
    host: str
    port: int
    db: str | None
    admin_token: str | None
    workers: tuple[int, ...] = ()  # the pids of `serve --workers N`'s worker processes (pid is the primary's)

    @property
    def url(self) -> str:
        return f"http://{connect_host(self.host)}:{self.port}"

    def holds(self, db: str | Path) -> bool:
        return self.db is not None and same_file(self.db, db)


def private_dir() -> Path:
    """The run directory, owner-only (0700): state files, and the private socket of `serve --workers`."""
    directory = paths.state_dir()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(directory, 0o700)  # an older, wider directory is narrowed
    return directory


_PRIVATE_SOCKET = re.compile(r"\d+\.(\d+)\.sock")  # run/<port>.<pid>.sock of serve --workers (workers.py)


def remove_stale_sockets() -> list[str]:
    """Remove the private sockets that primaries of `serve --workers` killed before their stop left
    in the run directory (one per kill): only names of that pattern, only sockets (never a symlink,
    which is not followed), only this user's, only when their pid is gone or nothing listens there.
    Nothing is done when the directory is not this user's own. The names removed."""
    try:
        fd = os.open(paths.state_dir(), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return []
    removed = []
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            return []
        for name in os.listdir(fd):
            m = _PRIVATE_SOCKET.fullmatch(name)
            if m is None or int(m[1]) == os.getpid():
                continue
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISSOCK(st.st_mode) and st.st_uid == os.geteuid() and not _answers(fd, name, int(m[1])):
                    os.unlink(name, dir_fd=fd)
                    removed.append(name)
            except OSError:
                continue
    finally:
        os.close(fd)
    return removed


def _answers(dir_fd: int, name: str, pid: int) -> bool:
    """Whether the socket `name` has a live listener: its pid alive and a connection accepted."""
    if not _alive(pid):
        return False
    # connect() takes a path, not a directory fd: on Linux through /proc/self/fd, the directory checked above
    proc = f"/proc/self/fd/{dir_fd}"
    path = f"{proc}/{name}" if os.path.isdir(proc) else str(paths.state_dir() / name)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        try:
            sock.connect(path)
        except OSError as exc:
            return exc.errno != errno.ECONNREFUSED  # refused: nobody listens; anything else: keep it
    return True


def write_state(*, host: str, port: int, db: str | None, admin_token: str, workers: list[int] | None = None) -> Path:
    """This process's state file, owner-only (written before anyone can read it); rewritten when
    a worker of `serve --workers` is restarted."""
    directory = private_dir()
    path = directory / f"{port}.json"
    data: dict[str, Any] = {"pid": os.getpid(), "host": host, "port": port, "db": db, "admin_token": admin_token}
    if workers:
        data["workers"] = list(workers)
    tmp = directory / f".{port}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)
    return path


def clear_state(path: Path) -> None:
    """Remove `path` if it is still this process's (another serve may have taken the port since)."""
    state = read_state(path)
    if state is not None and state.pid == os.getpid():
        path.unlink(missing_ok=True)


def read_state(path: Path) -> State | None:
    try:
        data = json.loads(path.read_text())
        return State(path=path, pid=data.get("pid") if isinstance(data.get("pid"), int) else None,
                     host=str(data.get("host") or "127.0.0.1"), port=int(data["port"]),
                     db=data.get("db"), admin_token=data.get("admin_token"),
                     workers=tuple(p for p in data.get("workers") or () if isinstance(p, int)))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def states() -> list[State]:
    """Every readable state file whose process is alive, the most recently started first."""
    directory = paths.state_dir()
    try:
        files = sorted(directory.glob("*.json"), key=_mtime, reverse=True)
    except OSError:
        return []
    found = [s for s in map(read_state, files) if s is not None]
    return [s for s in found if s.pid is None or _alive(s.pid)]


def stale_states() -> list[State]:
    """State files left by a proxy that is gone (crashed or killed)."""
    directory = paths.state_dir()
    found = [read_state(p) for p in directory.glob("*.json")] if directory.is_dir() else []
    return [s for s in found if s is not None and s.pid is not None and not _alive(s.pid)]


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def same_file(a: str | Path, b: str | Path) -> bool:
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


# -- the admin client ----------------------------------------------------------------------------


@dataclass(frozen=True)
class AdminClient:
    """Admin requests to one proxy, with its token."""

    url: str  # http://host:port, no trailing slash
    token: str | None = None

    def headers(self) -> dict[str, str]:
        return {TOKEN_HEADER: self.token} if self.token else {}

    def endpoint(self, name: str) -> str:
        return self.url + ADMIN_PREFIX + name

    def health(self, timeout: float = 2.0) -> dict[str, Any] | None:
        """GET /_llmtap/health; None when nothing (or not llmtap, or not with this token) answers."""
        try:
            data = self._call("health", None, timeout)
        except AdminError:
            return None
        return data if isinstance(data, dict) and data.get("ok") is True else None

    def sql(self, query: str, timeout: float = 300.0) -> tuple[Result, bool]:
        """(columns, types, rows), and whether the proxy cut the answer short."""
        answer = self._call("sql", {"sql": query}, timeout)
        rows = [tuple(row) for row in answer["rows"]]
        return (answer["columns"], answer["types"], rows), bool(answer.get("truncated"))

    def call(self, name: str, body: dict[str, Any] | None = None, timeout: float = 5.0) -> Any:
        """`name`'s JSON answer (a POST with `body`, else a GET); AdminError when refused or unreachable."""
        return self._call(name, body, timeout)

    def _call(self, name: str, body: dict[str, Any] | None, timeout: float) -> Any:
        headers = self.headers()
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(self.endpoint(name), data=data, headers=headers,
                                         method="POST" if body is not None else "GET")
        try:
            with _DIRECT.open(request, timeout=timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise AdminError(_refusal(exc), exc.code) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise AdminError(f"cannot reach llmtap serve at {self.url}: {reason}") from None


def _refusal(exc: urllib.error.HTTPError) -> str:
    try:
        message = json.loads(exc.read())["error"]
    except (ValueError, KeyError, TypeError):
        message = f"HTTP {exc.code} {exc.reason}"
    if exc.code in (401, 403):
        return f"llmtap serve refused the request: {message}"
    return str(message)


# -- finding the running proxy -------------------------------------------------------------------


@dataclass(frozen=True)
class LiveProxy:
    """A `llmtap serve` that answered its health check."""

    url: str  # http://host:port, no trailing slash
    pid: int | None
    db: str | None
    admin_token: str | None
    health: dict[str, Any] = field(default_factory=dict)

    @property
    def client(self) -> AdminClient:
        return AdminClient(self.url, self.admin_token)

    @property
    def prefixes(self) -> list[str]:
        """Route prefixes ("/" for the default route); ["/"] when the proxy does not say."""
        routes = self.health.get("routes")
        if isinstance(routes, list) and routes:
            return [str(r.get("prefix", "/")) for r in routes if isinstance(r, dict)]
        return ["/"]

    @property
    def warnings(self) -> list[str]:
        """What the proxy says needs a look: writes to its database failing, the file removed while serving."""
        found = self.health.get("warnings")
        return [str(w) for w in found] if isinstance(found, list) else []

    @property
    def url_tags(self) -> bool:
        """Whether the proxy strips a leading /_tag/<tag> and records it as the tag."""
        return self.health.get("url_tags") is True

    @property
    def injects_keys(self) -> bool:
        """Whether some route puts the upstream key in place of the client's (then clients
        present llmtap's client key)."""
        routes = self.health.get("routes")
        return isinstance(routes, list) and any(isinstance(r, dict) and r.get("injects_key") for r in routes)


def find_running(db: str | Path | None = None, timeout: float = 2.0) -> LiveProxy | None:
    """The running `llmtap serve` that records to `db` (any one, the newest first, when `db` is
    None), if it answers its health check with the token of its state file."""
    for state in states():
        if db is not None and not state.holds(db):
            continue
        answer = AdminClient(state.url, state.admin_token).health(timeout)
        if answer is not None:
            return LiveProxy(url=state.url, pid=state.pid, db=state.db, admin_token=state.admin_token,
                             health=answer)
    return None


def find_client(url: str | None = None, token: str | None = None) -> AdminClient | None:
    """An admin client for `url` (the token from its state file when it is a proxy of ours), else
    for the newest running proxy; None when there is none."""
    found = states()
    if url:
        url = url.rstrip("/")
        known = next((s for s in found if s.url == url or url.endswith(f":{s.port}")), None)
        return AdminClient(url, token or (known.admin_token if known else None))
    if not found:
        return None
    return AdminClient(found[0].url, token or found[0].admin_token)
