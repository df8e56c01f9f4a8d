"""The simulator standing in for a slower channel: delayed headers, a fresh connection's cost,
no keep-alive. Lower bounds only (a sleep never ends early); connection counts, not speeds."""

from __future__ import annotations

import time

import aiohttp
from click.testing import CliRunner

from proxy.simulator.app import Simulator
from proxy.simulator.cli import mock_upstream
from proxy.simulator.config import SimConfig

FAST = {"ttft_ms": 0, "itl_ms": 0, "tokens": 3, "prefill_us_per_token": 0}
CHAT = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


async def _post(session: aiohttp.ClientSession, url: str, **headers: str) -> tuple[float, float, str]:
    """(ms to headers, ms to the end, the Connection header) of one streamed chat."""
    t0 = time.perf_counter()
    async with session.post(url + "/v1/chat/completions", json=CHAT, headers=headers) as r:
        at_headers = time.perf_counter()
        body = await r.read()
        assert r.status == 200 and body.endswith(b"data: [DONE]\n\n")
        return (at_headers - t0) * 1000, (time.perf_counter() - t0) * 1000, r.headers.get("Connection", "")


async def test_headers_delay_holds_the_headers_and_the_tokens_behind_them() -> None:
    async with Simulator(SimConfig(**FAST, headers_delay_ms=150)) as sim, aiohttp.ClientSession() as s:
        headers_ms, end_ms, _ = await _post(s, sim.url)
        assert headers_ms >= 149 and end_ms >= headers_ms
        override_ms, _, _ = await _post(s, sim.url, **{"x-sim-headers-delay-ms": "300"})
        assert override_ms >= 299


async def test_connect_delay_is_paid_once_per_connection() -> None:
    async with Simulator(SimConfig(**FAST, connect_delay_ms=150)) as sim, aiohttp.ClientSession() as s:
        first_ms, _, _ = await _post(s, sim.url)
        for _ in range(3):
            await _post(s, sim.url)
        assert first_ms >= 149
        assert sim.connections == 1  # the next three rode the same connection


async def test_no_keep_alive_makes_every_request_open_a_connection() -> None:
    config = SimConfig(**FAST, connect_delay_ms=100, keep_alive=False)
    async with Simulator(config) as sim, aiohttp.ClientSession() as s:
        results = [await _post(s, sim.url) for _ in range(3)]
        assert sim.connections == 3
        assert all(headers_ms >= 99 and connection == "close" for headers_ms, _, connection in results)


def test_mock_upstream_has_the_options() -> None:
    text = CliRunner().invoke(mock_upstream, ["--help"]).output
    for option in ("--headers-delay-ms", "--connect-delay-ms", "--no-keep-alive"):
        assert option in text
