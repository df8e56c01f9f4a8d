"""One benchmark request, OpenAI Chat Completions or Anthropic Messages, measured
on the client side the way vLLM's `bench serve` does.

- TTFT: from just before the request is sent to the read that completed the
  first output-carrying event (reasoning and tool arguments count, as in the
  proxy's `ttft_ms`). Streaming only.
- ITL: the gaps between successive output events.
- E2E: from just before the request is sent to the end of the body.
- TPOT: (E2E - TTFT) / (output tokens - 1), for streams of 2+ output tokens.
- Output tokens: the response's usage; without usage, the output events.

Events are parsed by the proxy's own SSE parser and dialects, so "first
token" means the same thing on both sides of the proxy.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Literal

import aiohttp
import orjson

from proxy.meter.dialects.anthropic import Anthropic
from proxy.meter.dialects.base import Dialect
from proxy.meter.dialects.openai_chat import OpenAIChat
from proxy.common.headers import TAG_HEADER
from proxy.meter.sse import SSEParser

Api = Literal["openai", "anthropic"]
ANTHROPIC_VERSION = "2023-06-01"


def bench_version() -> str:
    try:
        return version("llmtap")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0"


USER_AGENT = f"llmtap-bench/{bench_version()}"


def endpoint(api: Api, base_url: str) -> str:
    """The SDKs' conventions: an OpenAI base ends in /v1, an Anthropic base does not."""
    base = base_url.rstrip("/")
    return base + ("/chat/completions" if api == "openai" else "/v1/messages")


@dataclass(frozen=True, slots=True)
class Target:
    api: Api
    base_url: str  # where the client sends: the proxy, or the upstream with --direct
    model: str
    api_key: str | None = None
    timeout_s: float = 300.0

    @property
    def url(self) -> str:
        return endpoint(self.api, self.base_url)

    def headers(self, tag: str | None) -> dict[str, str]:
        headers = {"User-Agent": USER_AGENT, "Content-Type": "application/json"}
        if self.api == "anthropic":
            headers["anthropic-version"] = ANTHROPIC_VERSION
            if self.api_key:
                headers["x-api-key"] = self.api_key
        elif self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        if tag:
            headers[TAG_HEADER] = tag
        return headers

    def body(self, prompt: str, max_tokens: int, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "max_tokens": max_tokens, "stream": stream,
                                "messages": [{"role": "user", "content": prompt}]}
        if stream and self.api == "openai":
            body["stream_options"] = {"include_usage": True}
        return body


@dataclass(slots=True)
class Result:
    """One request as the client saw it; times in ms."""

    ok: bool
    stream: bool
    status: int | None = None
    error: str | None = None
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    tpot_ms: float | None = None
    itl_ms: list[float] = field(default_factory=list)
    input_tokens: int | None = None
    output_tokens: int | None = None
    started: float = 0.0  # perf_counter seconds
    ended: float = 0.0


async def send(session: aiohttp.ClientSession, target: Target, prompt: str, max_tokens: int,
               stream: bool, tag: str | None = None) -> Result:
    """Send one request and measure it; network and HTTP errors become a failed Result."""
    data = orjson.dumps(target.body(prompt, max_tokens, stream))
    timeout = aiohttp.ClientTimeout(total=target.timeout_s, sock_connect=10)
    dialect: Dialect = Anthropic() if target.api == "anthropic" else OpenAIChat()
    started = time.perf_counter()
    result = Result(ok=False, stream=stream, started=started)
    try:
        async with session.post(target.url, data=data, headers=target.headers(tag), timeout=timeout) as resp:
            result.status = resp.status
            if resp.status != 200 or not stream:
                dialect.on_body(await resp.read())
                times: list[float] = []
            else:
                times = await _read_stream(resp, dialect)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        result.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        result.ended = time.perf_counter()
        return result
    result.ended = time.perf_counter()
    _finish(result, dialect, times)
    return result


async def _read_stream(resp: aiohttp.ClientResponse, dialect: Dialect) -> list[float]:
    """perf_counter times of the output events, each the time of the read that completed it."""
    parser = SSEParser()
    times: list[float] = []
    async for data in resp.content.iter_any():
        now = time.perf_counter()
        for name, payload in parser.feed(data):
            if dialect.on_event(payload, name) is not None:
                times.append(now)
    return times


def _finish(result: Result, dialect: Dialect, times: list[float]) -> None:
    def ms(t: float) -> float:
        return (t - result.started) * 1000

    result.e2e_ms = ms(result.ended)
    usage = dialect.usage
    result.input_tokens = usage.input_tokens
    result.output_tokens = usage.output_tokens if usage.output_tokens is not None else (len(times) or None)
    result.error = _error(result, dialect)
    result.ok = result.error is None
    if not times:
        return
    result.ttft_ms = ms(times[0])
    result.itl_ms = [(b - a) * 1000 for a, b in zip(times, times[1:])]
    if result.output_tokens and result.output_tokens > 1:
        result.tpot_ms = (result.e2e_ms - result.ttft_ms) / (result.output_tokens - 1)


def _error(result: Result, dialect: Dialect) -> str | None:
    if result.status != 200:
        detail = dialect.error_message or dialect.error_type or "no error message"
        return f"HTTP {result.status}: {detail}"
    if dialect.error_type:
        return f"{dialect.error_type}: {dialect.error_message or ''}".rstrip(": ")
    if not dialect.terminal:
        return "the response ended before its final event"
    return None
