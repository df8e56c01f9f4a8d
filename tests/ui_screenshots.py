"""The screenshots of docs/ui.md: the simulated upstream, the proxy with its web UI, some traffic (three
models, a few errors, a Claude Code session with a tool run), each page in headless Chromium.

    python -m tests.ui_screenshots [--out docs/img]
"""

from __future__ import annotations

import asyncio
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
from .test_timeline import SESSION, agent
from .test_web_ui import World, login

WIDTH, HEIGHT = 1200, 760
MODELS = (("gpt-4o-mini", "/v1/chat/completions", 180, 8), ("claude-sonnet-4-5", "/v1/messages", 420, 18),
          ("gpt-5", "/v1/chat/completions", 650, 12))


async def traffic(url: str) -> None:
    rng = random.Random(30)
    async with aiohttp.ClientSession() as s:
        for i in range(36):
            model, path, ttft, itl = MODELS[i % 3]
            headers = {"x-sim-ttft-ms": str(int(ttft * rng.uniform(0.7, 1.6))), "x-sim-itl-ms": str(itl),
                       "x-sim-tokens": str(rng.randint(10, 40)), "user-agent": ("claude-cli/2.1.197 (external, cli)"
                                                                              if "claude" in model else "codex_exec/0.63.0")}
            if i % 11 == 5:
                headers["x-sim-status"] = "429"
            body = {"model": model, "stream": True, "max_tokens": 256,
                    "messages": [{"role": "user", "content": "hello " * rng.randint(10, 400)}]}
            async with s.post(url + path, json=body, headers=headers) as r:
                await r.read()
    await agent(url)


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
            assert proxy.flush(10)
            async with Chromium(binary, width=WIDTH, height=HEIGHT) as browser:
                await browser.resize(WIDTH, HEIGHT)
                world = World(proxy, browser, "")
                await login(world)
                columns, _, rows = proxy.store.query(
                    "SELECT id FROM requests WHERE request_model = 'claude-sonnet-4-5' AND outcome = 'ok' ORDER BY ttft_ms DESC LIMIT 1")
                slow = {"x-sim-ttft-ms": "900", "x-sim-itl-ms": "60", "x-sim-tokens": "200"}

                async def streams() -> None:
                    async with aiohttp.ClientSession() as s:
                        body = {"model": "gpt-5", "stream": True, "messages": [{"role": "user", "content": "go"}]}

                        async def one(delay: float) -> None:
                            await asyncio.sleep(delay)
                            async with s.post(proxy.url + "/v1/chat/completions", json=body, headers=slow) as r:
                                await r.read()
                        await asyncio.gather(*(one(i * 0.3) for i in range(6)))

                pages = [
                    ("live", "#/live", "document.querySelectorAll('#inflight tr[data-id]').length >= 3 && [...document"
                     ".querySelectorAll('#inflight tr[data-id]')].some(r => r.cells[4].textContent !== '–')"),
                    ("requests", "#/requests", "document.querySelectorAll('table.requests tbody tr').length > 0"),
                    ("request", f"#/request/{rows[0][0]}", "!!document.querySelector('#chunk-chart canvas')"),
                    ("sessions", "#/sessions", "document.querySelectorAll('tr[data-session]').length > 0"),
                    ("session", f"#/session/{SESSION}", "!!document.querySelector('#gantt')"),
                    ("overview", "#/overview", "window.__llmtapChartsDrawn > 0 && window.__llmtapChartsDrawn === window.__llmtapChartsExpected"),
                    ("compare", "#/compare?by=model&a=gpt-4o-mini&b=gpt-5&since=24h", "!!document.querySelector('#compare-out table')"),
                ]
                for name, route, ready in pages:
                    task = asyncio.create_task(streams()) if name == "live" else None
                    await world.page(route, ready)
                    await browser.evaluate(PAINTED)
                    await browser.screenshot(out / f"ui-{name}.png", full_page=False)
                    if task is not None:
                        await task
                assert browser.errors == [], browser.errors
    print(f"wrote {len(pages)} screenshots to {out}")


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[sys.argv.index("--out") + 1]) if "--out" in sys.argv else Path("docs/img")))
