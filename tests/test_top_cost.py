"""top shows the window's cost (the rows' cost_usd) in its title and, when upstreams stated limits, a
panel of each key's latest remaining requests and tokens and a subscription's windows."""

from __future__ import annotations

from analysis.top.model import TopModel
from analysis.top.render import frame

from .test_top import NOW, finished_row, tick


def test_cost_in_the_title_and_the_limits_panel() -> None:
    model = TopModel()
    model.apply(tick([
        finished_row(1, cost_usd=0.25, key_fingerprint="k:aaaaaaaaaaaa", upstream_host="api.anthropic.com",
                     ratelimit_requests_remaining=49, ratelimit_requests_limit=50,
                     ratelimit_tokens_remaining=1_000, ratelimit_tokens_limit=40_000),
        finished_row(2, cost_usd=0.5, key_fingerprint="k:bbbbbbbbbbbb", upstream_host="api.anthropic.com",
                     ratelimit_5h_utilization=0.83, ratelimit_7d_utilization=0.21),
        finished_row(3, cost_usd=None, model="local-model"),
    ]))
    lines = [line.text for line in frame(model, 100, 40, "127.0.0.1:8787", clock=lambda: NOW)]
    assert "· cost $0.75/5m ·" in lines[0]
    heading = next(i for i, line in enumerate(lines) if line.startswith("limits 2 keys"))
    header, first, second = lines[heading], lines[heading + 1], lines[heading + 2]
    assert header.split()[3:] == ["upstream", "requests", "tokens", "5h", "7d", "runs", "out"]
    assert first.split()[:3] == ["k:aaaaaaaaaaaa", "api.anthropic.com", "49/50"] and "1.0k/40.0k" in first
    assert second.split()[-3:] == ["83.0%", "21.0%", "-"]  # one response: no rate to project


def test_no_limits_stated_no_panel() -> None:
    model = TopModel()
    model.apply(tick([finished_row(1)]))
    lines = [line.text for line in frame(model, 100, 40, "127.0.0.1:8787", clock=lambda: NOW)]
    assert not any(line.startswith("limits ") for line in lines) and "cost " not in lines[0]
