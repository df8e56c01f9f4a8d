"""Cost from genai-prices: computed in the views from the tokens and the price of the request's date,
checked against the package's own calculation (no price is written in llmtap or in these tests)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import pytest
from click.testing import CliRunner
from genai_prices import Usage, calc_price

from analysis.source import open_source
from proxy.common import prices
from proxy.cli import main
from proxy.common.schema import create_tables_sql

# model as the upstream reported it, upstream host, started_at, (input, cache read, cache write, output, reasoning)
ROWS: list[tuple[str | None, str, datetime, tuple[int | None, int, int, int | None, int]]] = [
    ("claude-sonnet-4-5-20250929", "api.anthropic.com", datetime(2026, 11, 3, 9, 0, tzinfo=UTC), (12_000, 10_000, 1_000, 400, 0)),
    ("claude-sonnet-4-5-20250929", "api.anthropic.com", datetime(2026, 11, 3, 9, 5, tzinfo=UTC), (250_000, 0, 0, 900, 0)),  # a tier
    ("claude-sonnet-4-6", "api.anthropic.com", datetime(2026, 3, 1, 12, 0, tzinfo=UTC), (300_000, 0, 0, 100, 0)),  # two periods
    ("claude-sonnet-4-6", "api.anthropic.com", datetime(2026, 3, 20, 12, 0, tzinfo=UTC), (300_000, 0, 0, 100, 0)),
    ("gpt-5-2025-08-07", "api.openai.com", datetime(2026, 11, 4, 1, 0, tzinfo=UTC), (9_000, 8_192, 0, 300, 128)),
    ("deepseek-chat", "api.deepseek.com", datetime(2026, 11, 4, 0, 10, tzinfo=UTC), (5_000, 0, 0, 500, 0)),  # off-peak hours
    ("deepseek-chat", "api.deepseek.com", datetime(2026, 11, 4, 12, 0, tzinfo=UTC), (5_000, 0, 0, 500, 0)),
    ("anthropic/claude-sonnet-4.5", "openrouter.ai", datetime(2026, 11, 5, 8, 0, tzinfo=UTC), (2_000, 0, 0, 50, 0)),
    ("gemini-2.5-pro", "127.0.0.1", datetime(2026, 11, 5, 8, 0, tzinfo=UTC), (1_000, 0, 0, 100, 20)),  # by model name
    ("sonar", "api.perplexity.ai", datetime(2026, 11, 5, 8, 0, tzinfo=UTC), (100, 0, 0, 10, 0)),  # a fee per request
]


def insert(con: duckdb.DuckDBPyConnection, rows: list[dict[str, Any]]) -> None:
    for row in rows:
        names = ", ".join(row)
        con.execute(f"INSERT INTO requests ({names}) VALUES ({', '.join('?' * len(row))})", list(row.values()))


def row(n: int, model: str | None, host: str, at: datetime, tokens: tuple[Any, ...], **extra: Any) -> dict[str, Any]:
    i, cr, cw, o, r = tokens
    return dict(id=f"{n:032x}", started_at=at, upstream_host=host, request_model=model, response_model=model,
                input_tokens=i, cache_read_tokens=cr, cache_creation_tokens=cw, output_tokens=o, reasoning_tokens=r,
                outcome="ok", kind="generation", **extra)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "prices.duckdb"
    con = duckdb.connect(str(path))
    con.execute(create_tables_sql())
    insert(con, [row(n, *spec) for n, spec in enumerate(ROWS)])
    insert(con, [row(100, "sim-unknown-model", "127.0.0.1", datetime(2026, 11, 5, tzinfo=UTC), (10, 0, 0, 5, 0)),
                 row(101, "gpt-5-2025-08-07", "api.openai.com", datetime(2026, 11, 5, tzinfo=UTC), (None, 0, 0, None, 0)),
                 row(102, None, "127.0.0.1", datetime(2026, 11, 5, tzinfo=UTC), (None, 0, 0, None, 0))])
    con.close()
    return path


def package_price(model: str, host: str, at: datetime, tokens: tuple[Any, ...]) -> float:
    """genai-prices' own answer: the provider from the URL when it knows it, else from the model."""
    i, cr, cw, o, r = tokens
    usage = Usage(input_tokens=i, cache_read_tokens=cr, cache_write_tokens=cw, output_tokens=o,
                  output_reasoning_tokens=r)
    try:
        return float(calc_price(usage, model, provider_api_url=f"https://{host}", genai_request_timestamp=at).total_price)
    except LookupError:
        return float(calc_price(usage, model, genai_request_timestamp=at).total_price)


def test_the_views_price_each_row_as_the_package_does(db: Path) -> None:
    source = open_source(db)
    try:
        _, _, got = source.query("SELECT id, cost_usd, price_source FROM requests ORDER BY id")
    finally:
        source.close()
    by_id = {rid: (cost, src) for rid, cost, src in got}
    for n, (model, host, at, tokens) in enumerate(ROWS):
        cost, src = by_id[f"{n:032x}"]
        assert cost == pytest.approx(package_price(model, host, at, tokens), rel=1e-12, abs=1e-15), (model, at)
        assert src == prices.source() and src.startswith("genai-prices ")
    # the periods, the tier and the off-peak hours gave different prices for the same tokens
    assert by_id[f"{2:032x}"][0] != by_id[f"{3:032x}"][0]
    assert by_id[f"{5:032x}"][0] != by_id[f"{6:032x}"][0]
    assert by_id[f"{100:032x}"] == (None, prices.UNKNOWN)  # never a silent 0
    assert by_id[f"{101:032x}"] == (None, prices.source())  # a known model, no token counts: nothing to price
    assert by_id[f"{102:032x}"] == (None, None)  # no model at all (a probe)


def test_the_cost_is_derived_not_stored(db: Path) -> None:
    con = duckdb.connect(str(db), read_only=True)
    columns = [d[0] for d in con.execute("SELECT * FROM requests LIMIT 0").description]
    con.close()
    assert "cost_usd" not in columns and "price_source" not in columns


def test_row_cost_is_the_same_arithmetic_as_the_view(db: Path) -> None:
    for model, host, at, tokens in ROWS:
        i, cr, cw, o, r = tokens
        got = prices.row_cost(dict(response_model=model, upstream_host=host, started_at=at, input_tokens=i,
                                   cache_read_tokens=cr, cache_creation_tokens=cw, output_tokens=o, reasoning_tokens=r))
        assert got == pytest.approx(package_price(model, host, at, tokens), rel=1e-12, abs=1e-15)
    assert prices.row_cost(dict(response_model="sim-unknown-model", input_tokens=10)) is None


def test_report_shows_cost_by_model_beside_the_latency(db: Path) -> None:
    result = CliRunner().invoke(main, ["report", "--db", str(db), "--by", "model"])
    assert result.exit_code == 0, result.output
    second_block = result.output.split("\n\n")[2]  # the first is latency (TTFT, E2E); cost ends the second
    header = second_block.splitlines()[1]
    assert "tok/s" in header and header.split()[-1] == "cost"
    sonnet = next(line for line in second_block.splitlines() if line.startswith("claude-sonnet-4-5-2025"))
    assert sonnet.split()[-1].startswith("$")
    assert f"Cost: list prices from {prices.source()}." in result.output
    assert "1 of unknown models have no cost (see `llmtap prices MODEL`)." in result.output


def test_prices_says_what_was_matched_and_the_price_used() -> None:
    result = CliRunner().invoke(main, ["prices", "claude-sonnet-4-5-20250929"])
    assert result.exit_code == 0, result.output
    assert "matched   anthropic / claude-sonnet-4-5 (Claude Sonnet 4.5), by model name" in result.output
    assert f"source    {prices.source()}" in result.output
    segment = prices.lookup("claude-sonnet-4-5-20250929").segment_at(datetime.now(UTC))  # type: ignore[union-attr]
    assert f"input ${segment.prices['input'][0]:g}/MTok" in result.output

    routed = CliRunner().invoke(main, ["prices", "anthropic/claude-sonnet-4.5", "--upstream", "https://openrouter.ai/api/v1"])
    assert routed.exit_code == 0 and "openrouter / " in routed.output and "by upstream URL" in routed.output

    unknown = CliRunner().invoke(main, ["prices", "sim-unknown-model"])
    assert unknown.exit_code == 1
    assert unknown.output.startswith("sim-unknown-model: no price in genai-prices ")
    assert "cost_usd is NULL" in unknown.output


def test_prices_are_not_fetched_unless_asked() -> None:
    assert prices._updater is None  # the package's network update is opt-in
    assert not prices._snapshot().from_auto_update


# What the other tests take from genai-prices: the fixture's models (tests/analysis_fixture.py) at its
# dates, whose costs tests/test_report.py's golden text shows, and the names tests use as never priced.
# The lock (requirements/lock.txt) pins the package; a bump that changes any of these fails here first,
# by name: update this table, then the golden text the new figures move.
FIXTURE_PRICES: dict[tuple[str, str], dict[str, Any] | None] = {
    ("claude-haiku-4-5-20251001", "api.anthropic.com"): {
        "input": (1.0, ()), "cache_read": (0.1, ()), "cache_write": (1.25, ()), "output": (5.0, ())},
    ("claude-opus-4-1", "api.anthropic.com"): {
        "input": (15.0, ()), "cache_read": (1.5, ()), "cache_write": (18.75, ()), "output": (75.0, ())},
    ("claude-sonnet-4-5-20250929", "api.anthropic.com"): {
        "input": (3.0, ((200000, 6.0),)), "cache_read": (0.3, ((200000, 0.6),)),
        "cache_write": (3.75, ((200000, 7.5),)), "output": (15.0, ((200000, 22.5),))},
    ("gpt-4.1-mini-2025-04-14", "api.openai.com"): {"input": (0.4, ()), "cache_read": (0.1, ()), "output": (1.6, ())},
    ("gpt-5-2025-08-07", "api.openai.com"): {"input": (1.25, ()), "cache_read": (0.125, ()), "output": (10.0, ())},
    ("gpt-5o", "api.openai.com"): None,
    ("qwen3-coder-30b", "llm.internal"): None,
    ("gpt-x", "127.0.0.1"): None,  # the simulator's models in tests/test_run.py and others
    ("claude-x", "127.0.0.1"): None,
    ("sim-unknown-model", "127.0.0.1"): None,
}


def test_genai_prices_release_prices_what_the_tests_assume() -> None:
    from .analysis_fixture import DAY0

    found = {key: (priced.segment_at(DAY0).prices if (priced := prices.lookup(*key)) else None)
             for key in FIXTURE_PRICES}
    changed = {key: found[key] for key in FIXTURE_PRICES if found[key] != FIXTURE_PRICES[key]}
    assert not changed, f"{prices.source()} prices these differently from the release last tested: {changed}"


def test_lookups_kept_in_a_file_are_the_packages_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The next process reads its lookups from prices-cache.json: the same prices, tiers, periods and
    off-peak hours as the package's; a file of another copy of the package's data is not used."""
    monkeypatch.setenv("LLMTAP_HOME", str(tmp_path))
    pairs = sorted({(model, host) for model, host, *_ in ROWS if model} | {("sim-unknown-model", "127.0.0.1")})
    first = prices._Remembered()
    for pair in pairs:
        first.put(*pair, prices._looked_up(*pair))
    assert {pair: prices._Remembered().get(*pair) for pair in pairs} == {pair: prices._looked_up(*pair) for pair in pairs}
    path = tmp_path / "prices-cache.json"
    assert path.stat().st_mode & 0o777 == 0o600
    path.write_bytes(path.read_bytes().replace(b'"key":"', b'"key":"0:0 '))  # as after an upgrade
    assert prices._Remembered().get(*pairs[0]) is False


def test_a_command_after_the_first_does_not_load_the_package(db: Path, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    check = ("import sys; from analysis.source import open_source; open_source(sys.argv[1]).close();"
             "print(sorted(m for m in sys.modules if m.startswith('genai_prices')))")
    env = {**os.environ, "LLMTAP_HOME": str(tmp_path)}
    loaded = [subprocess.run([sys.executable, "-c", check, str(db)], env=env, capture_output=True, text=True,
                             check=True).stdout.strip() for _ in range(2)]
    assert loaded[0] != "[]" and loaded[1] == "[]", loaded
