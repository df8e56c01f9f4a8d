"""`llmtap bench` against the real simulator and the real proxy, on loopback, with tiny counts."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pty
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from click.testing import CliRunner

from analysis.bench import client
from analysis.bench.cli import bench as bench_command
from analysis.bench.output import recording_notes
from analysis.bench.plan import PlanOptions, build_plan
from analysis.bench.prompts import PromptMaker, calibrate
from analysis.bench.run import BenchRequest, bench
from analysis.bench.runner import BenchRun, Budget, run_bench
from analysis.bench.summary import ExperimentSummary
from proxy.serve.server import write_state
from .serving import RunningProxy
from proxy.simulator.app import Simulator
from proxy.simulator.config import SimConfig

from proxy.simulator.app import DEFAULT_MODELS

from .conftest import proxy_config, rows
from .waiting import wait_until_sync

FAST = {"ttft_ms": 5, "itl_ms": 1, "tokens": 100_000, "prefill_us_per_token": 0}


@asynccontextmanager
async def sim_and_proxy(tmp_path: Path, **sim: object) -> AsyncIterator[tuple[Simulator, RunningProxy]]:
    async with Simulator(SimConfig(**{**FAST, **sim})) as s:  # type: ignore[arg-type]
        async with RunningProxy(proxy_config(s.url, tmp_path)) as p:
            yield s, p


def target(proxy: RunningProxy, api: client.Api = "openai") -> client.Target:
    base = proxy.url + ("/v1" if api == "openai" else "")
    return client.Target(api, base, "sim-gpt" if api == "openai" else "sim-claude", timeout_s=20)


async def run(proxy: RunningProxy, budget: Budget | None = None, warmup: int = 1, **plan: object) -> BenchRun:
    experiments = build_plan(PlanOptions(**plan))  # type: ignore[arg-type]
    return await run_bench(target(proxy), experiments, budget or Budget(), warmup=warmup)


def medians(summary: ExperimentSummary, metric: str) -> list[float]:
    return [getattr(p, metric).p50 for p in summary.points]


async def test_input_sweep_ttft_grows_with_input_and_rows_carry_the_tag(tmp_path: Path) -> None:
    async with sim_and_proxy(tmp_path, prefill_us_per_token=50) as (_, proxy):
        result = await run(proxy, runs=3, inputs=(200, 1000, 3000), experiments=("input",))
        recorded = rows(proxy, "SELECT tag, user_agent, tool, stream, max_tokens, status FROM requests")
    (sweep,) = result.experiments
    ttft = medians(sweep, "ttft_ms")
    assert ttft == sorted(ttft) and ttft[2] - ttft[0] > 100, ttft  # 5 ms + 50 us per token: 15, 55, 155 ms
    for expected, got in zip((15, 55, 155), ttft):
        assert expected - 2 < got < expected + 40
    assert [p.ok for p in sweep.points] == [3, 3, 3] and all(p.output_tokens == 64 for p in sweep.points)
    tags = [r["tag"] for r in recorded]
    assert tags.count(sweep.tag) == 9 and sweep.tag == f"{result.tag_base}-input"
    assert tags.count(f"{sweep.tag}-warmup") == 1 and tags.count(f"{result.tag_base}-calibration") == 2
    assert len(recorded) == 12 == result.sent
    assert {(r["user_agent"], r["tool"], r["status"]) for r in recorded} == {(client.USER_AGENT, "llmtap-bench", 200)}
    assert client.USER_AGENT.startswith("llmtap-bench/")
    assert {(r["stream"], r["max_tokens"]) for r in recorded if r["tag"] == sweep.tag} == {(True, 64)}


async def test_output_sweep_e2e_grows_ttft_flat(tmp_path: Path) -> None:
    async with sim_and_proxy(tmp_path, itl_ms=3) as (_, proxy):
        result = await run(proxy, runs=3, outputs=(5, 20, 60), experiments=("output",))
    (sweep,) = result.experiments
    e2e, ttft = medians(sweep, "e2e_ms"), medians(sweep, "ttft_ms")
    assert e2e == sorted(e2e) and e2e[2] - e2e[0] > 100, e2e  # 5 + 3 ms per token after the first
    # flat: a load's noise (50 ms at a load average of 40) but never the 165 ms E2E grows by
    assert max(ttft) - min(ttft) < (e2e[2] - e2e[0]) / 2, (ttft, e2e)
    assert [p.output_tokens for p in sweep.points] == [5, 20, 60]
    # TPOT at the upstream's 3 ms a token where there are tokens enough: under load a delayed first token
    # and the few after it can reach the client in one read (5 tokens: TPOT near 0, as the client saw it)
    assert all(2.5 < p.tpot_ms.p50 < 6 for p in sweep.points[1:]), [p.tpot_ms.p50 for p in sweep.points]
    assert sweep.points[0].tpot_ms.p50 < 6


async def test_concurrency_sweep_finds_the_knee_at_the_simulators_capacity(tmp_path: Path) -> None:
    async with sim_and_proxy(tmp_path, ttft_ms=2, itl_ms=5, capacity=2) as (_, proxy):
        result = await run(proxy, runs=2, concurrency=(1, 2, 4, 8), experiments=("concurrency",))
    (sweep,) = result.experiments
    assert [p.ok for p in sweep.points] == [2, 4, 8, 16]
    throughput = [p.output_tokens_per_s for p in sweep.points]
    assert throughput[1] > 1.6 * throughput[0]  # below capacity: twice the clients, twice the tokens
    assert sweep.knee == 4, (throughput, medians(sweep, "tpot_ms"))
    assert [p.knee for p in sweep.points] == [False, False, True, False]


@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_prompts_hit_their_target_lengths_after_calibration(tmp_path: Path, api: client.Api) -> None:
    async with sim_and_proxy(tmp_path) as (_, proxy), aiohttp.ClientSession() as session:
        t = target(proxy, api)

        async def measure(prompt: str) -> int | None:
            return (await client.send(session, t, prompt, 1, False)).input_tokens

        maker = PromptMaker()
        calibration = await calibrate(maker, measure)
        assert calibration.measured
        for tokens in (200, 500, 1000, 2000, 4000):
            got = await measure(maker.prompt(tokens))
            assert got is not None and abs(got - tokens) <= 0.1 * tokens, (tokens, got)
        assert maker.prompt(500) != maker.prompt(500)  # every prompt opens differently: no shared cached prefix


async def test_streaming_and_not_through_the_anthropic_api(tmp_path: Path) -> None:
    async with sim_and_proxy(tmp_path, itl_ms=2) as (_, proxy), aiohttp.ClientSession() as session:
        t = target(proxy, "anthropic")
        streamed = await client.send(session, t, "hello " * 100, 10, True, "t1")
        whole = await client.send(session, t, "hello " * 100, 10, False, "t1")
        recorded = rows(proxy, "SELECT dialect, tag, outcome FROM requests")
    assert streamed.ok and whole.ok, (streamed.error, whole.error)
    assert streamed.output_tokens == whole.output_tokens == 10 and len(streamed.itl_ms) == 9
    assert streamed.ttft_ms is not None and streamed.ttft_ms < streamed.e2e_ms and whole.ttft_ms is None
    assert recorded == [{"dialect": "anthropic", "tag": "t1", "outcome": "ok"}] * 2


async def test_max_requests_stops_the_run(tmp_path: Path) -> None:
    async with sim_and_proxy(tmp_path) as (sim, proxy):
        result = await run(proxy, Budget(max_requests=5), runs=5, inputs=(200, 500), experiments=("input",))
        seen = len(sim.requests)
    assert result.sent == 5 == seen and result.stopped_by == "max-requests"
    (sweep,) = result.experiments  # 2 calibration + 1 warm-up + 2 measured
    assert [p.ok for p in sweep.points] == [2]


async def test_max_seconds_and_stop_end_the_run_and_keep_what_was_measured(tmp_path: Path) -> None:
    async with sim_and_proxy(tmp_path, itl_ms=5) as (_, proxy):
        t0 = time.monotonic()
        timed = await run(proxy, Budget(max_seconds=1.0), runs=50, outputs=(40,), experiments=("output",))
        assert time.monotonic() - t0 < 2.5 and timed.stopped_by == "max-seconds"
        assert 0 < timed.experiments[0].points[0].ok < 50

        budget = Budget()
        plan = build_plan(PlanOptions(runs=50, outputs=(10,), experiments=("output",)))

        def stop_after_five(done: int, planned: int, label: str) -> None:
            if done == 2 + 1 + 5:  # calibration, warm-up, five measured
                budget.stop.set()

        stopped = await run_bench(target(proxy), plan, budget, progress=stop_after_five)
    assert stopped.stopped_by == "interrupted" and stopped.experiments[0].points[0].ok == 5


async def test_through_the_running_proxy_found_by_its_state_file(tmp_path: Path) -> None:
    async with sim_and_proxy(tmp_path) as (sim, proxy):
        write_state(proxy)
        plan = PlanOptions(runs=2, outputs=(5,), experiments=("output",))
        outcome = await bench(BenchRequest(model="m1", plan=plan), Budget())
        recorded = rows(proxy, "SELECT tag, request_model FROM requests WHERE request_model = 'm1'")
    assert not outcome.simulated and outcome.info.base_url == proxy.url + "/v1"
    assert "running proxy" in outcome.info.via and outcome.info.db == str(proxy.config.db_path)
    tag = outcome.run.experiments[0].tag
    assert sum(1 for r in recorded if r["tag"] == tag) == 2
    assert outcome.recorded is not None and {t: n for t, _h, n in outcome.recorded}[tag] == 2  # via /_llmtap/sql
    assert len(sim.requests) == 2 + 1 + 2

    # --base-url through the running proxy keeps its path; rows that reached another host get a warning
    async with sim_and_proxy(tmp_path / "second") as (_, proxy):
        write_state(proxy)
        request = BenchRequest(model="m1", base_url="https://upstream.example/v1", plan=plan)
        outcome = await bench(request, Budget(max_requests=2))
    assert outcome.info.base_url == proxy.url + "/v1"
    notes = recording_notes(outcome.run, outcome.recorded, db=outcome.info.db, base_url=request.base_url,
                            db_flag=None, direct=False)
    assert notes[0].startswith("recorded 2 rows in ")
    assert "warning: the proxy sent these to 127.0.0.1, not to upstream.example" in notes[1]


async def test_out_of_the_box_through_the_running_proxy_picks_the_routes_model(tmp_path: Path) -> None:
    """`llmtap bench` with no option while `serve` runs: the model the route's traffic used most, else
    the first the upstream lists; through the CLI, as docs/bench.md promises."""
    plan = PlanOptions(runs=2, outputs=(5,), experiments=("output",))
    async with sim_and_proxy(tmp_path) as (sim, proxy):
        write_state(proxy)
        listed = await bench(BenchRequest(plan=plan), Budget())  # nothing recorded yet
        assert listed.info.model == DEFAULT_MODELS[0]
        assert listed.info.model_from == "the first the upstream lists (GET /v1/models)"
        async with aiohttp.ClientSession() as s:
            for _ in range(3):  # a tool's daily traffic: the most used model
                body = {"model": "gpt-5-mini", "stream": True, "max_tokens": 5,
                        "messages": [{"role": "user", "content": "hi"}]}
                async with s.post(proxy.url + "/v1/chat/completions", json=body,
                                  headers={"Authorization": "Bearer sk-test"}) as r:
                    assert r.status == 200 and await r.read()
        assert proxy.flush(10)
        command = [sys.executable, "-m", "proxy", "bench", "--experiment", "output", "--runs", "2", "--outputs", "5"]
        result = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=60)
        picked = rows(proxy, "SELECT request_model, count(*) AS n FROM requests WHERE starts_with(tag, 'bench-')"
                             " GROUP BY 1 ORDER BY 1")
        assert result.returncode == 0, result.stderr
        assert "openai model gpt-5-mini (the most used on route / (3 requests): no --model)" in result.stdout
        assert {r["request_model"]: r["n"] for r in picked} == {DEFAULT_MODELS[0]: 5, "gpt-5-mini": 5}

        with pytest.raises(ValueError, match=r"give --model \(the running proxy's route /nope has no successful"):
            await bench(BenchRequest(plan=plan, proxy_route="/nope", api="anthropic"), Budget())


def test_cli_json_on_a_tiny_run_against_the_builtin_simulator(tmp_path: Path) -> None:
    db = tmp_path / "bench.duckdb"
    args = ["--experiment", "output", "--outputs", "4", "--runs", "2", "--db", str(db), "--format", "json"]
    result = CliRunner().invoke(bench_command, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["model"] == "sim-gpt" and "built-in simulator" in data["via"] and data["db"] == str(db)
    (experiment,) = data["experiments"]
    (point,) = experiment["points"]
    assert (point["ok"], point["max_tokens"], point["output_tokens"], point["concurrency"]) == (2, 4, 4, 2)
    assert 80 <= point["ttft_p50_ms"] < 200 and point["e2e_p50_ms"] > point["ttft_p50_ms"] + 40
    assert experiment["tag"].startswith("bench-") and experiment["tag"].endswith("-output")
    assert f"llmtap report --tag {experiment['tag']} --db {db} --html" in result.stderr
    assert data["requests_sent"] == 6  # 2 calibration, a warm-up round of 2 (2 in flight), 2 measured
    assert f"recorded 6 rows in {db}" in result.stderr


def test_cli_direct_records_nothing_and_prints_csv(tmp_path: Path, llmtap_home: Path) -> None:
    args = ["--direct", "--api", "anthropic", "--experiment", "stream", "--runs", "1", "--warmup", "0",
            "--format", "csv"]
    result = CliRunner().invoke(bench_command, args)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("tag,experiment,target_input_tokens,max_tokens,stream,") and len(lines) == 3
    assert [line.split(",")[4] for line in lines[1:]] == ["True", "False"]
    assert "not recorded: --direct" in result.stderr and not llmtap_home.exists()


def test_ctrl_c_stops_the_command_and_prints_what_was_measured(tmp_path: Path) -> None:
    db = tmp_path / "bench.duckdb"
    code = "from analysis.bench.cli import bench; bench()"
    args = ["--experiment", "output", "--outputs", "20", "--runs", "200", "--parallel", "1", "--db", str(db),
            "--max-seconds", "20", "--format", "csv"]
    # stderr on a terminal, so the progress line says how many requests are done
    terminal, progress = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=progress,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    os.close(progress)
    os.set_blocking(terminal, False)
    seen = bytearray()

    def done() -> int:
        with contextlib.suppress(BlockingIOError, OSError):
            seen.extend(os.read(terminal, 65536))
        assert proc.poll() is None, seen.decode(errors="replace")
        return max((int(n) for n in re.findall(rb"bench: (\d+)/", seen)), default=0)

    try:  # two calibration requests, one warm-up, then three measured ones
        wait_until_sync(lambda: done() >= 6, 60, "three measured requests")
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=15)[0]
        os.set_blocking(terminal, True)
        with contextlib.suppress(OSError):  # EIO once the command has closed its end
            while chunk := os.read(terminal, 65536):
                seen.extend(chunk)
        err = seen.decode(errors="replace")
    finally:
        proc.kill()
        os.close(terminal)
    assert proc.returncode == 0, err
    assert "stopped: interrupted" in err
    lines = out.splitlines()
    assert lines[0].startswith("tag,experiment,") and len(lines) == 2
    ok = int(lines[1].split(",")[lines[0].split(",").index("ok")])
    assert 0 < ok < 200
