"""Running the plan: calibration, warm-up, then each point's requests, within bounds.

Every request counts against --max-requests (calibration and warm-up too, so
the bound is a bound on cost). At --max-seconds, or when `stop` is set (Ctrl-C),
no new request starts and the ones in flight are abandoned; what finished
before is summarised as usual. Warm-up requests (K rounds per experiment at
its first point, as many at once as that point has in flight) carry the tag
`<tag>-warmup` and are left out of the statistics; the two calibration
requests carry `bench-<time>-calibration`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import aiohttp

from analysis.bench import client
from analysis.bench.client import Result, Target
from analysis.bench.plan import Experiment, Point
from analysis.bench.prompts import Calibration, PromptMaker, calibrate
from analysis.bench.summary import ExperimentSummary, mark_knee, summarize_point
from analysis.filters import BENCH_TAG_PREFIX

Progress = Callable[[int, int, str], None]  # done, planned, what is running


class BenchError(Exception):
    """The benchmark cannot go on (for example, the calibration request failed)."""


def new_tag_base(now: datetime | None = None) -> str:
    return BENCH_TAG_PREFIX + (now or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%SZ")


@dataclass(slots=True)
class Budget:
    """The request-count and time bounds, and the stop signal."""

    max_requests: int | None = None
    max_seconds: float | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    sent: int = 0
    stopped_by: str | None = None  # "max-requests", "max-seconds" or "interrupted"
    deadline: float | None = None

    def start(self) -> None:
        if self.max_seconds is not None:
            self.deadline = time.monotonic() + self.max_seconds

    def remaining(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def take(self) -> bool:
        """May one more request start? Counts it when it may."""
        if self.stopped_by is None:
            if self.stop.is_set():
                self.stopped_by = "interrupted"
            elif self.max_requests is not None and self.sent >= self.max_requests:
                self.stopped_by = "max-requests"
            elif self.deadline is not None and time.monotonic() >= self.deadline:
                self.stopped_by = "max-seconds"
        if self.stopped_by is not None:
            return False
        self.sent += 1
        return True


@dataclass(slots=True)
class BenchRun:
    tag_base: str
    started_at: datetime
    experiments: list[ExperimentSummary] = field(default_factory=list)
    calibration: Calibration | None = None
    finished: Counter[str] = field(default_factory=Counter)  # requests that finished, per tag
    sent: int = 0
    stopped_by: str | None = None
    elapsed_s: float = 0.0

    def tag(self, experiment: str) -> str:
        return f"{self.tag_base}-{experiment}"


class Runner:
    def __init__(self, session: aiohttp.ClientSession, target: Target, budget: Budget, *, warmup: int = 1,
                 progress: Progress | None = None, maker: PromptMaker | None = None) -> None:
        self.session, self.target, self.budget = session, target, budget
        self.warmup = warmup
        self.progress = progress or (lambda done, planned, label: None)
        self.maker = maker or PromptMaker()
        self.done = 0
        self.planned = 0
        self.run: BenchRun | None = None

    async def bench(self, plan: list[Experiment], tag_base: str | None = None) -> BenchRun:
        started = datetime.now(timezone.utc)
        run = self.run = BenchRun(tag_base or new_tag_base(started), started)
        self.planned = 2 + sum(self.warmup * e.points[0].concurrency + e.requests for e in plan if e.points)
        if self.budget.max_requests is not None:
            self.planned = min(self.planned, self.budget.max_requests)
        t0 = time.monotonic()
        self.budget.start()
        try:
            run.calibration = await calibrate(self.maker, self._calibration_request)
            for experiment in plan:
                if self.budget.stopped_by is not None:
                    break
                run.experiments.append(await self._experiment(experiment))
        finally:
            run.sent, run.stopped_by = self.budget.sent, self.budget.stopped_by
            run.elapsed_s = time.monotonic() - t0
        return run

    def _finished(self, tag: str) -> None:
        assert self.run is not None
        self.run.finished[tag] += 1
        self.done += 1
        self.progress(self.done, self.planned, tag)

    async def _send(self, point: Point, tag: str) -> Result:
        prompt = self.maker.prompt(point.input_tokens)
        result = await client.send(self.session, self.target, prompt, point.max_tokens, point.stream, tag)
        self._finished(tag)
        return result

    async def _calibration_request(self, prompt: str) -> int | None:
        """One short non-streaming request; the input tokens its usage reports."""
        if not self.budget.take():
            return None
        assert self.run is not None
        tag = f"{self.run.tag_base}-calibration"
        result = await client.send(self.session, self.target, prompt, 1, False, tag)
        self._finished(tag)
        if not result.ok:
            raise BenchError(f"the calibration request to {self.target.url} failed: {result.error}")
        return result.input_tokens

    async def _experiment(self, experiment: Experiment) -> ExperimentSummary:
        assert self.run is not None
        summary = ExperimentSummary(experiment.name, self.run.tag(experiment.name))
        await self._warm_up(experiment.points[0], summary.tag + "-warmup")
        for point in experiment.points:
            results = await self._point(point, summary.tag)
            if results:
                summary.points.append(summarize_point(point, results))
            if self.budget.stopped_by is not None:
                break
        if experiment.name == "concurrency":
            mark_knee(summary)
        return summary

    async def _warm_up(self, point: Point, tag: str) -> None:
        """`warmup` rounds of the first point's width, so its connections are open before measuring."""
        for _ in range(self.warmup):
            tasks = [asyncio.ensure_future(self._send(point, tag))
                     for _ in range(point.concurrency) if self.budget.take()]
            if not tasks:
                return
            await self._bounded(tasks)

    async def _point(self, point: Point, tag: str) -> list[Result]:
        """point.requests requests, point.concurrency at a time."""
        results: list[Result] = []
        queued = iter(range(point.requests))

        async def worker() -> None:
            while next(queued, None) is not None and self.budget.take():
                results.append(await self._send(point, tag))

        await self._bounded([asyncio.ensure_future(worker()) for _ in range(point.concurrency)])
        return results

    async def _bounded(self, tasks: Sequence[asyncio.Future[Any]]) -> None:
        """Wait for the tasks; cancel them at the deadline or on stop."""
        everything: asyncio.Future[Any] = asyncio.gather(*tasks)
        stopped: asyncio.Future[Any] = asyncio.ensure_future(self.budget.stop.wait())
        try:
            done, _ = await asyncio.wait({everything, stopped}, timeout=self.budget.remaining(),
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if everything in done:
            everything.result()
            return
        if self.budget.stopped_by is None:
            self.budget.stopped_by = "interrupted" if self.budget.stop.is_set() else "max-seconds"
        everything.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await everything


async def run_bench(target: Target, plan: list[Experiment], budget: Budget, *, warmup: int = 1,
                    progress: Progress | None = None, tag_base: str | None = None) -> BenchRun:
    """Open a client session and run the plan against `target`."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        runner = Runner(session, target, budget, warmup=warmup, progress=progress)
        return await runner.bench(plan, tag_base)

