"""The 5-hour window's projection (analysis/window_projection.py) on a Claude login's real-style unified
headers from the simulator through the proxy: `report --limits` says when the window runs out at the
current rate, `top` shows it in its limits panel; and `llmtap keys name` names the key in both."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import pytest
from click.testing import CliRunner

from analysis.top.model import TopModel
from analysis.top.render import frame
from analysis.window_projection import project
from proxy.cli import main
from proxy.observe.live import finished_entry
from tests.serving import RunningProxy
from proxy.simulator.app import Simulator
from proxy.simulator.config import SimConfig

from .conftest import proxy_config
from .test_ratelimits import CLAUDE_LOGIN, MESSAGES
from .test_top import tick


async def _login_traffic(tmp_path: Path, n: int, rows: list[dict] | None = None) -> Path:
    config = SimConfig(ttft_ms=1, itl_ms=0, tokens=20, subscription_5h_tokens=1_000)
    async with Simulator(config) as sim, RunningProxy(proxy_config(sim.url, tmp_path)) as p:
        if rows is not None:
            p.state.recorder.observe(lambda finished: rows.append(finished_entry(finished.row)))
        async with aiohttp.ClientSession() as session:
            for _ in range(n):
                async with session.post(p.url + "/v1/messages", json=MESSAGES, headers=CLAUDE_LOGIN) as resp:
                    assert resp.status == 200
                    await resp.read()
        assert p.flush(10)
        return Path(p.config.db_path)


async def test_report_limits_projects_the_window_and_names_the_key(tmp_path: Path) -> None:
    db = await _login_traffic(tmp_path, 5)  # 22 tokens of 1,000 a request: 2.2 % each, within a second
    doc = json.loads(CliRunner().invoke(main, ["report", "--db", str(db), "--limits", "--format", "json"]).output)
    (key,) = doc["keys"]
    assert key["utilization_5h"] == pytest.approx(0.11, abs=0.005)
    runs_out = datetime.fromisoformat(key["runs_out"]).replace(tzinfo=UTC)
    reset = datetime.fromisoformat(key["reset"]).replace(tzinfo=UTC)
    # at some 2 % in well under a second, the window's rest goes in under a minute, long before its reset
    assert datetime.now(UTC) - timedelta(seconds=5) < runs_out < reset - timedelta(hours=4)
    fingerprint = key["key"]

    named = CliRunner().invoke(main, ["keys", "name", fingerprint, "work"])
    assert named.exit_code == 0 and f"{fingerprint} is now 'work'" in named.output
    assert CliRunner().invoke(main, ["keys", "list"]).output == f"{fingerprint}  work\n"
    text = CliRunner().invoke(main, ["report", "--db", str(db), "--limits"]).output
    lines = text.splitlines()
    heading = lines.index("5-hour window at the current rate (the last 30 minutes' rise)")
    assert lines[heading + 1].startswith("  work at 127.0.0.1: runs out at ") and lines[heading + 1].endswith(" UTC")
    assert any(line.startswith("work ") for line in lines[:heading])  # the key column shows the name
    bad = CliRunner().invoke(main, ["keys", "name", "k:123", "x"])
    assert bad.exit_code == 2 and "k: and 12 hex digits" in bad.output


async def test_top_shows_when_the_window_runs_out(tmp_path: Path) -> None:
    rows: list[dict] = []
    await _login_traffic(tmp_path, 4, rows)
    model = TopModel()
    now = max(r["started"] for r in rows) + 1
    model.apply(tick(rows, now=now))
    lines = [line.text for line in frame(model, 100, 40, "127.0.0.1:8787", clock=lambda: now)]
    heading = next(i for i, line in enumerate(lines) if line.startswith("limits 1 key"))
    assert lines[heading].endswith("runs out")
    assert "(in " in lines[heading + 1]


def test_projection_words() -> None:
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    reset = now + timedelta(hours=3)
    at = [(now - timedelta(minutes=20), 0.40, reset), (now - timedelta(minutes=10), 0.50, reset)]
    found = project(at, now)  # 10 % in the 20 minutes since the first: the other 50 % in 100 minutes
    assert found.runs_out == now + timedelta(minutes=100) and found.text(now) == "13:40 (in 1h40m)"
    assert project(at[:1], now).note == "one response"
    assert project([(now, 1.0, reset)], now).note == "used up"
    assert project([(now - timedelta(hours=1), 0.1, reset), (now, 0.11, reset)], now).note == "not before the reset"
    assert project([(now - timedelta(hours=1), 0.5, reset), (now, 0.5, reset)], now).note == "no rise"
    assert project([(now - timedelta(hours=6), 0.5, now - timedelta(hours=1))], now).note == "reset past"
