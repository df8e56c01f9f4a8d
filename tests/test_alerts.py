"""Alerts on real traffic (the simulator's limits and a made-up model's own prices, through the real
proxy): `llmtap check` exits 1 with one line naming what crossed, 0 with "ok …"; `serve` writes one
warning line per crossing of the 5-hour window or the daily budget, not one per request."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import yaml
from click.testing import CliRunner

from proxy.cli import main
from proxy.common import prices
from tests.serving import RunningProxy
from proxy.simulator.app import Simulator
from proxy.simulator.config import SimConfig
from proxy.settings import alerts, config as cfg

from .conftest import proxy_config
from .test_ratelimits import API_KEY, CLAUDE_LOGIN

MESSAGES = {"model": "acme-9", "max_tokens": 100, "messages": [{"role": "user", "content": "hi there"}]}
PRICES = {"acme-9": {"input": 1000.0, "output": 5000.0}}  # 20 output tokens: $0.10 a request and more


@pytest.fixture(autouse=True)
def no_prices_after() -> Iterator[None]:
    yield
    prices.configure({}, {}, None)


async def _traffic(p: RunningProxy, headers: dict[str, str], n: int) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(n):
            async with session.post(p.url + "/v1/messages", json=MESSAGES, headers=headers) as resp:
                await resp.read()


async def test_serve_warns_once_per_crossing_and_check_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines: list[str] = []
    sim_config = SimConfig(ttft_ms=1, itl_ms=0, tokens=20, subscription_5h_tokens=150)
    alerts = {"window_5h_utilization": 0.5, "daily_budget_usd": 0.25}
    names = {"k:notakey": "unused"}
    async with Simulator(sim_config) as sim, RunningProxy(
            proxy_config(sim.url, tmp_path, prices=PRICES, alerts=alerts, key_names=names), report=lines.append) as p:
        await _traffic(p, CLAUDE_LOGIN, 6)  # 22 tokens a request: 15 % of the window each
        await _traffic(p, API_KEY, 5)  # $0.10 and more each: over $0.25 at the third
        assert p.flush(10)
        db = str(p.config.db_path)
    window = [line for line in lines if "window_5h_utilization" in line]
    budget = [line for line in lines if "daily_budget_usd" in line]
    assert len(window) == 1 and window[0].startswith("llmtap: warning: [alerts] window_5h_utilization: 5h window "), lines
    assert " over 50.0 % (k:" in window[0] and " at 127.0.0.1; it resets at " in window[0]
    assert len(budget) == 1 and budget[0].startswith("llmtap: warning: [alerts] daily_budget_usd: spend 20"), lines
    assert budget[0].endswith(" over $0.25 (since serve started)"), lines

    config = tmp_path / "config.toml"
    config.write_text('[prices."acme-9"]\ninput = 1000.0\noutput = 5000.0\n\n'
                      "[alerts]\nwindow_5h_utilization = 0.5\ndaily_budget_usd = 0.25\nerror_rate = 0.5\n")
    monkeypatch.setenv("LLMTAP_CONFIG", str(config))
    result = CliRunner().invoke(main, ["check", "--db", db])
    assert result.exit_code == 1, result.output
    (line,) = result.output.splitlines()
    assert line.startswith("llmtap check: 5h window ") and " over 50.0 % (k:" in line
    assert "; spend " in line and " over $0.25" in line and line.endswith("(since 1h)")
    assert "errors" not in line  # within its threshold: only what crossed is named

    result = CliRunner().invoke(main, ["check", "--db", db, "--window-5h", "1", "--daily-budget-usd", "100",
                                       "--ttft-p95-ms", "60000"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("ok since 1h: p95 TTFT - (no streams), errors ")
    assert "spend " in result.output and "within $100" in result.output

    result = CliRunner().invoke(main, ["check", "--db", db, "--format", "json"])
    doc = json.loads(result.output)
    assert result.exit_code == 1 and doc["ok"] is False
    assert {c["name"]: c["crossed"] for c in doc["checks"]} == {
        "error_rate": False, "window_5h_utilization": True, "daily_budget_usd": True}


def test_check_needs_a_threshold_and_refuses_a_bad_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result = CliRunner().invoke(main, ["check", "--db", str(tmp_path / "none.duckdb")])
    assert result.exit_code == 2 and "nothing to check: set [alerts]" in result.output
    bad = tmp_path / "bad.toml"
    bad.write_text("[alerts]\nerror_rate = 5\n")
    with pytest.raises(cfg.ConfigError, match=r"alerts.error_rate is a fraction of 1"):
        cfg.build(bad, {})
    result = CliRunner().invoke(main, ["check", "--config", str(bad)])
    assert result.exit_code == 1 and "alerts.error_rate is a fraction of 1" in result.output


# [alerts] key -> the Prometheus rule of deploy/alerts.yml that watches the same condition, and the factor
# from the rule's unit to the key's (the rule's TTFT is in seconds)
RULES = {"ttft_p95_ms": ("LlmtapTTFTHigh", 1000.0), "error_rate": ("LlmtapErrorRate", 1.0),
         "window_5h_utilization": ("LlmtapWindow5h", 1.0), "daily_budget_usd": ("LlmtapDailySpend", 1.0)}


def test_the_prometheus_rules_judge_as_check_does() -> None:
    """deploy/alerts.yml, the Prometheus face of [alerts]: a rule per key, crossing on `>` its threshold as
    `judge` does; its thresholds are valid [alerts] values, and `judge` says the same of values around them."""
    doc = yaml.safe_load((Path(__file__).parent.parent / "deploy/alerts.yml").read_text())
    exprs = {rule["alert"]: rule["expr"] for group in doc["groups"] for rule in group["rules"] if "alert" in rule}
    assert set(RULES) == set(alerts.KEYS)
    table = {}
    for key, (alert, factor) in RULES.items():
        found = re.search(r"\)?\s*(>=|>|<=|<)\s*([\d.]+)(?:\s|$)", exprs[alert])
        assert found and found.group(1) == ">", (alert, exprs[alert])
        table[key] = float(found.group(2)) * factor
    limits = alerts.check_alerts(table)
    for key, threshold in table.items():
        assert not alerts.judge(limits, key, threshold).crossed
        assert alerts.judge(limits, key, threshold * 1.001).crossed
