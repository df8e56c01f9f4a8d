"""`llmtap report` on the fixture database: exact output, percentiles, windows."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import duckdb
import pytest
from click.testing import CliRunner

from analysis.filters import Filters
from analysis.formatting import fmt_count, fmt_ms
from analysis.report import GROUPINGS, group_stats
from analysis.source import open_source
from analysis.timewindow import WindowError, parse_time
from .analysis_fixture import build_fixture_db, fixture_rows
from proxy.cli import main
from proxy.common import prices


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("report") / "fixture.duckdb"
    build_fixture_db(path)
    return path


def run(db: Path, *args: str) -> str:
    result = CliRunner().invoke(main, ["report", "--db", str(db), *args])
    assert result.exit_code == 0, result.output
    return result.output


BY_MODEL = """\
30 generations from 2026-11-28 09:02 to 2026-11-30 17:40 UTC, by model
not shown: 1 model_list (--all, --by kind)

                                         TTFT                 E2E
model              reqs    err%    p50    p95    p99    p50    p95    p99
-----------------  ----  ------  -----  -----  -----  -----  -----  -----
claude-sonnet-4-5    13   53.8%  885ms   2.8s   3.1s   5.8s  18.5s  21.3s
gpt-5                 5   40.0%   2.1s   2.4s   2.4s  12.5s  14.3s  14.5s
qwen3-coder-30b       5   60.0%  415ms  446ms  449ms   2.8s   3.0s   3.0s
claude-haiku-4-5      3    0.0%      -      -      -  900ms   1.2s   1.2s
gpt-4.1-mini          2   50.0%      -      -      -   1.9s   1.9s   1.9s
claude-opus-4-1       1  100.0%      -      -      -      -      -      -
gpt-5o                1  100.0%      -      -      -      -      -      -
-----------------  ----  ------  -----  -----  -----  -----  -----  -----
total                30   50.0%  950ms   2.8s   3.1s   4.1s  16.7s  20.9s

                         TPOT        output     tokens     cache
model               p50   p95   p99  tok/s      in   out  read%     cost
-----------------  ----  ----  ----  -----  ------  ----  -----  -------
claude-sonnet-4-5  22ms  25ms  25ms     37  272.0k  2.6k  94.5%    $0.16
gpt-5              13ms  15ms  15ms     61  125.0k  2.2k  88.0%    $0.05
qwen3-coder-30b    18ms  18ms  19ms     48   12.5k   570      -        -
claude-haiku-4-5      -     -     -     33    5.5k    90   0.0%   $0.006
gpt-4.1-mini          -     -     -     63     800   120   0.0%  $0.0005
claude-opus-4-1       -     -     -      -       -     -      -        -
gpt-5o                -     -     -      -       -     -      -        -
-----------------  ----  ----  ----  -----  ------  ----  -----  -------
total              18ms  25ms  25ms     40  415.9k  5.5k  88.3%    $0.22

5 slowest requests
id        model              tool         ttft     e2e  outcome
--------  -----------------  -----------  ----  ------  -------------------
7044c8eb  gpt-5              codex           -  600.0s  upstream_timeout
f75d7396  claude-sonnet-4-5  claude-code  1.1s   45.0s  client_disconnected
203e96ce  claude-sonnet-4-5  claude-code  1.5s   22.0s  ok
df2feb00  gpt-5              codex        2.4s   14.5s  ok
36aaec97  gpt-5              codex        2.1s   12.5s  ok

Percentiles: successful requests only (TTFT: streams). Slowest: any outcome.
Cost: list prices from SOURCE.
  3 of unknown models have no cost (see `llmtap prices MODEL`).
""".replace("SOURCE", prices.source())  # the package's version (test_prices.py holds its figures)


def test_report_by_model_is_the_default(db: Path) -> None:
    assert run(db) == BY_MODEL
    assert run(db, "--by", "model", "--format", "table") == BY_MODEL


def test_all_and_kind_show_the_other_kinds(db: Path) -> None:
    every = run(db, "--all")
    assert every.startswith("31 requests from 2026-11-28 09:02 to 2026-11-30 17:41 UTC, by model\n\n")
    assert "\n(none)                1    0.0%      -      -      -   95ms   95ms   95ms\n" in every  # GET /v1/models
    assert run(db, "--kind", "model_list").startswith("1 request (model_list) from ")
    assert run(db, "--by", "kind").splitlines()[0] == "31 requests from 2026-11-28 09:02 to 2026-11-30 17:41 UTC, by kind"
    result = CliRunner().invoke(main, ["report", "--db", str(db), "--all", "--kind", "probe"])
    assert result.exit_code == 2 and "give --kind or --all, not both" in result.output


def test_report_by_day(db: Path) -> None:
    assert run(db, "--by", "day").split("\n\n")[1:3] == [
        """\
                                 TTFT                E2E
day         reqs   err%    p50    p95    p99   p50    p95    p99
----------  ----  -----  -----  -----  -----  ----  -----  -----
2026-11-28    10  50.0%  950ms   2.3s   2.4s  6.4s  13.2s  14.2s
2026-11-29    12  75.0%  450ms  675ms  695ms  3.0s   5.0s   5.2s
2026-11-30     8  12.5%   1.8s   3.0s   3.2s  4.1s  19.1s  21.4s
----------  ----  -----  -----  -----  -----  ----  -----  -----
total         30  50.0%  950ms   2.8s   3.1s  4.1s  16.7s  20.9s""",
        """\
                  TPOT        output     tokens     cache
day          p50   p95   p99  tok/s      in   out  read%   cost
----------  ----  ----  ----  -----  ------  ----  -----  -----
2026-11-28  22ms  22ms  22ms     40   82.8k  1.6k  78.5%  $0.06
2026-11-29  19ms  24ms  25ms     46   63.0k  1.2k  76.2%  $0.03
2026-11-30  16ms  24ms  25ms     34  270.1k  2.7k  94.1%  $0.13
----------  ----  ----  ----  -----  ------  ----  -----  -----
total       18ms  25ms  25ms     40  415.9k  5.5k  88.3%  $0.22""",
    ]


def test_report_by_hour_with_a_tool_filter(db: Path) -> None:
    assert run(db, "--by", "hour", "--tool", "cline") == """\
5 generations from 2026-11-28 14:26 to 2026-11-29 15:05 UTC, by hour

                                        TTFT               E2E
hour              reqs    err%    p50    p95    p99   p50   p95   p99
----------------  ----  ------  -----  -----  -----  ----  ----  ----
2026-11-28 14:00     1  100.0%      -      -      -     -     -     -
2026-11-29 10:00     1  100.0%      -      -      -     -     -     -
2026-11-29 13:00     1  100.0%      -      -      -     -     -     -
2026-11-29 15:00     2    0.0%  415ms  446ms  449ms  2.8s  3.0s  3.0s
----------------  ----  ------  -----  -----  -----  ----  ----  ----
total                5   60.0%  415ms  446ms  449ms  2.8s  3.0s  3.0s

                        TPOT        output    tokens    cache
hour               p50   p95   p99  tok/s     in  out  read%  cost
----------------  ----  ----  ----  -----  -----  ---  -----  ----
2026-11-28 14:00     -     -     -      -      -    -      -     -
2026-11-29 10:00     -     -     -      -      -    -      -     -
2026-11-29 13:00     -     -     -      -      -  300      -     -
2026-11-29 15:00  18ms  18ms  19ms     48  12.5k  270      -     -
----------------  ----  ----  ----  -----  -----  ---  -----  ----
total             18ms  18ms  19ms     48  12.5k  570      -     -

5 slowest requests
id        model            tool    ttft   e2e  outcome
--------  ---------------  -----  -----  ----  --------------------
b6c58c3b  qwen3-coder-30b  cline  600ms  9.0s  stream_truncated
f4b37f81  qwen3-coder-30b  cline  450ms  3.0s  ok
b560f46d  qwen3-coder-30b  cline  380ms  2.6s  ok
2b5eabc3  qwen3-coder-30b  cline      -  40ms  http_error
2d0a6212  qwen3-coder-30b  cline      -  35ms  upstream_unreachable

Percentiles: successful requests only (TTFT: streams). Slowest: any outcome.
Cost: list prices from SOURCE.
  3 of unknown models have no cost (see `llmtap prices MODEL`).
""".replace("SOURCE", prices.source())


def test_report_json(db: Path) -> None:
    assert run(db, "--by", "tag", "--tag", "bench", "--format", "json") == """\
{
  "by": "tag",
  "requests": 2,
  "first": "2026-11-28 14:25",
  "last": "2026-11-29 15:06",
  "kinds": [
    "generation"
  ],
  "not_shown": {},
  "sort": "count",
  "groups": [
    {
      "tag": "bench",
      "requests": 2,
      "errors": 1,
      "error_pct": 50.0,
      "ttft_p50_ms": null,
      "ttft_p90_ms": null,
      "ttft_p95_ms": null,
      "ttft_p99_ms": null,
      "tpot_p50_ms": null,
      "tpot_p95_ms": null,
      "tpot_p99_ms": null,
      "e2e_p50_ms": 1900.0,
      "e2e_p95_ms": 1900.0,
      "e2e_p99_ms": 1900.0,
      "output_tokens_per_s_p50": 63.2,
      "input_tokens": 800,
      "output_tokens": 120,
      "cache_read_tokens": 0,
      "cache_read_share": 0.0,
      "cost_usd": 0.000512,
      "cost_per_request_usd": 0.000512,
      "unpriced": 0,
      "subscription_requests": 0
    }
  ],
  "total": {
    "requests": 2,
    "errors": 1,
    "error_pct": 50.0,
    "ttft_p50_ms": null,
    "ttft_p90_ms": null,
    "ttft_p95_ms": null,
    "ttft_p99_ms": null,
    "tpot_p50_ms": null,
    "tpot_p95_ms": null,
    "tpot_p99_ms": null,
    "e2e_p50_ms": 1900.0,
    "e2e_p95_ms": 1900.0,
    "e2e_p99_ms": 1900.0,
    "output_tokens_per_s_p50": 63.2,
    "input_tokens": 800,
    "output_tokens": 120,
    "cache_read_tokens": 0,
    "cache_read_share": 0.0,
    "cost_usd": 0.000512,
    "cost_per_request_usd": 0.000512,
    "unpriced": 0,
    "subscription_requests": 0
  },
  "slowest": [
    {
      "id": "9697e5cf-8f60-44c9-dbaf-59991223cf64",
      "model": "gpt-4.1-mini",
      "tool": "openai-python",
      "ttft_ms": null,
      "e2e_ms": 1900.0,
      "outcome": "ok"
    },
    {
      "id": "7692508d-f11b-a961-fb84-cee82af412a0",
      "model": "gpt-4.1-mini",
      "tool": "openai-python",
      "ttft_ms": null,
      "e2e_ms": 12.0,
      "outcome": "proxy_error"
    }
  ]
}
"""


def test_report_csv(db: Path) -> None:
    assert run(db, "--by", "route", "--format", "csv") == """\
route,requests,errors,error_pct,ttft_p50_ms,ttft_p90_ms,ttft_p95_ms,ttft_p99_ms,tpot_p50_ms,tpot_p95_ms,tpot_p99_ms,e2e_p50_ms,e2e_p95_ms,e2e_p99_ms,output_tokens_per_s_p50,input_tokens,output_tokens,cache_read_tokens,cache_read_share,cost_usd,cost_per_request_usd,unpriced,subscription_requests
/,17,8,47.06,885.0,2350.0,2775.0,3115.0,22.4,25.0,25.0,4100.0,16440.0,20888.0,34.1,277550,2651,257000,0.926,0.166515,0.015138,0,0
/openai,8,4,50.0,2100.0,2340.0,2370.0,2394.0,13.4,14.7,14.8,11150.0,14200.0,14440.0,61.6,125800,2320,110000,0.8744,0.055012,0.013753,0,0
/local,5,3,60.0,415.0,443.0,446.5,449.3,17.8,18.5,18.5,2800.0,2980.0,2996.0,48.1,12500,570,,,,,3,0
"""


@pytest.mark.parametrize("by", list(GROUPINGS))
def test_every_grouping_fits_80_columns(db: Path, by: str) -> None:
    output = run(db, "--by", by)
    assert max(len(line) for line in output.splitlines()) <= 80
    assert "5 slowest requests" in output


def test_long_session_ids_are_cut_the_same_in_both_blocks(db: Path) -> None:
    blocks = run(db, "--by", "session").split("\n\n")[1:3]
    firsts = [[line.split()[0] for line in block.splitlines()[3:]] for block in blocks]
    assert firsts[0] == firsts[1]
    assert firsts[0][1].endswith("…") and len(firsts[0][1]) < 36


# -- the numbers, checked against plain Python on the same rows ------------------

def quantile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def expected_stats(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if r["outcome"] == "ok"]

    def known(column: str, among: list[dict[str, Any]]) -> list[float]:
        return [r[column] for r in among if r[column] is not None]

    def total(column: str) -> int | None:
        values = known(column, rows)
        return sum(values) if values else None

    streamed = [r for r in ok if r["stream"]]
    errors = len(rows) - len(ok)
    stats = {"requests": len(rows), "errors": errors, "error_pct": 100 * errors / len(rows)}
    for q in (50, 90, 95, 99):
        stats[f"ttft_p{q}_ms"] = quantile(known("ttft_ms", streamed), q / 100)
    for name in ("tpot", "e2e"):
        for q in (50, 95, 99):
            stats[f"{name}_p{q}_ms"] = quantile(known(f"{name}_ms", ok), q / 100)
    stats["output_tokens_per_s_p50"] = quantile(known("output_tokens_per_s", ok), 0.5)
    for column in ("input_tokens", "output_tokens", "cache_read_tokens"):
        stats[column] = total(column)
    cache, inputs = stats["cache_read_tokens"], stats["input_tokens"]
    stats["cache_read_share"] = cache / inputs if cache is not None and inputs else None
    return stats


@pytest.mark.parametrize("by, column", [("model", "request_model"), ("tool", "tool"), ("tag", "tag")])
def test_metrics_match_an_independent_computation(db: Path, by: str, column: str) -> None:
    groups: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for row in fixture_rows()[0]:
        groups[row[column]].append(row)
    source = open_source(db)
    try:
        got = {g[by]: g for g in group_stats(source, by, Filters())}
    finally:
        source.close()
    assert set(got) == set(groups)
    for key, rows in groups.items():
        expected = expected_stats(rows)
        actual = {name: got[key][name] for name in expected}
        unknown = {name for name, value in expected.items() if value is None}
        assert {name for name, value in actual.items() if value is None} == unknown, key
        known = {name: value for name, value in expected.items() if name not in unknown}
        assert {name: actual[name] for name in known} == pytest.approx(known, rel=1e-9), key


def test_percentiles_use_linear_interpolation(db: Path) -> None:
    """Sonnet's successful e2e: 3210 4100 5200 6400 8100 22000 ms."""
    source = open_source(db)
    try:
        sonnet = next(g for g in group_stats(source, "model", Filters()) if g["model"] == "claude-sonnet-4-5")
    finally:
        source.close()
    assert sonnet["e2e_p50_ms"] == pytest.approx(5800)
    assert sonnet["e2e_p99_ms"] == pytest.approx(8100 + 0.95 * (22000 - 8100))
    assert sonnet["e2e_p95_ms"] == pytest.approx(8100 + 0.75 * (22000 - 8100))


# -- windows and filters -----------------------------------------------------------

def heading(db: Path, *args: str) -> str:
    return run(db, "--all", *args).splitlines()[0]


def test_since_and_until_take_iso_times(db: Path) -> None:
    assert heading(db, "--since", "2026-11-30") == (
        "9 requests from 2026-11-30 09:00 to 2026-11-30 17:41 UTC, by model")
    assert heading(db, "--since", "2026-11-29T08:00", "--until", "2026-11-29T09:00") == (
        "3 requests from 2026-11-29 08:30 to 2026-11-29 08:31 UTC, by model")
    # 09:30+01:00 is 08:30 UTC: the 08:30:00 request is included, since is inclusive
    assert heading(db, "--since", "2026-11-29T09:30:00+01:00", "--until", "2026-11-29T08:31Z") == (
        "1 request from 2026-11-29 08:30 to 2026-11-29 08:30 UTC, by model")


def test_relative_windows_count_back_from_now(db: Path) -> None:
    assert heading(db, "--since", "100000d").startswith("31 requests")
    assert run(db, "--until", "36500d") == "no generations match\n"


def test_a_bad_window_is_a_usage_error(db: Path) -> None:
    result = CliRunner().invoke(main, ["report", "--db", str(db), "--since", "last tuesday"])
    assert result.exit_code == 2
    assert "'last tuesday' is neither a span like 30m, 24h, 7d, today, yesterday nor an ISO date-time" in (
        " ".join(result.output.split()))


@pytest.fixture()
def moved_db(db: Path, tmp_path: Path) -> Path:
    """The fixture with its last day (2026-11-30) moved to yesterday (UTC) and the 29th kept a day before."""
    path = tmp_path / "moved.duckdb"
    path.write_bytes(db.read_bytes())
    yesterday = datetime.now(timezone.utc).date() - timedelta(days=1)
    days = (yesterday - datetime(2026, 11, 30).date()).days
    con = duckdb.connect(str(path))
    try:
        con.execute(f"UPDATE requests SET started_at = started_at + INTERVAL {days} DAY")
    finally:
        con.close()
    return path


def test_since_today_and_yesterday_are_utc_days(moved_db: Path) -> None:
    yesterday = (datetime.now(timezone.utc).date() - timedelta(days=1)).isoformat()
    day_before = (datetime.now(timezone.utc).date() - timedelta(days=2)).isoformat()
    assert heading(moved_db, "--since", "yesterday") == (
        f"9 requests from {yesterday} 09:00 to {yesterday} 17:41 UTC, by model")
    assert heading(moved_db, "--since", "yesterday", "--until", "today") == (
        f"9 requests from {yesterday} 09:00 to {yesterday} 17:41 UTC, by model")
    assert heading(moved_db, "--until", "yesterday").split(" to ")[1].startswith(day_before)
    assert run(moved_db, "--since", "TODAY") == "no generations match\n"
    for command in ("errors", "export", "sessions"):
        args = [command, "--db", str(moved_db), "--since", "today"]
        if command == "export":
            args += ["--out", str(moved_db.parent / "out")]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, (command, result.output)


def test_filters_combine_and_quote_their_values(db: Path) -> None:
    assert heading(db, "--tag", "refactor", "--model", "claude-haiku-4-5") == (
        "1 request from 2026-11-28 09:07 to 2026-11-28 09:07 UTC, by model")
    assert heading(db, "--tool", "codex", "--tool", "curl").startswith("7 requests")
    assert run(db, "--model", "o'brien') OR (1=1") == "no generations match\n"


NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize("text, expected", [
    ("30m", NOW - timedelta(minutes=30)),
    ("24h", NOW - timedelta(hours=24)),
    ("7d", NOW - timedelta(days=7)),
    ("2w", NOW - timedelta(weeks=2)),
    ("90s", NOW - timedelta(seconds=90)),
    ("1.5h", NOW - timedelta(minutes=90)),
    ("2026-11-30", datetime(2026, 11, 30, tzinfo=timezone.utc)),
    ("2026-11-30T14:00", datetime(2026, 11, 30, 14, tzinfo=timezone.utc)),
    ("2026-11-30 14:00+02:00", datetime(2026, 11, 30, 12, tzinfo=timezone.utc)),
    ("today", datetime(2026, 12, 1, tzinfo=timezone.utc)),
    (" Yesterday", datetime(2026, 11, 30, tzinfo=timezone.utc)),
])
def test_parse_time(text: str, expected: datetime) -> None:
    assert parse_time(text, NOW) == expected


def test_parse_time_refuses_other_text() -> None:
    with pytest.raises(WindowError):
        parse_time("last tuesday", NOW)


# -- humanised numbers ----------------------------------------------------------------

@pytest.mark.parametrize("ms, text", [
    (None, "-"), (0.4, "0ms"), (820, "820ms"), (999.4, "999ms"), (999.6, "1.0s"),
    (6400, "6.4s"), (600000, "600.0s"),
])
def test_fmt_ms(ms: float | None, text: str) -> None:
    assert fmt_ms(ms) == text


@pytest.mark.parametrize("n, text", [
    (None, "-"), (0, "0"), (999, "999"), (1000, "1.0k"), (12345, "12.3k"), (999_960, "1.0M"),
    (4_200_000, "4.2M"), (3_000_000_000, "3.0G"),
])
def test_fmt_count(n: int | None, text: str) -> None:
    assert fmt_count(n) == text


def test_report_json_parses(db: Path) -> None:
    data = json.loads(run(db, "--format", "json"))
    assert [g["model"] for g in data["groups"]][:3] == ["claude-sonnet-4-5", "gpt-5", "qwen3-coder-30b"]
    assert len(data["slowest"]) == 5


def test_show_prints_every_timestamp_in_one_format(db: Path, tmp_path: Path) -> None:
    path = tmp_path / "resets.duckdb"
    path.write_bytes(db.read_bytes())
    con = duckdb.connect(str(path))
    try:  # a rate-limit reset, a second timestamp column, in another zone's offset
        con.execute("UPDATE requests SET ratelimit_requests_reset = TIMESTAMPTZ '2026-11-29 12:31:00.25+02:00'"
                    " WHERE starts_with(id, '7044c8eb')")
    finally:
        con.close()
    result = CliRunner().invoke(main, ["show", "--db", str(path), "7044c8eb"])
    assert result.exit_code == 0, result.output
    stamps = re.findall(r"\d{4}-\d\d-\d\d[ T][^ ]+(?: UTC)?", result.output)
    assert stamps == ["2026-11-29 10:30:00.000 UTC", "2026-11-29 10:30:00.000 UTC", "2026-11-29 10:31:00.250 UTC"]
