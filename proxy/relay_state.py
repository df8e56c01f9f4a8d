"""What every request handler shares: config, routes, the upstream session, the store."""

from __future__ import annotations

import asyncio
import re
import sys
from dataclasses import dataclass, field
from time import perf_counter_ns
from typing import Any, Callable

import aiohttp
from aiohttp import web

from .config import ServeConfig
from .guard import Guard
from .looplag import LoopLag
from .meter import Meter
from .routes import RouteTable


# An ended request's row is built together with those of the next few (`ProxyState.record_ended`):
# one after another, the meter's code and data stay in the CPU's caches, and measuring costs a
# fifth less than row by row between other requests' reads (non-streaming, measured side by side
# as benchmarks/paired_cost.py does; benchmarks/README.md "After the third round").
RECORD_BATCH = 32
RECORD_DELAY_S = 0.005  # the longest an ended request waits for its row to be built
# A batch's work is bounded too, so that building it holds the loop well under a millisecond
# (the target for the delay llmtap adds to a chunk): a row costs about 0.45 µs per KiB of JSON
# body parsed then (request, and a non-streaming response) and 0.25 µs per output event.
RECORD_BATCH_BYTES = 256 * 1024
RECORD_BATCH_EVENTS = 1_000
Ended = tuple[Meter, str | None, tuple[str, str] | None, int]  # meter, outcome, error, end (ns)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass
class ProxyState:
    config: ServeConfig
    routes: RouteTable
    store: Any = None  # proxy.store.Store, or None when not recording
    report: Callable[[str], None] = _stderr
    admin_token: str = field(default="", repr=False)  # the admin endpoint's secret (config.admin_token)
    client_key: str | None = field(default=None, repr=False)  # what clients present where a route injects a key
    guard: Guard = field(default_factory=lambda: Guard.build((), (), remote=False))  # web pages, Host names
    session: aiohttp.ClientSession = field(init=False)
    listeners: list[Callable[[dict[str, Any]], None]] = field(default_factory=list)
    requests_seen: int = 0
    metrics: Any = None  # proxy.metrics.PrometheusMetrics, served at GET /_llmtap/metrics
    inflight: dict[str, Meter] = field(default_factory=dict)  # by meter id, for the live view
    loop_lag: LoopLag = field(default_factory=LoopLag)
    ended: list[Ended] = field(default_factory=list)  # requests over, rows not built yet
    _ended_bytes: int = field(default=0, repr=False)  # JSON the batch's rows will parse
    _ended_events: int = field(default=0, repr=False)
    _timer: asyncio.TimerHandle | None = field(default=None, repr=False)

    def record(self, meter: Meter, outcome: str | None, error: tuple[str, str] | None) -> None:
        """The request is over (now, by the monotonic clock): its row is built within
        RECORD_DELAY_S, with those of the requests that end meanwhile."""
        self.inflight.pop(meter.id, None)
        self.ended.append((meter, outcome, error, perf_counter_ns()))
        self._ended_bytes += (meter.request_bytes or 0) + (0 if meter.is_stream else meter.response_bytes)
        self._ended_events += len(meter.times)
        if (len(self.ended) >= RECORD_BATCH or self._ended_bytes >= RECORD_BATCH_BYTES
                or self._ended_events >= RECORD_BATCH_EVENTS):
            self.record_ended()
        elif self._timer is None:
            try:
                self._timer = asyncio.get_running_loop().call_later(RECORD_DELAY_S, self.record_ended)
            except RuntimeError:  # no event loop: at once
                self.record_ended()

    def record_ended(self) -> None:
        """Build the rows of the requests that are over, hand them to the store and the listeners.
        Called by `record`, and before anything that needs every row (a flush, a stop)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        ended, self.ended = self.ended, []
        self._ended_bytes = self._ended_events = 0
        for meter, outcome, error, end_ns in ended:
            self._record(meter, outcome, error, end_ns)

    def _record(self, meter: Meter, outcome: str | None, error: tuple[str, str] | None, end_ns: int) -> None:
        try:
            row, chunks = meter.finish(outcome, end_ns, error)
        except Exception as exc:  # a bug in measuring loses a metric, never a request
            self.report(f"llmtap: could not measure a request: {type(exc).__name__}: {exc}")
            return
        self.requests_seen += 1
        if self.store is not None:
            self.store.put(row, chunks if self.config.record_chunks else None)
        if not self.config.quiet:
            self.report(log_line(row))
        for listener in self.listeners:
            try:
                listener(row)
            except Exception:  # pragma: no cover - listeners must not break recording
                pass


STATE = web.AppKey("llmtap_state", ProxyState)


_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # C0, DEL and C1: line breaks, terminal escapes
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(m: re.Match[str]) -> str:
    return _ESCAPES.get(m[0]) or f"\\x{ord(m[0]):02x}"


def log_line(row: dict[str, Any]) -> str:
    """One concise stderr line per request. A client's model name or path and an upstream's error
    message can hold control characters: shown escaped (`\\n`, `\\x1b`), so that no request can
    forge a line or drive the terminal (one regex search per line; a substitution only when present)."""
    parts = [f"{row['method']} {row['path']}", str(row["status"] or "-"), row["outcome"]]
    if row.get("request_model"):
        parts.append(row["request_model"])
    if row.get("ttft_ms") is not None:
        parts.append(f"ttft {row['ttft_ms']:.0f}ms")
    if row.get("e2e_ms") is not None:
        parts.append(f"e2e {row['e2e_ms']:.0f}ms")
    if row.get("output_tokens") is not None:
        parts.append(f"in {row.get('input_tokens') or 0} out {row['output_tokens']}")
    if row.get("error_message"):
        parts.append(f"error: {row['error_message'][:120]}")
    line = "llmtap: " + "  ".join(parts)
    return _CONTROLS.sub(_escaped, line) if _CONTROLS.search(line) else line
