"""Your own prices: the config file's [prices] (a made-up model) and [price_markup] win over genai-prices
in the views' cost SQL, `/_llmtap/metrics`, `run` and `prices`; a model priced nowhere stays NULL."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from click.testing import CliRunner

from proxy.cli import main
from proxy.common import prices
from tests.serving import RunningProxy
from proxy.settings import config as cfg
from proxy.simulator.app import Simulator

from .conftest import rows
from .test_run import clean_env, llmtap

CONFIG = """
[prices."acme-9"]
input = 1000.0
output = 5000.0
cache_read = 100.0

[price_markup]
"/" = 10
"""


@pytest.fixture(autouse=True)
def no_prices_after() -> Iterator[None]:
    yield
    prices.configure({}, {}, None)


async def _chat(base: str, model: str, n: int = 1) -> None:
    async with aiohttp.ClientSession() as s:
        for _ in range(n):
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True,
                    "stream_options": {"include_usage": True}}
            async with s.post(f"{base}/v1/chat/completions", json=body, headers={"authorization": "Bearer sk-t"}) as r:
                assert r.status == 200
                await r.read()


def _expected(row: dict) -> float:
    return (row["input_tokens"] * 1000.0 + row["output_tokens"] * 5000.0) / 1e6 * 1.1


async def test_config_prices_in_views_metrics_report_and_prices(sim: Simulator, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "config.toml"
    path.write_text(CONFIG)
    monkeypatch.setenv("LLMTAP_CONFIG", str(path))
    config = cfg.build(None, {"port": 0, "upstream": sim.url, "db": str(tmp_path / "own.duckdb"), "quiet": True,
                              "flush_interval_s": 0.2})
    assert config.prices == {"acme-9": {"input": 1000.0, "output": 5000.0, "cache_read": 100.0}}
    async with RunningProxy(config) as p:
        await _chat(p.url, "acme-9", 2)
        await _chat(p.url, "nobody-prices-this-1")
        got = rows(p, "SELECT request_model, input_tokens, output_tokens, cost_usd, price_source FROM requests"
                      " ORDER BY started_at")
        auth = {"authorization": f"Bearer {p.admin_token}"}
        async with aiohttp.ClientSession() as s, s.get(f"{p.url}/_llmtap/metrics", headers=auth) as r:
            metrics = await r.text()
    acme = [r for r in got if r["request_model"] == "acme-9"]
    assert len(acme) == 2 and all(r["cost_usd"] == pytest.approx(_expected(r)) for r in acme)
    assert all(r["price_source"] == "config" for r in acme)
    (unknown,) = [r for r in got if r["request_model"] != "acme-9"]
    assert unknown["cost_usd"] is None and unknown["price_source"] == "unknown model"  # never 0
    total = sum(_expected(r) for r in acme)
    cost_lines = [line for line in metrics.splitlines() if line.startswith("llmtap_client_inference_cost_usd_total{")]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in cost_lines) == pytest.approx(total)

    db = str(tmp_path / "own.duckdb")
    result = CliRunner().invoke(main, ["report", "--db", db, "--by", "model", "--format", "json"])
    assert result.exit_code == 0, result.output
    groups = {g["model"]: g for g in json.loads(result.output)["groups"]}
    assert groups["acme-9"]["cost_usd"] == pytest.approx(total, abs=1e-6)
    assert groups["nobody-prices-this-1"]["cost_usd"] is None
    text = CliRunner().invoke(main, ["report", "--db", db, "--by", "model"]).output
    assert f"Cost: list prices from the config file ({path}) then genai-prices" in text

    listed = CliRunner().invoke(main, ["prices"])
    assert listed.exit_code == 0 and f"prices from the config file {path} (source \"config\")" in listed.output
    assert "acme-9" in listed.output and "input $1000/MTok" in listed.output and "markup 10 % on route /" in listed.output
    one = CliRunner().invoke(main, ["prices", "acme-9", "--route", "/", "--format", "json"])
    info = json.loads(one.output)
    assert info["source"] == f"config ({path})" and info["markup_pct"] == 10
    assert info["prices_at"]["output"]["usd_per_mtok"] == 5000.0
    assert CliRunner().invoke(main, ["prices", "nobody-prices-this-1"]).exit_code == 1


async def test_run_prints_the_configs_cost(sim: Simulator, tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(CONFIG)
    script = ("import openai; o = openai.OpenAI(api_key='sk-t', max_retries=0); "
              "o.chat.completions.create(model='acme-9', messages=[{'role': 'user', 'content': 'hi'}])")
    env = {**clean_env(tmp_path), "LLMTAP_CONFIG": str(path)}
    code, _out, err = await llmtap("run", "--upstream", sim.url, "--db", str(tmp_path / "run.duckdb"), "--port", "0",
                                   "--tag", "own", "--", sys.executable, "-c", script, env=env)
    assert code == 0, err
    # 1 input token and 8 output: (1000 + 8 * 5000) / 1e6 * 1.1
    assert f"  cost $0.0451 at list price (the config file ({path}) then genai-prices" in err, err


def test_bad_prices_are_refused_with_the_key(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[prices."x"]\ninput = -1\n')
    with pytest.raises(cfg.ConfigError, match=r"prices.x.input is USD per million tokens"):
        cfg.build(path, {})
    path.write_text('[prices."x"]\ninptu = 1\n')
    with pytest.raises(cfg.ConfigError, match="unknown key"):
        cfg.build(path, {})
    path.write_text('[prices."x"]\ninput = 1\n[price_markup]\n"/a" = 5\n')
    assert "[prices.\"x\"]\ninput = 1" in cfg.to_toml(cfg.build(path, {"upstream": "http://127.0.0.1:1"}))
