"""The screenshots of docs/ui.md: the simulated upstream, the proxy with its web UI, some traffic (three
models, a few errors) and real Claude Code sessions (`claude -p` through llmtap, the simulator playing
the model: a parallel `Bash` + `Read`, then a `Bash` alone, in two projects; the simulated agent of
tests/test_timeline.py where the CLI is not installed), each page in headless Chromium at 1,400 and 800 px.

    python -m tests.ui_screenshots [--out docs/img]
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import tempfile
from pathlib import Path

import aiohttp

from analysis.views import create_views
from analysis.web import WebUi
from proxy.serve.server import RunningProxy
from proxy.settings.config import ServeConfig
from proxy.simulator.app import Simulator
from proxy.simulator.config import SimConfig

from .browser import Chromium, find_chromium
from .test_timeline import agent
from .test_web_ui import World, login, qwen_turn_and_side_request

PERSON_PAUSE_S = 1.5  # the person's pause between two prompts, drawn as "you" on the session page

WIDTHS, HEIGHT = (1400, 800), 900
MODELS = (("gpt-4o-mini", "/v1/chat/completions", 180, 8), ("claude-sonnet-4-5", "/v1/messages", 420, 18),
          ("gpt-5", "/v1/chat/completions", 650, 12))
CLAUDE_QUIET = {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
                "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1", "ANTHROPIC_API_KEY": "sk-test"}


async def traffic(url: str) -> None:
    rng = random.Random(30)
    async with aiohttp.ClientSession() as s:
        for i in range(36):
            model, path, ttft, itl = MODELS[i % 3]
            headers = {"x-sim-ttft-ms": str(int(ttft * rng.uniform(0.7, 1.6))), "x-sim-itl-ms": str(itl),
                       "x-sim-tokens": str(rng.randint(10, 40)), "user-agent": "codex_exec/0.63.0"}
            if i % 11 == 5:
                headers["x-sim-status"] = "429"
            body = {"model": model, "stream": True, "max_tokens": 256,
                    "messages": [{"role": "user", "content": "hello " * rng.randint(10, 400)}]}
            async with s.post(url + path, json=body, headers=headers) as r:
                await r.read()


def claude_binary() -> Path | None:
    cache = Path(os.environ.get("LLMTAP_CLI_CACHE") or Path.home() / ".cache" / "llmtap-test-clis")
    for found in (cache / "node_modules/.bin/claude", Path("/work/cli-cache/node_modules/.bin/claude")):
        if found.exists():
            return found
    return None


async def claude_sessions(url: str, tmp: Path) -> bool:
    """Real `claude -p` runs through the proxy: the simulator (told by headers) answers the first request
    of a prompt with the tools' calls and the one after their results with text."""
    binary = claude_binary()
    if binary is None:
        return False
    runs = (("shop", "Bash,Read", {"Bash": {"command": "sleep 1.2; ls", "description": "List the files"},
                                   "Read": {"file_path": str(tmp / "shop" / "README")}}),
            ("api", "Bash", {"command": "sleep 2.5; echo done", "description": "Run the check"}))
    for project, tools, args in runs:
        cwd = tmp / project
        cwd.mkdir(parents=True, exist_ok=True)
        (cwd / "README").write_text("a project\n")
        headers = {"x-sim-tool-call": "1", "x-sim-tool-script": "1", "x-sim-tool-name": tools,
                   "x-sim-tool-args": json.dumps(args), "x-sim-ttft-ms": "600", "x-sim-itl-ms": "40", "x-sim-tokens": "30"}
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp / "home"), "LANG": "C.UTF-8", "TERM": "dumb",
               "ANTHROPIC_BASE_URL": url, "ANTHROPIC_CUSTOM_HEADERS": "\n".join(f"{k}: {v}" for k, v in headers.items()),
               **CLAUDE_QUIET}
        proc = await asyncio.create_subprocess_exec(
            "timeout", "-k", "5", "90", str(binary), "-p", "run the check", "--allowedTools", "Bash,Read",
            env=env, cwd=cwd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        if proc.returncode != 0:
            sys.exit(f"claude -p failed ({proc.returncode}): {out.decode()[-400:]} {err.decode()[-400:]}")
        await asyncio.sleep(PERSON_PAUSE_S)  # scripted, not a wait for anything: the "you" span the page shows
    return True


# The page drawn as it is now: fonts loaded, then two animation frames (the layout after `ready`, painted).
PAINTED = ("document.fonts.ready.then(() => new Promise(done => requestAnimationFrame("
           "() => requestAnimationFrame(() => done(true)))))")


async def main(out: Path) -> None:
    binary = find_chromium()
    if binary is None:
        sys.exit("no chromium")
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="llmtap-shots-"))
    async with Simulator(SimConfig(ttft_ms=200, itl_ms=10, tokens=20)) as sim:
        config = ServeConfig(port=0, upstream=sim.url, db=str(tmp / "llmtap.duckdb"), quiet=True, flush_interval_s=0.2)
        async with RunningProxy(config, query_setup=create_views, ui=WebUi()) as proxy:
            await traffic(proxy.url)
            real = await claude_sessions(proxy.url, tmp)
            await agent(proxy.url)
            await qwen_turn_and_side_request(proxy.url)  # a turn and its side request (kind 'side')
            assert proxy.flush(10)
            print("sessions:", "real Claude Code (claude -p) and the simulated agent" if real else "the simulated agent only")
            _, _, [(session,)] = proxy.store.query(
                "SELECT session_id FROM requests WHERE tool = 'claude-code' AND session_id IS NOT NULL"
                " GROUP BY session_id ORDER BY bool_or(request_model <> 'claude-x') DESC,"  # a real CLI's first
                " bool_or(list_contains(list_transform(tool_calls, lambda c: c.name), 'Read')) DESC, min(started_at) LIMIT 1")
            _, _, [(request,)] = proxy.store.query(
                f"SELECT id FROM requests WHERE session_id = '{session}' AND tool_calls IS NOT NULL ORDER BY started_at LIMIT 1")
            async with Chromium(binary, width=WIDTHS[0], height=HEIGHT) as browser:
                world = World(proxy, browser, "", [])
                await login(world)
                pages = [
                    ("requests", "#/requests", "document.querySelectorAll('table.requests tbody tr').length > 0"),
                    ("request", f"#/request/{request}", "!!document.querySelector('#waterfall')"),
                    ("sessions", "#/sessions", "document.querySelectorAll('tr[data-session]').length > 0"),
                    ("session", f"#/session/{session}", "!!document.querySelector('#gantt')"),
                    ("overview", "#/overview", "window.__llmtapChartsDrawn > 0 && window.__llmtapChartsDrawn === window.__llmtapChartsExpected"),
                ]
                for width in WIDTHS:
                    await browser.resize(width, HEIGHT)
                    for name, route, ready in pages:
                        if width != WIDTHS[0] and name in ("requests", "overview"):
                            continue
                        await world.page(route, ready)
                        await browser.evaluate(PAINTED)
                        suffix = "" if width == WIDTHS[0] else f"-{width}"
                        await browser.screenshot(out / f"ui-{name}{suffix}.png", full_page=name in ("session", "request"))
                _, _, [(turn,)] = proxy.store.query("SELECT id FROM requests WHERE request_model = 'qwen3-coder'"
                                                    " AND kind = 'generation'")
                await browser.resize(WIDTHS[0], 560)
                await world.page(f"#/request/{turn}", "!!document.querySelector('#session-link')")
                await browser.evaluate("document.getElementById('session-link').click(); 1")
                await browser.wait_for("!!document.querySelector('#gantt details.side')")
                await browser.evaluate("document.querySelector('#gantt details.side').open = true; 1")
                await browser.evaluate(PAINTED)
                await browser.screenshot(out / "ui-session-side.png", full_page=False)
                assert browser.errors == [], browser.errors
    print(f"wrote the screenshots to {out}")


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[sys.argv.index("--out") + 1]) if "--out" in sys.argv else Path("docs/img")))
