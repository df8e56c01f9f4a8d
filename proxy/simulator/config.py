"""How the simulated upstream behaves, and the per-request header overrides."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from proxy.simulator.tokens import TOOL_NAME


@dataclass(slots=True)
class SimConfig:
    """Behaviour of every simulated response.

    cache_read_tokens is a cached prefix added on top of the tokens counted in
    the request's text: it shows up in the usage but does not cost prefill
    time. The effective TTFT is ttft_ms + uncached input tokens *
    prefill_us_per_token / 1000. With capacity > 0, each inter-token delay is
    scaled by active/capacity while more than `capacity` generations run.

    To stand in for a slower channel (an aggregator, a corporate proxy, a far
    region): headers_delay_ms holds every API response's headers (and a
    WebSocket response's first frame) that long, the tokens shifted with
    them; connect_delay_ms holds each new connection that long before the
    server sees its first bytes (inside the TLS handshake for https, before
    the first response for http: the kernel completes the TCP handshake
    itself); keep_alive False closes each connection after its response, so
    every request opens a new one. connect_delay_ms takes effect when the
    Simulator starts.

    state_processing: every answer states the server's own time on it, as
    real upstreams do (stated.py): `openai-processing-ms` for the OpenAI APIs,
    `Server-Timing: total;dur=` for the others, a `responsesapi.websocket_timing`
    frame before a WebSocket response's last. headers_delay_ms stands for the
    channel in front of the server, so it is left out of the stated time: it
    shows as the path.
    """

    ttft_ms: float = 50
    itl_ms: float = 10
    tokens: int = 20
    reasoning_tokens: int = 0
    tool_call: bool = False
    # The calls a tool-call answer asks for (tool_call): their tools' names, comma-separated, one call
    # each, made together (`Bash,Read`); their arguments as one JSON object text (None: generated
    # from `tokens`), sent in `tokens` fragments; with tool_script, a request whose history ends with
    # a tool result is answered with text instead (an agent's loop: call, result, final answer).
    tool_name: str = TOOL_NAME
    tool_args: str | None = None
    tool_script: bool = False
    error_status: int | None = None
    stream_error: bool = False
    disconnect_after: int | None = None
    gzip: bool = False
    cache_read_tokens: int = 0
    prefill_us_per_token: float = 20.0
    capacity: int = 0
    model: str | None = None
    headers_delay_ms: float = 0
    connect_delay_ms: float = 0
    keep_alive: bool = True
    state_processing: bool = False
    # Account limits (quota.py), per credential: an API key's budget per window, a Claude login's per
    # 5 hours and 7 days; every response states what is left, and a request over budget gets a 429.
    # The defaults are a high tier's (no test or benchmark at loopback speed reaches them in a minute).
    ratelimit_requests: int = 30_000
    ratelimit_input_tokens: int = 30_000_000
    ratelimit_output_tokens: int = 6_000_000
    ratelimit_window_s: float = 60.0
    subscription_5h_tokens: int = 20_000_000
    subscription_7d_tokens: int = 200_000_000


class BadOverride(ValueError):
    """An x-sim-* request header has an invalid value."""


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError("must be >= 0")
    return value


def _duration(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise ValueError("must be a finite number >= 0")
    return value


def _flag(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("must be 1 or 0")


def _status(text: str) -> int | None:
    value = int(text)
    if not 200 <= value <= 599:
        raise ValueError("must be an HTTP status between 200 and 599")
    return value if value >= 400 else None


def _names(text: str) -> str:
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise ValueError("must be tool names, comma-separated")
    return ",".join(names)


def _json_object(text: str) -> str:
    import json

    if not isinstance(json.loads(text), dict):
        raise ValueError("must be a JSON object")
    return text


# header name -> (SimConfig field, parser)
OVERRIDES: dict[str, tuple[str, Callable[[str], Any]]] = {
    "x-sim-ttft-ms": ("ttft_ms", _duration),
    "x-sim-itl-ms": ("itl_ms", _duration),
    "x-sim-tokens": ("tokens", _count),
    "x-sim-reasoning-tokens": ("reasoning_tokens", _count),
    "x-sim-tool-call": ("tool_call", _flag),
    "x-sim-tool-name": ("tool_name", _names),
    "x-sim-tool-args": ("tool_args", _json_object),
    "x-sim-tool-script": ("tool_script", _flag),
    "x-sim-status": ("error_status", _status),
    "x-sim-stream-error": ("stream_error", _flag),
    "x-sim-disconnect-after": ("disconnect_after", _count),
    "x-sim-gzip": ("gzip", _flag),
    "x-sim-cache-read-tokens": ("cache_read_tokens", _count),
    "x-sim-prefill-us-per-token": ("prefill_us_per_token", _duration),
    "x-sim-headers-delay-ms": ("headers_delay_ms", _duration),
    "x-sim-state-processing": ("state_processing", _flag),
}


def with_overrides(config: SimConfig, headers: Mapping[str, str]) -> SimConfig:
    """The config for one request: `config` with its x-sim-* headers applied.

    x-sim-status below 400 means "no error". Raises BadOverride.
    """
    changes: dict[str, Any] = {}
    for header, (field_name, parse) in OVERRIDES.items():
        text = headers.get(header)
        if text is None:
            continue
        try:
            changes[field_name] = parse(text)
        except ValueError as exc:
            raise BadOverride(f"invalid {header} header {text!r}: {exc}") from None
    return replace(config, **changes) if changes else config
