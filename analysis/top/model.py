"""What `llmtap top` shows, aggregated from the feed's ticks.

`TopModel.apply(tick)` takes one tick; the methods below answer each section
of the screen. Times are the proxy's epoch seconds (`tick["now"]`), so the
window does not depend on this machine's clock. Conventions follow
`llmtap report`: percentiles (linear interpolation, like numpy) are over
successful requests, TTFT only over streams; errors are every outcome but
`ok`. Sessions are the tool's own session id and count every request seen
since top started (and the backfilled window). Finished requests of other
kinds than `kinds` (default: generations; token counts, probes, model lists
and prewarms take milliseconds) are only counted, in `other_total`; so are
`llmtap bench`'s requests (tags bench-...), in `bench_total`, unless `bench`.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from proxy.meter.request_kind import path_kind
from proxy.common.stats import quantile as _sorted_quantile

from analysis.window_projection import project
from analysis.filters import BENCH_TAG_PREFIX

Row = dict[str, Any]
RECENT = 50
MAX_SESSIONS = 500
MAX_OTHER_IDS = 10_000
METRICS = ("ttft_ms", "tpot_ms", "e2e_ms")


def quantile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); `values` need not be sorted."""
    return _sorted_quantile(sorted(values), q)


def ended(row: Row) -> float:
    """When a finished request ended, in epoch seconds."""
    return (row.get("started") or 0.0) + (row.get("e2e_ms") or 0.0) / 1000


def kind_of(row: Row) -> str:
    """The row's kind; from its method and path when the proxy did not say (an older llmtap)."""
    return row.get("kind") or path_kind(row.get("method") or "POST", row.get("path") or "")


def is_ok(row: Row) -> bool:
    return row.get("outcome") == "ok"


def metric_values(rows: list[Row], metric: str) -> list[float]:
    """The values the percentiles of `metric` are over (see the module docstring)."""
    streams_only = metric == "ttft_ms"
    return [r[metric] for r in rows
            if r.get(metric) is not None and is_ok(r) and (r.get("stream") or not streams_only)]


@dataclass
class GroupStats:
    label: str | None
    requests: int
    errors: int
    p50: dict[str, float | None]  # by metric
    p95: dict[str, float | None]


def group_stats(label: str | None, rows: list[Row]) -> GroupStats:
    values = {m: metric_values(rows, m) for m in METRICS}
    return GroupStats(
        label=label, requests=len(rows), errors=sum(not is_ok(r) for r in rows),
        p50={m: quantile(v, 0.5) for m, v in values.items()},
        p95={m: quantile(v, 0.95) for m, v in values.items()},
    )


@dataclass
class Session:
    session_id: str
    tool: str | None = None
    rows: list[Row] = field(default_factory=list)
    first: float | None = None  # epoch s: first request started
    last: float | None = None  # epoch s: last request ended

    def add(self, row: Row) -> None:
        self.rows.append(row)
        self.tool = row.get("tool") or self.tool
        start, end = row.get("started"), ended(row)
        if start is not None:
            self.first = start if self.first is None else min(self.first, start)
        self.last = end if self.last is None else max(self.last, end)


@dataclass
class SessionStats:
    session_id: str
    tool: str | None
    requests: int
    live: int
    ttft_total_ms: float | None
    ttft_p95_ms: float | None
    input_tokens: int | None
    output_tokens: int | None
    cache_read_share: float | None
    wall_s: float | None


LIMIT_COLUMNS = ("ratelimit_requests_remaining", "ratelimit_requests_limit", "ratelimit_tokens_remaining",
                 "ratelimit_tokens_limit", "ratelimit_5h_utilization", "ratelimit_7d_utilization")


def _headroom(row: Row) -> float:
    """The smallest share left of any stated limit (a window's unused part)."""
    shares = [row[left] / row[limit] for left, limit in (("ratelimit_requests_remaining", "ratelimit_requests_limit"),
                                                         ("ratelimit_tokens_remaining", "ratelimit_tokens_limit"))
              if row.get(left) is not None and row.get(limit)]
    shares += [1 - row[w] for w in ("ratelimit_5h_utilization", "ratelimit_7d_utilization") if row.get(w) is not None]
    return min(shares, default=1.0)


def _total(rows: list[Row], column: str) -> int | None:
    """The column's sum; None when no row knows it."""
    known = [r[column] for r in rows if r.get(column) is not None]
    return sum(known) if known else None


class TopModel:
    def __init__(self, window_s: float = 300.0, recent: int = RECENT,
                 kinds: tuple[str, ...] = ("generation",), bench: bool = False) -> None:
        self.window_s = window_s
        self.kinds = kinds  # () is every kind
        self.bench = bench  # show `llmtap bench`'s requests (tags bench-...) too
        self.other_total = 0  # finished requests of other kinds, not shown
        self.bench_total = 0  # finished bench requests, not shown
        self._other_ids: dict[Any, None] = {}
        self.now: float | None = None
        self.inflight: list[Row] = []
        self.recent: deque[Row] = deque(maxlen=recent)  # newest last
        self.window: deque[Row] = deque()  # finished rows, by arrival
        self.sessions: dict[str, Session] = {}
        self.ids: set[Any] = set()  # of the rows in the window, to skip backfilled duplicates
        self.finished_total = 0
        self.loop_lag: dict[str, Any] = {}
        self.dropped = 0
        self.finished_dropped = 0
        self.ticks = 0

    # -- input -------------------------------------------------------------------

    def apply(self, tick: Row) -> None:
        """One tick of the feed."""
        self.ticks += 1
        self.now = tick.get("now", self.now)
        self.inflight = list(tick.get("inflight") or [])
        self.loop_lag = tick.get("loop_lag") or {}
        self.dropped = tick.get("dropped", 0)
        self.finished_dropped = tick.get("finished_dropped", 0)
        self.add_finished(tick.get("finished") or [])
        self.trim()

    def add_finished(self, rows: list[Row]) -> None:
        for row in rows:
            if row.get("id") in self.ids:
                continue
            if not self.bench and str(row.get("tag") or "").startswith(BENCH_TAG_PREFIX):
                self._other(row.get("id"), bench=True)
                continue
            if self.kinds and kind_of(row) not in self.kinds:
                self._other(row.get("id"))
                continue
            self.ids.add(row.get("id"))
            self.finished_total += 1
            self.recent.append(row)
            self.window.append(row)
            if row.get("session_id"):
                self._session(row["session_id"]).add(row)

    def _other(self, row_id: Any, bench: bool = False) -> None:
        """Count a request of another kind (or a bench one) once (a backfilled one comes twice); ids kept
        bounded."""
        if row_id in self._other_ids:
            return
        self._other_ids[row_id] = None
        if len(self._other_ids) > MAX_OTHER_IDS:
            del self._other_ids[next(iter(self._other_ids))]
        if bench:
            self.bench_total += 1
        else:
            self.other_total += 1

    def disconnected(self) -> None:
        """The feed is gone: nothing is known to be in flight any more."""
        self.inflight = []

    def _session(self, session_id: str) -> Session:
        session = self.sessions.pop(session_id, None) or Session(session_id)
        self.sessions[session_id] = session  # most recently active last
        while len(self.sessions) > MAX_SESSIONS:
            del self.sessions[next(iter(self.sessions))]
        return session

    def trim(self) -> None:
        """Forget rows that ended before the window."""
        if self.now is None:
            return
        cutoff = self.now - self.window_s
        while self.window and ended(self.window[0]) < cutoff:
            self.ids.discard(self.window.popleft().get("id"))

    # -- the sections ------------------------------------------------------------

    def in_window(self) -> list[Row]:
        if self.now is None:
            return list(self.window)
        cutoff = self.now - self.window_s
        return [r for r in self.window if ended(r) >= cutoff]

    def by(self, column: str) -> list[GroupStats]:
        """Per `request_model` or `tool` over the window, busiest first."""
        groups: dict[str | None, list[Row]] = {}
        for row in self.in_window():
            groups.setdefault(row.get(column), []).append(row)
        stats = [group_stats(label, rows) for label, rows in groups.items()]
        return sorted(stats, key=lambda g: (-g.requests, g.label or ""))

    def cost(self) -> float | None:
        """The window's generations at list price (cost_usd); None when none is priced."""
        known = [r["cost_usd"] for r in self.in_window() if r.get("cost_usd") is not None]
        return sum(known) if known else None

    def limits(self) -> list[Row]:
        """The latest limits each upstream stated per key in the window, the scarcest first."""
        latest: dict[tuple[Any, Any], Row] = {}
        points: dict[tuple[Any, Any], list[tuple[float, float, Any]]] = {}
        for row in self.in_window():
            if any(row.get(c) is not None for c in LIMIT_COLUMNS):
                key = (row.get("key_fingerprint"), row.get("upstream_host"))
                merged = latest.setdefault(key, {"key_fingerprint": key[0], "upstream_host": key[1]})
                merged.update({c: row[c] for c in LIMIT_COLUMNS if row.get(c) is not None})
                if row.get("ratelimit_5h_utilization") is not None:
                    points.setdefault(key, []).append((ended(row), row["ratelimit_5h_utilization"],
                                                       row.get("ratelimit_5h_reset")))
        now = datetime.fromtimestamp(self.now if self.now is not None else time.time(), UTC)
        for key, found in points.items():  # when the 5-hour window runs out at the window's rate
            projection = project(found, now)
            shown = {"used up": "used up", "not before the reset": "after reset"}.get(projection.note or "")
            latest[key]["runs_out"] = projection.text(now) if projection.runs_out is not None else shown or "-"
        return sorted(latest.values(), key=_headroom)

    def outcomes(self) -> Counter[str]:
        """Requests by outcome over the window (`ok` included)."""
        return Counter(r.get("outcome") or "unknown" for r in self.in_window())

    def session_stats(self) -> list[SessionStats]:
        """One line per session, the most recently active first (in flight counts as active)."""
        live = Counter(r.get("session_id") for r in self.inflight if r.get("session_id"))
        order = [*live, *reversed(self.sessions)]
        seen: set[Any] = set()
        out = []
        for sid in order:
            if sid not in seen:
                seen.add(sid)
                out.append(self._session_line(sid, live[sid]))  # type: ignore[arg-type]  # sessions have ids
        return out

    def _session_line(self, session_id: str, live: int) -> SessionStats:
        session = self.sessions.get(session_id) or Session(session_id)
        rows = session.rows
        ttfts = [r["ttft_ms"] for r in rows if r.get("ttft_ms") is not None]
        tool = session.tool or next((r.get("tool") for r in self.inflight
                                     if r.get("session_id") == session_id), None)
        input_tokens = _total(rows, "input_tokens")
        last = self.now if live and self.now is not None else session.last
        first = session.first
        if first is None and live:
            first = min((self.now or 0) - r["elapsed_ms"] / 1000 for r in self.inflight
                        if r.get("session_id") == session_id)
        return SessionStats(
            session_id=session_id, tool=tool, requests=len(rows), live=live,
            ttft_total_ms=sum(ttfts) if ttfts else None,
            ttft_p95_ms=quantile(metric_values(rows, "ttft_ms"), 0.95),
            input_tokens=input_tokens, output_tokens=_total(rows, "output_tokens"),
            cache_read_share=(_total(rows, "cache_read_tokens") or 0) / input_tokens if input_tokens else None,
            wall_s=last - first if first is not None and last is not None else None,
        )
