"""`report --limits` and `errors` on rows the proxy recorded from the simulated upstream's real-style
rate-limit headers: an API key run to its 429s, a Claude login's windows, the link from a 429 to the
headroom before it."""

from __future__ import annotations

from pathlib import Path

import json

import aiohttp
from click.testing import CliRunner

from analysis.limits import KeyLimits, LimitsReport, to_table
from proxy.cli import main
from .serving import RunningProxy
from proxy.simulator.app import Simulator
from proxy.simulator.config import SimConfig

from .conftest import proxy_config
from .test_ratelimits import API_KEY, CHAT, CLAUDE_LOGIN, MESSAGES, OPENAI_KEY


async def traffic(tmp_path: Path) -> Path:
    config = SimConfig(ttft_ms=1, itl_ms=0, tokens=20, ratelimit_requests=3, subscription_5h_tokens=100)
    async with Simulator(config) as sim, RunningProxy(proxy_config(sim.url, tmp_path)) as p:
        async with aiohttp.ClientSession() as session:
            for body, path, headers, n in ((MESSAGES, "/v1/messages", API_KEY, 5), (CHAT, "/v1/chat/completions", OPENAI_KEY, 2),
                                           (MESSAGES, "/v1/messages", CLAUDE_LOGIN, 7)):
                for _ in range(n):
                    async with session.post(p.url + path, json=body, headers=headers) as resp:
                        await resp.read()
        assert p.flush(10)
        db = Path(p.config.db_path)
    return db


def cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


async def test_report_limits_per_key_and_hour(tmp_path: Path) -> None:
    db = await traffic(tmp_path)
    text = cli("report", "--db", str(db), "--limits")
    lines = text.splitlines()
    assert lines[0].startswith("limits the upstreams stated from ") and max(map(len, lines)) <= 80
    heading = "lowest headroom per hour (share left; a subscription's windows used)"
    keys = [line.split() for line in lines[:lines.index(heading)] if line.startswith("k:")]
    assert len(keys) == 3, text
    # key, upstream, requests, tokens, 5h, 7d, reset, 429s
    assert sorted((k[2], k[4], k[7]) for k in keys) == [("-", "100.0%", "2"), ("0/3", "-", "2"), ("1/3", "-", "0")]
    hourly = [line.split() for line in lines[lines.index(heading) + 3:] if line.strip()]
    assert sorted((h[4], h[6], h[-1]) for h in hourly) == [("-", "100.0%", "2"), ("0.0%", "-", "2"), ("33.3%", "-", "0")]

    data = json.loads(cli("report", "--db", str(db), "--limits", "--format", "json"))
    by_kind = {k["credential_kind"]: k for k in data["keys"]}
    assert by_kind["api_key"]["rate_limited"] >= 2 and by_kind["claude_login"]["utilization_5h"] == 1.0
    assert by_kind["claude_login"]["utilization_7d"] < 1.0


def test_a_reset_on_the_next_day_keeps_the_column_s_width() -> None:
    """At 23:30 UTC a 5-hour window resets at 04:30 the next day: the table stays within 80 columns, the
    times aligned, and the day is said (+1d), not a date that widens the line."""
    def key(name: str, reset: str) -> KeyLimits:
        return KeyLimits(name, "api.anthropic.com", "api_key", "2026-12-01 23:30", 0, 3, 6_000_000, 6_000_000,
                         reset, 1.0, 0.25, "rejected", 2)

    keys = [key("k:0e78ecadc6f7", "2026-12-02 04:30:00"), key("k:e5f1955c2137", "2026-12-01 23:31:01"),
            key("k:fbcb38448d34", "2026-12-20 04:30:00")]
    lines = to_table(LimitsReport("2026-12-01 23:30", "2026-12-01 23:30", keys)).splitlines()
    assert max(map(len, lines)) <= 80, "\n".join(lines)
    column = lines[2].index("reset")
    assert [line[column:column + 11] for line in lines[4:7]] == ["04:30:00+1d", "23:31:01   ", "12-20 04:30"]


async def test_errors_links_a_429_to_the_headroom_before_it(tmp_path: Path) -> None:
    db = await traffic(tmp_path)
    text = cli("errors", "--db", str(db))
    linked = [line for line in text.splitlines() if line.startswith("  > ") or line.startswith("    ")]
    joined = " ".join(line.strip("> ").strip() for line in linked)
    assert "2 × 429, the last at" in joined and "remaining requests fell to 0 at" in joined, text
    assert "the 5-hour window reached 100% at" in joined, text
    assert "; reset " in joined and "(retry-after " in joined


async def test_a_subscription_s_cost_is_a_list_price_equivalent(tmp_path: Path) -> None:
    db = await traffic(tmp_path)
    text = cli("report", "--db", str(db), "--by", "tool")
    assert "on a subscription: a list-price equivalent, not money spent." in text
    got = cli("sql", "--db", str(db), "--format", "csv",
              "SELECT billing, count(*) AS n, bool_and(cost_usd > 0) AS priced FROM requests"
              " WHERE status = 200 GROUP BY ALL ORDER BY 1")
    assert got.splitlines()[1:] == ["api,5,true", "subscription,5,true"], got
