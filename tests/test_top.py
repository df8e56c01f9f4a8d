"""`llmtap top`: the model and the frame, then the real thing in tmux against real processes."""

from __future__ import annotations

import asyncio
import os
import re
import select
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import aiohttp
from proxy.common import instances as running
from .state_files import state_of
import pytest
from click.testing import CliRunner

from analysis.top.cli import top
from analysis.top.model import TopModel, quantile
from analysis.top.render import frame
from analysis.top.terminal import ALT_SCREEN_OFF, ALT_SCREEN_ON, SHOW_CURSOR, paint

from .cli_traffic import claude_tools
from .waiting import START_S

NOW = 1_800_000_000.0


def finished_row(i: int, *, model: str = "m-a", tool: str = "claude-code", session: str | None = "s1",
                 outcome: str = "ok", ttft: float | None = 100.0, e2e: float = 1000.0, started: float = NOW - 10,
                 **extra: Any) -> dict[str, Any]:
    return {"id": f"r{i}", "method": "POST", "path": "/v1/messages", "request_model": model, "tool": tool,
            "session_id": session, "status": 200 if outcome == "ok" else 500, "outcome": outcome,
            "error_type": None, "stream": True, "ttft_ms": ttft, "tpot_ms": 20.0, "e2e_ms": e2e,
            "input_tokens": 1000, "output_tokens": 50, "cache_read_tokens": 900, "output_tokens_per_s": 50.0,
            "started": started, **extra}


def inflight_row(i: int, session: str = "s1", elapsed: float = 2000.0) -> dict[str, Any]:
    return {"id": f"f{i}", "method": "POST", "path": "/v1/messages", "model": "m-a", "tool": "claude-code",
            "session_id": session, "status": 200, "elapsed_ms": elapsed, "ttft_ms": 300.0,
            "output_events": 10, "tokens": 12, "tokens_per_s": 6.0}


def tick(finished: list[dict[str, Any]] | None = None, inflight: list[dict[str, Any]] | None = None,
         now: float = NOW) -> dict[str, Any]:
    return {"now": now, "dropped": 0, "requests_seen": 0, "loop_lag": {"p50_ms": 0.2, "p99_ms": 1.5, "max_ms": 3.0},
            "inflight": inflight or [], "finished": finished or [], "finished_dropped": 0}


# -- the model -------------------------------------------------------------------

def test_percentiles_cover_the_window_and_successful_requests_only() -> None:
    model = TopModel(window_s=60)
    old = [finished_row(i, ttft=5000.0, started=NOW - 300) for i in range(5)]  # ended long before the window
    recent = [finished_row(10 + i, ttft=float(100 * (i + 1))) for i in range(10)]
    failed = finished_row(99, outcome="stream_truncated", ttft=9000.0)
    model.apply(tick(old + recent + [failed]))
    [stats] = model.by("request_model")
    assert (stats.requests, stats.errors) == (11, 1)
    ttfts = [float(100 * (i + 1)) for i in range(10)]
    assert stats.p50["ttft_ms"] == quantile(ttfts, 0.5) == 550.0
    assert stats.p95["ttft_ms"] == pytest.approx(955.0)
    assert model.outcomes() == {"ok": 10, "stream_truncated": 1}
    assert {s.session_id: s.requests for s in model.session_stats()} == {"s1": 16}  # sessions keep everything


def test_rows_seen_twice_count_once_and_sessions_show_live_requests() -> None:
    model = TopModel(window_s=300)
    rows = [finished_row(i, started=NOW - 20 + i) for i in range(3)]
    model.add_finished(rows)
    model.apply(tick(rows, inflight=[inflight_row(1, elapsed=5000.0), inflight_row(2, session="s2")]))
    assert model.finished_total == 3
    lines = {s.session_id: s for s in model.session_stats()}
    s1 = lines["s1"]
    assert (s1.requests, s1.live, s1.input_tokens, s1.output_tokens) == (3, 1, 3000, 150)
    assert s1.ttft_total_ms == 300.0 and s1.cache_read_share == pytest.approx(0.9)
    assert s1.wall_s == pytest.approx(20.0)  # first start to now: a request is still running
    assert (lines["s2"].requests, lines["s2"].live, lines["s2"].wall_s) == (0, 1, pytest.approx(2.0))
    model.disconnected()
    assert model.inflight == [] and [s.session_id for s in model.session_stats()] == ["s1"]


# -- the frame -------------------------------------------------------------------

def busy_model() -> TopModel:
    model = TopModel(window_s=300)
    rows = [finished_row(i, model=f"model-{i % 4}", tool=("codex", "claude-code")[i % 2], session=f"sess-{i % 9}",
                         outcome="ok" if i % 7 else "http_error") for i in range(60)]
    model.apply(tick(rows, [inflight_row(i, session=f"sess-{i}") for i in range(12)]))
    return model


@pytest.mark.parametrize("width,height", [(80, 24), (120, 40), (50, 20), (80, 8), (30, 3)])
def test_a_frame_fits_the_terminal(width: int, height: int) -> None:
    lines = frame(busy_model(), width, height, "127.0.0.1:8787", clock=lambda: NOW)
    assert len(lines) <= height and all(len(line.text) <= width for line in lines)
    headings = [line.text.split()[0] for line in lines if line.heading]
    if height >= 20:
        assert headings == ["in", "finished", "model", "tool", "errors", "sessions"]
        rows_after = [i for i, line in enumerate(lines) if line.heading and not line.text.startswith("errors")]
        assert all(not lines[i + 1].heading for i in rows_after)  # every table keeps at least one row


def test_the_80x24_frame_says_what_each_section_holds() -> None:
    text = "\n".join(line.text for line in frame(busy_model(), 80, 24, "127.0.0.1:8787", clock=lambda: NOW))
    assert text.splitlines()[0].startswith("llmtap top  127.0.0.1:8787 · 12 in flight · 60 done · lag p99 1.5ms")
    assert re.search(r"^in flight 12 +tool +session +elapsed +ttft +tokens +tok/s$", text, re.M)
    assert re.search(r"^m-a +claude-code +sess-0 +2.0s +300ms +12 +6.0$", text, re.M)
    assert re.search(r"^finished 60 +tool +session +result +ttft +e2e +out +tok/s$", text, re.M)
    assert re.search(r"^model 5m +reqs +err +ttft50 +ttft95 +tpot50 +tpot95 +e2e50 +e2e95$", text, re.M)
    assert re.search(r"^model-0 +15 +3 +100ms +100ms +20ms +20ms +1.0s +1.0s$", text, re.M)
    assert "errors 5m  http_error 9   (ok 51)" in text
    assert re.search(r"^sessions 12 +tool +reqs +ttft tot +ttft95 +in +out +cache% +wall$", text, re.M)


def test_the_tool_column_fits_its_names_and_other_kinds_are_counted() -> None:
    model = TopModel(window_s=300)
    rows = [finished_row(0, model="claude-sonnet-4-5", tool="anthropic-python"),
            finished_row(1, model="claude-sonnet-4-5", tool="claude-code", path="/v1/messages/count_tokens"),
            finished_row(2, model="claude-sonnet-4-5", tool="claude-code", kind="token_count"),
            finished_row(3, model="claude-sonnet-4-5", tool="claude-code", kind="generation")]
    model.apply(tick(rows))
    text = "\n".join(line.text for line in frame(model, 100, 24, "127.0.0.1:8787", clock=lambda: NOW))
    # a wide terminal's room goes to the tool as well as the model: neither is cut
    assert re.search(r"^claude-sonnet-4-5 +anthropic-python +s1 ", text, re.M), text
    narrow = "\n".join(line.text for line in frame(model, 80, 24, "127.0.0.1:8787", clock=lambda: NOW))
    assert max(len(line) for line in narrow.splitlines()) <= 80
    assert re.search(r"^finished 2 ", text, re.M)  # a row without `kind` is judged by its path
    assert "errors 5m  none   (ok 2)   2 other kinds not shown (--all)" in text
    everything = TopModel(window_s=300, kinds=())
    everything.apply(tick(rows))
    assert everything.finished_total == 4 and everything.other_total == 0


def test_paint_repaints_in_place_without_scrolling() -> None:
    lines = frame(busy_model(), 80, 24, "x", clock=lambda: NOW)
    painted = paint(lines)
    assert painted.startswith("\x1b[H") and painted.endswith("\x1b[J") and painted.count("\r\n") == len(lines) - 1
    assert "\x1b[7m" in painted and ALT_SCREEN_ON not in painted and ALT_SCREEN_OFF + SHOW_CURSOR not in painted


def test_no_running_proxy_is_a_clear_error() -> None:
    result = CliRunner().invoke(top, ["--once"])
    assert result.exit_code == 1 and "no running `llmtap serve` found" in result.output
    result = CliRunner().invoke(top, ["--once", "--url", "http://127.0.0.1:9"])
    assert result.exit_code == 1 and "cannot reach llmtap serve at http://127.0.0.1:9" in result.output
    result = CliRunner().invoke(top, ["--window", "soon"])
    assert result.exit_code == 2 and "not a span like 30s, 5m or 1h" in result.output


def test_top_is_an_llmtap_command() -> None:
    from proxy.cli import main

    assert "top" in main.list_commands(None), "add `top` to COMMANDS in proxy/cli.py"


# -- the real thing: llmtap serve + mock-upstream processes, top in tmux ---------

PY = sys.executable
SESSIONS = ("0b7e2c1a-5d3f-4e8a-9c21-7f6d5e4c3b2a", "9f1d3b5c-2a4e-4c6b-8d0f-1e2d3c4b5a69", "codex-7d1e-44aa")


def _first_line(proc: subprocess.Popen, timeout: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no output in {timeout} s"
    return proc.stdout.readline().strip()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """`llmtap mock-upstream` and `llmtap serve` as real processes; their own LLMTAP_HOME."""
    root = tmp_path_factory.mktemp("top")
    env = {**os.environ, "LLMTAP_HOME": str(root / "home"), "LLMTAP_CONFIG": str(root / "none.toml")}
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        env.pop(var, None)
    upstream = subprocess.Popen([PY, "-m", "proxy", "mock-upstream", "--port", "0", "--itl-ms", "60"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    procs = [upstream]
    try:
        url = _first_line(upstream, START_S).rsplit(" ", 1)[1]
        serve = subprocess.Popen([PY, "-m", "proxy", "serve", "--port", "0", "--upstream", url, "--quiet",
                                  "--db", str(root / "top.duckdb")], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, env=env)
        procs.append(serve)
        deadline = time.monotonic() + START_S
        while (state := state_of(serve.pid, root / "home")) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert state is not None, "serve did not start"
        yield {"url": state.url, "home": env["LLMTAP_HOME"], "root": str(root), "token": state.admin_token or ""}
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


async def request(s: aiohttp.ClientSession, base: str, session: str, tokens: int, ttft_ms: int = 200,
                  status: int | None = None) -> None:
    headers = {"x-sim-tokens": str(tokens), "x-sim-ttft-ms": str(ttft_ms), "x-sim-cache-read-tokens": "2000"}
    if status:
        headers["x-sim-status"] = str(status)
    if session.startswith("codex"):
        headers.update({"originator": "codex_exec", "user-agent": "codex_exec/0.171.0", "session_id": session})
        body: dict[str, Any] = {"model": "gpt-5-codex", "stream": True, "stream_options": {"include_usage": True},
                                "messages": [{"role": "user", "content": "hi " * 40}]}
        path = "/v1/chat/completions"
    else:
        headers.update({"user-agent": "claude-cli/2.1.0 (external, cli)", "x-claude-code-session-id": session})
        body = {"model": "claude-sonnet-4-5", "max_tokens": 400, "stream": True,
                "messages": [{"role": "user", "content": "hello " * 60}], "tools": claude_tools()}
        path = "/v1/messages"
    async with s.post(base + path, json=body, headers=headers) as r:
        await r.read()


async def agent(s: aiohttp.ClientSession, base: str, session: str) -> None:
    """A quick request that finishes, then a slow stream that stays in flight for seconds."""
    await request(s, base, session, tokens=8)
    await request(s, base, session, tokens=200, ttft_ms=300)


class Tmux:
    """A private tmux server (its own socket), one 80x24 session."""

    def __init__(self) -> None:
        self.base = ["tmux", "-L", f"llmtap-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"]

    async def run(self, *args: str) -> str:
        proc = await asyncio.create_subprocess_exec(*self.base, *args, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        return out.decode()

    async def start(self, command: str) -> None:
        await self.run("new-session", "-d", "-s", "top", "-x", "80", "-y", "24", command)

    async def screen(self) -> str:
        return await self.run("capture-pane", "-p", "-t", "top")

    async def flags(self) -> str:
        return (await self.run("display-message", "-p", "-t", "top", "#{alternate_on} #{cursor_flag}")).strip()

    async def wait_for(self, check: Any, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = await self.screen()
            if check(screen):
                return screen
            await asyncio.sleep(0.2)
        raise AssertionError("the screen never showed what was expected:\n" + screen)

    def kill(self) -> None:
        subprocess.run([*self.base, "kill-server"], capture_output=True, timeout=10)


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    t = Tmux()
    yield t
    t.kill()


def top_command(stack: dict[str, str], *args: str) -> str:
    """top, then one line: its exit status and the terminal's line discipline (`icanon echo` when sane)."""
    argv = " ".join([PY, "-m", "analysis.top", *args])
    modes = "stty -a | tr ' ;' '\\n\\n' | grep -xE -- '-?(icanon|echo)' | tr '\\n' ' '"
    return f'env LLMTAP_HOME={stack["home"]} {argv}; rc=$?; echo "top exited $rc, terminal: $({modes})."; sleep 60'


def everything_shown(screen: str) -> bool:
    inflight = re.findall(r"^(claude-sonnet-4-5|gpt-5-codex) +(claude-code|codex) +\S+ +[\d.]+m?s +\d+ms +\d+ +[\d.]+$",
                          screen.split("finished")[0], re.M)
    return (
        "in flight 3" in screen and len(inflight) == 3
        and re.search(r"^finished [4-9] ", screen, re.M) is not None
        and re.search(r"^claude-sonnet-4-5 +[2-9] +[01] +\d+ms +\d+ms +\d+ms +\d+ms", screen, re.M) is not None
        and re.search(r"^gpt-5-codex +1 +0 +\d+ms +\d+ms", screen, re.M) is not None
        and re.search(r"^errors 5m  http_error 1 +\(ok [3-9]\)", screen, re.M) is not None
        and all(re.search(rf"^{sid[:10]}\S* +(claude-code|codex) +[12]\+1 ", screen, re.M) for sid in SESSIONS)
    )


async def test_top_in_tmux_shows_live_load_and_q_restores_the_terminal(stack: dict[str, str], tmux: Tmux) -> None:
    async with aiohttp.ClientSession() as s:
        await tmux.start(top_command(stack))
        await tmux.wait_for(lambda screen: "llmtap top  127.0.0.1:" in screen and "connecting" not in screen, 10)
        assert (await tmux.flags()) == "1 0"  # alternate screen, cursor hidden
        load = [asyncio.create_task(agent(s, stack["url"], sid)) for sid in SESSIONS]
        load.append(asyncio.create_task(request(s, stack["url"], SESSIONS[0], tokens=5, status=503)))
        try:
            screen = await tmux.wait_for(everything_shown, 15)
            lines = screen.rstrip("\n").split("\n")
            assert len(lines) <= 24 and all(len(line) <= 80 for line in lines)
            await tmux.run("send-keys", "-t", "top", "q")
            after = await tmux.wait_for(lambda screen: "top exited" in screen, 10)
        finally:
            for task in load:
                task.cancel()
            await asyncio.gather(*load, return_exceptions=True)
    assert "top exited 0, terminal: icanon echo ." in after and "llmtap top" not in after
    assert (await tmux.flags()) == "0 1"  # back on the normal screen, cursor shown


async def test_ctrl_c_quits_cleanly_too(stack: dict[str, str], tmux: Tmux) -> None:
    await tmux.start(top_command(stack, "--interval", "0.1", "--window", "30s"))
    await tmux.wait_for(lambda screen: "errors 30s" in screen, 10)
    await tmux.run("send-keys", "-t", "top", "C-c")
    after = await tmux.wait_for(lambda screen: "top exited" in screen, 10)
    assert "top exited 0, terminal: icanon echo ." in after and "Traceback" not in after
    assert (await tmux.flags()) == "0 1"


async def recorded(s: aiohttp.ClientSession, stack: dict[str, str], session: str) -> None:
    """Wait until the proxy's store has written a row of `session` (it flushes every second)."""
    sql = {"sql": f"SELECT count(*) FROM requests WHERE session_id = '{session}'"}
    admin = running.AdminClient(stack["url"], stack["token"])
    async with asyncio.timeout(5):
        while True:
            async with s.post(admin.endpoint("sql"), json=sql, headers=admin.headers()) as r:
                if (await r.json())["rows"][0][0]:
                    return
            await asyncio.sleep(0.1)


async def test_once_prints_one_plain_frame(stack: dict[str, str]) -> None:
    async with aiohttp.ClientSession() as s:
        await request(s, stack["url"], "once-session", tokens=3, ttft_ms=10)
        # in flight however long top takes to start (10 s at a load average of 40); cancelled below
        slow = asyncio.create_task(request(s, stack["url"], "once-session", tokens=100, ttft_ms=120_000))
        await recorded(s, stack, "once-session")
        proc = await asyncio.create_subprocess_exec(
            PY, "-m", "analysis.top", "--once", env={**os.environ, "LLMTAP_HOME": stack["home"],
                                                     "COLUMNS": "80", "LINES": "24"},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 15)
        slow.cancel()
        await asyncio.gather(slow, return_exceptions=True)
    text = out.decode()
    assert proc.returncode == 0, err.decode()
    assert "\x1b" not in text and len(text.splitlines()) <= 24
    assert re.search(r"^in flight [1-9]", text, re.M) and re.search(r"^once-session +claude-code +1\+1 ", text, re.M)
    assert re.search(r"^finished [1-9]", text, re.M)  # backfilled from the proxy's database


def test_a_long_title_wraps_between_its_parts_instead_of_being_cut() -> None:
    model = busy_model()
    model.dropped, model.finished_dropped = 3, 4  # the title grows past 80 columns
    lines = frame(model, 80, 24, "127.0.0.1:8787", clock=lambda: NOW)
    heads = [line.text for line in lines[:2]]
    assert all(len(text) <= 80 for text in heads) and "…" not in "".join(heads)
    assert heads[0].startswith("llmtap top  127.0.0.1:8787 · 12 in flight")
    assert "dropped 3 ticks, 4 rows" in " · ".join(heads) and heads[1].endswith(time.strftime("%H:%M:%S", time.localtime(NOW)))
    assert len(lines) <= 24


def test_no_color_paints_headings_plain() -> None:
    lines = frame(busy_model(), 80, 24, "x", clock=lambda: NOW)
    assert "\x1b[7m" in paint(lines) and "\x1b[7m" not in paint(lines, styled=False)


async def test_top_into_a_pipe_writes_plain_frames(stack: dict[str, str]) -> None:
    """Live `top` with stdout a pipe: frames of plain text and no escape, until SIGTERM."""
    env = {**os.environ, "LLMTAP_HOME": stack["home"], "COLUMNS": "80", "LINES": "24"}
    proc = await asyncio.create_subprocess_exec(PY, "-m", "analysis.top", "--interval", "0.1", env=env,
                                                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    seen = b""
    try:
        async with asyncio.timeout(15):
            while seen.count(b"llmtap top  127.0.0.1:") < 2:
                seen += await proc.stdout.read(4096)  # type: ignore[union-attr]
    finally:
        proc.terminate()
        rest, err = await asyncio.wait_for(proc.communicate(), 15)
    assert proc.returncode == 0, err.decode()
    assert b"\x1b" not in seen + rest and b"\n\nllmtap top  127.0.0.1:" in seen


def test_no_color_in_a_terminal_keeps_the_screen_but_not_reverse_video(stack: dict[str, str]) -> None:
    import pty

    env = {**os.environ, "LLMTAP_HOME": stack["home"], "COLUMNS": "80", "LINES": "24", "NO_COLOR": "1"}
    leader, follower = pty.openpty()
    proc = subprocess.Popen([PY, "-m", "analysis.top", "--interval", "0.1"], env=env, stdin=subprocess.DEVNULL,
                            stdout=follower, stderr=subprocess.PIPE)
    os.close(follower)
    seen = b""
    try:
        deadline = time.monotonic() + 15
        while seen.count(b"llmtap top  127.0.0.1:") < 2 and time.monotonic() < deadline:
            if select.select([leader], [], [], 0.5)[0]:
                seen += os.read(leader, 65536)
    finally:
        proc.terminate()
        proc.wait(15)
        os.close(leader)
    assert seen.count(b"llmtap top  127.0.0.1:") >= 2
    assert ALT_SCREEN_ON.encode() in seen and b"\x1b[7m" not in seen
