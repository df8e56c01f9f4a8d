"""One owner of a request's life, from its arrival to its row.

The relay (proxy/relay: app.py, reverse.py, websocket.py) says `recorder.start(...)` when a request arrives and
gets its meter back (None when not measuring); it tells the meter what happens as it happens (the
meter's named events, proxy/meter/meter.py); and it says `recorder.end(meter, outcome, error)` once,
however the request ended. The recorder keeps the in-flight registry (what `/_llmtap/live` shows),
builds the rows of ended requests in small batches, and hands each finished request — its row, its
chunk rows, its captured bodies — to every observer alike: the store, Prometheus, OpenTelemetry,
the live feed, the stderr line (mitmproxy's addons). No observer drives the relay, and one that
fails costs its own metric, never a request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Any

from multidict import CIMultiDictProxy

from proxy.meter.capture import make_meter
from proxy.settings.config import ServeConfig
from proxy.meter.meter import Meter
from proxy.meter.redact import redact_row
from proxy.common import latency
from proxy.common.chunk_rows import ChunkRows
from proxy.common.schema import Outcome
from proxy.common.terminal_text import printable

# An ended request's row is built together with those of the next few (`Recorder.record_ended`):
# one after another, the meter's code and data stay in the CPU's caches, and measuring costs a
# fifth less than row by row between other requests' reads (non-streaming, measured side by side
# with benchmarks/paired_cost.py).
RECORD_BATCH = 32
RECORD_DELAY_S = latency.RECORD_DELAY_S  # the longest an ended request waits for its row to be built (its budget)
# A batch's work is bounded too, so that building it holds the loop well under a millisecond
# (the target for the delay llmtap adds to a chunk): a row costs about 0.45 µs per KiB of JSON
# body parsed then (request, and a non-streaming response) and 0.25 µs per output event.
RECORD_BATCH_BYTES = 256 * 1024
RECORD_BATCH_EVENTS = 1_000
Error = tuple[str, str]  # (error_type, message)
Ended = tuple[Meter, "Outcome | None", "Error | None", int]  # meter, outcome, error, end (ns)


@dataclass(frozen=True, slots=True)
class Finished:
    """What observers get of one request: its row (schema.REQUEST_COLUMNS), its chunk rows
    (CHUNK_COLUMNS) and, with --capture-bodies, its bodies row (BODY_COLUMNS)."""

    row: dict[str, Any]
    chunks: ChunkRows | list[tuple[Any, ...]]  # a list of tuples: rows read back (a spill file, a test)
    body: tuple[Any, ...] | None


Observer = Callable[[Finished], None]


def on_rows(observe_row: Callable[[dict[str, Any]], None]) -> Observer:
    """An observer for something that wants the row only (Prometheus, OpenTelemetry)."""
    def observe(finished: Finished) -> None:
        observe_row(finished.row)
    return observe


def store_observer(store: Any, record_chunks: bool) -> Observer:
    """The DuckDB store as an observer: the bodies row first, then the request's row and chunks."""
    def observe(finished: Finished) -> None:
        if finished.body is not None:
            store.put_body(finished.body)
        store.put(finished.row, finished.chunks if record_chunks else None)
    return observe


def log_observer(report: Callable[[str], None]) -> Observer:
    """The stderr line of each request (`serve` without --quiet)."""
    def observe(finished: Finished) -> None:
        report(log_line(finished.row))
    return observe


class Recorder:
    def __init__(self, config: ServeConfig, report: Callable[[str], None]) -> None:
        self.config, self.report = config, report
        self.observers: list[Observer] = []
        self.inflight: dict[str, Meter] = {}  # by meter id, for the live view
        self.requests_seen = 0
        self.ended: list[Ended] = []  # requests over, rows not built yet
        self._ended_bytes = 0  # JSON the batch's rows will parse
        self._ended_events = 0
        self._timer: asyncio.TimerHandle | None = None
        self.secrets: tuple[str, ...] = ()  # llmtap's client key, the keys routes inject: redacted in every row

    def observe(self, observer: Observer) -> None:
        if observer not in self.observers:
            self.observers.append(observer)

    def forget(self, observer: Observer) -> None:
        if observer in self.observers:
            self.observers.remove(observer)

    # -- a request's life -------------------------------------------------------------------------

    def start(self, *, received_ns: int, method: str, path: str, query: Mapping[str, str],
              headers: CIMultiDictProxy[str], route: str = "", upstream_host: str = "", tag: str | None = None,
              credential: str | None = None, relayed: bool = True) -> Meter | None:
        """A request arrived (at `received_ns`, the monotonic clock): its meter, in flight from now;
        None when not measuring. `relayed=False` for what llmtap answers itself (no body capture)."""
        cfg = self.config
        if not cfg.measure:
            return None
        meter = make_meter(cfg.capture_bodies and relayed, cfg.capture_max_kb, received_ns=received_ns,
                           method=method, path=path, query=dict(query), headers=headers, route=route,
                           upstream_host=upstream_host, tag=tag, credential=credential)
        self.inflight[meter.id] = meter
        return meter

    def end(self, meter: Meter, outcome: Outcome | None, error: Error | None) -> None:
        """The request is over (now, by the monotonic clock); `outcome` None: the meter decides from
        what it saw. Its row is built within RECORD_DELAY_S, with those of the requests that end
        meanwhile."""
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
        """Build the rows of the requests that are over and hand them to the observers. Called by
        `end`, and before anything that needs every row (a flush, a stop)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        ended, self.ended = self.ended, []
        self._ended_bytes = self._ended_events = 0
        for meter, outcome, error, end_ns in ended:
            self._record(meter, outcome, error, end_ns)

    def _record(self, meter: Meter, outcome: Outcome | None, error: Error | None, end_ns: int) -> None:
        try:
            row, chunks = meter.finish(outcome, end_ns, error)
            redact_row(row, [*meter.secrets(), *self.secrets])  # every text, before any observer sees it
        except Exception as exc:  # a bug in measuring loses a metric, never a request
            self.report(f"llmtap: could not measure a request: {type(exc).__name__}: {exc}")
            return
        self.deliver(Finished(row, chunks, meter.captured))

    def deliver(self, finished: Finished) -> None:
        """Hand one finished request to every observer: this process's own (from `_record`), or
        one that a `serve --workers` worker built and shipped here (proxy/serve/workers.py)."""
        self.requests_seen += 1
        for observer in self.observers:
            try:
                observer(finished)
            except Exception:  # pragma: no cover - observers must not break recording
                pass


def log_line(row: dict[str, Any]) -> str:
    """One concise stderr line per request. A client's model name or path and an upstream's error
    message can hold control characters: shown escaped (`\\n`, `\\u001b`: terminal_text.printable), so
    that no request can forge a line or drive the terminal."""
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
    return printable(line)
