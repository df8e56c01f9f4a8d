"""`render_html`: the whole report as one self-contained HTML file, drawn by the web UI's Overview
renderer (`static/report.js`) from the data it embeds.

The file needs no network: the chart library, its CSS, the page's own script and
the data (JSON, written with orjson) are all inline. Its size is bounded whatever
the database holds: per-model quantile lists for the CDFs, at most 200 time
buckets per series, a hashed sample of at most 2,000 requests per model for the
scatter, at most 62 cost bars (of a day, a week, 30 days or more), and charts for
the 12 busiest models (`analysis.html.queries`).

Charts are drawn with uPlot 1.6 (MIT, vendored in `analysis/static/`): about
50 KB minified with no dependencies, which keeps a report near 100 KB where
Plotly (~3.5 MB) or ECharts (~1 MB) would dominate the file; it draws on a
canvas, so tens of thousands of points stay fast; and it does what the report
needs (scatter, lines, steps, bars, time axes, live legends). Chart.js (~200 KB)
was the runner-up: prettier defaults, four times the size, slower on big scatters.

After drawing, the page sets `window.__llmtapChartsDrawn` to the number of
charts drawn (and `window.__llmtapChartsExpected` to the number it meant to
draw), so a headless browser can check it; `window.__llmtapYTicks` holds each
chart's y axis labels as last drawn (counts get whole-number ticks only).
"""

from __future__ import annotations

from collections.abc import Callable

from analysis.breakdown import build_breakdown, html_panel
from analysis.html.charts import build_charts
from analysis.html.page import report_page
from analysis.html.queries import fetch_report_data
from analysis.session_report import HTML_SESSIONS, html_panel as session_panel
from analysis.timeline import latest


def render_html(
    query: Callable[[str], tuple[list[str], list[str], list[tuple]]],
    where: str = "TRUE",
    title: str = "llmtap report",
    by: tuple[str, str] = ("route", "route"),
    counted: str = "requests",
) -> str:
    """The report over the requests matching `where` (an SQL predicate on `requests`); its TTFT
    breakdown grouped by `by` (a name and its SQL expression, as `report.GROUPINGS`)."""
    data = fetch_report_data(query, where)
    if not data["totals"]["requests"]:
        return report_page(title, where, data, [], counted=counted)
    panel = html_panel(build_breakdown(query, by[0], by[1], where=where))
    return report_page(title, where, data, build_charts(data), panels=panel + session_panel(latest(query, where, HTML_SESSIONS)), counted=counted)
