"""The latency breakdown adds up, row by row, on every dialect and connection kind: the proxy's
part, the connection's (pool, DNS, TCP, TLS), the upstream's wait for headers, headers to the
first token, and decoding, against the recorded upstream_headers_ms, ttft_ms and last_token_ms.
Structure only: sums, which parts are zero, and a 150 ms hold that must land in TLS."""

from __future__ import annotations

import json
import ssl
from pathlib import Path

import aiohttp
import pytest

from .serving import RunningProxy
from proxy.simulator.app import Simulator
from proxy.simulator.config import SimConfig

from .conftest import proxy_config, rows
from .fast_path_skips import needs, on

trustme = pytest.importorskip("trustme")

FAST = {"ttft_ms": 5, "itl_ms": 1, "tokens": 4, "prefill_us_per_token": 0}
PARTS = ("proxy_overhead_ms", "pool_wait_ms", "dns_ms", "connect_ms", "tls_ms", "upstream_wait_ms", "proxy_wait_ms")
CONNECTION = ("dns_ms", "connect_ms", "tls_ms")
MESSAGES = [{"role": "user", "content": "hi"}]
DIALECTS = {
    "openai_chat": ("/v1/chat/completions", {"model": "m", "stream": True, "messages": MESSAGES}),
    "openai_responses": ("/v1/responses", {"model": "m", "stream": True, "input": "hi"}),
    "anthropic": ("/v1/messages", {"model": "m", "stream": True, "max_tokens": 50, "messages": MESSAGES}),
    "gemini": ("/v1beta/models/sim-gemini:streamGenerateContent?alt=sse",
               {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}),
}
SQL = "SELECT * FROM requests ORDER BY started_at"


def assert_adds_up(row: dict) -> None:
    """The parts are consecutive intervals: to headers, to the first token, to the last."""
    assert all(row[name] is not None and row[name] >= 0 for name in PARTS), row
    assert sum(row[name] for name in PARTS) == pytest.approx(row["upstream_headers_ms"], abs=1e-6)
    assert row["upstream_headers_ms"] + row["headers_to_first_token_ms"] == pytest.approx(row["ttft_ms"], abs=1e-6)
    assert row["ttft_ms"] + row["decode_ms"] == pytest.approx(row["last_token_ms"], abs=1e-6)
    assert row["last_token_ms"] <= row["e2e_ms"]


async def stream(session: aiohttp.ClientSession, base: str, dialect: str) -> None:
    path, body = DIALECTS[dialect]
    async with session.post(base + path, json=body, headers={"Authorization": "Bearer sk-test"}) as r:
        assert r.status == 200, await r.text()
        await r.read()


@pytest.mark.parametrize("dialect", list(DIALECTS))
async def test_each_sse_dialect_new_then_reused(proxy: RunningProxy, dialect: str) -> None:
    async with aiohttp.ClientSession() as s:
        for _ in range(3):
            await stream(s, proxy.url, dialect)
    first, *later = rows(proxy, SQL)
    assert [r["dialect"] for r in (first, *later)] == [dialect] * 3
    for row in (first, *later):
        assert_adds_up(row)
    assert first["connection_reused"] is False and first["tls_ms"] == 0  # a plain-http upstream
    assert [r["connection_reused"] for r in later] == [True, True]
    assert all(r[name] == 0 for r in later for name in CONNECTION)


async def test_websocket_turns_ride_the_open_connection(proxy: RunningProxy) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.ws_connect(proxy.url + "/v1/responses", headers={"Authorization": "Bearer sk-test"}) as ws:
            for _ in range(2):
                await ws.send_json({"type": "response.create", "model": "m", "input": "hi"})
                while (await ws.receive_json(timeout=10))["type"] != "response.completed":
                    pass
    turns = rows(proxy, SQL)
    assert [(r["status"], r["connection_reused"]) for r in turns] == [(101, True), (101, True)]
    for row in turns:
        assert_adds_up(row)
        assert row["upstream_wait_ms"] == 0 and row["headers_to_first_token_ms"] == row["ttft_ms"]


async def test_every_request_on_a_new_connection_without_keep_alive(tmp_path: Path) -> None:
    async with Simulator(SimConfig(**FAST, keep_alive=False)) as sim:
        async with RunningProxy(proxy_config(sim.url, tmp_path)) as p, aiohttp.ClientSession() as s:
            for _ in range(3):
                await stream(s, p.url, "openai_chat")
            recorded = rows(p, SQL)
    assert [r["connection_reused"] for r in recorded] == [False] * 3
    for row in recorded:
        assert_adds_up(row)


async def test_a_name_is_looked_up_once_then_cached(tmp_path: Path) -> None:
    """An upstream named `localhost`: the first new connection resolves it (dns_ms), the next new
    ones find it in the connector's cache (0)."""
    async with Simulator(SimConfig(**FAST, keep_alive=False)) as sim:
        named = sim.url.replace("127.0.0.1", "localhost")
        async with RunningProxy(proxy_config(named, tmp_path)) as p, aiohttp.ClientSession() as s:
            for _ in range(3):
                await stream(s, p.url, "openai_chat")
            recorded = rows(p, SQL)
    assert [r["connection_reused"] for r in recorded] == [False] * 3
    assert recorded[0]["dns_ms"] > 0 and [r["dns_ms"] for r in recorded[1:]] == [0, 0]
    for row in recorded:
        assert_adds_up(row)


async def test_a_tls_upstream_whose_handshake_costs_150_ms(tmp_path: Path, tls: tuple[ssl.SSLContext, Path]) -> None:
    """The simulator holds each new connection's ClientHello 150 ms: that lands in tls_ms, once."""
    async with Simulator(SimConfig(**FAST, connect_delay_ms=150), ssl_context=tls[0]) as sim:
        config = proxy_config(sim.url, tmp_path, ca_bundle=str(tls[1]))
        async with RunningProxy(config) as p, aiohttp.ClientSession() as s:
            for dialect in ("openai_chat", "anthropic"):
                await stream(s, p.url, dialect)
            recorded = rows(p, SQL)
    first, second = recorded
    for row in recorded:  # without the conn_timing hook, a new connection's handshake is in connect_ms
        assert_adds_up(row if on("conn_timing") else {**row, "tls_ms": row["tls_ms"] or 0.0})
    assert first["connection_reused"] is False
    if on("conn_timing"):
        assert first["tls_ms"] >= 149 and first["tls_ms"] > first["connect_ms"]
    else:
        assert first["tls_ms"] is None and first["connect_ms"] >= 149
    assert second["connection_reused"] is True and second["tls_ms"] == 0


async def test_no_upstream_connection_no_breakdown(tmp_path: Path) -> None:
    """An upstream that refuses: the connection was tried (not reused) and never got headers;
    a request llmtap answers itself (no route) has no connection at all."""
    async with Simulator(SimConfig(**FAST)) as sim:
        dead = sim.url
    config = proxy_config(dead, tmp_path, routes={"/only": dead})
    async with RunningProxy(config) as p, aiohttp.ClientSession() as s:
        await stream_status(s, p.url + "/v1/chat/completions", 502)
        recorded = rows(p, SQL)
    (refused,) = recorded
    assert refused["connection_reused"] is False and refused["upstream_wait_ms"] is None
    assert refused["headers_to_first_token_ms"] is None and refused["decode_ms"] is None


async def test_a_local_answer_has_no_connection(proxy: RunningProxy) -> None:
    async with aiohttp.ClientSession() as s:
        await stream_status(s, proxy.url + "/_tag/x/v1/v1/chat/completions/..%2f", 400)
    (row,) = rows(proxy, SQL)
    assert row["connection_reused"] is None and all(row[name] is None for name in PARTS[1:])


async def stream_status(session: aiohttp.ClientSession, url: str, status: int) -> None:
    async with session.post(url, json=DIALECTS["openai_chat"][1]) as r:
        assert r.status == status, await r.text()


@needs("conn_timing")  # the tls column
async def test_report_breakdown_shows_every_request_paying_a_fresh_tls_connection(
        tmp_path: Path, tls: tuple[ssl.SSLContext, Path]) -> None:
    """/a reuses its connection; /b's upstream closes each one, and each new TLS handshake there
    costs 150 ms: the breakdown says so, in the table, the bars, the JSON and the HTML report."""
    from click.testing import CliRunner

    from analysis.cli import report

    slow = SimConfig(**FAST, connect_delay_ms=150, keep_alive=False)
    async with Simulator(SimConfig(**FAST)) as a, Simulator(slow, ssl_context=tls[0]) as b:
        config = proxy_config(a.url, tmp_path, routes={"/a": a.url, "/b": b.url}, ca_bundle=str(tls[1]))
        async with RunningProxy(config) as p, aiohttp.ClientSession() as s:
            for _ in range(4):
                for route in ("/a", "/b"):
                    await stream(s, p.url + route, "openai_chat")
            assert p.flush(10)
    db = str(tmp_path / "llmtap.duckdb")
    runner = CliRunner()
    text = runner.invoke(report, ["--db", db, "--breakdown", "--by", "route"]).output
    lines = text.splitlines()
    head = next(line for line in lines if line.startswith("route"))
    assert head.split() == ["route", "reqs", "new%", "llmtap", "dns", "connect", "tls", "wait", "→token", "TTFT",
                            "decode"]
    row_a = next(line.split() for line in lines if line.startswith("/a "))
    row_b = next(line.split() for line in lines if line.startswith("/b "))
    assert row_a[1:3] == ["4", "25%"] and row_a[6] == "0.0"
    assert row_b[1:3] == ["4", "100%"] and float(row_b[6]) >= 149
    bar_a, bar_b = (next(line for line in lines if line.startswith(r + "  ") and line.endswith(" ms")) for r in ("/a", "/b"))
    assert bar_b.count("▓") > 30 and "▓" not in bar_a and len(bar_b) > len(bar_a)
    data = json.loads(runner.invoke(report, ["--db", db, "--breakdown", "--by", "route", "--format", "json"]).output)
    for group in data["groups"]:  # the means of the parts add up to the mean TTFT
        means = group["mean_ms"]
        assert sum(v for k, v in means.items() if k != "ttft") == pytest.approx(means["ttft"], abs=0.01)
    page = tmp_path / "r.html"
    assert runner.invoke(report, ["--db", db, "--by", "route", "--html", str(page)]).exit_code == 0
    assert "Where TTFT goes, by route" in page.read_text() and 'title="tls: ' in page.read_text()
