"""Faults from the upstream, on purpose: the client gets exactly what the upstream sent (or
llmtap's error in the API's shape), the proxy keeps serving, a row says what happened, and
memory, file descriptors and upstream connections return to where they were."""

from __future__ import annotations

import asyncio
import hashlib
import time
import zlib
from pathlib import Path

import aiohttp
import brotli
import pytest

from proxy.meter.decode import DEFAULT_LIMIT
from .serving import RunningProxy

from .conftest import proxy_config, rows
from .faultkit import (JSON, SSE, Baseline, RawConn, RawUpstream, Serve, chunk, http_head, peak_rss_mb,
                       reset_peak, sends_events)

try:
    from compression import zstd  # type: ignore[import-not-found]
except ImportError:
    from backports import zstd  # type: ignore[no-redef]

CHAT = "/v1/chat/completions"
BODY = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'
EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"tok"}}]}\n\n'


async def post(url: str, path: str = CHAT, body: bytes = BODY) -> tuple[int, bytes, str | None]:
    """(status, every body byte the client got, the error that cut the body or None)."""
    got, cut = bytearray(), None
    async with aiohttp.ClientSession(auto_decompress=False) as s:
        async with s.post(url + path, data=body, headers={"Content-Type": "application/json"}) as r:
            try:
                async for data in r.content.iter_any():
                    got += data
            except aiohttp.ClientPayloadError as exc:
                cut = type(exc).__name__
            return r.status, bytes(got), cut


async def still_serving(p: RunningProxy) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.get(p.url + "/_llmtap/health", headers=p.admin.headers()) as r:
            assert r.status == 200 and (await r.json())["ok"] is True


# -- breaking off ------------------------------------------------------------------------


async def test_upstream_closes_mid_stream(tmp_path: Path) -> None:
    async def handler(conn: RawConn) -> None:
        await conn.read_request()
        await conn.send(http_head(200, SSE, chunked=True) + chunk(EVENT * 3))
        await asyncio.sleep(0.05)
        conn.writer.close()  # a FIN, without the last chunk

    async with RawUpstream(handler) as up, RunningProxy(proxy_config(up.url, tmp_path)) as p:
        base = Baseline()
        status, got, cut = await post(p.url)
        await still_serving(p)
        await up.idle()
        await base.settled()
        row = rows(p)[0]
    assert (status, got, cut) == (200, EVENT * 3, "ClientPayloadError")
    assert row["outcome"] == "stream_truncated" and row["output_events"] == 3
    assert row["response_bytes"] == len(EVENT * 3)


async def test_upstream_closes_short_of_its_content_length(tmp_path: Path) -> None:
    async def handler(conn: RawConn) -> None:
        await conn.read_request()
        await conn.send(http_head(200, JSON, length=1000) + b'{"id": "partial')
        conn.writer.close()

    async with RawUpstream(handler) as up, RunningProxy(proxy_config(up.url, tmp_path)) as p:
        status, got, cut = await post(p.url)
        await up.idle()
        row = rows(p)[0]
    assert (status, got, cut) == (200, b'{"id": "partial', "ClientPayloadError")
    assert row["outcome"] == "stream_truncated" and row["status"] == 200


@pytest.mark.parametrize("when", ["before_headers", "after_headers"])
async def test_upstream_resets_the_connection(tmp_path: Path, when: str) -> None:
    async def handler(conn: RawConn) -> None:
        await conn.read_request()
        if when == "after_headers":
            await conn.send(http_head(200, SSE, chunked=True) + chunk(EVENT))
            await asyncio.sleep(0.05)
        conn.reset()

    async with RawUpstream(handler) as up, RunningProxy(proxy_config(up.url, tmp_path)) as p:
        base = Baseline()
        results = [await post(p.url, "/v1/messages") for _ in range(3)]
        await still_serving(p)
        await up.idle()
        await base.settled()
        found = rows(p)
    assert len(found) == 3
    if when == "before_headers":
        for status, got, cut in results:
            assert status == 502 and cut is None
            assert b'"type":"error"' in got and b"cannot reach upstream 127.0.0.1" in got  # Anthropic's shape
        assert {r["outcome"] for r in found} == {"upstream_unreachable"}
    else:
        assert all(r == (200, EVENT, "ClientPayloadError") for r in results)
        assert {r["outcome"] for r in found} == {"stream_truncated"}


# -- what the meter cannot read ------------------------------------------------------------


async def test_malformed_sse_and_invalid_utf8_are_relayed_byte_for_byte(tmp_path: Path) -> None:
    events = [
        b"data: {not json\n\n",
        b"data: \xff\xfe\xc3\x28 invalid utf-8\n\n",
        b": a comment\r\nevent: x\rdata: {\"choices\":[{\"delta\":{\"content\":\"\xe2\x82\"}}]}\r\n\r\n",
        b"garbage line without a field\n\n",
        b"data: [DONE]\n\n",
    ]

    async with RawUpstream(sends_events(events)) as up, RunningProxy(proxy_config(up.url, tmp_path)) as p:
        status, got, cut = await post(p.url)
        row = rows(p)[0]
    assert (status, got, cut) == (200, b"".join(events), None)
    assert row["outcome"] == "ok" and row["parse_error"] and "openai_chat event" in row["parse_error"]


async def test_a_10_mb_event_line_is_relayed_intact_and_the_row_says_it_was_not_measured(tmp_path: Path) -> None:
    big = b'data: {"choices":[{"delta":{"content":"' + b"x" * (10 * 1024 * 1024) + b'"}}]}\n\n'
    tail = EVENT + b"data: [DONE]\n\n"

    async def handler(conn: RawConn) -> None:
        await conn.read_request()
        await conn.send(http_head(200, SSE, chunked=True) + chunk(EVENT))
        for i in range(0, len(big), 65536):
            await conn.send(chunk(big[i:i + 65536]))
        await conn.send(chunk(tail) + b"0\r\n\r\n")

    async with RawUpstream(handler) as up, RunningProxy(proxy_config(up.url, tmp_path)) as p:
        status, got, cut = await post(p.url)
        row = rows(p)[0]
    assert (status, cut) == (200, None)
    assert hashlib.sha256(got).digest() == hashlib.sha256(EVENT + big + tail).digest()
    assert row["outcome"] == "ok" and row["output_events"] == 2  # the two small events
    assert "SSE event" in row["parse_error"] and "not measured" in row["parse_error"]


# -- silence and slowness -----------------------------------------------------------------


@pytest.mark.parametrize("when", ["before_headers", "after_headers"])
async def test_an_upstream_that_sends_nothing_times_out(tmp_path: Path, when: str) -> None:
    async def handler(conn: RawConn) -> None:
        await conn.read_request()
        if when == "after_headers":
            await conn.send(http_head(200, SSE, chunked=True) + chunk(EVENT))
        await conn.closed_by_peer(10)

    async with RawUpstream(handler) as up, RunningProxy(proxy_config(up.url, tmp_path, idle_timeout_s=0.4)) as p:
        base = Baseline()
        t0 = time.monotonic()
        status, got, cut = await post(p.url)
        took = time.monotonic() - t0
        await up.idle()
        await base.settled()
        row = rows(p)[0]
    assert took < 3
    assert row["outcome"] == "upstream_timeout"
    if when == "before_headers":
        assert status == 504 and b"did not answer in time" in got and cut is None
    else:
        assert (status, got, cut) == (200, EVENT, "ClientPayloadError")


async def test_a_dripping_upstream_is_relayed_as_it_comes(tmp_path: Path) -> None:
    """One byte a second, for 4 s: each reaches the client at once; the idle timer restarts per byte."""
    sent: list[float] = []

    async def handler(conn: RawConn) -> None:
        await conn.read_request()
        await conn.send(http_head(200, {"Content-Type": "text/plain"}, length=4))
        for byte in b"drip":
            await asyncio.sleep(1.0)
            sent.append(time.monotonic())
            await conn.send(bytes([byte]))

    async with RawUpstream(handler) as up, RunningProxy(proxy_config(up.url, tmp_path, idle_timeout_s=1.5)) as p:
        arrived: list[tuple[float, bytes]] = []
        async with aiohttp.ClientSession() as s:
            async with s.post(p.url + "/v1/x", data=b"{}") as r:
                async for data in r.content.iter_any():
                    arrived.append((time.monotonic(), data))
        row = rows(p)[0]
    assert b"".join(d for _, d in arrived) == b"drip" and len(arrived) == 4
    delays = [a - s for (a, _), s in zip(arrived, sent)]
    assert max(delays) < 0.2, delays
    assert row["outcome"] == "ok" and row["e2e_ms"] > 3900


# -- decompression bombs ---------------------------------------------------------------------


def bomb(encoding: str, size: int) -> bytes:
    """`size` zero bytes, compressed: a few hundred KB that expand to far more than the meter decodes."""
    block = b"\0" * (1 << 20)
    if encoding == "gzip":
        c = zlib.compressobj(6, zlib.DEFLATED, 31)
        return b"".join(c.compress(block) for _ in range(size >> 20)) + c.flush()
    if encoding == "br":
        b = brotli.Compressor(quality=5, lgwin=24)
        return b"".join(b.process(block) for _ in range(size >> 20)) + b.finish()
    z = zstd.ZstdCompressor()
    return b"".join(z.compress(block) for _ in range(size >> 20)) + z.flush()


@pytest.mark.parametrize("encoding", ["gzip", "br", "zstd"])
async def test_a_decompression_bomb_costs_the_metric_not_memory(tmp_path: Path, encoding: str) -> None:
    size = 4 * DEFAULT_LIMIT
    payload = bomb(encoding, size)
    assert len(payload) < size // 100

    async def handler(conn: RawConn) -> None:
        await conn.read_request()
        await conn.send(http_head(200, {"Content-Type": "text/event-stream", "Content-Encoding": encoding},
                                  length=len(payload)))
        for i in range(0, len(payload), 16384):
            await conn.send(payload[i:i + 16384])

    async with RawUpstream(handler) as up, RunningProxy(proxy_config(up.url, tmp_path)) as p:
        before = reset_peak()
        status, got, cut = await post(p.url)
        grew = peak_rss_mb() - before
        row = rows(p)[0]
    assert (status, cut) == (200, None) and got == payload  # relayed compressed, untouched
    assert grew < 40, f"peak RSS grew {grew:.0f} MB"  # was 130 to 530 MB when a read decoded in one piece
    assert "measuring limit" in row["parse_error"]
    assert row["outcome"] == "ok"  # the relay completed; a terminal event the meter never saw proves nothing
    assert row["response_bytes"] == len(payload)


# -- volume ---------------------------------------------------------------------------------------


def bulk_handler(size: int, block: int = 256 * 1024):
    """`size` bytes for any path; 1 KiB for /warm."""
    data = bytes(range(256)) * (block // 256)

    async def handler(conn: RawConn) -> None:
        head = await conn.read_request()
        length = 1024 if head.startswith(b"GET /warm ") else size
        await conn.send(http_head(200, {"Content-Type": "application/octet-stream"}, length=length))
        left = length
        while left:
            n = min(left, block)
            conn.writer.write(data[:n])
            conn.upstream.bytes_sent += n
            await conn.writer.drain()
            left -= n
    return handler


async def relay_bulk(tmp_path: Path, size: int) -> tuple[float, float]:
    """`size` bytes through a `llmtap serve` process; returns (seconds, the proxy's RSS growth in MB)."""
    async with RawUpstream(bulk_handler(size)) as up:
        serve = await Serve(up.url, tmp_path / "bulk.duckdb", "--quiet").started()
        try:
            async with aiohttp.ClientSession() as s:
                await (await s.get(serve.base + "/_llmtap/health", headers=serve.admin.headers())).read()
                # one request's row written first: the store's first insert grows DuckDB's memory, and on a
                # busy machine it would land inside the measured span
                await (await s.get(serve.base + "/warm")).read()
                assert await poll_sql(s, serve, "SELECT outcome FROM requests WHERE path = '/warm'") == [["ok"]]
                before = reset_peak(serve.proc.pid)
                got, t0 = 0, time.monotonic()
                async with s.get(serve.base + "/v1/files/big/content") as r:
                    assert r.status == 200
                    async for data in r.content.iter_chunked(1 << 20):
                        got += len(data)
                took = time.monotonic() - t0
                peak = peak_rss_mb(serve.proc.pid)
                result = await poll_sql(s, serve, "SELECT outcome, response_bytes FROM requests WHERE path <> '/warm'")
            assert got == size and result == [["ok", size]]
        finally:
            assert serve.stop() == 0, serve.output()
    return took, peak - before


async def poll_sql(s: aiohttp.ClientSession, serve: Serve, sql: str, within_s: float = 60.0) -> list:
    """The query's rows once there are any. The store writes about every second, later on a busy
    machine: `within_s` only keeps a broken store from hanging the test."""
    deadline = time.monotonic() + within_s
    while True:
        async with s.post(serve.admin.endpoint("sql"), json={"sql": sql}, headers=serve.admin.headers()) as q:
            result = (await q.json())["rows"]
        if result or time.monotonic() > deadline:
            return result
        await asyncio.sleep(0.1)


async def test_1_gb_relayed_with_flat_memory(tmp_path: Path) -> None:
    """About 3 s here (some 500 MB/s through the proxy process)."""
    took, grew = await relay_bulk(tmp_path, 1 << 30)
    assert grew < 50, f"proxy peak RSS grew {grew:.0f} MB relaying 1 GiB in {took:.1f} s"
