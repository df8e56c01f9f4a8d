"""`llmtap bench --routes` / `--base-url` twice: the same requests to each channel, interleaved,
under one tag, ending with compare's verdict on what the proxy recorded."""

from __future__ import annotations

import json
import re
from pathlib import Path

from click.testing import CliRunner

from analysis.bench.channels import RENDERERS, bench_channels
from analysis.bench.cli import bench as bench_command
from analysis.bench.runner import Budget
from proxy.serve.server import write_state
from .serving import RunningProxy
from proxy.simulator.app import Simulator
from proxy.simulator.config import SimConfig

from .conftest import proxy_config, rows

FAST = {"ttft_ms": 5, "itl_ms": 1, "tokens": 100_000, "prefill_us_per_token": 0}
ROUNDS = 12


async def test_base_urls_are_sent_interleaved_and_compared(tmp_path: Path) -> None:
    db = tmp_path / "channels.duckdb"
    async with Simulator(SimConfig(**FAST)) as fast, Simulator(SimConfig(**FAST, headers_delay_ms=150)) as slow:
        run = await bench_channels("openai", "sim-gpt", None, ("/direct", "/router"),
                                   (fast.url + "/v1", slow.url + "/v1"), db, Budget(), rounds=ROUNDS,
                                   input_tokens=200, max_tokens=8)
    assert run.tag.endswith("-channels") and run.stopped_by is None
    assert [len(run.results[label]) for label in ("/direct", "/router")] == [ROUNDS, ROUNDS]
    assert all(r.ok for results in run.results.values() for r in results)
    async with RunningProxy(proxy_config("http://127.0.0.1:9", tmp_path, db=str(db))) as p:
        recorded = rows(p, f"SELECT route, tag, max_tokens, request_bytes FROM requests WHERE tag = '{run.tag}'"
                           " ORDER BY started_at")
    assert [r["route"] for r in recorded] == ["/direct", "/router"] * ROUNDS  # A, B, A, B, ...
    # the same length to every channel: one body size (the unique opening lines are as long as each other)
    assert {(r["max_tokens"], r["request_bytes"]) for r in recorded} == {(8, recorded[0]["request_bytes"])}
    ttft = next(d for d in run.comparison.differences if d.metric == "ttft")
    assert ttft.verdict.startswith("/router is slower") and ttft.ci_low_ms - 3 <= 150 <= ttft.ci_high_ms + 3
    text = RENDERERS["table"](run, "openai", "sim-gpt")
    short = re.search(r"In short: /router is \+([\d.]+) ms", text)
    # the figure printed is the run's (whose interval holds the true 150 ms, above); a run on a loaded
    # machine may measure 135 ms with its interval saying so, so the figure itself has no fixed range
    assert "/direct = " in text and short and abs(float(short[1]) - ttft.median_diff_ms) < 1
    assert "before response headers" in text
    data = json.loads(RENDERERS["json"](run, "openai", "sim-gpt"))
    assert [c["route"] for c in data["channels"]] == ["/direct", "/router"]
    assert data["comparison"]["differences"][0]["metric"] == "ttft" and data["verdicts"]


async def test_routes_of_the_running_proxy(tmp_path: Path) -> None:
    async with Simulator(SimConfig(**FAST)) as one, Simulator(SimConfig(**FAST)) as two:
        config = proxy_config(one.url, tmp_path, routes={"/a": one.url, "/b": two.url})
        async with RunningProxy(config) as p:
            write_state(p)
            run = await bench_channels("openai", "sim-gpt", None, ("/a", "/b"), (), None, Budget(), rounds=6,
                                       input_tokens=100, max_tokens=4)
            recorded = rows(p, f"SELECT route FROM requests WHERE tag = '{run.tag}' ORDER BY started_at")
    assert "running proxy" in run.via and run.db == str(p.config.db_path)
    assert [r["route"] for r in recorded] == ["/a", "/b"] * 6
    assert {len(one.requests), len(two.requests)} == {2 + 1 + 6, 1 + 6}  # calibration on the first channel
    assert run.comparison is not None and [g.label for g in run.comparison.groups] == ["/a", "/b"]


def test_usage_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    no_proxy = runner.invoke(bench_command, ["--routes", "/a,/b", "--model", "m", "--db", str(tmp_path / "x.duckdb")])
    assert no_proxy.exit_code != 0 and "--routes sends through the running `llmtap serve`" in no_proxy.output
    one = runner.invoke(bench_command, ["--routes", "/a", "--model", "m"])
    assert one.exit_code != 0 and "two or more different route prefixes" in one.output
    experiment = runner.invoke(bench_command, ["--routes", "/a,/b", "--experiment", "input"])
    assert experiment.exit_code != 0 and "--experiment does not apply" in experiment.output
    counts = runner.invoke(bench_command, ["--base-url", "http://127.0.0.1:9/v1", "--base-url", "http://127.0.0.1:8/v1",
                                           "--routes", "/a,/b,/c", "--model", "m", "--db", str(tmp_path / "y.duckdb")])
    assert counts.exit_code != 0 and "as many of each" in counts.output
