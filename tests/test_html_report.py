"""The HTML report: self-contained, right data, escaped, and drawn by a real browser."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from pathlib import Path

import duckdb
import orjson
import pytest

from analysis.filters import Filters
from analysis.html.queries import (CDF_QUANTILES, CHART_MODELS, COST_BARS, HISTOGRAM_BINS, SCATTER_POINTS,
                                   TIME_BUCKETS, Query)
from analysis.html.report import render_html
from analysis.source import open_source
from .analysis_fixture import build_fixture_db
from .browser import Chromium, find_chromium
from proxy.common.schema import create_tables_sql



def duckdb_query(con: duckdb.DuckDBPyConnection) -> Query:
    """A `query` callable over a DuckDB connection: (columns, type names, rows)."""

    def run(sql: str) -> tuple[list[str], list[str], list[tuple]]:
        cursor = con.execute(sql)
        description = cursor.description or []
        return [d[0] for d in description], [str(d[1]) for d in description], cursor.fetchall()

    return run


XSS_MODEL = "<script>alert(1)</script><img src=x onerror=alert(3)>"
XSS_MESSAGE = "Rate limit <img src=x onerror=alert(2)> reached"
# model, TTFT at 0 input tokens (ms), TTFT per input token (ms), TPOT (ms)
MODELS = (
    ("gpt-4o-mini", 180.0, 0.05, 12.0),
    ("claude-sonnet-4", 420.0, 0.12, 22.0),
    ("llama-3.1-8b-local", 40.0, 0.40, 8.0),
    (XSS_MODEL, 250.0, 0.20, 15.0),
)
REQUESTS = 800
CHART_COUNT = 8
NARROW = 600

# Request i goes to model i % 4, every 6 s; every 13th is a 429, every 29th an upstream timeout.
# The noise is a fixed permutation, so every run builds the same rows.
FIXTURE_SQL = f"""
INSERT INTO requests (id, started_at, request_model, stream, status, outcome, error_type, error_message,
    ttft_ms, tpot_ms, e2e_ms, output_tokens_per_s, input_tokens, output_tokens, tool, tag)
SELECT 'req-' || i, TIMESTAMPTZ '2025-06-01 12:00:00+00' + to_seconds(i * 6), m.name, true,
    CASE WHEN i % 13 = 0 THEN 429 WHEN i % 29 = 0 THEN NULL ELSE 200 END,
    CASE WHEN i % 13 = 0 THEN 'http_error' WHEN i % 29 = 0 THEN 'upstream_timeout' ELSE 'ok' END,
    CASE WHEN i % 13 = 0 THEN 'rate_limit_error' END,
    CASE WHEN i % 13 = 0 THEN $${XSS_MESSAGE}$$ END,
    CASE WHEN i % 13 <> 0 THEN m.base + m.slope * inp + noise * 60 END,
    m.tpot * (0.8 + 0.4 * noise),
    m.base + m.slope * inp + noise * 60 + m.tpot * (0.8 + 0.4 * noise) * outp,
    1000.0 / (m.tpot * (0.8 + 0.4 * noise)),
    inp, outp, 'codex', 'fixture'
FROM (SELECT i, ((i * 7919) % 1000) / 1000.0 AS noise, 200 + ((i * 104729) % 16000) AS inp,
        50 + ((i * 31) % 400) AS outp FROM range({REQUESTS}) r(i)) s
JOIN (VALUES {", ".join(f"({k}, $${n}$$, {b}, {sl}, {t})" for k, (n, b, sl, t) in enumerate(MODELS))})
    m(k, name, base, slope, tpot) ON s.i % 4 = m.k;
INSERT INTO chunks SELECT 'req-' || i, j, 100.0 + j * 10, 40, 'delta' FROM range({REQUESTS}) r(i), range(5) c(j);
"""


def fixture_db() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute(create_tables_sql())
    con.execute(FIXTURE_SQL)
    return con


@pytest.fixture(scope="module")
def report() -> str:
    con = fixture_db()
    try:
        return render_html(duckdb_query(con))
    finally:
        con.close()


def embedded_data(page: str) -> dict:
    match = re.search(r'<script type="application/json" id="llmtap-data">(.*?)</script>', page, re.S)
    assert match, "no embedded chart data"
    return orjson.loads(match.group(1))


def charts_by_id(page: str) -> dict[str, dict]:
    """The charts with data (those drawn; the others are a card saying so)."""
    return {chart["id"]: chart for chart in embedded_data(page)["charts"] if chart["series"]}


def summary_requests(page: str) -> dict[str | None, int]:
    """The table per model's request counts, by model (None: the total row), from the embedded data."""
    return {row["model"]: row["requests"] for row in embedded_data(page)["summary"]}


def test_report_is_self_contained(report: str) -> None:
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", report, re.I)
    assert not re.search(r"<link\b|@import|url\(\s*['\"]?(https?:)?//", report, re.I)
    assert "uPlot" in report and ".u-legend" in report  # the library and its CSS are inline
    assert report.count("<script") == 3


ERRORS = sum(1 for i in range(REQUESTS) if i % 13 == 0 or i % 29 == 0)


def test_summary_table_has_every_model_and_the_totals(report: str) -> None:
    assert summary_requests(report) == {**{name: 200 for name, *_ in MODELS}, None: REQUESTS}
    assert embedded_data(report)["totals"]["errors"] == ERRORS


def test_charts_carry_the_data(report: str) -> None:
    charts = charts_by_id(report)
    assert len(charts) == CHART_COUNT
    scatter = charts["ttft-input"]["series"]
    assert sorted(s["label"] for s in scatter) == sorted(name for name, *_ in MODELS)
    ok_per_model = sum(1 for i in range(REQUESTS) if i % 13 and i % 29) / len(MODELS)
    assert abs(sum(len(s["x"]) for s in scatter) / len(scatter) - ok_per_model) < 5
    assert {s["label"] for s in charts["errors"]["series"]} == {name for name, *_ in MODELS}
    assert charts["errors"]["categories"] == ["HTTP 429", "upstream_timeout"]


def test_scatter_fits_recover_each_models_prefill_slope(report: str) -> None:
    fits = {s["label"]: s["fit"] for s in charts_by_id(report)["ttft-input"]["series"]}
    for name, base, slope, _ in MODELS:
        intercept, per_1k = fits[name]
        assert per_1k == pytest.approx(1000 * slope, rel=0.1)
        assert intercept == pytest.approx(base + 30, abs=40)  # the noise adds 30 ms on average


def test_model_names_and_messages_are_escaped(report: str) -> None:
    """In the file only as JSON with `<` escaped (the browser test sees them drawn as text)."""
    assert XSS_MODEL not in report and XSS_MESSAGE not in report
    assert "<img" not in report
    data = embedded_data(report)
    assert XSS_MODEL in summary_requests(report) and XSS_MESSAGE in {r["example"] for r in data["error_table"]}
    assert XSS_MODEL in {s["label"] for s in charts_by_id(report)["cdf-ttft_ms"]["series"]}


def test_filter_narrows_the_report() -> None:
    con = fixture_db()
    page = render_html(duckdb_query(con), where="request_model = 'gpt-4o-mini'", title="gpt <only>")
    assert "<title>gpt &lt;only&gt;</title>" in page
    assert "Filter: <code>request_model = &#x27;gpt-4o-mini&#x27;</code>" in page
    assert {s["label"] for s in charts_by_id(page)["ttft-input"]["series"]} == {"gpt-4o-mini"}
    assert summary_requests(page)[None] == 200


@pytest.mark.parametrize("where", ["TRUE", "started_at < TIMESTAMPTZ '2000-01-01 00:00:00+00'"])
def test_nothing_to_report_says_so(where: str) -> None:
    con = duckdb.connect()
    con.execute(create_tables_sql())
    if where != "TRUE":
        con.execute(FIXTURE_SQL)
    data = embedded_data(render_html(duckdb_query(con), where=where))
    assert data["totals"]["requests"] == 0 and data["charts"] == [] and data["filtered"] == (where != "TRUE")


def test_scatter_is_sampled_to_a_bound() -> None:
    con = duckdb.connect()
    con.execute(create_tables_sql())
    con.execute(f"""INSERT INTO requests (id, started_at, request_model, stream, outcome, ttft_ms, input_tokens)
        SELECT 'r' || i, TIMESTAMPTZ '2025-06-01 00:00:00+00' + to_seconds(i), 'big', true, 'ok', 100 + i % 97, i
        FROM range({SCATTER_POINTS + 1500}) r(i)""")
    [series] = charts_by_id(render_html(duckdb_query(con)))["ttft-input"]["series"]
    assert len(series["x"]) == SCATTER_POINTS


# Two years of requests from 15 models, each model with its own error status: more models, days, statuses
# and requests than any chart draws. Every 3rd request streams; gpt-4o-mini's have a price.
BIG_STORE_SQL = """
INSERT INTO requests (id, started_at, request_model, kind, stream, status, outcome, ttft_ms, tpot_ms, e2e_ms,
    output_tokens_per_s, input_tokens, output_tokens, upstream_host)
SELECT 'big-' || i, TIMESTAMPTZ '2024-01-01 00:00:00+00' + to_seconds(i * 1051),
    CASE WHEN i % 15 = 0 THEN 'gpt-4o-mini' ELSE 'model-' || i % 15 END,
    'generation', i % 3 = 0, CASE WHEN i % 11 = 0 THEN 400 + i % 15 ELSE 200 END,
    CASE WHEN i % 11 = 0 THEN 'http_error' ELSE 'ok' END, 100 + i % 997, 5 + i % 31, 900 + i % 4001,
    20 + i % 89, 1000 + i % 5003, 50 + i % 701, 'api.openai.com'
FROM range({n}) r(i)"""


def chart_points(db: Path, n: int) -> dict[str, int]:
    con = duckdb.connect(str(db))
    con.execute(create_tables_sql())
    con.execute(BIG_STORE_SQL.format(n=n))
    con.close()
    source = open_source(db)
    try:
        charts = charts_by_id(render_html(source.query))
    finally:
        source.close()
    assert all(len(c["series"]) <= CHART_MODELS + 1 for c in charts.values())
    return {chart_id: max((len(s["x"]) for s in c["series"]), default=0) for chart_id, c in charts.items()}


def test_charts_data_stays_bounded_on_a_bigger_store(tmp_path: Path) -> None:
    """Points per series do not grow with the store: a sample, quantiles, time buckets, bins, a few dozen bars."""
    bounds = {"ttft-input": SCATTER_POINTS, "cdf-ttft_ms": len(CDF_QUANTILES), "cdf-tpot_ms": len(CDF_QUANTILES),
              "cdf-e2e_ms": len(CDF_QUANTILES), "time-ttft_ms": TIME_BUCKETS, "time-tpot_ms": TIME_BUCKETS,
              "tokens-per-s": HISTOGRAM_BINS + 1, "errors": 12, "cost-per-day": COST_BARS}
    small, big = chart_points(tmp_path / "small.duckdb", 60_000), chart_points(tmp_path / "big.duckdb", 120_000)
    assert small.keys() == big.keys() == bounds.keys()
    assert {c: n for c, n in big.items() if n > bounds[c]} == {}
    assert big["ttft-input"] == small["ttft-input"] == SCATTER_POINTS  # the sample's size, whatever the store's


# --- in a real browser -------------------------------------------------------------

CHROMIUM = find_chromium()
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary found")

# Per chart canvas: how many pixels are clearly coloured (series), not grey (axes, grid) or blank.
COLOURED_PIXELS_JS = """
Array.from(document.querySelectorAll('.chart canvas')).map(c => {
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let n = 0;
  for (let i = 0; i < d.length; i += 4)
    if (d[i + 3] > 0 && Math.max(d[i], d[i + 1], d[i + 2]) - Math.min(d[i], d[i + 1], d[i + 2]) > 60) n++;
  return n;
})
"""
CHART_CENTRES_JS = """
Array.from(document.querySelectorAll('.chart .u-over')).map(el => {
  el.scrollIntoView({block: 'center'});
  const r = el.getBoundingClientRect();
  return [r.left + r.width / 2, r.top + r.height / 2];
})
"""


CANVAS_WIDTHS_JS = "Array.from(document.querySelectorAll('.chart canvas')).map(c => c.getBoundingClientRect().width)"
LEGENDS_JS = "Array.from(document.querySelectorAll('.u-legend')).map(l => l.textContent)"
NEXT_FRAME_JS = "new Promise(r => requestAnimationFrame(() => setTimeout(r, 50)))"
# The table per model as drawn: its model cell's text, then each cell's raw value
SUMMARY_JS = """[...document.querySelectorAll('table.summary tbody tr')].map(tr =>
  [tr.children[0].textContent, ...[...tr.children].slice(1).map(td => td.dataset.value)])"""


async def browse(page_html: str, tmp_path: Path, name: str) -> tuple[Chromium, dict]:
    """Open the page, wait for its charts, hover each one, narrow the window; return what was seen."""
    path = tmp_path / f"{name}.html"
    path.write_text(page_html, encoding="utf-8")
    async with asyncio.timeout(60), Chromium(CHROMIUM, width=1400, height=1000) as browser:
        await browser.open(path.as_uri())
        with contextlib.suppress(TimeoutError):  # the asserts say what did not happen
            await browser.wait_for("window.__llmtapChartsDrawn === window.__llmtapChartsExpected", 10)
        seen = {
            "expected": await browser.evaluate("window.__llmtapChartsExpected"),
            "drawn": await browser.evaluate("window.__llmtapChartsDrawn"),
            "pixels": await browser.evaluate(COLOURED_PIXELS_JS),
            "scripts": await browser.evaluate("document.scripts.length"),
            "legend": await browser.evaluate(LEGENDS_JS),
            "summary": await browser.evaluate(SUMMARY_JS),
            "text": await browser.evaluate("document.body.innerText"),
            "elements": await browser.evaluate("document.querySelectorAll('img, main script, iframe').length"),
        }
        for x, y in await browser.evaluate(CHART_CENTRES_JS):
            await browser.evaluate(NEXT_FRAME_JS)
            await browser.mouse_move(x, y)
        await browser.evaluate(NEXT_FRAME_JS)
        if shots := os.environ.get("LLMTAP_SCREENSHOTS"):
            await browser.screenshot(Path(shots) / f"{name}.png")
        await browser.resize(NARROW, 900)  # a phone: one column, and the charts follow
        with contextlib.suppress(TimeoutError):
            await browser.wait_for(f"{CANVAS_WIDTHS_JS}.every(w => w <= {NARROW})", 5)
        seen["narrow_widths"] = await browser.evaluate(CANVAS_WIDTHS_JS)
    return browser, seen


@needs_chromium
async def test_every_chart_draws_in_chromium_without_errors(report: str, tmp_path: Path) -> None:
    browser, seen = await browse(report, tmp_path, "report")
    assert browser.errors == []
    assert browser.dialogs == []
    assert seen["expected"] == seen["drawn"] == CHART_COUNT
    assert len(seen["pixels"]) == CHART_COUNT
    assert all(n > 300 for n in seen["pixels"]), seen["pixels"]
    assert seen["scripts"] == 3
    assert any(XSS_MODEL in text for text in seen["legend"])  # reached the page as text
    assert {row[0]: int(row[1]) for row in seen["summary"]} == {**{name: 200 for name, *_ in MODELS},
                                                                "All models": REQUESTS}
    assert f"{ERRORS} ({100 * ERRORS / REQUESTS:.1f}%)" in seen["text"] and XSS_MESSAGE in seen["text"]
    assert seen["elements"] == 0  # the hostile names and messages made no element
    assert all(url.startswith("file://") for url in browser.requested), browser.requested
    assert len(seen["narrow_widths"]) == CHART_COUNT
    assert all(200 < w <= NARROW for w in seen["narrow_widths"]), seen["narrow_widths"]


ONE_REQUEST_SQL = """INSERT INTO requests (id, started_at, request_model, stream, status, outcome,
    ttft_ms, tpot_ms, e2e_ms, output_tokens_per_s, input_tokens, output_tokens)
    VALUES ('only', TIMESTAMPTZ '2025-06-01 12:00:00+00', 'solo', true, 200, 'ok', 300, 10, 1290, 77.5, 1000, 100)"""


@needs_chromium
@pytest.mark.parametrize(("rows_sql", "charts"), [("", 0), (ONE_REQUEST_SQL, CHART_COUNT - 1)], ids=["empty", "one"])
async def test_tiny_reports_open_without_errors(rows_sql: str, charts: int, tmp_path: Path) -> None:
    """No requests: a page that says so. One request: every chart but the errors one draws."""
    con = duckdb.connect()
    con.execute(create_tables_sql())
    if rows_sql:
        con.execute(rows_sql)
    browser, seen = await browse(render_html(duckdb_query(con)), tmp_path, f"tiny-{charts}")
    assert browser.errors == []
    assert seen["expected"] == seen["drawn"] == charts
    assert ("No requests match this selection" in seen["text"]) == (charts == 0)
    assert len(seen["pixels"]) == charts
    assert all(n > 0 for n in seen["pixels"]), seen["pixels"]


# Two models, 12 minutes: m-neg's TTFT falls as its input grows (a negative "prefill" slope); one 429.
SMALL_SQL = """INSERT INTO requests (id, started_at, request_model, stream, status, outcome,
    ttft_ms, tpot_ms, e2e_ms, output_tokens_per_s, input_tokens, output_tokens)
SELECT 'small-' || i, TIMESTAMPTZ '2025-06-01 12:00:00+00' + to_seconds(i * 60),
    CASE WHEN i % 2 = 0 THEN 'm-neg' ELSE 'm-b' END, true,
    CASE WHEN i = 5 THEN 429 ELSE 200 END, CASE WHEN i = 5 THEN 'http_error' ELSE 'ok' END,
    CASE WHEN i % 2 = 0 THEN 1000 - 20 * i ELSE 300 + 5 * i END, 10, 2000, 50, 1000 * (i + 1), 100
FROM range(24) r(i)"""


@needs_chromium
async def test_counts_have_whole_ticks_legends_no_dashes_and_a_negative_slope_a_caveat(tmp_path: Path) -> None:
    con = duckdb.connect()
    con.execute(create_tables_sql())
    con.execute(SMALL_SQL)
    page = render_html(duckdb_query(con))
    assert "A line falling to the right is no prefill cost" in page
    path = tmp_path / "small.html"
    path.write_text(page, encoding="utf-8")
    async with asyncio.timeout(60), Chromium(CHROMIUM, width=1400, height=1000) as browser:
        await browser.open(path.as_uri())
        await browser.wait_for("window.__llmtapChartsDrawn === window.__llmtapChartsExpected", 10)
        ticks = await browser.evaluate("window.__llmtapYTicks.errors")
        for x, y in await browser.evaluate(CHART_CENTRES_JS):
            await browser.evaluate(NEXT_FRAME_JS)
            await browser.mouse_move(x, y)
            await browser.evaluate(NEXT_FRAME_JS)
        legends = await browser.evaluate(LEGENDS_JS)
        text = await browser.evaluate("document.body.innerText")
        prefill = await browser.evaluate("document.querySelector('tr[data-model=\"m-neg\"] td:nth-child(12)').title")
    assert "* negative: TTFT did not grow with input here" in text and prefill.startswith("* negative")
    assert ticks and all(t.isdigit() for t in ticks), ticks  # one 429: ticks 0 and 1, never 0.5
    assert legends and not [text for text in legends if "--" in text], legends


def test_renders_through_the_cli_source_and_filters(tmp_path: Path) -> None:
    """The way `llmtap report --html` calls it: a read-only `Source` (views shadow the table)."""
    build_fixture_db(tmp_path / "fixture.duckdb")
    source = open_source(tmp_path / "fixture.duckdb")
    try:
        everything = render_html(source.query)
        one_tool = render_html(source.query, where=Filters(tools=("codex",)).where())
    finally:
        source.close()
    charts = charts_by_id(everything)
    assert len(charts) == CHART_COUNT + 1  # with the views, the cost per day too
    cost = charts["cost-per-day"]
    assert cost["categories"] == ["2026-11-28", "2026-11-29", "2026-11-30"] and cost["counts"] is False
    _, _, (total,) = source_rows(tmp_path / "fixture.duckdb", "SELECT sum(cost_usd) FROM requests")
    assert sum(sum(s["y"]) for s in cost["series"]) == pytest.approx(total[0], rel=1e-5)
    assert summary_requests(everything)[None] == 31
    assert "Filter: <code>tool IN (&#x27;codex&#x27;)</code>" in one_tool


def source_rows(db: Path, sql: str) -> tuple[list[str], list[str], list[tuple]]:
    source = open_source(db)
    try:
        return source.query(sql)
    finally:
        source.close()


def test_report_html_option_writes_the_page(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from proxy.cli import main

    db = tmp_path / "fixture.duckdb"
    build_fixture_db(db)
    out = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["report", "--db", str(db), "--html", str(out), "--tag", "no-such-tag"])
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") or page.lower().startswith("<!doctype html>")
    assert "uPlot" in page and "https://" not in page.split("</style>")[0]
