"""The official SDKs get the same answers through llmtap as directly, for each API."""

from __future__ import annotations

import asyncio

import aiohttp
import anthropic
import openai
import pytest

from .serving import RunningProxy
from proxy.simulator.app import Simulator

from .conftest import rows


async def chat(base: str, **extra: object) -> tuple[str, object]:
    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="sk-test-openai", max_retries=0)
    stream = await client.chat.completions.create(
        model="gpt-x", messages=[{"role": "user", "content": "hello there"}], stream=True,
        stream_options={"include_usage": True}, **extra)  # type: ignore[arg-type]
    text, usage = "", None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
        usage = chunk.usage or usage
    await client.close()
    return text, usage


async def messages(base: str) -> tuple[str, object]:
    client = anthropic.AsyncAnthropic(base_url=base, api_key="sk-ant-test", max_retries=0)
    async with client.messages.stream(model="claude-x", max_tokens=100,
                                      messages=[{"role": "user", "content": "hello there"}]) as stream:
        text = "".join([t async for t in stream.text_stream])
        final = await stream.get_final_message()
    await client.close()
    return text, final.usage


async def responses(base: str) -> tuple[str, object]:
    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="sk-test-openai", max_retries=0)
    stream = await client.responses.create(model="gpt-x", input="hello there", stream=True)
    text, usage = "", None
    async for event in stream:
        if event.type == "response.output_text.delta":
            text += event.delta
        if event.type == "response.completed":
            usage = event.response.usage
    await client.close()
    return text, usage


@pytest.mark.parametrize("call", [chat, messages, responses])
async def test_sdk_same_answer(sim: Simulator, proxy: RunningProxy, call) -> None:  # type: ignore[no-untyped-def]
    direct = await call(sim.url)
    proxied = await call(proxy.url)
    assert proxied == direct and direct[0]
    row = rows(proxy)[0]
    assert row["outcome"] == "ok" and row["stream"] is True
    assert row["output_tokens"] == 8 and row["tokens_source"] == "usage"
    assert row["tool"] in ("openai-python", "anthropic-python")


async def test_non_streaming_sdk(sim: Simulator, proxy: RunningProxy) -> None:
    client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test", max_retries=0)
    done = await client.chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "hi"}])
    await client.close()
    row = rows(proxy)[0]
    assert done.usage is not None and row["output_tokens"] == done.usage.completion_tokens
    assert row["stream"] is False and row["ttft_ms"] is None and row["e2e_ms"] > 0


async def test_upstream_error_reaches_sdk_unchanged(sim: Simulator, proxy: RunningProxy) -> None:
    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-ant-test", max_retries=0,
                                      default_headers={"x-sim-status": "529"})
    with pytest.raises(anthropic.APIStatusError) as err:
        await client.messages.create(model="claude-x", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    await client.close()
    assert err.value.status_code == 529
    row = rows(proxy)[0]
    assert row["outcome"] == "http_error" and row["error_type"] == "overloaded_error"


async def test_64_concurrent_streams(sim: Simulator, proxy: RunningProxy) -> None:
    results = await asyncio.gather(*(chat(proxy.url) for _ in range(64)))
    assert len({r[0] for r in results}) == 1
    recorded = rows(proxy)
    assert len(recorded) == 64 and all(r["outcome"] == "ok" for r in recorded)


async def test_websocket_session_through_proxy(sim: Simulator, proxy: RunningProxy) -> None:
    create = {"type": "response.create", "model": "gpt-x", "input": "hello there"}
    async with aiohttp.ClientSession() as s:
        async with s.ws_connect(proxy.url + "/v1/responses", headers={"Authorization": "Bearer sk-test"}) as ws:
            kinds: list[list[str]] = []
            for _ in range(2):
                await ws.send_json(create)
                seen: list[str] = []
                while not seen or seen[-1] != "response.completed":
                    seen.append((await ws.receive_json(timeout=5))["type"])
                kinds.append(seen)
    assert kinds[0] == kinds[1] and "response.output_text.delta" in kinds[0]
    recorded = rows(proxy)
    assert len(recorded) == 2
    assert all(r["dialect"] == "openai_responses" and r["output_tokens"] == 8 for r in recorded)
