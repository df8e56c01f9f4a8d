"""The simulated upstream, driven directly by the official SDKs and aiohttp."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import subprocess
import sys
import time
import zlib
from collections.abc import AsyncIterator, Callable

import aiohttp
import anthropic
import openai
import pytest
from click.testing import CliRunner

from proxy.simulator.app import Simulator
from proxy.simulator.cli import mock_upstream
from proxy.simulator.config import SimConfig
from proxy.simulator.tokens import expected_reasoning, expected_text

from .waiting import wait_until

FAST = SimConfig(ttft_ms=5, itl_ms=1, tokens=5, prefill_us_per_token=0)
PROMPT = "x" * 40  # 10 input tokens (characters / 4)
CHAT = {"model": "gpt-x", "messages": [{"role": "user", "content": PROMPT}]}
CLAUDE = {"model": "claude-x", "max_tokens": 100, "messages": [{"role": "user", "content": PROMPT}]}
GEMINI = {"contents": [{"role": "user", "parts": [{"text": PROMPT}]}]}


@pytest.fixture
async def sim() -> AsyncIterator[Simulator]:
    async with Simulator(FAST) as s:
        yield s


def openai_client(sim: Simulator, **headers: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=sim.url + "/v1", api_key="sk-test", max_retries=0, default_headers=headers)


def anthropic_client(sim: Simulator, **headers: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=sim.url, api_key="sk-test", max_retries=0, default_headers=headers)


def sse_events(body: bytes) -> list[dict]:
    """The JSON data of every SSE event except [DONE]."""
    events = []
    for block in body.decode().split("\n\n"):
        data = [line[6:] for line in block.splitlines() if line.startswith("data: ")]
        if data and data[0] != "[DONE]":
            events.append(json.loads("\n".join(data)))
    return events


async def post(sim: Simulator, path: str, body: dict, **kwargs: object) -> tuple[aiohttp.ClientResponse, bytes]:
    async with aiohttp.ClientSession() as session:
        async with session.post(sim.url + path, json=body, **kwargs) as resp:  # type: ignore[arg-type]
            return resp, await resp.read()


# --- OpenAI Chat Completions ---------------------------------------------------------


async def test_chat_stream_text_and_usage(sim: Simulator) -> None:
    client = openai_client(sim, **{"x-sim-cache-read-tokens": "30"})
    stream = await client.chat.completions.create(**CHAT, stream=True, stream_options={"include_usage": True})
    chunks = [chunk async for chunk in stream]
    content = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(content) == expected_text(5) and len(content) == 5
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (40, 5, 45)
    assert usage.prompt_tokens_details.cached_tokens == 30
    assert all(c.usage is None for c in chunks[:-1])


async def test_chat_stream_reasoning_then_tool_call(sim: Simulator) -> None:
    client = openai_client(sim, **{"x-sim-reasoning-tokens": "3", "x-sim-tool-call": "1", "x-sim-tokens": "4"})
    stream = await client.chat.completions.create(**CHAT, stream=True, stream_options={"include_usage": True})
    chunks = [chunk async for chunk in stream]
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = [d.model_extra["reasoning_content"] for d in deltas if (d.model_extra or {}).get("reasoning_content")]
    assert "".join(reasoning) == expected_reasoning(3)
    calls = [call for d in deltas for call in d.tool_calls or []]
    assert calls[0].id and calls[0].function.name == "lookup" and calls[0].function.arguments == ""
    arguments = [call.function.arguments for call in calls[1:]]
    assert len(arguments) == 4 and json.loads("".join(arguments)) == {"text": expected_text(2)}
    assert chunks[-2].choices[0].finish_reason == "tool_calls"
    usage = chunks[-1].usage
    assert usage.completion_tokens == 7 and usage.completion_tokens_details.reasoning_tokens == 3


async def test_chat_non_stream_capped_by_max_tokens(sim: Simulator) -> None:
    done = await openai_client(sim).chat.completions.create(**CHAT, max_completion_tokens=3)
    assert done.choices[0].message.content == expected_text(3)
    assert done.choices[0].finish_reason == "length"
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (10, 3)
    assert done.model == "gpt-x"


async def test_chat_stream_error_raises_mid_stream(sim: Simulator) -> None:
    client = openai_client(sim, **{"x-sim-stream-error": "1", "x-sim-tokens": "6"})
    stream = await client.chat.completions.create(**CHAT, stream=True)
    received = []
    with pytest.raises(openai.APIError, match="simulated"):
        async for chunk in stream:
            received.append(chunk.choices[0].delta.content)
    assert "".join(c for c in received if c) == expected_text(3)


@pytest.mark.parametrize(
    ("status", "error_class"),
    [(429, openai.RateLimitError), (401, openai.AuthenticationError), (500, openai.InternalServerError)],
)
async def test_openai_http_errors(sim: Simulator, status: int, error_class: type[Exception]) -> None:
    client = openai_client(sim, **{"x-sim-status": str(status)})
    with pytest.raises(error_class) as caught:
        await client.chat.completions.create(**CHAT, stream=True)
    assert "(simulated)" in str(caught.value)
    if status == 429:
        assert caught.value.response.headers["retry-after"] == "1"


async def test_invalid_override_is_400(sim: Simulator) -> None:
    client = openai_client(sim, **{"x-sim-tokens": "many"})
    with pytest.raises(openai.BadRequestError, match="x-sim-tokens"):
        await client.chat.completions.create(**CHAT)


@pytest.mark.parametrize(
    ("path", "shape"),
    [
        ("/v1/chat/completions", lambda b: b["error"]["type"] == "invalid_request_error"),
        ("/v1/messages", lambda b: b["type"] == "error" and b["error"]["type"] == "invalid_request_error"),
        ("/v1beta/models/g:generateContent", lambda b: b["error"]["status"] == "INVALID_ARGUMENT"),
    ],
)
async def test_malformed_json_is_400_in_the_api_shape(sim: Simulator, path: str, shape: Callable[[dict], bool]) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(sim.url + path, data=b"{not json") as resp:
            assert resp.status == 400 and shape(await resp.json())


# --- OpenAI Responses ----------------------------------------------------------------


async def test_responses_stream_events_and_usage(sim: Simulator) -> None:
    client = openai_client(sim, **{"x-sim-reasoning-tokens": "2"})
    stream = await client.responses.create(model="gpt-x", input=PROMPT, stream=True)
    events = [event async for event in stream]
    types = [e.type for e in events]
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert types.count("response.reasoning_summary_text.delta") == 2
    assert types.count("response.output_text.delta") == 5 and types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == expected_text(5)
    final = events[-1].response
    assert final.model == "gpt-x" and final.output_text == expected_text(5)
    assert (final.usage.input_tokens, final.usage.output_tokens, final.usage.total_tokens) == (10, 7, 17)
    assert final.usage.output_tokens_details.reasoning_tokens == 2


async def test_responses_tool_call_and_non_stream(sim: Simulator) -> None:
    client = openai_client(sim, **{"x-sim-tool-call": "1"})
    stream = await client.responses.create(model="gpt-x", input=PROMPT, stream=True)
    events = [event async for event in stream]
    args = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(args) == 5 and json.loads("".join(args)) == {"text": expected_text(3)}
    done = await openai_client(sim).responses.create(model="gpt-x", input=PROMPT, max_output_tokens=2)
    assert done.status == "incomplete" and done.output_text == expected_text(2) and done.usage.output_tokens == 2


async def test_responses_stream_error_is_response_failed(sim: Simulator) -> None:
    stream = await openai_client(sim, **{"x-sim-stream-error": "1"}).responses.create(
        model="gpt-x", input=PROMPT, stream=True
    )
    events = [event async for event in stream]
    assert [e.type for e in events].count("response.output_text.delta") == 2
    assert events[-1].type == "response.failed" and events[-1].response.error.code == "server_error"
    assert [e.sequence_number for e in events] == list(range(len(events)))


async def test_websocket_two_responses_on_one_connection(sim: Simulator) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(sim.url + "/v1/responses", headers={"x-sim-tokens": "3"}) as ws:
            for _ in range(2):
                await ws.send_str(json.dumps({"type": "response.create", "model": "gpt-x", "input": PROMPT}))
                events = []
                while not events or events[-1]["type"] != "response.completed":
                    events.append(json.loads(await asyncio.wait_for(ws.receive_str(), 2)))
                text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
                assert text == expected_text(3) and events[0]["sequence_number"] == 0
                assert events[-1]["response"]["usage"]["output_tokens"] == 3
            await ws.send_str("not json")
            error = json.loads(await asyncio.wait_for(ws.receive_str(), 2))
            assert error["type"] == "error"


# --- Anthropic Messages --------------------------------------------------------------


async def test_messages_stream_thinking_text_and_usage(sim: Simulator) -> None:
    client = anthropic_client(sim, **{"x-sim-reasoning-tokens": "3", "x-sim-cache-read-tokens": "50"})
    async with client.messages.stream(**CLAUDE) as stream:
        text = [piece async for piece in stream.text_stream]
        final = await stream.get_final_message()
    assert "".join(text) == expected_text(5) and len(text) == 5
    assert [block.type for block in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == expected_reasoning(3)
    assert final.stop_reason == "end_turn" and final.model == "claude-x"
    usage = final.usage
    assert (usage.input_tokens, usage.cache_read_input_tokens, usage.output_tokens) == (10, 50, 8)
    assert stream.response.headers["request-id"].startswith("req_")


async def test_messages_tool_use_and_non_stream(sim: Simulator) -> None:
    client = anthropic_client(sim, **{"x-sim-tool-call": "1"})
    async with client.messages.stream(**CLAUDE) as stream:
        final = await stream.get_final_message()
    assert final.stop_reason == "tool_use" and final.content[0].input == {"text": expected_text(3)}
    message = await anthropic_client(sim).messages.create(**(CLAUDE | {"max_tokens": 4}))
    assert message.content[0].text == expected_text(4) and message.stop_reason == "max_tokens"
    assert message.usage.output_tokens == 4


async def test_count_tokens(sim: Simulator) -> None:
    counted = await anthropic_client(sim).messages.count_tokens(
        model="claude-x", system="y" * 8, messages=[{"role": "user", "content": PROMPT}]
    )
    assert counted.input_tokens == 12


async def test_anthropic_errors(sim: Simulator) -> None:
    with pytest.raises(anthropic.InternalServerError) as caught:
        await anthropic_client(sim, **{"x-sim-status": "529"}).messages.create(**CLAUDE)
    assert caught.value.status_code == 529 and "Overloaded" in str(caught.value)
    assert caught.value.body["error"]["type"] == "overloaded_error"
    with pytest.raises(anthropic.APIStatusError, match="overloaded_error"):
        async with anthropic_client(sim, **{"x-sim-stream-error": "1"}).messages.stream(**CLAUDE) as stream:
            await stream.get_final_message()


# --- Gemini --------------------------------------------------------------------------


async def test_gemini_stream_usage_and_json(sim: Simulator) -> None:
    headers = {"x-sim-reasoning-tokens": "2", "x-sim-cache-read-tokens": "4"}
    resp, body = await post(sim, "/v1beta/models/gemini-x:streamGenerateContent?alt=sse", GEMINI, headers=headers)
    events = sse_events(body)
    parts = [e["candidates"][0]["content"]["parts"][0] for e in events]
    assert len(events) == 7 and [p.get("thought", False) for p in parts] == [True] * 2 + [False] * 5
    assert "".join(p["text"] for p in parts[2:]) == expected_text(5)
    assert "usageMetadata" not in events[-2] and events[-1]["candidates"][0]["finishReason"] == "STOP"
    assert events[-1]["usageMetadata"] == {
        "promptTokenCount": 14,
        "candidatesTokenCount": 5,
        "thoughtsTokenCount": 2,
        "cachedContentTokenCount": 4,
        "totalTokenCount": 21,
    }
    resp, body = await post(sim, "/v1beta/models/gemini-x:generateContent", GEMINI)
    done = json.loads(body)
    assert done["candidates"][0]["content"]["parts"][0]["text"] == expected_text(5)
    assert done["usageMetadata"]["candidatesTokenCount"] == 5 and done["modelVersion"] == "gemini-x"


# --- Timing, load and faults ---------------------------------------------------------


async def timed_events(url: str, body: dict, headers: dict[str, str]) -> tuple[float, list[float]]:
    """(request start, arrival time of each chunk) on the monotonic clock."""
    arrivals = []
    async with aiohttp.ClientSession() as session:
        start = time.monotonic()
        async with session.post(url, json=body, headers=headers) as resp:
            async for _chunk in resp.content.iter_any():
                arrivals.append(time.monotonic())
    return start, arrivals


async def test_timing_ttft_and_inter_token_delay(sim: Simulator) -> None:
    headers = {"x-sim-ttft-ms": "100", "x-sim-itl-ms": "50", "x-sim-tokens": "4"}
    start, arrivals = await timed_events(sim.url + "/v1/chat/completions", CHAT | {"stream": True}, headers)
    # role chunk, 4 deltas (the finish chunk and [DONE] may share the last delta's read)
    assert len(arrivals) >= 5
    deltas_ms = [(t - start) * 1000 for t in arrivals[1:5]]
    # each delta on its target counted from the start (proxy/simulator/pacing.py), never before it; after it
    # by however long a busy machine keeps the loop (seconds at most: the delays are milliseconds)
    for delta_ms, due_ms in zip(deltas_ms, (100, 150, 200, 250)):
        assert due_ms <= delta_ms < due_ms + 3000, deltas_ms


async def test_ttft_grows_with_input(sim: Simulator) -> None:
    headers = {"x-sim-ttft-ms": "0", "x-sim-prefill-us-per-token": "1000", "x-sim-tokens": "1"}
    body = CHAT | {"stream": True, "messages": [{"role": "user", "content": "x" * 400}]}  # 100 tokens
    start, arrivals = await timed_events(sim.url + "/v1/chat/completions", body, headers)
    ttft_ms = (arrivals[1] - start) * 1000
    assert 95 <= ttft_ms < 175  # never early; late by what a busy machine adds


async def test_capacity_slows_tokens_when_exceeded() -> None:
    config = SimConfig(ttft_ms=0, itl_ms=20, tokens=6, capacity=1, prefill_us_per_token=0)
    url_body = (CHAT | {"stream": True}, {})
    async with Simulator(config) as sim:
        url = sim.url + "/v1/chat/completions"
        start, alone = await timed_events(url, *url_body)
        solo_ms = (alone[-1] - start) * 1000
        pair = asyncio.gather(timed_events(url, *url_body), timed_events(url, *url_body))
        await wait_until(lambda: sim.active_streams == 2, what="both streams active")
        (start, first), _ = await pair
        assert sim.active_streams == 0
    pair_ms = (first[-1] - start) * 1000
    # Lower bounds only, which a busy machine cannot break (it only adds time): 5 gaps of 20 ms alone;
    # with 2 streams at capacity 1 at least 4 of them are 40 ms (the first may come before the second
    # stream joins), where without the slowdown the pair would take 100 ms too.
    assert solo_ms >= 95
    assert pair_ms >= 175


SYNC_FLUSH = b"\x00\x00\xff\xff"


async def test_gzip_streams_and_bodies(sim: Simulator) -> None:
    headers = {"x-sim-gzip": "1", "accept-encoding": "gzip", "x-sim-itl-ms": "10"}
    url = sim.url + "/v1/chat/completions"
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        async with session.post(url, json=CHAT | {"stream": True}, headers=headers) as resp:
            assert resp.headers["content-encoding"] == "gzip"
            chunks = [chunk async for chunk in resp.content.iter_any()]
        async with session.post(url, json=CHAT, headers=headers) as resp:
            whole = json.loads(gzip.decompress(await resp.read()))
    # each event is flushed on its own (Z_SYNC_FLUSH ends with an empty stored block, 00 00 ff ff), so
    # whatever the reads (a busy machine joins several writes in one), every flush holds whole events
    raw = b"".join(chunks)
    flushes = raw.split(SYNC_FLUSH)[:-1]
    decompressor = zlib.decompressobj(wbits=31)
    out = [decompressor.decompress(piece + SYNC_FLUSH) for piece in flushes]
    assert len(out) >= 6 and all(piece.endswith(b"\n\n") and piece.count(b"data: ") == 1 for piece in out)
    body = gzip.decompress(raw)
    assert body.endswith(b"data: [DONE]\n\n")
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in sse_events(body)) == expected_text(5)
    assert whole["choices"][0]["message"]["content"] == expected_text(5)
    _, plain = await post(sim, "/v1/chat/completions", CHAT, headers={"x-sim-gzip": "1", "accept-encoding": "identity"})
    assert json.loads(plain)["object"] == "chat.completion"


async def test_disconnect_after_truncates_the_body(sim: Simulator) -> None:
    received = bytearray()
    async with aiohttp.ClientSession() as session:
        headers = {"x-sim-disconnect-after": "2"}
        async with session.post(sim.url + "/v1/messages", json=CLAUDE | {"stream": True}, headers=headers) as resp:
            with pytest.raises(aiohttp.ClientPayloadError):
                async for chunk in resp.content.iter_any():
                    received += chunk
    types = [e["type"] for e in sse_events(bytes(received))]
    assert types.count("content_block_delta") == 2 and "message_stop" not in types


# --- Housekeeping --------------------------------------------------------------------


async def test_requests_are_recorded_raw(sim: Simulator) -> None:
    raw = json.dumps(CLAUDE).encode()
    compressed = gzip.compress(raw)
    headers = {"Content-Encoding": "gzip", "Content-Type": "application/json", "X-Api-Key": "k"}
    async with aiohttp.ClientSession() as session:
        url = sim.url + "/v1/messages/count_tokens?beta=true"
        async with session.post(url, data=compressed, headers=headers) as resp:
            assert (await resp.json()) == {"input_tokens": 10}
    method, path_qs, recorded_headers, body = sim.requests[-1]
    assert (method, path_qs, body) == ("POST", "/v1/messages/count_tokens?beta=true", compressed)
    assert recorded_headers["x-api-key"] == "k"


async def test_probes_models_and_unknown_paths(sim: Simulator) -> None:
    async with aiohttp.ClientSession() as session:
        for path in ("/", "/api/hello"):
            async with session.head(sim.url + path) as resp:
                assert resp.status == 200
        async with session.get(sim.url + "/v1/models?limit=1000") as resp:
            assert [m["id"] for m in (await resp.json())["data"]] == ["sim-gpt", "sim-claude", "sim-gemini"]
        async with session.post(sim.url + "/v1/v1/messages", json=CLAUDE) as resp:
            assert resp.status == 404 and "/v1/v1/messages" in (await resp.json())["error"]["message"]


def test_cli_help_lists_every_option() -> None:
    result = CliRunner().invoke(mock_upstream, ["--help"])
    assert result.exit_code == 0
    for option in ("--host", "--port", "--ttft-ms", "--itl-ms", "--tokens", "--reasoning-tokens", "--tool-call",
                   "--error-status", "--stream-error", "--disconnect-after", "--gzip", "--cache-read-tokens",
                   "--prefill-us-per-token", "--capacity", "--model"):
        assert option in result.output


async def test_websocket_prewarm_generates_nothing() -> None:
    """Codex sends `generate: false` first on its WebSocket; the real API answers without output."""
    async with Simulator(SimConfig(ttft_ms=5, itl_ms=1, tokens=5)) as sim:
        async with aiohttp.ClientSession() as s:
            async with s.ws_connect(sim.url + "/v1/responses") as ws:
                await ws.send_json({"type": "response.create", "model": "m", "input": "hi", "generate": False})
                kinds: list[str] = []
                while not kinds or kinds[-1] != "response.completed":
                    event = await ws.receive_json(timeout=5)
                    kinds.append(event["type"])
    assert "response.output_text.delta" not in kinds
    assert event["response"]["usage"]["output_tokens"] == 0


def test_mock_upstream_on_a_busy_port_says_so_in_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "proxy", "mock-upstream", "--port", str(port)],
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith(f"Error: cannot listen on 127.0.0.1:{port}: ") and "in use" in done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


async def test_the_agent_script_calls_declared_tools_with_their_own_arguments_then_answers() -> None:
    """--tool-script with two tools and arguments per tool: a request that declares only one gets a call
    of that one; a request whose history ends with its result gets text."""
    args = json.dumps({"Agent": {"prompt": "p"}, "Bash": {"command": "true"}})
    config = SimConfig(ttft_ms=0, itl_ms=0, tokens=4, tool_call=True, tool_name="Agent,Bash", tool_args=args,
                       tool_script=True)
    async with Simulator(config) as s, aiohttp.ClientSession() as http:
        async def ask(body: dict) -> dict:
            async with http.post(s.url + "/v1/messages", json={"model": "m", "max_tokens": 9, **body}) as r:
                return await r.json()

        both = await ask({"messages": [{"role": "user", "content": "go"}]})
        assert [(b["name"], b["input"]) for b in both["content"]] == [("Agent", {"prompt": "p"}),
                                                                       ("Bash", {"command": "true"})]
        only = await ask({"messages": [{"role": "user", "content": "go"}], "tools": [{"name": "Bash"}]})
        assert [b["name"] for b in only["content"]] == ["Bash"]
        done = await ask({"messages": [{"role": "user", "content": "go"},
                                       {"role": "assistant", "content": only["content"]},
                                       {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x"}]}]})
        assert [b["type"] for b in done["content"]] == ["text"] and done["stop_reason"] == "end_turn"
