"""The relay is transparent: same status, headers (minus hop-by-hop) and bytes, chunk by chunk."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import time
from pathlib import Path

import aiohttp
import pytest
from yarl import URL

from .serving import RunningProxy

from .conftest import proxy_config, rows
from .fast_path_skips import needs
from .upstreams import Script, ScriptedUpstream

HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-authenticate"}

CHAT_SSE = [
    b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n',
    b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}\n\n',
    b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}]}\n\n',
    b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}\n\n',
    b"data: [DONE]\n\n",
]
ANTHROPIC_SSE = [
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[],"stop_reason":null,"usage":{"input_tokens":12,"output_tokens":1}}}\n\n',
    b'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}\n\n',
    b'event: ping\ndata: {"type":"ping"}\n\n',
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Sure"}}\n\n',
    b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n',
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":1}}\n\n',
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n',
]
SSE_HEADERS = [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache"), ("X-Request-Id", "req_1"),
               ("Set-Cookie", "a=1"), ("Set-Cookie", "b=2"), ("Connection", "keep-alive, X-Hop"), ("X-Hop", "drop me"),
               ("Keep-Alive", "timeout=5"), ("Server", "scripted"), ("Date", "Mon, 30 Nov 2026 00:00:00 GMT")]


async def fetch(url: str | URL, method: str = "POST", **kw: object) -> tuple[int, str, list[tuple[str, str]], list[tuple[float, bytes]]]:
    """Raw client: status, reason, headers in order, and (arrival time, bytes) of every read."""
    async with aiohttp.ClientSession(auto_decompress=False) as s:
        async with s.request(method, url, **kw) as r:  # type: ignore[arg-type]
            reads = []
            async for data in r.content.iter_any():
                reads.append((time.perf_counter(), data))
            return r.status, r.reason or "", [(k, v) for k, v in r.headers.items()], reads


def end_to_end(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    named = {t.strip().lower() for k, v in headers if k.lower() == "connection" for t in v.split(",")}
    return [(k.lower(), v) for k, v in headers if k.lower() not in HOP | named]


@pytest.mark.parametrize("path,chunks", [("/v1/chat/completions", CHAT_SSE), ("/v1/messages?beta=true", ANTHROPIC_SSE)])
async def test_stream_identical_to_direct(tmp_path: Path, path: str, chunks: list[bytes]) -> None:
    async with ScriptedUpstream(Script(headers=SSE_HEADERS, chunks=chunks)) as up:
        async with RunningProxy(proxy_config(up.url, tmp_path)) as p:
            direct = await fetch(up.url + path, data=b'{"model":"m","stream":true}')
            proxied = await fetch(p.url + path, data=b'{"model":"m","stream":true}')
            recorded = rows(p)
    assert proxied[:2] == direct[:2]
    assert end_to_end(proxied[2]) == end_to_end(direct[2])
    assert b"".join(d for _, d in proxied[3]) == b"".join(chunks)
    assert ("x-hop", "drop me") not in [(k.lower(), v) for k, v in proxied[2]]
    assert [v for k, v in proxied[2] if k.lower() == "set-cookie"] == ["a=1", "b=2"]
    assert len(recorded) == 1 and recorded[0]["outcome"] == "ok" and recorded[0]["output_events"] >= 1


async def test_chunks_arrive_when_sent(tmp_path: Path) -> None:
    """Chunks spaced 100 ms upstream arrive about 100 ms apart: no buffering, no coalescing."""
    chunks = [f"data: {i}\n\n".encode() for i in range(5)]
    async with ScriptedUpstream(Script(headers=[("Content-Type", "text/event-stream")], chunks=chunks, delay_s=0.1)) as up:
        async with RunningProxy(proxy_config(up.url, tmp_path)) as p:
            _, _, _, reads = await fetch(p.url + "/stream", method="GET")
    assert [d for _, d in reads] == chunks
    gaps = [b[0] - a[0] for a, b in zip(reads, reads[1:])]
    assert all(0.07 < g < 0.15 for g in gaps), gaps


async def test_request_forwarded_exactly(tmp_path: Path) -> None:
    async with ScriptedUpstream(Script(headers=[("Content-Type", "application/json")], chunks=[b"{}"])) as up:
        async with RunningProxy(proxy_config(up.url + "/api", tmp_path)) as p:
            headers = {"Authorization": "Bearer sk-test-123", "x-api-key": "sk-ant-xyz", "anthropic-version": "2023-06-01",
                       "anthropic-beta": "a,b", "User-Agent": "claude-cli/2.1 (external, cli)", "Accept": "application/json",
                       "Accept-Encoding": "gzip, deflate, br, zstd", "X-Llmtap-Tag": "exp-1", "TE": "trailers",
                       "Proxy-Authorization": "Basic abc", "Connection": "keep-alive, X-Private", "X-Private": "hop"}
            await fetch(URL(p.url + "/v1/messages?beta=true&q=%2Fa%20b", encoded=True), data=b'{"model":"m"}', headers=headers)
            recorded = rows(p)
    got = up.received[0]
    assert got.method == "POST" and got.path_qs == "/api/v1/messages?beta=true&q=%2Fa%20b"
    names = {k.lower(): v for k, v in got.headers}
    for key in ("authorization", "x-api-key", "anthropic-version", "anthropic-beta", "user-agent", "accept", "accept-encoding"):
        assert names[key] == headers[next(h for h in headers if h.lower() == key)]
    assert not {"x-llmtap-tag", "te", "proxy-authorization", "x-private"} & set(names)
    assert names["host"] == up.url.removeprefix("http://")
    assert got.body == b'{"model":"m"}'
    assert recorded[0]["tag"] == "exp-1" and recorded[0]["tool"] == "claude-code"


async def test_no_headers_added_upstream(tmp_path: Path) -> None:
    """aiohttp's client adds Accept, Accept-Encoding, User-Agent by default: the relay must not."""
    async with ScriptedUpstream(Script(chunks=[b"ok"])) as up:
        async with RunningProxy(proxy_config(up.url, tmp_path)) as p:
            reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
            writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Only: 1\r\n\r\n")
            await writer.drain()
            await reader.readuntil(b"ok")
            writer.close()
    names = {k.lower() for k, _ in up.received[0].headers}
    assert names == {"host", "x-only"}


async def test_large_request_body(tmp_path: Path) -> None:
    body = hashlib.sha256(b"seed").digest() * (20 * 1024 * 1024 // 32)
    async with ScriptedUpstream(Script(chunks=[b"{}"])) as up:
        async with RunningProxy(proxy_config(up.url, tmp_path)) as p:
            status, *_ = await fetch(p.url + "/v1/chat/completions", data=body)
            recorded = rows(p)
    assert status == 200
    assert hashlib.sha256(up.received[0].body).digest() == hashlib.sha256(body).digest()
    assert recorded[0]["request_bytes"] == len(body)


@pytest.mark.parametrize("path,shape", [("/v1/chat/completions", "openai"), ("/v1/messages", "anthropic")])
async def test_body_over_limit_is_413_in_api_shape(tmp_path: Path, path: str, shape: str) -> None:
    async with ScriptedUpstream(Script(chunks=[b"{}"])) as up:
        async with RunningProxy(proxy_config(up.url, tmp_path, max_body_mb=1)) as p:
            async with aiohttp.ClientSession() as s:
                async with s.post(p.url + path, data=b"x" * (2 * 1024 * 1024)) as r:
                    status, body = r.status, await r.json()
            recorded = rows(p)
    assert status == 413 and not up.received
    error = body["error"]
    assert ("type" in body) == (shape == "anthropic")
    assert "1 MiB" in error["message"]
    assert recorded[0]["status"] == 413 and recorded[0]["error_type"] == "request_too_large"


async def test_gzip_stays_compressed(tmp_path: Path) -> None:
    raw = b"".join(CHAT_SSE)
    packed = gzip.compress(raw)
    parts = [packed[:20], packed[20:60], packed[60:]]
    headers = [("Content-Type", "text/event-stream"), ("Content-Encoding", "gzip")]
    async with ScriptedUpstream(Script(headers=headers, chunks=parts)) as up:
        async with RunningProxy(proxy_config(up.url, tmp_path)) as p:
            _, _, got_headers, reads = await fetch(p.url + "/v1/chat/completions", data=b'{"stream":true}',
                                                   headers={"Accept-Encoding": "gzip"})
            recorded = rows(p)
    assert dict((k.lower(), v) for k, v in got_headers)["content-encoding"] == "gzip"
    assert b"".join(d for _, d in reads) == packed
    assert recorded[0]["output_tokens"] == 2 and recorded[0]["input_tokens"] == 5


@pytest.mark.parametrize("method", ["GET", "HEAD", "DELETE", "PUT", "OPTIONS"])
async def test_methods(tmp_path: Path, method: str) -> None:
    headers = [("Content-Type", "application/json"), ("Content-Length", "11")]
    async with ScriptedUpstream(Script(headers=headers, chunks=[] if method == "HEAD" else [b'{"ok":true}'])) as up:
        async with RunningProxy(proxy_config(up.url, tmp_path)) as p:
            status, _, got, reads = await fetch(p.url + "/v1/things/1", method=method)
    assert status == 200 and up.received[0].method == method
    assert dict((k.lower(), v) for k, v in got)["content-length"] == "11"
    assert b"".join(d for _, d in reads) == (b"" if method == "HEAD" else b'{"ok":true}')


async def test_status_and_reason_relayed(tmp_path: Path) -> None:
    body = b'{"error":{"message":"slow down","type":"rate_limit","code":"rate_limited"}}'
    script = Script(status=429, reason="Too Many Requests", headers=[("Content-Type", "application/json"), ("Retry-After", "7")], chunks=[body])
    async with ScriptedUpstream(script) as up:
        async with RunningProxy(proxy_config(up.url, tmp_path)) as p:
            status, reason, headers, reads = await fetch(p.url + "/v1/chat/completions", data=b"{}")
            recorded = rows(p)
    assert (status, reason) == (429, "Too Many Requests")
    assert b"".join(d for _, d in reads) == body
    row = recorded[0]
    assert row["outcome"] == "http_error" and row["retry_after"] == "7"
    assert row["error_message"] == "slow down"


async def test_unknown_prefix_is_404_naming_routes(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = proxy_config(None, tmp_path, routes={"/openai": sim.url, "/anthropic": sim.url})  # type: ignore[arg-type]
    async with RunningProxy(config) as p:
        async with aiohttp.ClientSession() as s:
            async with s.post(p.url + "/other/v1/chat/completions", data=b"{}") as r:
                status, body = r.status, await r.json()
            async with s.get(p.url + "/openai/v1/models") as r:
                ok = r.status
        recorded = rows(p)
    assert status == 404 and "/openai" in body["error"]["message"] and "/anthropic" in body["error"]["message"]
    assert ok == 200 and sim.requests[-1][1] == "/v1/models"
    assert [r["outcome"] for r in recorded] == ["http_error", "ok"]


async def test_compressed_request_body_forwarded_raw(tmp_path: Path) -> None:
    """Codex sends zstd request bodies: the relay must not decompress them; the meter reads a copy."""
    from backports import zstd

    plain = b'{"model":"gpt-x","stream":true,"input":"hello"}'
    packed = zstd.compress(plain)
    async with ScriptedUpstream(Script(headers=[("Content-Type", "application/json")], chunks=[b"{}"])) as up:
        async with RunningProxy(proxy_config(up.url, tmp_path)) as p:
            await fetch(p.url + "/v1/responses", data=packed,
                        headers={"Content-Encoding": "zstd", "Content-Type": "application/json"})
            recorded = rows(p)
    assert up.received[0].body == packed
    assert dict((k.lower(), v) for k, v in up.received[0].headers)["content-encoding"] == "zstd"
    assert recorded[0]["request_model"] == "gpt-x" and recorded[0]["request_bytes"] == len(packed)


async def test_gemini_stream_through_proxy(sim, proxy) -> None:  # type: ignore[no-untyped-def]
    path = "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    body = {"contents": [{"role": "user", "parts": [{"text": "hello"}]}]}
    direct = await fetch(sim.url + path, json=body, headers={"x-goog-api-key": "g-key"})
    proxied = await fetch(proxy.url + path, json=body, headers={"x-goog-api-key": "g-key"})
    assert direct[0] == proxied[0] == 200
    row = rows(proxy)[0]
    assert (row["dialect"], row["request_model"], row["output_tokens"], row["outcome"]) == ("gemini", "gemini-2.5-flash", 8, "ok")
    assert row["key_fingerprint"] and row["stream"] is True


async def test_websocket_upgrade_refused_upstream(tmp_path: Path) -> None:
    async with ScriptedUpstream(Script(status=404, headers=[("Content-Type", "application/json")], chunks=[b"{}"])) as up:
        async with RunningProxy(proxy_config(up.url, tmp_path)) as p:
            async with aiohttp.ClientSession() as s:
                with pytest.raises(aiohttp.WSServerHandshakeError) as err:
                    await s.ws_connect(p.url + "/v1/responses")
            recorded = rows(p)
    assert err.value.status == 404
    assert recorded[0]["outcome"] == "http_error" and recorded[0]["error_type"] == "websocket_refused"


@needs("arrival")  # the public path's clock starts at the handler, after the headers
async def test_a_request_arrives_at_its_first_byte(proxy: RunningProxy) -> None:
    """aiohttp starts the handler once the headers are parsed: a client that sends them in two parts,
    300 ms apart, has waited those 300 ms, and the row's clock starts at the first byte (#21)."""
    from .faultkit import status_of

    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{proxy.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n").encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(head[:20])
    await writer.drain()
    await asyncio.sleep(0.3)
    writer.write(head[20:] + b"\r\n" + body)
    response = await reader.read()
    writer.close()
    assert status_of(response) == 200
    (e2e, overhead), = [(r["e2e_ms"], r["proxy_overhead_ms"]) for r in rows(proxy)]
    assert e2e >= 300 and overhead >= 300  # the first byte came 300 ms before the headers were whole
