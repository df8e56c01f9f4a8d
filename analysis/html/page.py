"""The HTML around the charts: header, summary and error tables, chart cards, inlined assets.

Every value that comes from the database goes through `html.escape` here, or
through `textContent` in `static/report.js`; the chart data is embedded as JSON
in a `<script type="application/json">` block with `<`, `>` and `&` escaped, so
no string in it can close the block.
"""

from __future__ import annotations

import html
from datetime import UTC, datetime
from importlib import resources
from typing import Any

import orjson

from analysis.html.formats import html_count, html_ms, html_pct, html_rate, html_span, html_tokens

PALETTE = (
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948",
    "#b07aa1", "#ff9da7", "#9c755f", "#17becf", "#bcbd22", "#6b6ecf",
)  # fmt: skip
OTHER = "#9aa0a6"


def asset(name: str) -> str:
    return resources.files("analysis").joinpath("static", name).read_text(encoding="utf-8")


def inline_script(source: str) -> str:
    return "<script>" + source.replace("</", "<\\/") + "</script>"


def json_block(value: Any) -> str:
    text = orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY).decode()
    text = text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
    return f'<script type="application/json" id="llmtap-data">{text}</script>'


def swatch(color_index: int) -> str:
    color = PALETTE[color_index] if 0 <= color_index < len(PALETTE) else OTHER
    return f'<span class="swatch" style="background:{color}"></span>'


def header(title: str, where: str, totals: dict[str, Any]) -> str:
    e = html.escape
    parts = [f"<header><h1>{e(title)}</h1>"]
    if totals["requests"]:
        parts.append(time_range(totals["first_s"], totals["last_s"]))
        parts.append(kpis(totals))
    if where.strip().upper() != "TRUE":
        parts.append(f'<p class="filter">Filter: <code>{e(where)}</code></p>')
    parts.append("</header>")
    return "".join(parts)


def time_range(first: float | None, last: float | None) -> str:
    if first is None or last is None:
        return ""

    def stamp(seconds: float) -> str:
        return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S")

    span = f'<span class="muted">({html_span(last - first)})</span>'
    return f'<p class="range">{stamp(first)} &rarr; {stamp(last)} UTC {span}</p>'


def kpis(totals: dict[str, Any]) -> str:
    error_pct = html_pct(100 * totals["errors"] / totals["requests"])
    items = (
        ("Requests", html_count(totals["requests"])),
        ("Errors", f"{html_count(totals['errors'])} ({error_pct})"),
        ("Models", html_count(totals["models"])),
        ("Input tokens", html_tokens(totals["input_tokens"])),
        ("Output tokens", html_tokens(totals["output_tokens"])),
    )
    cells = "".join(
        f'<div class="kpi"><div class="kpi-v">{value}</div><div class="kpi-k">{name}</div></div>'
        for name, value in items
    )
    return f'<div class="kpis">{cells}</div>'


SUMMARY_HEAD = (
    ("Model", ""), ("Requests", ""), ("Errors", ""),
    ("TTFT p50", "ms"), ("p90", "ms"), ("p99", "ms"),
    ("TPOT p50", "ms"), ("p99", "ms"),
    ("E2E p50", "ms"), ("p99", "ms"),
    ("Tokens/s", "median"), ("Prefill", "ms / 1k in"),
    ("Input", "tokens"), ("Output", "tokens"),
)  # fmt: skip


NEGATIVE_SLOPE = ("* negative: TTFT did not grow with input here (prompt caching, or too little spread in"
                  " input sizes); not a prefill cost.")


def summary_table(rows: list[dict[str, Any]]) -> str:
    head = "".join(f"<th>{name}<small>{unit}</small></th>" for name, unit in SUMMARY_HEAD)
    body = "".join(summary_row(row, i) for i, row in enumerate(rows))
    negative = any((row["ttft_ms_per_1k_input"] or 0) < 0 for row in rows)
    return (
        '<section class="panel"><h2>Per model</h2>'
        '<p class="note">Latencies and tokens/s over successful requests (TTFT over streams); '
        "errors are every outcome but <code>ok</code>; prefill is the TTFT slope against input tokens."
        + (f" {NEGATIVE_SLOPE}" if negative else "") + "</p>"
        f'<div class="scroll"><table class="num"><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table></div></section>"
    )


def summary_row(row: dict[str, Any], index: int) -> str:
    if row["model"] is None:
        name, css = "All models", ' class="total"'
    else:
        name, css = swatch(index) + html.escape(row["model"]), ""
    ttft, tpot, e2e = (row[k] or [None] * 3 for k in ("ttft_ms", "tpot_ms", "e2e_ms"))
    cells = (
        html_count(row["requests"]), html_pct(row["error_pct"]),
        html_ms(ttft[0]), html_ms(ttft[1]), html_ms(ttft[2]),
        html_ms(tpot[0]), html_ms(tpot[1]), html_ms(e2e[0]), html_ms(e2e[1]),
        html_rate(row["tokens_per_s"]), html_slope(row["ttft_ms_per_1k_input"]),
        html_tokens(row["input_tokens"]), html_tokens(row["output_tokens"]),
    )  # fmt: skip
    return f'<tr{css}><th scope="row">{name}</th>' + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def html_slope(ms_per_1k: float | None) -> str:
    """The prefill slope; a negative one is marked (see NEGATIVE_SLOPE)."""
    text = html_ms(ms_per_1k)
    return f'<span title="{html.escape(NEGATIVE_SLOPE)}">{text}*</span>' if ms_per_1k is not None and ms_per_1k < 0 else text


def error_table(rows: list[dict[str, Any]], total: int) -> str:
    if not rows:
        return ""
    e = html.escape
    body = "".join(
        f"<tr><td>{e(r['outcome'])}</td><td>{'' if r['status'] is None else r['status']}</td>"
        f"<td>{e(r['error_type'] or '')}</td><td class=\"n\">{html_count(r['n'])}</td>"
        f"<td class=\"n\">{html_pct(100 * r['n'] / total)}</td><td class=\"n\">{r['models']}</td>"
        f"<td class=\"msg\">{e(r['example'] or '')}</td></tr>"
        for r in rows
    )
    head = (
        "<tr><th>Outcome</th><th>Status</th><th>Error type</th><th class=\"n\">Requests</th>"
        "<th class=\"n\">Share</th><th class=\"n\">Models</th><th>Example message</th></tr>"
    )
    return (
        '<section class="panel"><h2>Errors</h2>'
        f'<div class="scroll"><table class="errors"><thead>{head}</thead><tbody>{body}</tbody></table></div></section>'
    )


def chart_card(chart: dict[str, Any]) -> str:
    e = html.escape
    inner = (
        f'<div class="chart" id="chart-{e(chart["id"])}"></div>'
        if chart["series"]
        else '<div class="empty">No data for this chart in this selection.</div>'
    )
    note = f'<p class="note">{e(chart["note"])}</p>' if chart["note"] else ""
    return f'<figure class="card"><figcaption><h2>{e(chart["title"])}</h2>{note}</figcaption>{inner}</figure>'


def page(title: str, body: str, scripts: str) -> str:
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title>"
        f"<style>{asset('uPlot.min.css')}\n{asset('report.css')}</style></head>"
        f"<body>{body}{scripts}</body></html>"
    )


def report_page(title: str, where: str, data: dict[str, Any], charts: list[dict[str, Any]],
                panels: str = "") -> str:
    """`panels`: more sections after the summary table, as HTML (the TTFT breakdown)."""
    totals = data["totals"]
    drawable = [c for c in charts if c["series"]]
    body = (
        header(title, where, totals)
        + "<main>"
        + summary_table(data["summary"])
        + panels
        + '<section class="grid">'
        + "".join(chart_card(c) for c in charts)
        + "</section>"
        + error_table(data["error_table"], totals["requests"])
        + "</main>"
        + footer()
    )
    payload = {"palette": PALETTE, "other": OTHER, "charts": drawable}
    scripts = json_block(payload) + inline_script(asset("uPlot.iife.min.js")) + inline_script(asset("report.js"))
    return page(title, body, scripts)


def empty_page(title: str, where: str, totals: dict[str, Any]) -> str:
    body = (
        header(title, where, totals)
        + '<main><section class="panel nothing"><h2>No requests match this selection</h2>'
        + (
            "<p>No recorded request matches the filter above: widen the time window or drop a filter.</p>"
            if where.strip().upper() != "TRUE"
            else "<p>The database has no requests yet: send some traffic through <code>llmtap serve</code>.</p>"
        )
        + "</section></main>"
        + footer()
    )
    return page(title, body, inline_script("window.__llmtapChartsExpected = 0; window.__llmtapChartsDrawn = 0;"))


def footer() -> str:
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f'<footer>Generated by llmtap on {now} &middot; charts drawn with uPlot (MIT)</footer>'
