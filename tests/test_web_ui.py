"""The web UI (#30) in a real headless Chromium, on a real proxy with real traffic.

One simulated upstream, one proxy (with the web UI, as `llmtap serve` builds it), one browser for the
module. The doors: the one-time login leaves a session in the origin's sessionStorage (no cookie) and no
ticket in the URL; another origin can neither read the API nor act through it, and what the browser sends
to another port opens nothing; a rebinding Host is refused. The pages: no console error,
hostile text shown as text, 800 px usable, every control reachable by keyboard; and their numbers
are the CLI's `--format json` for the same requests.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator

import aiohttp
import orjson
import pytest
import pytest_asyncio
from aiohttp import web
from click.testing import CliRunner

from analysis.web import WebUi
from proxy.cli import main
from proxy.common.instances import TOKEN_HEADER
from proxy.common.schema import KINDS
from proxy.serve.server import write_state
from tests.serving import RunningProxy
from proxy.simulator.app import Simulator
from proxy.simulator.config import SimConfig

from .browser import Chromium, find_chromium
from .conftest import proxy_config
from .test_timeline import SESSION, agent
from .waiting import wait_until

CHROMIUM = find_chromium()
pytestmark = [pytest.mark.asyncio(loop_scope="module"),
              pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary found")]

XSS_MODEL = '<script>window.__xss=1</script>"><img src=x onerror="window.__xss=2">'
XSS_TAG = '"><img src=x onerror="window.__xss=3">'
OSC_MODEL = "gpt\x1b]0;pwned\x07\x1b]8;;http://evil.test\x07link\x1b]8;;\x07"
XSS_MESSAGE = 'Bad model <img src=x onerror="window.__xss=4"> \x1b]52;c;ZXZpbA==\x07'
REBIND = "rebind.test"
LIVE_S = 1.0  # a finished request is on the Live page within this (the issue's bound)


async def bad_upstream(request: web.Request) -> web.Response:
    """An upstream whose error message is hostile text."""
    await request.read()
    return web.json_response({"error": {"message": XSS_MESSAGE, "type": "invalid_request_error"}}, status=400)


async def chat(s: aiohttp.ClientSession, url: str, model: str = "gpt-4o-mini", headers: dict[str, str] | None = None,
               path: str = "/v1/chat/completions") -> int:
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": "hello " * 30}]}
    async with s.post(url + path, json=body, headers=headers or {}) as r:
        await r.read()
        return r.status


QWEN_UA = {"User-Agent": "QwenCode/0.24.4 (linux; x64)", "Authorization": "Bearer k-qwen"}
QWEN_MESSAGES = [{"role": "system", "content": "You are Qwen Code, a non-interactive CLI agent"},
                 {"role": "user", "content": "run the check"}]


async def qwen_turn_and_side_request(url: str) -> None:
    """Qwen Code's turn (it declares tools) and its tool-less request beside it: the request the `kind`
    column marks `side` (tests/test_agent_sessions.py, branch agents), in the turn's session."""
    tools = [{"type": "function", "function": {"name": "run_shell_command", "parameters": {"type": "object"}}}]
    async with aiohttp.ClientSession() as s:
        for body in ({"model": "qwen3-coder", "messages": QWEN_MESSAGES, "tools": tools},
                     {"model": "qwen3-coder", "messages": QWEN_MESSAGES}):
            async with s.post(url + "/v1/chat/completions", json=body, headers=QWEN_UA) as r:
                assert r.status == 200
                await r.read()


class World:
    def __init__(self, proxy: RunningProxy, browser: Chromium, attacker: str, caught: list[web.Request]) -> None:
        self.proxy, self.browser, self.attacker, self.caught = proxy, browser, attacker, caught
        self.ui = proxy.url + "/_llmtap/ui/"

    def rows(self, sql: str) -> list[dict[str, Any]]:
        assert self.proxy.flush(10)
        columns, _, data = self.proxy.store.query(sql)
        return [dict(zip(columns, r)) for r in data]

    async def ticket(self) -> str:
        async with aiohttp.ClientSession() as s:
            async with s.post(self.proxy.url + "/_llmtap/ui/ticket", headers={TOKEN_HEADER: self.proxy.admin_token}) as r:
                assert r.status == 200
                answer = await r.json()
        return f"{self.proxy.url}{answer['path']}{answer['ticket']}"

    async def session(self) -> str:
        return await self.browser.evaluate("sessionStorage.getItem('llmtap_ui')")

    async def page(self, route: str, ready: str) -> None:
        """Show `route` (#/...) and wait until `ready` (a JS expression) holds (logged in first)."""
        if not await self.browser.evaluate("location.pathname === '/_llmtap/ui/' && !!document.getElementById('main')"):
            await login(self)
        await self.browser.evaluate(f"location.hash = {orjson.dumps(route).decode()}")
        try:
            await self.browser.wait_for(ready, timeout=20)
        except TimeoutError:  # say what the page shows instead (an error from the API, say)
            shown = await self.browser.evaluate("(document.getElementById('main') || document.body).textContent")
            raise AssertionError(f"{route}: not {ready} within 20 s; the page shows: {shown[:500]!r}") from None

    async def text(self) -> str:
        return await self.browser.evaluate("document.getElementById('main').textContent")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    tmp = tmp_path_factory.mktemp("web-ui")
    bad = web.Application()
    bad.router.add_route("*", "/{tail:.*}", bad_upstream)
    bad_runner = web.AppRunner(bad, access_log=None)
    await bad_runner.setup()
    site = web.TCPSite(bad_runner, "127.0.0.1", 0)
    await site.start()
    bad_url = f"http://127.0.0.1:{bad_runner.addresses[0][1]}"
    caught: list[web.Request] = []  # what the browser sent to /_llmtap/ of the other server's port

    async def catch(request: web.Request) -> web.Response:
        caught.append(request)
        return web.Response(text="caught")

    attacker = web.Application()
    async def elsewhere(_: web.Request) -> web.Response:
        return web.Response(text="<!doctype html><title>elsewhere</title><p>a page elsewhere</p>", content_type="text/html")

    attacker.router.add_get("/", elsewhere)
    attacker.router.add_route("*", "/_llmtap/{tail:.*}", catch)
    attacker_runner = web.AppRunner(attacker, access_log=None)
    await attacker_runner.setup()
    await web.TCPSite(attacker_runner, "127.0.0.1", 0).start()
    attacker_url = f"http://127.0.0.1:{attacker_runner.addresses[0][1]}"
    config = SimConfig(ttft_ms=20, itl_ms=2, tokens=8, prefill_us_per_token=0)
    async with Simulator(config) as sim:
        settings = proxy_config(sim.url, tmp, routes={"/bad": bad_url}, capture_bodies=True)
        async with RunningProxy(settings, ui=WebUi()) as proxy:
            async with aiohttp.ClientSession() as s:
                for i in range(6):
                    await chat(s, proxy.url, "gpt-4o-mini" if i % 2 else "claude-haiku-4-5", {"x-llmtap-tag": "plain"})
                await chat(s, proxy.url, XSS_MODEL, {"x-llmtap-tag": XSS_TAG})
                await chat(s, proxy.url, OSC_MODEL)
                assert await chat(s, proxy.url, "bad-model", path="/bad/v1/chat/completions") == 400
            await agent(proxy.url)  # a Claude Code session: model, tool and you spans (tests/test_timeline.py)
            await qwen_turn_and_side_request(proxy.url)
            assert proxy.flush(10)
            flags = (f"--host-resolver-rules=MAP {REBIND} 127.0.0.1",)
            async with Chromium(CHROMIUM, width=1400, height=1000, flags=flags) as browser:
                yield World(proxy, browser, attacker_url, caught)
    await bad_runner.cleanup()
    await attacker_runner.cleanup()


def cli_json(*args: str) -> Any:
    result = CliRunner().invoke(main, [*args, "--format", "json"])
    assert result.exit_code == 0, result.output
    return orjson.loads(result.output)


async def cli(world: World, *args: str) -> Any:
    """The CLI's `--format json`, reading through the running proxy (its state file), in a thread."""
    write_state(world.proxy)
    return await asyncio.to_thread(cli_json, *args, "--db", str(world.proxy.config.db_path))


# -- the doors -----------------------------------------------------------------------------------------


async def test_login_trades_the_ticket_for_a_session_only_this_origin_holds(world: World) -> None:
    b = world.browser
    await b.open(world.ui)
    await b.wait_for("document.body.textContent.includes('Not logged in')")  # no session yet: nothing
    assert "Run llmtap ui in a terminal" in await b.evaluate("document.body.textContent")
    async with aiohttp.ClientSession() as s:
        async with s.get(world.proxy.url + "/_llmtap/api/requests") as r:
            assert r.status == 403
    login = await world.ticket()
    await b.open("about:blank")
    await b.open(login)
    await b.wait_for("location.pathname === '/_llmtap/ui/' && !!document.querySelector('nav a[aria-current]')")
    ticket = login.rpartition("=")[2]
    href = await b.evaluate("location.href")
    assert "login" not in href and ticket not in href
    assert await b.evaluate("document.cookie") == ""
    assert (await b.send("Network.getAllCookies"))["cookies"] == []  # no cookie at all: every port would get it
    assert await b.evaluate("localStorage.length") == 0 and await b.evaluate("sessionStorage.length") == 1
    session = await world.session()
    html = await b.evaluate("document.documentElement.outerHTML")
    assert ticket not in html and session not in html and world.proxy.admin_token not in html
    async with aiohttp.ClientSession() as s:  # the ticket is good once
        async with s.post(world.proxy.url + "/_llmtap/ui/login", json={"ticket": ticket}) as r:
            assert r.status == 403
        async with s.get(world.ui) as r:  # the page's files are code, no data: open without a session
            assert r.status == 200
            csp = r.headers["Content-Security-Policy"]
            assert "default-src 'self'" in csp and "unsafe-inline" not in csp
            assert "<script>" not in await r.text()  # no inline script: every one is a file of its own
        async with s.get(world.proxy.url + "/_llmtap/api/requests", headers={"X-Llmtap-Ui": session}) as r:
            assert r.status == 200


async def test_the_opener_file_of_llmtap_ui_logs_the_browser_in(world: World, tmp_path: Any, monkeypatch: Any) -> None:
    """What `llmtap ui` gives the browser (a file:// path, not the link: tests/test_doors.py) leads a real
    Chromium to the UI, logged in, with the ticket gone from the address bar."""
    from analysis.web.cli import opener_file

    monkeypatch.setenv("LLMTAP_HOME", str(tmp_path))
    b = world.browser
    await b.open("about:blank")
    link = await world.ticket()
    await b.open(opener_file(link).as_uri())
    await b.wait_for("location.pathname === '/_llmtap/ui/' && !!document.querySelector('#inflight')")
    assert await b.evaluate("location.hash") == "#/live" and await world.session()


async def test_the_session_opens_reads_only(world: World) -> None:
    await login(world)
    ours = {"X-Llmtap-Ui": await world.session()}
    async with aiohttp.ClientSession(headers=ours) as s:
        async with s.get(world.proxy.url + "/_llmtap/api/requests") as r:
            assert r.status == 200, await r.text()
        async with s.post(world.proxy.url + "/_llmtap/sql", json={"sql": "SELECT 1"}) as r:
            assert r.status == 403  # acting needs the admin token itself
        async with s.post(world.proxy.url + "/_llmtap/ui/ticket") as r:
            assert r.status == 403
        async with s.get(world.proxy.url + "/_llmtap/api/requests", headers={"Sec-Fetch-Site": "cross-site"}) as r:
            assert r.status == 403
        async with s.get(world.proxy.url + "/_llmtap/api/requests", headers={"Origin": "http://evil.test"}) as r:
            assert r.status == 403
    forged = {"X-Llmtap-Ui": ours["X-Llmtap-Ui"][:-4] + "0000"}
    async with aiohttp.ClientSession(headers=forged) as s:
        async with s.get(world.proxy.url + "/_llmtap/api/requests") as r:
            assert r.status == 403


async def test_what_the_browser_sends_to_another_port_opens_nothing(world: World) -> None:
    """Logged in, the person opens a page of another server on 127.0.0.1 (another port: the same site).
    Its page asks its own port for `/_llmtap/...` every way a page can; everything the browser sent
    there, replayed with aiohttp (as curl would: no Sec-Fetch-*, no Origin), opens nothing of llmtap's."""
    b = world.browser
    await login(world)
    world.caught.clear()
    await b.open(world.attacker)
    await b.evaluate("""Promise.all(['/_llmtap/api/requests', '/_llmtap/live', '/_llmtap/health', '/_llmtap/ui/']
        .map(p => fetch(p, {credentials: 'include'}).then(r => r.text())))""")
    await b.evaluate("new Promise(r => { const i = new Image(); i.onload = i.onerror = r; i.src = '/_llmtap/api/facets'; })")
    await b.evaluate("new Promise(r => { const e = new EventSource('/_llmtap/live'); e.onerror = () => { e.close(); r(1); }; })")
    assert len(world.caught) >= 6
    dropped = {"host", "origin", "referer", "content-length"}
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as s:
        for sent in world.caught:
            headers = {k: v for k, v in sent.headers.items() if k.lower() not in dropped and not k.lower().startswith("sec-fetch")}
            for name in ("api/requests", "api/facets", "live", "health"):
                async with s.get(f"{world.proxy.url}/_llmtap/{name}", headers=headers) as r:
                    assert r.status == 403, (name, headers)
    b.errors.clear()  # the other server's 404s, asked for here: no later test of this browser is to see them


async def test_another_origin_can_neither_read_nor_act(world: World) -> None:
    """A page on another origin of the same site (127.0.0.1, another port), and one on a rebinding name
    (rebind.test -> 127.0.0.1)."""
    b = world.browser
    await b.open(world.attacker)
    api = world.proxy.url + "/_llmtap/api/requests"
    read = await b.evaluate(f"""fetch({orjson.dumps(api).decode()}, {{credentials: 'include'}})
        .then(r => r.text().then(t => 'read ' + r.status + ' ' + t.slice(0, 40)), e => 'refused ' + e.name)""")
    assert read.startswith("refused"), read  # no CORS answer: the page cannot read it
    opaque = await b.evaluate(f"""fetch({orjson.dumps(api).decode()}, {{credentials: 'include', mode: 'no-cors'}})
        .then(r => r.type + ' ' + r.status)""")
    assert opaque == "opaque 0"
    before = len(world.rows("SELECT id FROM requests WHERE error_type = 'admin_forbidden'"))
    acts = [(world.proxy.url + "/_llmtap/sql", '{"sql": "SELECT 1"}'), (world.proxy.url + "/_llmtap/ui/ticket", "")]
    for url, body in acts:  # simple requests (text/plain): no preflight
        await b.evaluate(f"""fetch({orjson.dumps(url).decode()}, {{method: 'POST', credentials: 'include', mode: 'no-cors',
            headers: {{'Content-Type': 'text/plain'}}, body: {orjson.dumps(body).decode()}}}).then(() => 1, () => 0)""")
    def new_refusals() -> list[dict[str, Any]] | None:
        rows = world.rows("SELECT path, status FROM requests WHERE error_type = 'admin_forbidden' ORDER BY started_at")
        return rows[before:] if len(rows) >= before + 2 else None

    refused = await wait_until(new_refusals, what="the two refused admin requests' rows")
    assert sorted(r["path"] for r in refused) == ["/_llmtap/sql", "/_llmtap/ui/ticket"]
    assert {r["status"] for r in refused} == {403}
    await login(world)
    session = await world.session()
    rebound = world.ui.replace("127.0.0.1", REBIND)
    await b.open(rebound)  # the rebinding page's own name in Host: refused
    assert "forbidden" in await b.evaluate("document.body.textContent")
    rebound_api = api.replace("127.0.0.1", REBIND)
    async with aiohttp.ClientSession() as s:
        async with s.get(api, headers={"Host": f"{REBIND}:{world.proxy.port}", "X-Llmtap-Ui": session}) as r:
            assert r.status == 403  # even with the session, a foreign Host
    read = await b.evaluate(f"fetch({orjson.dumps(rebound_api).decode()}).then(r => r.status)")
    assert read == 403


# -- the pages -------------------------------------------------------------------------------------------


async def login(world: World) -> None:
    await world.browser.open("about:blank")  # a new document: the same one would take the link as a hash change
    await world.browser.open(await world.ticket())
    await world.browser.wait_for("location.pathname === '/_llmtap/ui/' && !!document.querySelector('#inflight')")


async def test_every_page_loads_without_an_error_and_only_from_the_proxy(world: World) -> None:
    await login(world)
    b = world.browser
    b.errors.clear()
    b.requested.clear()
    [row] = world.rows("SELECT id FROM requests WHERE request_model = 'gpt-4o-mini' ORDER BY started_at LIMIT 1")
    pages = [
        ("#/live", "!!document.querySelector('#finished')"),
        ("#/requests", "document.querySelectorAll('table.requests tbody tr').length > 0"),
        (f"#/request/{row['id']}", "!!document.querySelector('#waterfall') && !!document.querySelector('#chunk-chart canvas')"),
        ("#/sessions", "document.querySelectorAll('tr[data-session]').length > 0"),
        (f"#/session/{SESSION}", "!!document.querySelector('#gantt')"),
        ("#/overview", "window.__llmtapChartsDrawn > 0 && window.__llmtapChartsDrawn === window.__llmtapChartsExpected"),
        ("#/compare?by=model&a=claude-haiku-4-5&b=gpt-4o-mini&since=24h",
         "!!document.querySelector('#compare-out table') || !!document.querySelector('#compare-out .error')"),
    ]
    for route, ready in pages:
        await world.page(route, ready)
    assert b.errors == [] and b.dialogs == []
    assert all(url.startswith((world.proxy.url, "data:")) for url in b.requested), b.requested


async def test_live_shows_a_request_in_flight_then_finished_with_the_rows_ttft(world: World) -> None:
    b = world.browser
    await world.page("#/live", "!!document.querySelector('#finished')")
    await b.evaluate("""window.__seen = {}; new MutationObserver(() => {
        document.querySelectorAll('#inflight tr[data-id], #finished tr[data-id]').forEach(tr => {
          const k = tr.closest('table').id + ':' + tr.dataset.id; if (!(k in window.__seen)) window.__seen[k] = Date.now(); });
      }).observe(document.getElementById('main'), {childList: true, subtree: true}); 1""")
    slow = {"x-sim-ttft-ms": "300", "x-sim-itl-ms": "40", "x-sim-tokens": "40", "x-llmtap-tag": "live"}
    async with aiohttp.ClientSession() as s:
        started = time.time()
        await chat(s, world.proxy.url, "gpt-4o-mini", slow)
        ended = time.time()
    [row] = world.rows("SELECT id, ttft_ms FROM requests WHERE tag = 'live'")
    seen = await b.wait_for(f"window.__seen['finished:{row['id']}'] && window.__seen")
    assert f"inflight:{row['id']}" in seen  # it was shown while streaming (2 s, eight ticks)
    assert seen[f"inflight:{row['id']}"] / 1000 - started < LIVE_S
    assert seen[f"finished:{row['id']}"] / 1000 - ended < LIVE_S
    ttft = await b.evaluate(f"document.querySelector('#finished tr[data-id=\"{row['id']}\"] td:nth-child(8)').dataset.value")
    assert float(ttft) == pytest.approx(row["ttft_ms"], abs=1e-6)


async def test_the_waterfall_is_the_rows_columns_and_the_request_is_shows(world: World) -> None:
    [row] = world.rows("SELECT * FROM requests WHERE request_model = 'gpt-4o-mini' ORDER BY started_at LIMIT 1")
    await world.page(f"#/request/{row['id']}", "!!document.querySelector('#waterfall')")
    parts = await world.browser.evaluate(
        "[...document.querySelectorAll('#waterfall .label')].map(l => [l.textContent, +l.nextSibling.nextSibling.dataset.value])")
    columns = {"proxy overhead": "proxy_overhead_ms", "pool wait": "pool_wait_ms", "llmtap wait": "proxy_wait_ms",
               "DNS": "dns_ms", "connect": "connect_ms", "TLS": "tls_ms", "upstream wait": "upstream_wait_ms",
               "headers → first token": "headers_to_first_token_ms", "decode": "decode_ms"}
    shown = {label: value for label, value in parts}
    for label, column in columns.items():
        if row[column] is not None:
            assert shown[label] == pytest.approx(row[column], abs=1e-3), label
    assert sum(shown[label] for label in columns if label in shown) == pytest.approx(row["last_token_ms"], abs=0.01)
    shown_json = await cli(world, "show", row["id"])
    async with aiohttp.ClientSession() as s, s.get(world.proxy.url + f"/_llmtap/api/request/{row['id']}",
                                                   headers={TOKEN_HEADER: world.proxy.admin_token}) as r:
        api = await r.json()
    assert api["request"] == shown_json["request"] and api["chunks"] == shown_json["chunks"]
    ttft = await world.browser.evaluate("document.querySelector('dd[data-key=ttft_ms]').textContent")
    assert ttft == (f"{round(row['ttft_ms'])} ms" if row["ttft_ms"] >= 10 else f"{row['ttft_ms']:.1f} ms")
    assert len(api["chunks"]) == row["output_events"] and api["bodies"]["response_body"]


async def test_a_sessions_spans_are_the_clis(world: World) -> None:
    expected = await cli(world, "session", SESSION)
    await world.page(f"#/session/{SESSION}", "!!document.querySelector('#gantt')")
    spans = await world.browser.evaluate(
        "[...document.querySelectorAll('tr.span')].map(tr => [...tr.children].map(td => td.dataset.value))")
    assert [[float(a), kind, part, None if s == "" else float(s), rid, acc] for a, kind, part, s, rid, acc in spans] == \
        [[sp["start_s"], sp["kind"], sp["part"], sp["seconds"], sp["request_id"], sp["account"]] for sp in expected["spans"]]
    listed = await cli(world, "sessions")
    await world.page("#/sessions", "document.querySelectorAll('tr[data-session]').length > 0")
    walls = await world.browser.evaluate(
        "Object.fromEntries([...document.querySelectorAll('tr[data-session]')].map(tr => [tr.dataset.session, +tr.children[2].dataset.value]))")
    assert walls == {s["session"]: s["wall_s"] for s in listed}


async def test_overview_and_requests_numbers_are_the_clis(world: World) -> None:
    report = await cli(world, "report", "--by", "model")
    await world.page("#/overview", "document.querySelectorAll('table.summary tbody tr').length > 0")
    shown = await world.browser.evaluate("""Object.fromEntries([...document.querySelectorAll('table.summary tbody tr')]
        .map(tr => [tr.dataset.model, [1, 3, 8].map(i => tr.children[i].dataset.value)]))""")
    assert len(report["groups"]) >= 5
    for group in report["groups"]:
        requests, ttft, e2e = (None if v == "" else float(v) for v in shown[group["model"]])
        assert requests == group["requests"]
        for page, cli_value in ((ttft, group["ttft_p50_ms"]), (e2e, group["e2e_p50_ms"])):
            assert (page is None) == (cli_value is None), group["model"]
            if page is not None:
                assert page == pytest.approx(cli_value, abs=0.05)  # the CLI's JSON rounds to 0.1 ms
    every = await cli(world, "report", "--all")
    await world.page("#/requests?since=", "document.querySelectorAll('table.requests tbody tr').length > 0")
    assert (await world.browser.evaluate("document.getElementById('range').textContent")).endswith(f"of {every['requests']}")


async def test_hostile_text_is_shown_as_text(world: World) -> None:
    b = world.browser
    b.errors.clear()  # under xdist, whichever tests ran before in this process
    await world.page("#/requests?since=&limit=100", "document.querySelectorAll('table.requests tbody tr').length > 0")
    cells = await b.evaluate("[...document.querySelectorAll('table.requests td')].map(td => td.dataset.value)")
    assert XSS_MODEL in cells and OSC_MODEL in cells and XSS_TAG in cells and XSS_MESSAGE in cells
    assert XSS_MODEL in await world.text()
    [bad] = world.rows("SELECT id FROM requests WHERE request_model = 'bad-model'")
    await world.page(f"#/request/{bad['id']}", "!!document.querySelector('#error-message')")
    assert XSS_MESSAGE in await b.evaluate("document.getElementById('error-message').textContent")
    assert await b.evaluate("document.querySelectorAll('#diagnosis li').length") >= 1
    [xss] = world.rows("SELECT id FROM requests WHERE request_model LIKE '<script>%'")
    await world.page(f"#/request/{xss['id']}", "!!document.querySelector('dd[data-key=request_model]')")
    assert await b.evaluate("document.querySelector('dd[data-key=request_model]').textContent") == XSS_MODEL
    await world.page("#/live", "!!document.querySelector('#finished')")
    assert await b.evaluate("document.querySelectorAll('main img, main script').length") == 0
    assert await b.evaluate("window.__xss === undefined") and b.dialogs == [] and b.errors == []


async def test_an_800_px_window_stays_usable(world: World) -> None:
    b = world.browser
    await b.resize(800, 900)
    try:
        [row] = world.rows("SELECT id FROM requests WHERE request_model = 'gpt-4o-mini' ORDER BY started_at LIMIT 1")
        for route, ready in (("#/requests?since=", "document.querySelectorAll('table.requests tbody tr').length > 0"),
                             (f"#/request/{row['id']}", "!!document.querySelector('#waterfall')"),
                             (f"#/session/{SESSION}", "!!document.querySelector('#gantt')"),
                             ("#/sessions", "document.querySelectorAll('tr[data-session]').length > 0"),
                             ("#/overview", "window.__llmtapChartsDrawn > 0"), ("#/live", "!!document.querySelector('#finished')")):
            await world.page(route, ready)
            width = await b.evaluate("document.documentElement.scrollWidth")
            assert width <= 800, (route, width)  # wide tables scroll inside their box, not the page
            hidden = await b.evaluate("""[...document.querySelectorAll('nav a, form button, .pager button')].filter(el => {
                const r = el.getBoundingClientRect(); return r.right > 800 || r.width === 0; }).map(el => el.textContent)""")
            assert hidden == [], route
            if route == "#/sessions":  # the shares (the "why") in the window, not scrolled off
                shares = await b.evaluate("""[...document.querySelectorAll('table.sessions th.share, table.sessions .stack')]
                    .map(el => { const r = el.getBoundingClientRect(); return [el.textContent, r.width > 0 && r.right <= 800]; })""")
                assert [t for t, _ in shares[:4]] == ["model", "tools", "you", "other"] and all(v for _, v in shares), shares
                assert await b.evaluate("document.querySelector('table.sessions').closest('.scroll').scrollWidth") <= 800
    finally:
        await b.resize(1400, 1000)


async def test_a_page_left_before_its_answer_came_is_not_drawn_over_the_next(world: World) -> None:
    """Overview's answer held back until Requests is shown: when it comes, Requests stays (an
    answer for a page already left is dropped; drawn, it replaced the page under CI's load)."""
    b = world.browser
    rows = "document.querySelectorAll('table.requests tbody tr').length > 0"
    await world.page("#/live", "!!document.querySelector('#finished')")
    await b.hold("*/_llmtap/api/overview*")
    await b.evaluate("location.hash = '#/overview'; 1")
    overview = await b.held()
    await world.page("#/requests?since=&limit=5", rows)
    answers = await b.evaluate("window.__llmtapAnswers || 0")
    await b.release(overview)
    await b.wait_for(f"(window.__llmtapAnswers || 0) > {answers}")  # Overview's answer came, and was dropped
    assert await b.evaluate(rows) and not await b.evaluate("!!document.querySelector('table.summary')")
    assert await b.evaluate("location.hash") == "#/requests?since=&limit=5"


async def test_the_keyboard_reaches_every_control(world: World) -> None:
    b = world.browser
    for route, ready in (("#/requests?since=&limit=5", "document.querySelectorAll('table.requests tbody tr').length > 0"),
                         ("#/compare", "!!document.querySelector('#f-by')")):
        await world.page(route, ready)
        controls = await b.evaluate("""(() => { const all = [...document.querySelectorAll('a[href], button, input, select')]
            .filter(el => !el.disabled); all.forEach((el, i) => el.dataset.k = i); return all.length; })()""")
        await b.evaluate("document.activeElement && document.activeElement.blur(); 1")
        reached = set()
        for _ in range(2 * controls + 6):  # from wherever focus starts, round the page once at least
            await b.press("Tab", 9)
            key = await b.evaluate("document.activeElement && document.activeElement.dataset.k || null")
            if key is not None:
                reached.add(int(key))
        missed = await b.evaluate(f"[...document.querySelectorAll('[data-k]')].filter(el => !{sorted(reached)}.includes(+el.dataset.k)).map(el => el.outerHTML.slice(0, 120))")
        assert missed == [], route
    await world.page("#/requests?since=&limit=5", "!!document.querySelector('th button[data-sort=ttft_ms]')")
    await b.evaluate("document.querySelector('th button[data-sort=ttft_ms]').focus(); 1")
    await b.press("Enter", 13)  # a sort is a button: Enter works it
    await b.wait_for("location.hash.includes('sort=ttft_ms')")


async def test_a_session_is_good_for_its_token_and_its_hours_only() -> None:
    from proxy.relay import ui_doors

    issued = 1_800_000_000.0
    session = ui_doors.make_session("token-a", now=issued)
    assert ui_doors.session_valid(session, "token-a", now=issued + 60)
    assert not ui_doors.session_valid(session, "token-b", now=issued + 60)  # a restart's new token ends it
    assert not ui_doors.session_valid(session, "token-a", now=issued + ui_doors.SESSION_S + 1)
    version, when, nonce, mac = session.split(".")
    assert not ui_doors.session_valid(f"{version}.{int(when) + 3600}.{nonce}.{mac}", "token-a", now=issued + 60)
    assert not ui_doors.session_valid("", "token-a") and not ui_doors.session_valid(session, "")
    old = f"v1.{int(issued)}.{nonce}"  # the cookie of before, signed by the same token: not a session
    assert not ui_doors.session_valid(f"{old}.{ui_doors._sign('token-a', old)}", "token-a", now=issued + 60)
    tickets = ui_doors.Tickets()
    ticket = tickets.issue()
    assert tickets.redeem(ticket) and not tickets.redeem(ticket) and not tickets.redeem("")
    for _ in range(ui_doors.MAX_TICKETS + 1):
        tickets.issue()
    assert len(tickets._open) == ui_doors.MAX_TICKETS  # unused ones are bounded


async def test_a_tab_whose_session_the_proxy_no_longer_takes_says_how_to_log_in(world: World) -> None:
    """After a restart (a new admin token) the tab's session is refused: the page says `llmtap ui`, not
    the API's 403."""
    b = world.browser
    await login(world)
    await b.evaluate("sessionStorage.setItem('llmtap_ui', sessionStorage.getItem('llmtap_ui').slice(0, -4) + '0000'); 1")
    await b.evaluate("location.hash = '#/requests'; 1")
    await b.wait_for("!!document.getElementById('logged-out')")
    text = await world.text()
    assert "Run llmtap ui in a terminal" in text and "no longer takes" in text and "admin" not in text
    assert await b.evaluate("sessionStorage.getItem('llmtap_ui')") is None
    await login(world)  # the tab the next tests use


async def test_a_request_page_links_its_session_and_names_its_tool_calls(world: World) -> None:
    [asked] = world.rows(f"SELECT id, tool_calls FROM requests WHERE session_id = '{SESSION}' AND tool_calls IS NOT NULL")
    [answered] = world.rows(f"SELECT id, tool_results FROM requests WHERE session_id = '{SESSION}' AND tool_results IS NOT NULL")
    b = world.browser
    await world.page(f"#/request/{asked['id']}", "!!document.querySelector('#chunk-legend')")
    calls = await b.evaluate("[...document.querySelectorAll('tr.tool-call')].map(tr => [...tr.children].map(td => td.dataset.value))")
    assert calls == [[c["name"], c["id"], str(c["ended_ms"])] for c in asked["tool_calls"]] and calls
    kinds = await b.evaluate("[...document.querySelectorAll('#chunk-legend [data-kind]')].map(s => s.textContent)")
    shown = await cli(world, "show", asked["id"])
    by_kind: dict[str, int] = {}
    for c in shown["chunks"]:
        by_kind[c["event_type"]] = by_kind.get(c["event_type"], 0) + 1
    assert [k.split(":")[0] for k in kinds] == list(by_kind) and "tool_args" in by_kind  # text and tool_args apart
    assert all(f"{n} event" in k for k, n in zip(kinds, by_kind.values())) and "--" not in "".join(kinds)
    await b.evaluate("document.getElementById('session-link').click(); 1")
    await b.wait_for("!!document.querySelector('#gantt')")
    assert SESSION in await b.evaluate("document.querySelector('main h1').textContent")
    await world.page(f"#/request/{answered['id']}", "!!document.querySelector('tr.tool-result')")
    results = await b.evaluate("[...document.querySelectorAll('tr.tool-result')].map(tr => [...tr.children].map(td => td.dataset.value))")
    assert results == [[c["name"], c["id"]] for c in answered["tool_results"]]


async def test_the_sessions_list_draws_a_bar_per_session_on_one_scale(world: World) -> None:
    listed = {s["session"]: s for s in await cli(world, "sessions")}
    await world.page("#/sessions", "document.querySelectorAll('tr[data-session]').length > 0")
    b = world.browser
    shown = await b.evaluate("""Object.fromEntries([...document.querySelectorAll('tr[data-session]')].map(tr => {
        const bar = tr.querySelector('.stack'); return [tr.dataset.session, {width: bar.getBoundingClientRect().width,
        parts: Object.fromEntries([...bar.children].map(i => [i.dataset.part, i.getBoundingClientRect().width]))}]; }))""")
    assert set(shown) == set(listed)
    longest = max(s["wall_s"] for s in listed.values())
    widest = max(v["width"] for v in shown.values())
    for key, s in listed.items():
        assert shown[key]["width"] == pytest.approx(widest * s["wall_s"] / longest, abs=1.5), key  # one scale
        t = s["totals"]
        for part, seconds in (("wait", t["wait_s"]), ("generating", t["generating_s"]), ("tool", t["tool_s"]),
                              ("you", t["you_s"]), ("other", t["other_s"])):
            width = shown[key]["parts"].get(part, 0.0)
            assert width == pytest.approx(shown[key]["width"] * seconds / max(s["wall_s"], 1e-9), abs=1.5), (key, part)
    other = await b.evaluate("[...document.querySelectorAll('table.sessions th')].map(th => th.textContent)")
    assert "other" in other
    about = await b.evaluate(f"document.querySelector('tr[data-session=\"{SESSION}\"] td.who small').textContent")
    assert about == "claude-code · first lookup" == " · ".join(
        [listed[SESSION]["tool"], "first " + listed[SESSION]["first_tool"]])  # the CLI's JSON's project (none) and first tool
    assert "start (UTC)" in other and len(await b.evaluate(
        "document.querySelector('tr[data-session] td.when').textContent")) == len("2026-12-0510:44:42")  # to the second (the date and time on two lines)


async def test_a_sessions_turns_and_its_time_axis(world: World) -> None:
    expected = await cli(world, "session", SESSION)
    await world.page(f"#/session/{SESSION}", "!!document.querySelector('#time-axis')")
    b = world.browser
    turns = await b.evaluate("[...document.querySelectorAll('#gantt .turn')].map(t => t.textContent)")
    assert len(turns) == expected["turns"] == 2 and turns[0].startswith("Turn 1")
    assert "2 turns" in await b.evaluate("document.getElementById('session-head').textContent")
    ticks = await b.evaluate("[...document.querySelectorAll('#time-axis span')].map(s => +s.dataset.s)")
    assert ticks[0] == 0 and ticks[-1] <= expected["wall_s"] + 1e-9 and len(ticks) >= 3
    labels = await b.evaluate("[...document.querySelectorAll('#gantt .label')].map(l => l.textContent)")
    assert "model: wait" in labels and "first token" not in " ".join(labels)  # one name, the JSON's


@pytest.mark.skipif("side" not in KINDS, reason="side requests are marked by branch agents' `kind` 'side'")
async def test_side_requests_are_folded_under_their_turn(world: World) -> None:
    [side] = world.rows("SELECT id FROM requests WHERE kind = 'side'")
    [turn] = world.rows("SELECT id FROM requests WHERE request_model = 'qwen3-coder' AND kind = 'generation'")
    b = world.browser
    await world.page(f"#/request/{turn['id']}", "!!document.querySelector('#session-link')")
    await b.evaluate("document.getElementById('session-link').click(); 1")
    await b.wait_for("!!document.querySelector('#gantt')")
    folded = await b.evaluate("[...document.querySelectorAll('#gantt details.side')].map(d => [d.dataset.turn, d.open,"
                              " d.querySelector('summary').textContent])")
    assert folded == [["1", False, "1 side request in this turn (beside the agent's turn, not in its time)"]]
    spans = await b.evaluate("[...document.querySelectorAll('tr.span')].map(tr => tr.children[4].dataset.value)")
    assert side["id"] not in spans


async def test_requests_fits_1400_px_and_cuts_no_session_id_mid_word(world: World) -> None:
    b = world.browser
    await world.page(f"#/requests?since=&session={SESSION}", "document.querySelectorAll('table.requests tbody tr').length > 0")
    box = await b.evaluate("(() => { const s = document.querySelector('table.requests').closest('.scroll');"
                           " return [s.scrollWidth, s.clientWidth]; })()")
    assert box[0] <= box[1], box  # no column scrolled off at 1,400 px
    ids = await b.evaluate("[...document.querySelectorAll('table.requests tbody tr')].map(tr => tr.children[13].textContent)")
    assert set(ids) == {SESSION[:13] + "…"}  # as `llmtap sessions` prints it, which `llmtap session` takes back
    await world.page("#/overview", "!!document.querySelector('#overview .kpi')")
    assert "Errors among the generations" in await world.text() and "Generations" in await world.text()
