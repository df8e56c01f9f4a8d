"""A whole `llmtap bench` run: start what it needs, run the plan, check what was recorded."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from proxy.simulator.config import SimConfig

from analysis.bench.client import Api, Target
from analysis.bench.output import RunInfo
from analysis.bench.plan import PlanOptions, build_plan
from analysis.bench.runner import Budget, BenchRun, Progress, run_bench
from analysis.bench.upstream import BENCH_SIM, SIM_MODELS, check_base_url, default_model, open_setup

DEFAULT_KEY_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}


class BenchUsageError(ValueError):
    """A setting the run cannot start with; the message says which."""


@dataclass(slots=True)
class BenchRequest:
    """Everything `llmtap bench` was asked for."""

    api: Api = "openai"
    base_url: str | None = None
    model: str | None = None
    api_key: str | None = None
    api_key_env: str | None = None
    direct: bool = False
    proxy_route: str = ""
    db: Path | None = None
    plan: PlanOptions = field(default_factory=PlanOptions)
    parallel: int | None = None  # None: 1, or the simulator's capacity
    warmup: int = 1
    timeout_s: float = 300.0
    simulator: SimConfig = field(default_factory=lambda: replace(BENCH_SIM))


@dataclass(slots=True)
class BenchOutcome:
    run: BenchRun
    info: RunInfo
    recorded: list[tuple[str, str, int]] | None  # (tag, upstream host, rows); None: not recorded
    simulated: bool


def _api_key(req: BenchRequest, simulated: bool) -> str | None:
    if req.api_key:
        return req.api_key
    if req.api_key_env:
        key = os.environ.get(req.api_key_env)
        if not key:
            raise BenchUsageError(f"the environment variable {req.api_key_env} is not set")
        return key
    return None if simulated else os.environ.get(DEFAULT_KEY_ENV[req.api])


async def bench(req: BenchRequest, budget: Budget, progress: Progress | None = None) -> BenchOutcome:
    if req.base_url is not None:
        try:
            check_base_url(req.base_url)
        except ValueError as exc:
            raise BenchUsageError(str(exc)) from None
    async with open_setup(req.api, req.base_url, direct=req.direct, db=req.db, proxy_route=req.proxy_route,
                          simulator=req.simulator) as setup:
        key = _api_key(req, setup.simulated)
        model_from = ""
        model = req.model or (SIM_MODELS[req.api] if setup.simulated else None)
        if model is None:
            found = await default_model(setup, req.api, Target(req.api, setup.base_url, "", key).headers(None))
            if found is None:
                where = (f"the running proxy's route {setup.route} has no successful {req.api} generation"
                         " recorded and its upstream lists no model" if setup.serving else
                         "only the built-in simulator, or a running proxy's traffic, gives a default model")
                raise BenchUsageError(f"give --model ({where})")
            model, model_from = found
        target = Target(req.api, setup.base_url, model, key, req.timeout_s)
        parallel = req.parallel or (min(setup.capacity or 1, req.plan.runs) if setup.simulated else 1)
        plan = build_plan(replace(req.plan, parallel=parallel))
        run = await run_bench(target, plan, budget, warmup=req.warmup, progress=progress)
        recorded = await setup.recorded(run.tag_base, sum(run.finished.values()))
    info = RunInfo(req.api, model, setup.via, setup.base_url, req.plan.runs, req.warmup,
                   str(setup.db) if setup.db else None, model_from)
    return BenchOutcome(run, info, recorded, setup.simulated)
