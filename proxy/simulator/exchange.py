"""One simulated request: its effective config, parsed body and token plan."""

from __future__ import annotations

import asyncio
import math
import time
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import brotli
import orjson
from aiohttp import web

from proxy.simulator import quota
from proxy.simulator.config import BadOverride, SimConfig, with_overrides
from proxy.simulator.errors import Api
from proxy.simulator.pacing import TokenClock
from proxy.simulator.state import STATE, SimState
from proxy.simulator.tokens import carries_tool_result, count_input_tokens, declared_tools, split_arguments, tool_arg_pieces

try:
    from compression import zstd  # type: ignore[import-not-found]
except ImportError:  # Python < 3.14
    from backports import zstd  # type: ignore[no-redef]

# Real model names answer with the dated snapshot the real upstreams report (names only: llmtap prices
# them from genai-prices, the simulator knows no price).
SNAPSHOTS = {
    "claude-sonnet-4-5": "claude-sonnet-4-5-20250929",
    "claude-haiku-4-5": "claude-haiku-4-5-20251001",
    "claude-opus-4-1": "claude-opus-4-1-20250805",
    "gpt-5": "gpt-5-2025-08-07",
    "gpt-5-mini": "gpt-5-mini-2025-08-07",
}

# Request key: the loop time when the request arrived (RequestKey is aiohttp >= 3.13).
STARTED: Any = web.RequestKey("simulator_started", float) if hasattr(web, "RequestKey") else "simulator_started"


class SimError(Exception):
    """Answer with an HTTP error in the API's shape (raised by handlers)."""

    def __init__(self, api: Api, status: int, message: str | None = None, *, gzip: bool = False,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.api = api
        self.status = status
        self.message = message
        self.gzip = gzip
        self.headers = headers or {}


def new_request_id() -> str:
    return "req_" + uuid.uuid4().hex[:24]


class ToolCall(NamedTuple):
    """One call a tool-call answer asks for."""

    suffix: str  # the tail of its ids
    name: str
    pieces: list[str]  # its arguments' fragments, joining into a JSON object

    @property
    def arguments(self) -> str:
        return "".join(self.pieces)


@dataclass(slots=True)
class Exchange:
    api: Api
    config: SimConfig
    body: dict[str, Any]
    started: float
    gzip: bool = False
    request_id: str = ""
    input_tokens: int = 0  # counted from the prompt text, without the cached prefix
    model: str = "sim-model"
    stream: bool = False
    reasoning: int = 0
    output: int = 0  # text or tool-argument tokens
    truncated: bool = False  # output cut short by the request's max tokens
    created: int = 0
    account: Any = None  # quota.Account of the request's credential, charged when the response starts
    websocket: bool = False  # a response on the Responses WebSocket
    # when the server began on it, past the channel's hold (perf_counter: the loop's clock may tick by
    # the millisecond, too coarse for the time it states: stated.py)
    began: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self.request_id = self.request_id or new_request_id()
        self.input_tokens = count_input_tokens(self.body)
        self.created = int(time.time())

    @property
    def cached_tokens(self) -> int:
        return self.config.cache_read_tokens

    @property
    def prompt_tokens(self) -> int:
        """All input tokens, cached prefix included."""
        return self.input_tokens + self.cached_tokens

    @property
    def output_tokens(self) -> int:
        return self.reasoning + self.output

    @property
    def tool_call(self) -> bool:
        """Whether this answer is a tool call: asked for, (tool_script) the request does not bring a
        tool's result already, and it declares one of the tools to call (or declares none)."""
        config = self.config
        return config.tool_call and not (config.tool_script and carries_tool_result(self.body)) and bool(self._names())

    def _names(self) -> list[str]:
        """The tools to call: `tool_name`'s, less those a request that declares tools does not."""
        names, declared = self.config.tool_name.split(","), declared_tools(self.body)
        return names if declared is None else [n for n in names if n in declared]

    @property
    def calls(self) -> list[ToolCall]:
        """The calls of a tool-call answer, one per name in `tool_name` (that the request declares): the
        first's ids end in the exchange's suffix, the others' in the suffix and their position."""
        names, args = self._names(), self.config.tool_args
        by_name = per_tool(args, self.config.tool_name.split(","))

        def pieces(name: str) -> list[str]:
            text = by_name[name] if by_name is not None else args
            return split_arguments(text, self.output) if text is not None else tool_arg_pieces(self.output)

        return [ToolCall(self.suffix + (f"_{i}" if i else ""), name, pieces(name)) for i, name in enumerate(names)]

    @property
    def suffix(self) -> str:
        """A unique tail for response, message and item ids."""
        return self.request_id.removeprefix("req_")

    def plan(self, *, model: Any, max_tokens: Any, stream: Any) -> None:
        """Decide the output from the request: reasoning first, then text, capped at max_tokens."""
        self.model = self.config.model or (SNAPSHOTS.get(model, model) if isinstance(model, str) and model
                                           else "sim-model")
        self.stream = stream is True
        self.reasoning, self.output = self.config.reasoning_tokens, self.config.tokens
        if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens >= 0:
            if self.output_tokens > max_tokens:
                self.truncated = True
                self.reasoning = min(self.reasoning, max_tokens)
                self.output = max_tokens - self.reasoning

    def clock(self, state: SimState) -> TokenClock:
        ttft_ms = self.config.headers_delay_ms + self.config.ttft_ms
        ttft_ms += self.input_tokens * self.config.prefill_us_per_token / 1000
        return TokenClock(self.started, ttft_ms / 1000, self.config.itl_ms / 1000, state.load)


def per_tool(args: str | None, names: list[str]) -> dict[str, str] | None:
    """`tool_args` given per tool: a JSON object whose keys are the tools' names and whose values
    are each one's arguments; None when it is one object for every call."""
    if args is None or len(names) < 2:
        return None
    obj = orjson.loads(args)
    if set(obj) != set(names) or not all(isinstance(v, dict) for v in obj.values()):
        return None
    return {name: orjson.dumps(value).decode() for name, value in obj.items()}


def accepts_gzip(accept_encoding: str | None) -> bool:
    for item in (accept_encoding or "").split(","):
        name, _, params = item.partition(";")
        if name.strip().lower() not in ("gzip", "*"):
            continue
        q = params.strip()
        if not q.startswith("q="):
            return True
        try:
            return float(q[2:]) > 0
        except ValueError:
            return False
    return False


def decode_body(raw: bytes, content_encoding: str | None) -> bytes:
    """The request body without its Content-Encoding.

    Falls back to the bytes as they are: a server with auto_decompress on
    has already decoded them.
    """
    encoding = (content_encoding or "").strip().lower()
    try:
        if encoding in ("gzip", "x-gzip"):
            return zlib.decompress(raw, wbits=47)
        if encoding == "deflate":
            return zlib.decompress(raw)
        if encoding == "br":
            return brotli.decompress(raw)
        if encoding == "zstd":
            return zstd.decompress(raw)
    except Exception:
        return raw
    return raw


def parse_json(api: Api, raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise SimError(api, 400, f"malformed JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise SimError(api, 400, "the JSON body must be an object")
    return body


def effective_config(api: Api, state: SimState, headers: Any) -> SimConfig:
    try:
        return with_overrides(state.config, headers)
    except BadOverride as exc:
        raise SimError(api, 400, str(exc)) from None


async def open_exchange(request: web.Request, api: Api, *, limited: bool = True) -> Exchange:
    """Parse the request into an Exchange, or raise SimError (bad input, an injected status, or its
    credential's budget spent: `limited`)."""
    config = effective_config(api, request.app[STATE], request.headers)
    if config.headers_delay_ms:  # a slower channel: nothing, not even an error, before this
        await asyncio.sleep(config.headers_delay_ms / 1000)
    raw = decode_body(await request.read(), request.headers.get("Content-Encoding"))
    body = parse_json(api, raw)
    gzip = config.gzip and accepts_gzip(request.headers.get("Accept-Encoding"))
    if config.error_status is not None:
        raise SimError(api, config.error_status, gzip=gzip)
    started = request.get(STARTED) or asyncio.get_running_loop().time()
    ex = Exchange(api, config, body, started, gzip)
    if limited:
        ex.account = request.app[STATE].quotas.account(config, request.headers)
        if ex.account is not None and (wait := quota.spent(ex.account)) is not None:
            headers = {**quota.headers(api, ex.account), "retry-after": str(max(math.ceil(wait), 1))}
            raise SimError(api, 429, gzip=gzip, headers=headers)
    return ex
