"""`GET /_llmtap/live`: a server-sent-event feed of what the proxy is doing, for `llmtap top`.

Cheap by construction. Nothing runs per chunk: while at least one viewer is
connected, one ticker task wakes every `TICK_S`, takes a `Meter.snapshot()` of
each in-flight request (as far as its meter has read: the feed never makes a
meter parse), takes the rows finished since the previous tick (a listener
only keeps a reference to each), serialises one `tick` event and hands the
same bytes to every viewer. With no viewer connected the feed is
unregistered and costs nothing at all.

Each viewer has a bounded queue: a viewer that reads too slowly loses its
oldest ticks, counted in the `dropped` field of the ticks it does get,
instead of making the proxy buffer without bound.

A tick's JSON: `now` (epoch s), `dropped`, `requests_seen`, `loop_lag`
(health's p50/p99/max ms), `inflight` (see `inflight_entry`), `finished`
(see `FINISHED_FIELDS`, plus `started` in epoch s) and `finished_dropped`.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any, Callable

import orjson
from aiohttp import web

from proxy.meter.meter import Meter, RequestLabels, Snapshot
from proxy.common.prices import row_cost
from proxy.observe.looplag import LoopLag
from proxy.record.recorder import Finished, Recorder
from proxy.common.schema import GENERATING_KINDS

TICK_S = 0.25
VIEWER_QUEUE = 16  # ticks (4 s) a viewer may fall behind before it loses the oldest
MAX_FINISHED = 5000  # rows kept between two ticks; more are counted in finished_dropped
FINISHED_FIELDS = (
    "id", "method", "path", "request_model", "tool", "session_id", "status", "outcome", "error_type",
    "stream", "ttft_ms", "tpot_ms", "e2e_ms", "input_tokens", "output_tokens", "cache_read_tokens",
    "output_tokens_per_s", "kind", "tag",
    # for top's cost and limits: the price's inputs, and the limits the upstream stated to the key
    "response_model", "upstream_host", "key_fingerprint", "credential_kind", "cache_creation_tokens",
    "reasoning_tokens", "ratelimit_requests_remaining", "ratelimit_requests_limit", "ratelimit_tokens_remaining",
    "ratelimit_tokens_limit", "ratelimit_5h_utilization", "ratelimit_7d_utilization", "ratelimit_5h_reset", "cost_usd",
)
Labels = tuple[str | None, str | None, str | None]  # model, tool, session_id (a RequestLabels)


class Viewer:
    """One connected client: a bounded queue of serialised ticks."""

    def __init__(self, size: int = VIEWER_QUEUE) -> None:
        self.queue: deque[bytes] = deque(maxlen=size)
        self.ready = asyncio.Event()
        self.dropped = 0

    def push(self, tick: bytes) -> None:
        if len(self.queue) == self.queue.maxlen:
            self.dropped += 1
        self.queue.append(tick)
        self.ready.set()

    def take(self) -> list[bytes]:
        ticks = list(self.queue)
        self.queue.clear()
        self.ready.clear()
        return ticks


class LiveFeed:
    """The proxy side of the feed; one of the recorder's observers exactly while viewers are connected."""

    def __init__(self, recorder: Recorder, loop_lag: LoopLag, report: Callable[[str], None],
                 tick_s: float = TICK_S) -> None:
        self.recorder, self.loop_lag, self.report, self.tick_s = recorder, loop_lag, report, tick_s
        self.viewers: set[Viewer] = set()
        self.finished: deque[dict[str, Any]] = deque(maxlen=MAX_FINISHED)
        self.finished_dropped = 0
        self.labels: dict[str, Labels] = {}  # by meter id: parsed once per request
        self.task: asyncio.Task[None] | None = None
        self.closed = False  # the server is stopping: every stream ends

    def close(self) -> None:
        """End every viewer's stream now, rather than hold the server's shutdown for its timeout."""
        self.closed = True
        for viewer in self.viewers:
            viewer.ready.set()

    def __call__(self, finished: Finished) -> None:
        """A finished request (the recorder's observer): keep a reference to its row until the next tick."""
        if len(self.finished) == self.finished.maxlen:
            self.finished_dropped += 1
        self.finished.append(finished.row)

    def join(self, queue_size: int = VIEWER_QUEUE) -> Viewer:
        viewer = Viewer(queue_size)
        self.viewers.add(viewer)
        self.recorder.observe(self)
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._run())  # referenced here until it ends
        return viewer

    def leave(self, viewer: Viewer) -> None:
        self.viewers.discard(viewer)
        if self.viewers:
            return
        self.recorder.forget(self)
        self.finished.clear()
        self.labels.clear()
        if self.task is not None:
            self.task.cancel()
            self.task = None

    async def _run(self) -> None:
        while self.viewers:
            await asyncio.sleep(self.tick_s)
            try:
                data = self.tick()
            except Exception as exc:  # pragma: no cover - a bug here must not stop the feed
                self.report(f"llmtap: live feed tick failed: {type(exc).__name__}: {exc}")
                continue
            for viewer in self.viewers:
                viewer.push(data)

    def tick(self) -> bytes:
        """One serialised tick; takes the finished rows."""
        now_ns, now = time.perf_counter_ns(), time.time()
        meters = list(self.recorder.inflight.values())
        self._forget_finished_labels()
        finished = [finished_entry(row) for row in self.finished]
        self.finished.clear()
        tick = {
            "now": now,
            "requests_seen": self.recorder.requests_seen,
            "loop_lag": self.loop_lag.summary(),
            "inflight": [self._inflight(m, now_ns) for m in meters],
            "finished": finished,
            "finished_dropped": self.finished_dropped,
        }
        return orjson.dumps(tick)

    def _inflight(self, meter: Meter, now_ns: int) -> dict[str, Any]:
        snap = meter.snapshot()
        return _entry(snap, self._labels(meter, snap), now_ns)

    def _labels(self, meter: Meter, snap: Snapshot) -> Labels:
        """Model, tool and session of a request, parsed once its body has arrived."""
        labels = self.labels.get(snap.id)
        if labels is None:
            found: RequestLabels = meter.request_labels()
            if snap.request_read:  # else the body is still being read: asked again next tick
                self.labels[snap.id] = found
            return found
        return labels

    def _forget_finished_labels(self) -> None:
        for meter_id in [k for k in self.labels if k not in self.recorder.inflight]:
            del self.labels[meter_id]


def inflight_entry(meter: Meter, labels: Labels, now_ns: int) -> dict[str, Any]:
    """A request still running: what it is and how far it got (its meter's `snapshot`)."""
    return _entry(meter.snapshot(), labels, now_ns)


def _entry(snap: Snapshot, labels: Labels, now_ns: int) -> dict[str, Any]:
    elapsed_ms = (now_ns - snap.received) / 1e6
    ttft_ms = (snap.first_output - snap.received) / 1e6 if snap.first_output is not None else None
    tokens = snap.tokens
    model, tool, session_id = labels
    return {
        "id": snap.id, "method": snap.method, "path": snap.path,
        "model": model, "tool": tool, "session_id": session_id, "status": snap.status,
        "elapsed_ms": round(elapsed_ms, 1), "ttft_ms": None if ttft_ms is None else round(ttft_ms, 1),
        "output_events": snap.output_events, "tokens": tokens,
        "tokens_per_s": round(tokens * 1000 / elapsed_ms, 1) if tokens and elapsed_ms > 0 else None,
    }


def finished_entry(row: dict[str, Any]) -> dict[str, Any]:
    entry = {name: row.get(name) for name in FINISHED_FIELDS}
    if row.get("kind") in (*GENERATING_KINDS, None):
        entry["cost_usd"] = row_cost(row)  # as the views' cost_usd: the row itself has no price
    started = row.get("started_at")
    entry["started"] = started.timestamp() if started is not None else None
    return entry


def feed_of(recorder: Recorder, loop_lag: LoopLag, report: Callable[[str], None]) -> LiveFeed:
    """The recorder's feed: the one registered as a listener, else a new one."""
    for observer in recorder.observers:
        if isinstance(observer, LiveFeed):
            return observer
    return LiveFeed(recorder, loop_lag, report)  # registered by its first join, which follows without an await


def frame(dropped: int, tick: bytes) -> bytes:
    """One SSE `tick` event, with this viewer's dropped count spliced into the shared JSON."""
    return b'event: tick\ndata: {"dropped":%d,' % dropped + tick[1:] + b"\n\n"


def end_streams(recorder: Recorder) -> None:
    """The server is stopping (admin.end_live_streams): the feed's streams end."""
    for observer in recorder.observers:
        if isinstance(observer, LiveFeed):
            observer.close()


async def stream(request: web.Request, feed: LiveFeed) -> web.StreamResponse:
    """The handler for `GET /_llmtap/live` (admin rules already checked), on the recorder's feed
    (`feed_of`)."""
    viewer = feed.join()
    try:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        await response.write(b": llmtap live feed, one tick every %.0f ms\n\n" % (feed.tick_s * 1000))
        while not feed.closed:
            await viewer.ready.wait()
            for tick in viewer.take():
                await response.write(frame(viewer.dropped, tick))
    finally:
        feed.leave(viewer)
    return response
