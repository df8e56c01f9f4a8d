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
from proxy.common.schema import REQUEST_COLUMN_NAMES, create_tables_sql
from .serving import RunningProxy
from proxy.simulator.app import Simulator
from proxy.simulator.config import SimConfig

from .analysis_fixture import build_fixture_db
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


# -- prompts of different lengths, through the real proxy ---------------------------------------

PREFILL = {"ttft_ms": 5, "itl_ms": 1, "tokens": 4, "prefill_us_per_token": 20}  # 0.02 ms an input token
MIX_ROUNDS = 30
A_PROMPTS, B_PROMPTS = (1_000, 3_000), (2_000, 6_000)  # input tokens
SLOWER_BY_20 = 20


def prompt(tokens: int) -> dict:
    """A chat request of exactly `tokens` input tokens as the simulator counts them (4 characters each)."""
    return CHAT | {"messages": [{"role": "user", "content": "abc " * tokens}]}


@pytest.fixture(scope="module")
def prompt_mixes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """/short: prompts of 1k-3k input tokens; /long: 2k-6k to the same channel (the same speed per
    token); /long-slow: 2k-6k to one whose headers come 20 ms later. Each round sends one of each at
    once, so a busy machine falls on every route alike."""
    import asyncio

    db = tmp_path_factory.mktemp("mixes") / "llmtap.duckdb"
    rng = np.random.default_rng(26)

    async def record() -> None:
        async with Simulator(SimConfig(**PREFILL)) as same, \
                Simulator(SimConfig(**PREFILL, headers_delay_ms=SLOWER_BY_20)) as slow:
            routes = {"/short": same.url, "/long": same.url, "/long-slow": slow.url}
            async with RunningProxy(proxy_config(same.url, db.parent, routes=routes)) as p, \
                    aiohttp.ClientSession() as s:
                async def send(route: str, tokens: int) -> None:
                    async with s.post(p.url + route + "/v1/chat/completions", json=prompt(tokens)) as r:
                        assert r.status == 200
                        await r.read()

                for _ in range(MIX_ROUNDS):
                    long = int(rng.integers(*B_PROMPTS))
                    await asyncio.gather(send("/short", int(rng.integers(*A_PROMPTS))), send("/long", long),
                                         send("/long-slow", long))
                assert p.flush(10)

    asyncio.run(record())
    return db


def test_longer_prompts_at_the_same_speed_are_not_a_slower_channel(prompt_mixes: Path) -> None:
    """/long's prompts are twice /short's; its TTFT median is ~40 ms more, all of it prefill. Compared
    at a length both send, the difference is within the loop's jitter (power-of-two buckets said
    ~+11 ms: inside a bucket /long's prompts are longer)."""
    out = run_compare(prompt_mixes, "--by", "route", "/short", "/long")
    medians = {g["label"]: g["ttft"]["p50_ms"] for g in out["groups"]}
    assert medians["/long"] - medians["/short"] > 20
    d = diff(out, "ttft", "/long")
    assert d["n"] == d["n_baseline"] == MIX_ROUNDS
    low, high = d["shared_inputs"]
    assert A_PROMPTS[0] < B_PROMPTS[0] <= low <= d["at_input_tokens"] <= high <= A_PROMPTS[1]
    assert all(s == pytest.approx(20, abs=8) for s in d["slopes_ms_per_1k_tokens"])  # the simulator's prefill
    assert abs(d["median_diff_ms"]) < 5, d


def test_a_20_ms_slower_channel_with_longer_prompts_is_found(prompt_mixes: Path) -> None:
    out = run_compare(prompt_mixes, "--by", "route", "/short", "/long-slow")
    d = diff(out, "ttft", "/long-slow")
    assert d["call"] == "slower" and d["verdict"].startswith("/long-slow is slower: +"), d
    assert d["median_diff_ms"] == pytest.approx(SLOWER_BY_20, abs=6)
    assert d["ci_low_ms"] - 5 <= SLOWER_BY_20 <= d["ci_high_ms"] + 5, d


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


def channel_rows(route: str, rng: np.random.Generator, n: int, prompts: tuple[int, int], extra_ms: float = 0.0,
                 counted: bool = True) -> list[dict]:
    """The calibration's channel (benchmarks/compare_calibration.py): TTFT = 400 ms + 0.05 ms per
    input token (+ extra_ms), noise with a heavy tail; prompts uniform over `prompts`."""
    sizes = rng.integers(prompts[0], prompts[1] + 1, size=n)
    ttft = 400 + 0.05 * sizes + extra_ms + 10 * rng.standard_t(3, size=n) + (rng.random(n) < 0.05) * 300
    return [{"route": route, "input_tokens": int(x) if counted else None, "ttft_ms": float(t),
             "e2e_ms": float(t) + 200, "tpot_ms": 5.0} for x, t in zip(sizes, ttft)]


def test_shifted_prompt_mixes_at_the_same_speed_are_not_called_different(tmp_path: Path) -> None:
    """The case buckets got wrong (issue #26: B called slower, +27 ms, at any n): /a's prompts 1k-3k
    input tokens, /b's 2k-6k, the same channel. At a shared input length the difference is ~0."""
    rng = np.random.default_rng(5)
    rows = channel_rows("/a", rng, 300, (1_000, 3_000)) + channel_rows("/b", rng, 300, (2_000, 6_000))
    out = run_compare(synthetic_db(tmp_path / "m.duckdb", rows), "--by", "route", "/a", "/b")
    for metric in ("ttft", "e2e"):
        d = diff(out, metric, "/b")
        assert d["call"] == "cannot tell" and d["verdict"].startswith("cannot tell /b from /a"), d
        assert d["ci_low_ms"] < 0 < d["ci_high_ms"] and abs(d["median_diff_ms"]) < 5, d
        assert all(s == pytest.approx(50, abs=5) for s in d["slopes_ms_per_1k_tokens"])  # 0.05 ms a token
        assert 2_000 < d["at_input_tokens"] < 3_000


def test_a_20_ms_difference_with_shifted_prompts_is_found(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    rows = channel_rows("/a", rng, 300, (1_000, 3_000)) + channel_rows("/b", rng, 300, (2_000, 6_000), extra_ms=20)
    out = run_compare(synthetic_db(tmp_path / "d.duckdb", rows), "--by", "route", "/a", "/b")
    d = diff(out, "ttft", "/b")
    assert d["call"] == "slower" and d["ci_low_ms"] <= 20 <= d["ci_high_ms"], d
    assert d["median_diff_ms"] == pytest.approx(20, abs=5)


def test_the_words_when_sides_cannot_be_compared(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    rows = (channel_rows("/short", rng, 40, (1_000, 2_000)) + channel_rows("/long", rng, 40, (8_000, 12_000))
            + channel_rows("/few", rng, 4, (1_000, 2_000)) + channel_rows("/uncounted", rng, 40, (1_000, 2_000),
                                                                          counted=False))
    db = synthetic_db(tmp_path / "w.duckdb", rows)
    far = run_compare(db, "--by", "route", "/short", "/long")
    for d in far["differences"]:
        assert d["call"] == "cannot compare" and d["median_diff_ms"] is None and d["ci_low_ms"] is None
        assert d["verdict"].startswith("cannot compare: their prompts share no input length (/short's 1,")
        assert "/long's 8," in d["verdict"] and "--where 'input_tokens BETWEEN" in d["verdict"]
    few = diff(run_compare(db, "--by", "route", "/short", "/few"), "ttft", "/few")
    assert few["verdict"] == "cannot compare: too few streamed requests (/few has 4; 10 needed on each side)"
    uncounted = diff(run_compare(db, "--by", "route", "/short", "/uncounted"), "ttft", "/uncounted")
    assert uncounted["call"] == "cannot tell" and uncounted["at_input_tokens"] is None
    assert uncounted["verdict"].endswith("; not adjusted for input length (requests with input-token counts: "
                                         "/uncounted: 0 of 40)")
    table = CliRunner().invoke(compare_command, ["--db", str(db), "--by", "route", "/short", "/long"])
    assert table.exit_code == 0 and "/long against /short" in table.output
    assert table.output.count("cannot compare: their prompts share no input length") == 1  # said once for all three


def test_daily_traffic_by_tool_says_each_side_needs_10_requests(tmp_path: Path) -> None:
    """The fixture's day of claude-code, codex, cline, ...: too few successful generations each."""
    build_fixture_db(tmp_path / "f.duckdb")
    result = CliRunner().invoke(compare_command, ["--db", str(tmp_path / "f.duckdb"), "--by", "tool"])
    assert result.exit_code != 0
    assert ("compare --by tool needs two sides with 10+ successful requests each; found 0; "
            "too few: claude-code (8), codex (3), cline (2)") in result.output
    given = run_compare(tmp_path / "f.duckdb", "--by", "tool", "claude-code", "codex")
    verdicts = {d["metric"]: d["verdict"] for d in given["differences"]}
    assert verdicts["ttft"] == ("cannot compare: too few streamed requests (claude-code has 6; codex has 3; "
                                "10 needed on each side)")


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


def test_the_cli_and_the_library_ask_the_same_requests_of_a_side() -> None:
    from analysis import compare as library
    from analysis import compare_cli

    assert compare_cli.MIN_REQUESTS == library.MIN_REQUESTS


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


def test_an_answer_is_remembered_for_the_same_values_alone(tmp_path: Path) -> None:
    """The web UI asks again: the second answer comes from the memo and equals the first, computed
    anew; the values changed and it is computed again."""
    from analysis import compare as compare_module
    from analysis.compare import as_dict

    rng = np.random.default_rng(3)
    db = synthetic_db(tmp_path / "m.duckdb", prefill_rows("/a", [300, 3000] * 20, rng)
                      + prefill_rows("/b", [300, 3000] * 20, rng, extra_ms=5))
    con = duckdb.connect(str(db))
    create_views(con)

    def query(sql: str) -> tuple[list[str], list[str], list[tuple]]:
        cur = con.execute(sql)
        return [d[0] for d in cur.description], [], cur.fetchall()

    sides = [Side("/a", "route = '/a'"), Side("/b", "route = '/b'")]
    compare_module._MEMO.clear()
    first = as_dict(compare(query, sides))
    assert len(compare_module._MEMO) == 1
    assert as_dict(compare(query, sides)) == first and len(compare_module._MEMO) == 1
    compare_module._MEMO.clear()
    assert as_dict(compare(query, sides)) == first  # the memo's answer is the one computed
    con.execute("UPDATE m.main.requests SET ttft_ms = ttft_ms + 50 WHERE route = '/b'")
    create_views(con)
    changed = as_dict(compare(query, sides))
    assert changed["groups"] != first["groups"] and len(compare_module._MEMO) == 2


def test_the_resamples_levels_are_those_of_the_plain_definition() -> None:
    """`_resampled_levels` gathers with np.take and fits the lines from the rows' indices: the same
    numbers, bit for bit, as resampling the requests and calling `_levels` on them (same seed)."""
    from analysis.compare import ELEMENTS_PER_STEP, Sample, _levels, _pairs, _resampled_levels

    def reference(s: Sample, at: float | None, rng: np.random.Generator, resamples: int) -> np.ndarray:
        n = len(s.values)
        pairs = _pairs(n, rng)
        step = max(1, ELEMENTS_PER_STEP // max(n, len(pairs[0])))
        out = np.empty(resamples)
        for start in range(0, resamples, step):
            stop = min(resamples, start + step)
            rows = rng.integers(0, n, size=(stop - start, n))
            out[start:stop] = _levels(s.inputs[rows], s.values[rows], at, pairs)[0]
        return out

    rng = np.random.default_rng(7)
    for n in (10, 63, 2500):
        inputs = rng.integers(100, 400, n).astype(float)  # ties in input: pairs without a slope
        s = Sample(rng.normal(100, 10, n) + 0.05 * inputs, inputs)
        for at in (None, 250.0):
            got = _resampled_levels(s, at, np.random.default_rng(n), 300)
            assert np.array_equal(got, reference(s, at, np.random.default_rng(n), 300))
