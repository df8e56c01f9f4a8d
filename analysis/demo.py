"""`llmtap demo`: the simulated upstream, the real proxy and a short realistic mix of traffic.

No key, no network: everything runs in this process on loopback ports. The
traffic goes through the official SDKs, so the rows look like daily use, and
includes what the real CLIs send around their generations: Claude Code's `HEAD /` warm-up and `count_tokens` before each
prompt, Codex's WebSocket with its prewarm before the turn, a models list.
"""

from __future__ import annotations

import asyncio
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable

import aiohttp
import anthropic
import openai
import orjson

from proxy.settings.config import ServeConfig
from proxy.serve.server import RunningProxy
from proxy.simulator.app import Simulator
from proxy.simulator.config import SimConfig
from proxy.common.terminal_text import echo

from analysis.views import create_views

PROMPT = "Explain in one paragraph why streaming matters for perceived latency. " * 4


@dataclass(frozen=True)
class Call:
    label: str
    run: Callable[[str], Awaitable[None]]
    requests: int = 1  # requests the call sends


def _openai(base: str, headers: dict[str, str] | None = None) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base + "/v1", api_key="sk-demo-not-a-real-key", max_retries=0,
                              default_headers=headers or {})


def _anthropic(base: str, headers: dict[str, str] | None = None) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=base, api_key="sk-ant-demo-not-a-real-key", max_retries=0,
                                    default_headers=headers or {})


async def chat_stream(base: str, model: str = "gpt-5-mini", headers: dict[str, str] | None = None) -> None:
    async with _openai(base, headers) as client:
        stream = await client.chat.completions.create(
            model=model, stream=True, stream_options={"include_usage": True},
            messages=[{"role": "user", "content": PROMPT * random.randint(1, 12)}])
        async for _ in stream:
            pass


async def chat_once(base: str) -> None:
    async with _openai(base) as client:
        await client.chat.completions.create(model="gpt-5-mini", messages=[{"role": "user", "content": PROMPT}])


async def responses_stream(base: str) -> None:
    async with _openai(base, {"x-sim-reasoning-tokens": "12"}) as client:
        stream = await client.responses.create(model="gpt-5", input=PROMPT * random.randint(1, 20), stream=True)
        async for _ in stream:
            pass


async def messages_stream(base: str, headers: dict[str, str] | None = None,
                          tools: list[anthropic.types.ToolParam] | None = None) -> None:
    async with _anthropic(base, {"x-sim-reasoning-tokens": "16", "x-sim-cache-read-tokens": "3000", **(headers or {})}) as client:
        async with client.messages.stream(model="claude-sonnet-4-5", max_tokens=400, tools=tools or anthropic.omit,
                                          messages=[{"role": "user", "content": PROMPT * random.randint(1, 25)}]) as stream:
            async for _ in stream.text_stream:
                pass


async def messages_once(base: str) -> None:
    async with _anthropic(base) as client:
        await client.messages.create(model="claude-haiku-4-5", max_tokens=200, messages=[{"role": "user", "content": PROMPT}])


async def failing(base: str, status: str) -> None:
    try:
        if status == "529":
            await messages_once_with(base, {"x-sim-status": status})
        else:
            await chat_stream(base, headers={"x-sim-status": status})
    except (openai.APIError, anthropic.APIError):
        pass  # the error is the point: it lands in the database


async def messages_once_with(base: str, headers: dict[str, str]) -> None:
    async with _anthropic(base, headers) as client:
        await client.messages.create(model="claude-sonnet-4-5", max_tokens=50, messages=[{"role": "user", "content": "hi"}])


async def cut_stream(base: str) -> None:
    try:
        await messages_stream(base, {"x-sim-disconnect-after": "5"})
    except Exception:  # the SDK reports the cut connection in its own way; the row records it
        pass


CLAUDE_CODE = {"User-Agent": "claude-cli/2.1.197 (external, sdk-cli)", "x-app": "cli"}
# Claude Code declares its tools on every turn (a request without them is a side request, `kind` side)
CLAUDE_TOOLS: list[anthropic.types.ToolParam] = [
    {"name": name, "description": f"The {name} tool.", "input_schema": {"type": "object"}} for name in ("Bash", "Read")]
CODEX = {"User-Agent": "codex_exec/0.171.0 (Debian 12; x86_64) dumb", "originator": "codex_exec",
         "Authorization": "Bearer sk-demo-not-a-real-key", "OpenAI-Beta": "responses_websockets=2026-02-06",
         "x-codex-turn-metadata": '{"request_kind":"turn"}', "x-sim-reasoning-tokens": "8"}


async def claude_code_prompt(base: str) -> None:
    """What `claude -p` sends: a `HEAD /` warm-up, a token count, then the streamed turn."""
    async with aiohttp.ClientSession() as session:
        async with session.head(base + "/", headers={"User-Agent": "Bun/1.2.19"}) as response:
            await response.read()
    headers = {**CLAUDE_CODE, "X-Claude-Code-Session-Id": f"demo-{random.randint(1, 3)}"}
    async with _anthropic(base, headers) as client:
        messages = [{"role": "user", "content": PROMPT * random.randint(1, 25)}]
        await client.messages.count_tokens(model="claude-sonnet-4-5", messages=messages)  # type: ignore[arg-type]
    await messages_stream(base, headers, CLAUDE_TOOLS)


async def codex_turn(base: str) -> None:
    """Codex on its built-in provider: a WebSocket, a prewarm (`"generate": false`), then the turn."""
    frames = [{"type": "response.create", "model": "gpt-5-codex", "input": [], "generate": False},
              {"type": "response.create", "model": "gpt-5-codex",
               "input": [{"role": "user", "content": PROMPT * random.randint(1, 20)}]}]
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(base + "/v1/responses", headers=CODEX) as ws:
            for frame in frames:
                await ws.send_str(orjson.dumps(frame).decode())
                while (await ws.receive_json(timeout=20))["type"] not in ("response.completed", "response.failed"):
                    pass


async def models_list(base: str) -> None:
    async with _openai(base) as client:
        await client.models.list()


def mix() -> list[Call]:
    calls = [Call("chat stream", chat_stream)] * 10 + [Call("chat", chat_once)] * 3
    calls += [Call("responses stream", responses_stream)] * 6
    calls += [Call("messages stream", messages_stream)] * 10 + [Call("messages", messages_once)] * 3
    calls += [Call("429", lambda b: failing(b, "429")), Call("401", lambda b: failing(b, "401")),
              Call("529", lambda b: failing(b, "529")), Call("cut stream", cut_stream)]
    calls += [Call("claude code prompt", claude_code_prompt, 3)] * 4 + [Call("codex turn", codex_turn, 2)] * 3
    calls += [Call("models", models_list)] * 2
    random.Random(7).shuffle(calls)
    return calls


class Progress:
    def __init__(self, total: int) -> None:
        self.total, self.done, self.tty = total, 0, sys.stderr.isatty()

    def step(self, requests: int = 1) -> None:
        self.done += requests
        if self.tty:
            bar = "#" * (30 * self.done // self.total)
            echo(f"  [{bar:<30}] {self.done}/{self.total} requests", nl=False, err=True, redraw=True)

    def close(self) -> None:
        if self.tty:
            echo(err=True)
        echo(f"  sent {self.done} requests", err=True)


async def drive(base: str, calls: list[Call], concurrency: int = 4) -> None:
    progress = Progress(sum(call.requests for call in calls))
    queue: asyncio.Queue[Call] = asyncio.Queue()
    for call in calls:
        queue.put_nowait(call)

    async def worker() -> None:
        while not queue.empty():
            call = queue.get_nowait()
            try:
                await asyncio.wait_for(call.run(base), timeout=20)
            except (asyncio.TimeoutError, openai.APIError, anthropic.APIError, aiohttp.ClientError):
                pass
            progress.step(call.requests)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    progress.close()


async def run_demo(db: Path, seed: int = 7, port: int = 0) -> int:
    """Serve, drive the mix, stop (flushing every row). Returns the number of requests sent."""
    random.seed(seed)
    sim_config = SimConfig(ttft_ms=120, itl_ms=12, tokens=60, prefill_us_per_token=40, state_processing=True)
    async with Simulator(sim_config, record=False) as sim:
        config = ServeConfig(port=port, upstream=sim.url, db=str(db), quiet=True, tag="demo")
        async with RunningProxy(config, query_setup=create_views) as proxy:
            echo(f"llmtap demo: simulated upstream {sim.url}, proxy {proxy.url}, recording to {db}", err=True)
            calls = mix()
            await drive(proxy.url, calls)
    return sum(call.requests for call in calls)
