"""`GET /_llmtap/live`: ticks of in-flight and finished requests, only while someone watches."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from proxy.observe.live import VIEWER_QUEUE, LiveFeed, Viewer, frame
from .serving import RunningProxy
from proxy.simulator.app import Simulator
from proxy.meter.sse import SSEParser

from .cli_traffic import claude_tools
from .conftest import proxy_config
from .waiting import wait_until

LIVE = "/_llmtap/live"


def feeds(p: RunningProxy) -> list[LiveFeed]:
    return [x for x in p.state.recorder.observers if isinstance(x, LiveFeed)]


async def claude_stream(s: aiohttp.ClientSession, base: str, session_id: str, tokens: int = 40,
                        itl_ms: int = 25, ttft_ms: int = 150) -> None:
    body = {"model": "sim-claude", "max_tokens": 100, "stream": True, "messages": [{"role": "user", "content": "hi"}],
            "tools": claude_tools()}
    headers = {"x-claude-code-session-id": session_id, "user-agent": "claude-cli/2.1.0 (external, cli)",
               "x-sim-tokens": str(tokens), "x-sim-itl-ms": str(itl_ms), "x-sim-ttft-ms": str(ttft_ms)}
    async with s.post(base + "/v1/messages", json=body, headers=headers) as r:
        assert r.status == 200
        await r.read()


async def read_ticks(resp: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    parser = SSEParser()
    async for chunk in resp.content.iter_any():
        for event, data in parser.feed(chunk):
            assert event == "tick"
            yield orjson.loads(data)


async def test_ticks_show_requests_in_flight_then_finished(proxy: RunningProxy) -> None:
    sessions = ["sess-a", "sess-b", "sess-c"]
    seen_inflight: dict[str, list[dict]] = {}
    finished: dict[str, dict] = {}
    stamps: list[float] = []
    async with aiohttp.ClientSession() as s:
        async with s.get(proxy.url + LIVE, headers=proxy.admin.headers()) as resp:
            assert resp.status == 200 and resp.headers["Content-Type"] == "text/event-stream"
            load = asyncio.gather(*(claude_stream(s, proxy.url, sid) for sid in sessions))
            async with asyncio.timeout(10):
                async for tick in read_ticks(resp):
                    stamps.append(time.monotonic())
                    assert set(tick) >= {"now", "dropped", "loop_lag", "inflight", "finished", "requests_seen"}
                    assert tick["loop_lag"]["p99_ms"] is None or tick["loop_lag"]["p99_ms"] < 200
                    for entry in tick["inflight"]:
                        seen_inflight.setdefault(entry["id"], []).append(entry)
                    finished.update((row["id"], row) for row in tick["finished"])
                    if len(finished) == 3:
                        break
            await load
    assert set(finished) == set(seen_inflight)  # each request was seen live, then finished
    assert sorted(r["session_id"] for r in finished.values()) == sessions
    for rid, entries in seen_inflight.items():
        first, last = entries[0], entries[-1]
        assert (first["model"], first["tool"], first["method"], first["path"]) == (
            "sim-claude", "claude-code", "POST", "/v1/messages")
        assert [e["elapsed_ms"] for e in entries] == sorted(e["elapsed_ms"] for e in entries)
        assert last["ttft_ms"] is not None and 140 <= last["ttft_ms"] < 1000
        assert 0 < last["output_events"] and 0 < last["tokens"] and last["tokens_per_s"] > 0
        row = finished[rid]
        assert row["outcome"] == "ok" and row["stream"] is True and row["output_tokens"] == 40
        assert row["ttft_ms"] >= last["ttft_ms"] - 1 and row["e2e_ms"] > row["ttft_ms"]
        assert row["tpot_ms"] > 20 and row["started"] > 1.7e9 and row["request_model"] == "sim-claude"
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    assert 0.15 < sum(gaps) / len(gaps) < 0.4  # about four ticks a second, whatever the chunk rate


async def test_feed_exists_only_while_viewers_are_connected(proxy: RunningProxy) -> None:
    assert feeds(proxy) == []
    async with aiohttp.ClientSession() as s:
        a = await s.get(proxy.url + LIVE, headers=proxy.admin.headers())
        b = await s.get(proxy.url + LIVE, headers=proxy.admin.headers())
        await a.content.readline()
        await b.content.readline()
        [feed] = feeds(proxy)  # one feed, one ticker, for both viewers
        assert len(feed.viewers) == 2 and feed.task is not None and not feed.task.done()
        a.close()
        await wait_until(lambda: len(feed.viewers) == 1, what="the first viewer gone")
        assert feeds(proxy) == [feed]
        b.close()
        await wait_until(lambda: not feed.viewers, what="the second viewer gone")
    assert feeds(proxy) == [] and feed.task is None
    await wait_until(lambda: not [t for t in asyncio.all_tasks() if "LiveFeed._run" in repr(t.get_coro())],
                     what="the feed's ticker ended")
    # rows that finish with nobody watching are not collected anywhere
    async with aiohttp.ClientSession() as s:
        await claude_stream(s, proxy.url, "unwatched", tokens=3, itl_ms=1, ttft_ms=1)
    assert not feed.finished and feeds(proxy) == []


def test_viewer_queue_is_bounded_and_counts_what_it_drops() -> None:
    viewer = Viewer(size=4)
    for i in range(10):
        viewer.push(b'{"n":%d}' % i)
    assert viewer.dropped == 6 and viewer.ready.is_set()
    assert viewer.take() == [b'{"n":%d}' % i for i in range(6, 10)]
    assert not viewer.ready.is_set() and viewer.take() == []
    assert frame(viewer.dropped, b'{"n":9}') == b'event: tick\ndata: {"dropped":6,"n":9}\n\n'


async def test_a_viewer_that_stops_reading_costs_a_bounded_queue(sim: Simulator, tmp_path: Path) -> None:
    async with RunningProxy(proxy_config(sim.url, tmp_path)) as p:
        feed = LiveFeed(p.state.recorder, p.state.loop_lag, p.state.report, tick_s=0.005)  # the real feed, ticking fast to fill the socket quickly
        p.state.recorder.observe(feed)
        async with aiohttp.ClientSession() as s:
            big = "x" * 4000  # long session ids make ticks of ~80 kB
            load = [asyncio.create_task(claude_stream(s, p.url, f"s{i}-{big}", tokens=1, ttft_ms=8000))
                    for i in range(20)]
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            loop = asyncio.get_running_loop()
            await loop.sock_connect(sock, (p.config.main_host, p.port))
            await loop.sock_sendall(sock, b"GET /_llmtap/live HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                   + f"X-Llmtap-Admin-Token: {p.admin_token}\r\n\r\n".encode())
            try:
                assert (await loop.sock_recv(sock, 12)) == b"HTTP/1.1 200"  # then it reads no more
                await wait_until(lambda: feed.viewers and next(iter(feed.viewers)).dropped >= 3 * VIEWER_QUEUE, 15,
                                 "the stuck viewer dropping frames")
                viewer = next(iter(feed.viewers))
                assert len(viewer.queue) <= VIEWER_QUEUE
                async with asyncio.timeout(2):  # the proxy still answers while the viewer is stuck
                    assert (await s.get(p.url + "/_llmtap/health", headers=p.admin.headers())).status == 200
            finally:
                sock.close()
                for task in load:
                    task.cancel()
                await asyncio.gather(*load, return_exceptions=True)
        await wait_until(lambda: not feed.viewers, 5, "the stuck viewer gone")


async def test_admin_token_guards_the_feed(sim: Simulator, tmp_path: Path) -> None:
    async with RunningProxy(proxy_config(sim.url, tmp_path, admin_token="s3cret")) as p:
        async with aiohttp.ClientSession() as s:
            async with s.get(p.url + LIVE) as r:
                assert r.status == 403
            async with s.get(p.url + LIVE, headers={"X-Llmtap-Admin-Token": "s3cret"}) as r:
                assert r.status == 200
                async with asyncio.timeout(3):
                    tick = await anext(read_ticks(r))
                assert tick["inflight"] == []
            async with s.post(p.url + LIVE, headers={"X-Llmtap-Admin-Token": "s3cret"}) as r:
                assert r.status == 404  # GET only


async def test_stopping_the_proxy_ends_the_feed_without_waiting(sim: Simulator, tmp_path: Path) -> None:
    p = RunningProxy(proxy_config(sim.url, tmp_path))
    await p.__aenter__()
    async with aiohttp.ClientSession() as s:
        resp = await s.get(p.url + LIVE, headers=p.admin.headers())
        first = await resp.content.readline()
        started = time.monotonic()
        await p.aclose()
        assert time.monotonic() - started < 2  # not the 5 s shutdown timeout
        async with asyncio.timeout(3):
            rest = await resp.content.read()  # the stream ends cleanly, after a whole event
        assert (first + rest).endswith(b"\n\n")


async def test_request_labels_are_parsed_once_and_forgotten(proxy: RunningProxy) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.get(proxy.url + LIVE, headers=proxy.admin.headers()) as resp:
            load = asyncio.create_task(claude_stream(s, proxy.url, "once", tokens=20, itl_ms=20))
            [feed] = feeds(proxy)
            async with asyncio.timeout(5):
                async for tick in read_ticks(resp):
                    if tick["inflight"] and tick["inflight"][0]["session_id"]:
                        break
            assert [labels for labels in feed.labels.values()] == [("sim-claude", "claude-code", "once")]
            await load
            async with asyncio.timeout(5):
                async for tick in read_ticks(resp):
                    if tick["finished"]:
                        break
            assert feed.labels == {}
