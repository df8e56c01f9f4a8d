"""A real Prometheus (Debian's `prometheus` package) scrapes llmtap on loopback with the admin token as
its Bearer credentials_file, and the Grafana dashboard's own PromQL answers what the requests were:
TTFT quantiles as Prometheus interpolates the recorded TTFTs in their buckets, the token and cost
rates in the proportions of the recorded tokens and list prices. `promtool check config` passes on
deploy/'s file. Skipped where the package is not installed (.ci/run installs it)."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from proxy.observe.metrics import DURATION_BUCKETS
from proxy.common.prices import row_cost
from .serving import RunningProxy
from proxy.simulator.app import Simulator
from proxy.simulator.config import SimConfig

from .conftest import proxy_config, rows

ROOT = Path(__file__).resolve().parent.parent
PROMETHEUS, PROMTOOL = shutil.which("prometheus"), shutil.which("promtool")
pytestmark = pytest.mark.skipif(not (PROMETHEUS and PROMTOOL),
                                reason="Debian's prometheus package is not installed (apt-get install prometheus)")
DASHBOARD = json.loads((ROOT / "deploy/grafana/dashboards/llmtap.json").read_text())
WAIT_S = 60.0  # every wait is for a state, polled; this only bounds a broken run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def panel_exprs(title: str, rate_interval: str = "1m") -> list[str]:
    """The dashboard's PromQL of one panel, Grafana's variables given as Grafana would for "All"."""
    (panel,) = [p for p in DASHBOARD["panels"] if p["title"] == title]
    subst = {"$__rate_interval": rate_interval, "$instance": ".*", "$route": ".*", "$model": ".*", "$tool": ".*"}
    out = []
    for target in panel["targets"]:
        expr = target["expr"]
        for name, value in subst.items():
            expr = expr.replace(name, value)
        out.append(expr)
    return out


def histogram_quantile(q: float, values: list[float], bounds: tuple[float, ...] = DURATION_BUCKETS) -> float:
    """Prometheus's histogram_quantile over these observations in these buckets (linear within one)."""
    counts = [sum(1 for v in values if v <= b) for b in bounds] + [len(values)]
    rank = q * len(values)
    for i, count in enumerate(counts):
        if count >= rank:
            if i == len(bounds):
                return bounds[-1]
            start, below = (bounds[i - 1], counts[i - 1]) if i else (0.0, 0)
            return start + (bounds[i] - start) * (rank - below) / (count - below)
    raise AssertionError("unreachable")


class Prom:
    def __init__(self, url: str, session: aiohttp.ClientSession) -> None:
        self.url, self.session = url, session

    async def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        async with self.session.get(self.url + "/api/v1/query", params=params) as resp:
            body = await resp.json()
        assert body["status"] == "success", (expr, body)
        return body["data"]["result"]

    async def scalar(self, expr: str, at: float | None = None) -> float | None:
        result = await self.query(expr, at)
        return float(result[0]["value"][1]) if result else None

    async def until(self, expr: str, want: float) -> None:
        """Poll until `expr` is `want` (a scrape later than the requests has been ingested)."""
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while (await self.scalar(expr)) != want:
            assert asyncio.get_running_loop().time() < deadline, f"Prometheus never saw {expr} == {want}"
            await asyncio.sleep(0.2)


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[tuple[RunningProxy, Prom]]:
    config = SimConfig(ttft_ms=1, itl_ms=1, tokens=8)
    async with Simulator(config) as sim, RunningProxy(proxy_config(sim.url, tmp_path)) as proxy:
        token = tmp_path / "admin_token"
        token.write_text(proxy.admin_token)
        token.chmod(0o600)
        port = free_port()
        host, _, proxy_port = proxy.url.removeprefix("http://").rpartition(":")
        prom_config = tmp_path / "prometheus.yml"
        prom_config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{
                "job_name": "llmtap", "metrics_path": "/_llmtap/metrics", "scheme": "http",
                "authorization": {"type": "Bearer", "credentials_file": str(token)},
                "static_configs": [{"targets": [f"{host.strip('[]')}:{proxy_port}"]}],
            }],
        }))
        check = subprocess.run([PROMTOOL, "check", "config", str(prom_config)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        server = subprocess.Popen(
            [PROMETHEUS, f"--config.file={prom_config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=error"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            async with aiohttp.ClientSession() as session:
                prom = Prom(f"http://127.0.0.1:{port}", session)
                deadline = asyncio.get_running_loop().time() + WAIT_S
                while True:  # up, and scraping with the token (up == 0 would be a refused scrape)
                    try:
                        if await prom.scalar('up{job="llmtap"}') == 1:
                            break
                    except aiohttp.ClientError:
                        pass
                    assert server.poll() is None, server.stderr.read().decode() if server.stderr else ""
                    assert asyncio.get_running_loop().time() < deadline, "Prometheus did not start scraping"
                    await asyncio.sleep(0.2)
                yield proxy, prom
        finally:
            server.terminate()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()


MESSAGES = {"model": "claude-haiku-4-5", "max_tokens": 100, "messages": [{"role": "user", "content": "x" * 400}]}
CHAT = {"model": "gpt-5-mini", "messages": [{"role": "user", "content": "x" * 800}], "stream": True,
        "stream_options": {"include_usage": True}}


async def send(proxy: RunningProxy, tag: str, schedule: list[tuple[str, dict, dict[str, str]]]) -> None:
    async with aiohttp.ClientSession() as session:
        for path, body, headers in schedule:
            async with session.post(proxy.url + path, json=body, headers={**headers, "x-llmtap-tag": tag}) as resp:
                assert resp.status == 200
                await resp.read()


async def test_the_dashboards_promql_through_a_real_prometheus(stack: tuple[RunningProxy, Prom]) -> None:
    proxy, prom = stack
    api = {"x-api-key": "sk-ant-api03-sim-not-real", "user-agent": "claude-cli/2.1.0 (external, cli)"}
    openai = {"authorization": "Bearer sk-proj-sim-not-real", "user-agent": "OpenAI/Python 1.99.0"}
    # The first requests create the series, quick ones: what the rates measure comes after a scrape has
    # seen them. Prometheus extrapolates a rate to its window's start unless the counter would have been
    # 0 sooner: with more counted before than during the schedule, no series is cut short at 0.
    quick = {"x-sim-ttft-ms": "0", "x-sim-cache-read-tokens": "64"}
    first = [("/v1/chat/completions", CHAT, {**openai, **quick}), ("/v1/messages", {**MESSAGES, "stream": True},
                                                                   {**api, **quick})] * 16
    await send(proxy, "first", first)
    count = 'sum(gen_ai_client_inference_duration_seconds_count{job="llmtap"})'
    await prom.until(count, len(first))
    scraped = 'max(timestamp(gen_ai_client_inference_duration_seconds_count{job="llmtap"}))'  # a sample's own time
    seen_first = await prom.scalar(scraped)  # the scrape that had every series, before the schedule
    # TTFTs well inside their buckets (0.08-0.16 s, 0.16-0.32 s, 0.32-0.64 s)
    schedule = [("/v1/chat/completions", CHAT, {**openai, "x-sim-ttft-ms": str(ttft), "x-sim-cache-read-tokens": "64",
                                                "x-sim-tokens": str(tokens)})
                for ttft, tokens in ((90, 4), (90, 6), (180, 8), (180, 10), (400, 12), (400, 14))]
    schedule += [("/v1/messages", {**MESSAGES, "stream": True}, {**api, "x-sim-ttft-ms": "180", "x-sim-tokens": "9"})] * 2
    await send(proxy, "schedule", schedule)
    await prom.until(count, len(first) + len(schedule))
    seen_all = await prom.scalar(scraped)
    assert seen_first is not None and seen_all is not None
    # Evaluated just after the last scrape, over a window from just before the first one: every series
    # has a sample at both ends of it, so Prometheus extrapolates them all alike and the dashboard's
    # ratios and quantiles are the schedule's own (the window is Grafana's $__rate_interval here).
    at, window = seen_all + 0.1, f"{round((seen_all - seen_first + 0.2) * 1000)}ms"

    def panel(title: str) -> list[str]:
        return panel_exprs(title, window)

    measured = rows(proxy, "SELECT request_model, ttft_ms, input_tokens, output_tokens, cache_read_tokens, credential_kind"
                           " FROM requests WHERE tag = 'schedule'")
    assert len(measured) == len(schedule)

    # TTFT p50 and p95 by model, as the dashboard asks: the recorded TTFTs interpolated in their buckets
    p50, p95 = panel("TTFT: time to first chunk (streams)")
    for expr, q in ((p50, 0.5), (p95, 0.95)):
        got = {r["metric"]["model"]: float(r["value"][1]) for r in await prom.query(expr, at)}
        for model in ("gpt-5-mini", "claude-haiku-4-5"):
            ttfts = [r["ttft_ms"] / 1000 for r in measured if r["request_model"] == model]
            assert got[model] == pytest.approx(histogram_quantile(q, ttfts), rel=1e-9), (model, q)

    # tokens per second by type: in the proportions of the tokens recorded (the same scrapes, the same
    # extrapolation); the cache read share exactly
    input_rate, output_rate, cache_read_rate, *_ = [await prom.scalar(e, at) for e in panel("Tokens / s by type")]
    total = {c: sum(r[c] for r in measured) for c in ("input_tokens", "output_tokens", "cache_read_tokens")}
    assert output_rate > 0
    assert input_rate / output_rate == pytest.approx(total["input_tokens"] / total["output_tokens"], rel=1e-9)
    assert cache_read_rate / output_rate == pytest.approx(total["cache_read_tokens"] / total["output_tokens"], rel=1e-9)
    (share_expr,) = panel("Cache read share of input")
    shares = {r["metric"]["model"]: float(r["value"][1]) for r in await prom.query(share_expr, at)}
    chat = [r for r in measured if r["request_model"] == "gpt-5-mini"]
    assert shares["gpt-5-mini"] == pytest.approx(sum(r["cache_read_tokens"] for r in chat)
                                                 / sum(r["input_tokens"] for r in chat), rel=1e-9)

    # cost per hour by model: per output token, the list price of the rows (the views' cost_usd)
    (cost_expr,) = panel("Cost / hour by model (USD, list price)")
    cost = {r["metric"]["model"]: float(r["value"][1]) for r in await prom.query(cost_expr, at)}
    (by_model_expr,) = panel("Output tokens / s by model")
    tokens = {r["metric"]["model"]: float(r["value"][1]) for r in await prom.query(by_model_expr, at)}
    source = rows(proxy, "SELECT request_model, sum(output_tokens) AS out FROM requests WHERE tag = 'schedule' GROUP BY 1")
    priced = {r["request_model"]: r["out"] for r in source}
    full = rows(proxy, "SELECT * FROM requests WHERE tag = 'schedule'")
    for model in ("gpt-5-mini", "claude-haiku-4-5"):
        usd = sum(row_cost(r) or 0 for r in full if r["request_model"] == model)
        assert usd > 0
        assert cost[model] / (3600 * tokens[model]) == pytest.approx(usd / priced[model], rel=1e-6), model

    # the headroom gauges: the latest stated limits of each key
    left = await prom.query('llmtap_ratelimit_remaining_requests{job="llmtap"}')
    assert {r["metric"]["key_fingerprint"] for r in left} and all(float(r["value"][1]) < 30_000 for r in left)


def test_promtool_checks_deploys_config(tmp_path: Path) -> None:
    deployed = ROOT / "deploy/prometheus.yml"
    syntax = subprocess.run([PROMTOOL, "check", "config", "--syntax-only", str(deployed)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stdout + syntax.stderr
    # in full, with the compose secret's path pointed at a file that exists here
    token = tmp_path / "llmtap_admin_token"
    token.write_text("not-a-real-token")
    copy = tmp_path / "prometheus.yml"
    copy.write_text(deployed.read_text().replace("/run/secrets/llmtap_admin_token", str(token)))
    (tmp_path / "alerts.yml").write_text((ROOT / "deploy/alerts.yml").read_text())
    full = subprocess.run([PROMTOOL, "check", "config", str(copy)], capture_output=True, text=True)
    assert full.returncode == 0, full.stdout + full.stderr


def test_promtool_tests_the_alerting_rules() -> None:
    """deploy/alerts.yml's rules against deploy/alerts_test.yml's series (`promtool test rules`)."""
    rules = subprocess.run([PROMTOOL, "check", "rules", str(ROOT / "deploy/alerts.yml")], capture_output=True, text=True)
    assert rules.returncode == 0, rules.stdout + rules.stderr
    test = subprocess.run([PROMTOOL, "test", "rules", "alerts_test.yml"], cwd=ROOT / "deploy", capture_output=True,
                          text=True)
    assert test.returncode == 0 and "SUCCESS" in test.stdout, test.stdout + test.stderr
    # every metric the rules read is one proxy/observe/metrics.py exports (by its current names)
    names = set(re.findall(r"\b(gen_ai_\w+|llmtap_\w+)", (ROOT / "deploy/alerts.yml").read_text()))
    source = (ROOT / "proxy/observe/metrics.py").read_text()
    assert names and all(f'"{n.removesuffix("_bucket").removesuffix("_total")}"' in source for n in names), names
