"""What a request is, where people look: report, top, the HTML report, errors, show; over what the real
CLIs send (token counts, probes, Codex's WebSocket prewarm and turn, models lists), through the real proxy,
read back over its admin endpoint."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from analysis import report as report_mod
from analysis import show as show_mod
from analysis.error_report import build_error_report, to_table as errors_table
from analysis.filters import Filters
from analysis.html.queries import fetch_report_data
from analysis.html.report import render_html
from analysis.source import ServeSource
from analysis.top import run as top_run
from proxy.cli import main
from .serving import RunningProxy
from proxy.simulator.app import Simulator
from proxy.common.stats import quantile

from .analysis_fixture import build_fixture_db
from .cli_traffic import daily_mix
from .conftest import rows

GENERATIONS = Filters(kinds=("generation",))
ROUNDS = 3


@pytest.fixture
async def recorded(sim: Simulator, proxy: RunningProxy) -> list[dict[str, Any]]:
    """Three rounds of each CLI's traffic: 21 rows, 9 of them generations."""
    await daily_mix(proxy.url, rounds=ROUNDS)
    return rows(proxy)


def percentiles(values: list[float]) -> dict[int, float | None]:
    ordered = sorted(values)
    return {p: quantile(ordered, p / 100) for p in (50, 90, 99)}


async def test_report_percentiles_are_those_of_the_generations_alone(proxy: RunningProxy, recorded) -> None:
    source = ServeSource(proxy.admin)
    built = await asyncio.to_thread(report_mod.build_report, source, "model", GENERATIONS)
    generations = [r for r in recorded if r["kind"] == "generation"]
    assert built.requests == len(generations) == 3 * ROUNDS
    assert built.not_shown == {"model_list": ROUNDS, "prewarm": ROUNDS, "probe": ROUNDS, "token_count": ROUNDS}
    groups = {g["model"]: g for g in built.groups}
    assert set(groups) == {"claude-sonnet-4-5", "gpt-5-codex", "gpt-5-mini"}
    for model, group in groups.items():
        mine = [r for r in generations if r["request_model"] == model and r["outcome"] == "ok"]
        ttft = percentiles([r["ttft_ms"] for r in mine if r["stream"] and r["ttft_ms"] is not None])
        e2e = percentiles([r["e2e_ms"] for r in mine])
        assert group["requests"] == ROUNDS
        for p in (50, 90, 99):
            assert group[f"ttft_p{p}_ms"] == pytest.approx(ttft[p]) and ttft[p] is not None
        for p in (50, 99):
            assert group[f"e2e_p{p}_ms"] == pytest.approx(e2e[p])
    # what the fix is for: Claude Code's token counts (1-5 ms) share the model's name
    everything = await asyncio.to_thread(report_mod.build_report, source, "model", Filters())
    claude = next(g for g in everything.groups if g["model"] == "claude-sonnet-4-5")
    assert claude["requests"] == 2 * ROUNDS and claude["e2e_p50_ms"] < groups["claude-sonnet-4-5"]["e2e_p50_ms"]

    text = report_mod.to_table(built)
    assert text.startswith(f"{3 * ROUNDS} generations from ")
    assert f"not shown: {ROUNDS} model_list, {ROUNDS} prewarm, {ROUNDS} probe, {ROUNDS} token_count" in text
    codex = re.search(r"^gpt-5-codex +\d+ +\S+ +(\S+) +(\S+) +(\S+) ", text, re.M)
    assert codex is not None and "-" not in codex.groups()  # Codex's WebSocket turns have a TTFT

    by_kind = await asyncio.to_thread(report_mod.build_report, source, "kind", Filters())
    assert {g["kind"]: g["requests"] for g in by_kind.groups} == {
        "generation": 3 * ROUNDS, "token_count": ROUNDS, "probe": ROUNDS, "prewarm": ROUNDS, "model_list": ROUNDS}


async def test_websocket_ttft_in_the_html_report(proxy: RunningProxy, recorded) -> None:
    source = ServeSource(proxy.admin)
    data = await asyncio.to_thread(fetch_report_data, source.query, GENERATIONS.where())
    summary = {row["model"]: row for row in data["summary"]}
    assert summary["gpt-5-codex"]["ttft_ms"][0] is not None and summary["gpt-5-codex"]["requests"] == ROUNDS
    cdf = {row["model"]: row for row in data["cdf"]}
    assert cdf["gpt-5-codex"]["ttft_ms"] is not None
    assert data["totals"]["requests"] == 3 * ROUNDS  # the charts are generations too
    page = await asyncio.to_thread(render_html, source.query, GENERATIONS.where(), "llmtap report: generations")
    assert "kind IN (&#x27;generation&#x27;)" in page or "kind IN ('generation')" in page


async def test_websocket_ttft_and_kinds_in_top(proxy: RunningProxy, recorded) -> None:
    lines = [line.text for line in await top_run.once(proxy.admin, 300.0)]
    text = "\n".join(lines)
    assert re.search(rf"^finished {3 * ROUNDS} ", text, re.M), text
    assert re.search(rf"^errors 5m  none   \(ok {3 * ROUNDS}\)   {4 * ROUNDS} other kinds not shown \(--all\)$",
                     text, re.M), text
    codex = re.search(r"^gpt-5-codex +(\d+) +\d+ +(\S+) +(\S+) ", text, re.M)
    assert codex is not None and codex.group(1) == str(ROUNDS) and "-" not in codex.groups()[1:], text
    everything = "\n".join(line.text for line in await top_run.once(proxy.admin, 300.0, kinds=()))
    assert re.search(rf"^finished {7 * ROUNDS}\b", everything, re.M), everything


async def test_errors_lists_no_successful_request(proxy: RunningProxy, recorded) -> None:
    source = ServeSource(proxy.admin)
    built = await asyncio.to_thread(build_error_report, source, Filters())
    assert (built.requests, built.failed, built.groups) == (7 * ROUNDS, 0, [])
    assert built.empty_choices == (ROUNDS, ROUNDS)  # each include_usage stream's final usage chunk
    text = errors_table(built)
    assert text.startswith(f"0 failed of {7 * ROUNDS} requests (0.0%)")
    assert f"note: {ROUNDS} successful streams had {ROUNDS} chunks with empty" in text
    assert " ok " not in text and "no key sent" not in text


async def test_ids_tell_rows_apart_and_show_prints_one_whole(proxy: RunningProxy, recorded) -> None:
    assert len({r["id"][:8] for r in recorded}) == len(recorded)
    source = ServeSource(proxy.admin)
    built = await asyncio.to_thread(report_mod.build_report, source, "model", Filters())
    slowest = report_mod.to_table(built).split("slowest requests\n", 1)[1].splitlines()[2:7]
    shown_ids = [line.split()[0] for line in slowest]
    assert len(set(shown_ids)) == 5 and all(len(i) == 8 for i in shown_ids)

    turn = next(r for r in recorded if r["tool"] == "codex" and r["kind"] == "generation")
    shown = await asyncio.to_thread(show_mod.find, source, turn["id"][:8])
    assert shown.row["id"] == turn["id"] and len(shown.chunks) == turn["output_events"] > 0
    text = show_mod.to_text(shown)
    assert text.startswith(f"request {turn['id']}\n  GET /v1/responses  generation  openai_responses  stream\n")
    assert re.search(r"^  first token +\|=+ +\d+ms$", text, re.M)
    assert re.search(rf"^  events +\|[ ▁▂▃▄▅▆▇█]+ +{turn['output_events']}$", text, re.M)
    assert re.search(r"^  kind +generation$", text, re.M)


@pytest.fixture(scope="module")
def fixture_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("show") / "fixture.duckdb"
    build_fixture_db(path)
    return path


def test_show_takes_any_unique_prefix(fixture_db: Path) -> None:
    import duckdb

    con = duckdb.connect(str(fixture_db), read_only=True)
    ids = [i for (i,) in con.execute("SELECT id FROM requests WHERE outcome = 'http_error' ORDER BY id").fetchall()]
    every = [i for (i,) in con.execute("SELECT id FROM requests").fetchall()]
    con.close()
    done = CliRunner().invoke(main, ["show", "--db", str(fixture_db), ids[0][:6].upper()])
    assert done.exit_code == 0, done.output
    assert done.output.startswith(f"request {ids[0]}\n") and "\n  error " in done.output
    whole = CliRunner().invoke(main, ["show", "--db", str(fixture_db), ids[0], "--format", "json"])
    assert whole.exit_code == 0 and f'"id": "{ids[0]}"' in whole.output
    for wrong, said in (("", "is not a request id"), ("zz'; DROP", "is not a request id"),
                        ("ffffffffffff", "no request id starts with ffffffffffff")):
        done = CliRunner().invoke(main, ["show", "--db", str(fixture_db), wrong])
        assert done.exit_code == 1 and said in done.output, done.output
    # one hex digit matches several rows: the error lists them by the prefixes that tell them apart
    common = next(c for c in "0123456789abcdef" if sum(i.startswith(c) for i in every) >= 2)
    done = CliRunner().invoke(main, ["show", "--db", str(fixture_db), common])
    assert "requests (" in done.output and "give more of the id" in done.output
