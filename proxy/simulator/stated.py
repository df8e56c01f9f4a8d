"""The server's own account of its time on an answer, as real upstreams state it
(SimConfig.state_processing): `openai-processing-ms` for the OpenAI APIs, `Server-Timing` for the
others, and Codex's `responsesapi.websocket_timing` frame on the Responses WebSocket (its shape as
codex-rs reads it: `codex-rs/otel/src/events/session_telemetry.rs`).

The time runs from when the server began on the request (`Exchange.began`: past `headers_delay_ms`,
which stands for the channel in front of the server); each figure is cut down (never rounded up), so
it is never more than the server really took.
"""

from __future__ import annotations

import math
import time

import orjson

from proxy.simulator.exchange import Exchange


def _elapsed_ms(ex: Exchange, until: float | None = None) -> float:
    return max(0.0, ((time.perf_counter() if until is None else until) - ex.began) * 1000)


def _down(ms: float) -> float:
    return math.floor(ms * 1000) / 1000


def headers(ex: Exchange) -> dict[str, str]:
    """The header that states the time so far (none unless state_processing)."""
    if not ex.config.state_processing:
        return {}
    ms = _elapsed_ms(ex)
    if ex.api == "openai":
        return {"openai-processing-ms": str(math.floor(ms))}
    return {"server-timing": f"cache;desc=miss, total;dur={_down(ms)}"}


def timing_frame(ex: Exchange, first_token_at: float | None) -> bytes:
    """The timing frame a WebSocket response carries before its last: the simulator is all engine
    (its overhead outside the engine is 0); the TTFT is to its first output event."""
    metrics: dict[str, float] = {
        "responses_duration_excl_engine_and_client_tool_time_ms": 0,
        "engine_service_total_ms": _down(_elapsed_ms(ex)),
        "engine_iapi_tbt_across_engine_calls_ms": ex.config.itl_ms,
        "engine_service_tbt_across_engine_calls_ms": ex.config.itl_ms,
    }
    if first_token_at is not None:
        ttft = _down(_elapsed_ms(ex, first_token_at))
        metrics |= {"engine_iapi_ttft_total_ms": ttft, "engine_service_ttft_total_ms": ttft}
    return orjson.dumps({"type": "responsesapi.websocket_timing", "timing_metrics": metrics})
