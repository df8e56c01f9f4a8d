"""`llmtap compare`: a known 150 ms difference between two simulated channels is found with an
interval around it; two identical channels cannot be told apart; prompt size is controlled for.
Real sockets for the channels; synthetic rows (seeded) for the statistics' edge cases."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import aiohttp
import duckdb
import numpy as np
import pytest
from click.testing import CliRunner

from analysis.compare import Side, compare, negligible_ms
from analysis.compare_cli import compare as compare_command
from analysis.views import create_views
from proxy.schema import REQUEST_COLUMN_NAMES, create_tables_sql
from proxy.server import RunningProxy
from proxy.simulator.app import Simulator
from proxy.simulator.config import SimConfig

from .conftest import proxy_config

FAST = {"ttft_ms": 5, "itl_ms": 1, "tokens": 6, "prefill_us_per_token": 0}
CHAT = {"model": "m", "stream": True, "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hello " * 50}]}
ROUNDS = 20
SLOWER_BY = 150


@pytest.fixture(scope="module")
def channels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """/a and /c: the same simulated channel; /b: one that holds its headers 150 ms more.
    Requests interleaved a, b, c, a, b, c, ... recorded by the real proxy."""
    import asyncio

    db = tmp_path_factory.mktemp("channels") / "llmtap.duckdb"

    async def record() -> None:
        async with Simulator(SimConfig(**FAST)) as fast, \
                Simulator(SimConfig(**FAST, headers_delay_ms=SLOWER_BY)) as slow:
            config = proxy_config(fast.url, db.parent, routes={"/a": fast.url, "/b": slow.url, "/c": fast.url})
            async with RunningProxy(config) as p, aiohttp.ClientSession() as s:
                for _ in range(ROUNDS):
                    for route in ("/a", "/b", "/c"):
                        async with s.post(p.url + route + "/v1/chat/completions", json=CHAT) as r:
                            assert r.status == 200
                            await r.read()
                assert p.flush(10)

    asyncio.run(record())
    return db


def run_compare(db: Path, *args: str) -> dict:
    result = CliRunner().invoke(compare_command, ["--db", str(db), "--format", "json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def diff(out: dict, metric: str, group: str) -> dict:
    return next(d for d in out["differences"] if d["metric"] == metric and d["group"] == group)


def test_a_known_150_ms_difference_is_found_with_an_interval_around_it(channels: Path) -> None:
    out = run_compare(channels, "--by", "route", "/a", "/b")
    assert [(g["label"], g["requests"]) for g in out["groups"]] == [("/a", ROUNDS), ("/b", ROUNDS)]
    for metric in ("ttft", "e2e"):
        d = diff(out, metric, "/b")
        assert d["n"] == d["n_baseline"] == ROUNDS
        assert d["ci_low_ms"] <= d["median_diff_ms"] <= d["ci_high_ms"]
        # the interval holds the simulated 150 ms (a little slack for the loop's timer jitter)
        assert d["ci_low_ms"] - 3 <= SLOWER_BY <= d["ci_high_ms"] + 3, d
        assert d["verdict"].startswith("/b is slower: +")
    (parts,) = out["ttft_parts_diff_ms"]
    assert parts["upstream_headers"] == pytest.approx(SLOWER_BY, abs=10)  # before the headers ...
    assert abs(parts["connection"]) < 10  # ... and not in opening connections


def test_two_identical_channels_cannot_be_told_apart(channels: Path) -> None:
    out = run_compare(channels, "--by", "route", "/a", "/c")
    for metric in ("ttft", "tpot", "e2e"):
        d = diff(out, metric, "/c")
        assert d["verdict"].startswith("cannot tell /c from /a"), d
        assert abs(d["median_diff_ms"]) < 10


def test_the_table_says_it_in_words(channels: Path) -> None:
    result = CliRunner().invoke(compare_command, ["--db", str(channels), "--by", "route"])
    assert result.exit_code == 0, result.output
    text = result.output
    assert "/b against /a" in text and "/c against /a" in text  # the busiest first; all three have 20
    said = re.search(r"TTFT  /b is slower: \+([\d.]+) ms at p50", text)
    short = re.search(r"In short: /b is \+([\d.]+) ms", text)
    assert said and short, text  # the measured difference, as a number: within the channel's jitter
    assert float(said[1]) == pytest.approx(SLOWER_BY, abs=10) and float(short[1]) == float(said[1])
    assert "ms of it before response headers" in text
    assert "TTFT  cannot tell /c from /a" in text


# -- synthetic rows: the statistics alone ---------------------------------------------------------

def synthetic_db(path: Path, rows: list[dict]) -> Path:
    con = duckdb.connect(str(path))
    con.execute(create_tables_sql())
    start = datetime(2026, 11, 30, tzinfo=timezone.utc)
    for i, row in enumerate(rows):
        full = dict.fromkeys(REQUEST_COLUMN_NAMES) | {
            "id": f"{i:032x}", "started_at": start + timedelta(seconds=i), "outcome": "ok", "stream": True,
            "kind": "generation"} | row
        con.execute(f"INSERT INTO requests ({', '.join(full)}) VALUES ({', '.join('?' * len(full))})",
                    list(full.values()))
    con.close()
    return path


def prefill_rows(route: str, sizes: list[int], rng: np.random.Generator, extra_ms: float = 0.0) -> list[dict]:
    """TTFT = 50 ms + 0.1 ms per input token (+ extra_ms), with noise: the same channel, whatever
    the prompt sizes sent to it."""
    out = []
    for n in sizes:
        ttft = 50 + 0.1 * n + extra_ms + rng.normal(0, 2)
        out.append({"route": route, "input_tokens": n, "ttft_ms": ttft, "e2e_ms": ttft + 100, "tpot_ms": 5.0})
    return out


def test_prompt_size_is_controlled_for(tmp_path: Path) -> None:
    """/small gets mostly short prompts, /large mostly long ones, from the same channel: the plain
    medians differ by ~270 ms, at a shared input length nothing does."""
    rng = np.random.default_rng(1)
    small = [300] * 60 + [3000] * 15
    large = [300] * 15 + [3000] * 60
    db = synthetic_db(tmp_path / "s.duckdb", prefill_rows("/small", small, rng) + prefill_rows("/large", large, rng))
    out = run_compare(db, "--by", "route", "/small", "/large")
    medians = {g["label"]: g["ttft"]["p50_ms"] for g in out["groups"]}
    assert medians["/large"] - medians["/small"] > 200
    d = diff(out, "ttft", "/large")
    assert d["n"] == d["n_baseline"] == 75 and d["shared_inputs"] == [300, 3000]
    assert all(s == pytest.approx(100, abs=5) for s in d["slopes_ms_per_1k_tokens"])  # 0.1 ms a token
    assert abs(d["median_diff_ms"]) < 3 and d["call"] == "cannot tell"


def test_a_small_noisy_sample_says_how_many_more_would_tell(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    rows = [{"route": r, "input_tokens": 100, "ttft_ms": 200 + shift + rng.normal(0, 40), "e2e_ms": 500.0,
             "tpot_ms": 5.0} for r, shift in (("/a", 0), ("/b", 5)) for _ in range(12)]
    out = run_compare(synthetic_db(tmp_path / "n.duckdb", rows), "--by", "route", "/a", "/b")
    d = diff(out, "ttft", "/b")
    assert d["ci_low_ms"] < 0 < d["ci_high_ms"]
    assert d["more_requests"] > 12 and "more requests on each side would tell" in d["verdict"]
    assert d["detectable_ms"] >= negligible_ms("ttft", out["groups"][0]["ttft"]["p50_ms"])


def test_windows_and_conditions_as_sides(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    rows = prefill_rows("/x", [500] * 40, rng) + prefill_rows("/x", [500] * 40, rng, extra_ms=100)
    db = synthetic_db(tmp_path / "w.duckdb", rows)  # the second 40 seconds are 100 ms slower
    windows = run_compare(db, "--window", "2026-11-30T00:00..2026-11-30T00:00:40",
                          "--window", "2026-11-30T00:00:40..")
    assert [g["requests"] for g in windows["groups"]] == [40, 40]
    assert diff(windows, "ttft", "2026-11-30T00:00:40..")["median_diff_ms"] == pytest.approx(100, abs=3)
    conditions = run_compare(db, "--where", "ttft_ms < 150", "--where", "ttft_ms >= 150")
    assert [g["label"] for g in conditions["groups"]] == ["ttft_ms < 150", "ttft_ms >= 150"]


def test_usage_errors_say_what_to_give(tmp_path: Path) -> None:
    db = synthetic_db(tmp_path / "u.duckdb", prefill_rows("/x", [500] * 12, np.random.default_rng(4)))
    runner = CliRunner()
    assert "give one of --by" in runner.invoke(compare_command, ["--db", str(db)]).output
    one = runner.invoke(compare_command, ["--db", str(db), "--by", "route"])
    assert one.exit_code != 0 and "needs two sides with 10+ successful requests each; found 1 (/x)" in one.output
    missing = runner.invoke(compare_command, ["--db", str(db), "--by", "route", "/x", "/nope"])
    assert missing.exit_code != 0 and "no successful requests match /nope" in missing.output


def test_compare_reads_the_views_of_a_source() -> None:
    """The library takes any query callable (a file, the running proxy's admin SQL)."""
    con = duckdb.connect()
    con.execute(create_tables_sql())
    create_views(con)

    def query(sql: str) -> tuple[list[str], list[str], list[tuple]]:
        cur = con.execute(sql)
        return [d[0] for d in cur.description], [], cur.fetchall()

    with pytest.raises(ValueError, match="no successful requests"):
        compare(query, [Side("a", "route = 'a'"), Side("b", "route = 'b'")])
