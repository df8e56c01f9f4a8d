"""Every way a request can end leaves a row that says what happened."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import aiohttp
import anthropic
import openai
import pytest

from .serving import RunningProxy
from proxy.simulator.app import Simulator

from .conftest import proxy_config, rows
from .waiting import wait_until


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_upstream_refused_is_502_in_openai_shape(tmp_path: Path) -> None:
    async with RunningProxy(proxy_config(f"http://127.0.0.1:{closed_port()}", tmp_path)) as p:
        client = openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="sk-secret-value", max_retries=0)
        with pytest.raises(openai.APIStatusError) as err:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        await client.close()
        row = rows(p)[0]
    assert err.value.status_code == 502
    assert "cannot reach upstream 127.0.0.1" in err.value.message
    assert "sk-secret-value" not in err.value.message
    assert row["outcome"] == "upstream_unreachable" and row["status"] == 502


async def test_upstream_refused_is_502_in_anthropic_shape(tmp_path: Path) -> None:
    async with RunningProxy(proxy_config(f"http://127.0.0.1:{closed_port()}", tmp_path)) as p:
        client = anthropic.AsyncAnthropic(base_url=p.url, api_key="sk-ant-secret", max_retries=0)
        with pytest.raises(anthropic.APIStatusError) as err:
            await client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
        await client.close()
    body = err.value.body
    assert err.value.status_code == 502
    assert isinstance(body, dict) and body["type"] == "error" and body["error"]["type"] == "api_error"


async def test_upstream_silent_before_headers_is_504(tmp_path: Path) -> None:
    server = await asyncio.start_server(lambda r, w: asyncio.sleep(5), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with RunningProxy(proxy_config(f"http://127.0.0.1:{port}", tmp_path, idle_timeout_s=0.3)) as p:
            async with aiohttp.ClientSession() as s:
                async with s.post(p.url + "/v1/chat/completions", data=b"{}") as r:
                    status, body = r.status, await r.json()
            row = rows(p)[0]
    finally:
        server.close()
    assert status == 504 and "did not answer in time" in body["error"]["message"]
    assert row["outcome"] == "upstream_timeout"


async def test_client_disconnect_cancels_upstream(sim: Simulator, proxy: RunningProxy) -> None:
    async with aiohttp.ClientSession() as s:
        resp = await s.post(proxy.url + "/v1/chat/completions", json={"model": "m", "stream": True,
                            "messages": [{"role": "user", "content": "hi"}]},
                            headers={"x-sim-tokens": "1000", "x-sim-itl-ms": "10"})
        await resp.content.readany()
        assert sim.active_streams == 1
        resp.close()
    # the upstream's stream would last 10 s more: it ends long before when the proxy cancels it
    await wait_until(lambda: sim.active_streams == 0, 5, "the upstream stream cancelled after the client left")
    row = rows(proxy)[0]
    assert row["outcome"] == "client_disconnected" and row["status"] == 200


async def test_upstream_drop_mid_stream_truncates_client(sim: Simulator, proxy: RunningProxy) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(proxy.url + "/v1/messages", json={"model": "m", "stream": True, "max_tokens": 50,
                          "messages": [{"role": "user", "content": "hi"}]},
                          headers={"x-sim-disconnect-after": "3"}) as r:
            with pytest.raises(aiohttp.ClientPayloadError):
                await r.read()
    row = rows(proxy)[0]
    assert row["outcome"] == "stream_truncated" and row["output_events"] == 3


async def test_in_stream_error_event(sim: Simulator, proxy: RunningProxy) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(proxy.url + "/v1/messages", json={"model": "m", "stream": True, "max_tokens": 50,
                          "messages": [{"role": "user", "content": "hi"}]},
                          headers={"x-sim-stream-error": "1"}) as r:
            body = await r.read()
    assert b"overloaded_error" in body
    row = rows(proxy)[0]
    assert row["status"] == 200 and row["outcome"] == "stream_error" and row["error_type"] == "overloaded_error"


async def test_upstream_silent_mid_stream_is_upstream_timeout(sim: Simulator, tmp_path: Path) -> None:
    async with RunningProxy(proxy_config(sim.url, tmp_path, idle_timeout_s=0.3)) as p:
        async with aiohttp.ClientSession() as s:
            async with s.post(p.url + "/v1/chat/completions", json={"model": "m", "stream": True,
                              "messages": [{"role": "user", "content": "hi"}]},
                              headers={"x-sim-ttft-ms": "2000"}) as r:
                with pytest.raises(aiohttp.ClientPayloadError):
                    await r.read()
        row = rows(p)[0]
    assert row["outcome"] == "upstream_timeout" and row["status"] == 200
