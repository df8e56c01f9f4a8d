"""A real HTTP forward proxy on loopback for the egress tests: proxy.py (PyPI), port 0, as a subprocess.

proxy.py's import name is `proxy`, which is llmtap's own package, so it cannot
share llmtap's environment: it is installed apart, with
`python -m pip install --target <venv>/forward-proxy proxy.py` (.ci/run does),
and run with that directory first on its path. Without it the tests that
need it are skipped, saying how to install it.

Its access log has one line per request it relayed (`GET host:port/path` for
plain HTTP, `CONNECT host:port` for a tunnel), written when the client's
connection to it closes.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

TARGET = Path(sys.prefix) / "forward-proxy"
_ACCESS = re.compile(r"access_log:\d+ - \S+ - ([A-Z]+ \S+)")
INSTALL = f"{sys.executable} -m pip install --target {TARGET} proxy.py==2.4.10"


def available() -> bool:
    return (TARGET / "proxy" / "__init__.py").is_file()


needs_forward_proxy = pytest.mark.skipif(not available(), reason=f"proxy.py is not installed; {INSTALL}")


class ForwardProxy:
    """`with ForwardProxy(tmp_path) as fp:` a proxy.py on 127.0.0.1:fp.port until the block ends."""

    def __init__(self, directory: Path, basic_auth: str | None = None) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.basic_auth = basic_auth
        self.port = 0
        self.log = self.dir / "access.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "ForwardProxy":
        port_file = self.dir / "port"
        code = f"import sys; sys.path.insert(0, {str(TARGET)!r}); import proxy; proxy.entry_point()"
        args = [sys.executable, "-c", code, "--hostname", "127.0.0.1", "--port", "0", "--port-file", str(port_file),
                "--num-workers", "1", "--num-acceptors", "1", "--log-file", str(self.log)]
        if self.basic_auth:
            args += ["--basic-auth", self.basic_auth]
        env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
        self._process = subprocess.Popen(args, cwd=self.dir, env=env, stdout=subprocess.DEVNULL,
                                         stderr=(self.dir / "stderr").open("wb"), start_new_session=True)
        deadline = time.monotonic() + 60  # a start-up bound, not a measurement
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"proxy.py exited: {(self.dir / 'stderr').read_text()[-2000:]}")
            text = port_file.read_text().strip() if port_file.exists() else ""
            if text.isdigit() and _listening(int(text)):
                self.port = int(text)
                return self
            time.sleep(0.05)
        self.__exit__()
        raise RuntimeError("proxy.py did not start listening")

    def __exit__(self, *exc: object) -> None:
        if self._process is None:
            return
        try:
            os.killpg(self._process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self._process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait()
        self._process = None

    def access(self) -> list[str]:
        """The request part of each access-log line: `GET 127.0.0.1:PORT/path`, `CONNECT 127.0.0.1:PORT`."""
        if not self.log.exists():
            return []
        return [m.group(1) for m in _ACCESS.finditer(self.log.read_text())]

    def wait_for(self, entry: str, timeout: float = 30) -> list[str]:
        """The access entries once one starts with `entry` (written when the connection closes)."""
        deadline = time.monotonic() + timeout
        while True:
            seen = self.access()
            if any(e.startswith(entry) for e in seen) or time.monotonic() > deadline:
                return seen
            time.sleep(0.05)


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False
