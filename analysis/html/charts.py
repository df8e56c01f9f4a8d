"""Chart specs for the HTML report: what `static/report.js` draws, as JSON-ready dicts.

A spec is `{id, kind, title, note, x, y, series}`; each series is
`{label, color, x, y}` with its own x values (the page aligns them for uPlot).
`color` is the model's rank, so a model keeps its colour on every chart.
A chart without data is returned with `series: []` and the page shows a note instead.
"""

from __future__ import annotations

from typing import Any

from analysis.html.queries import CDF_QUANTILES, HISTOGRAM_BINS, SCATTER_POINTS

OTHER_COLOR = -1
P99_INDEX = min(range(len(CDF_QUANTILES)), key=lambda i: abs(CDF_QUANTILES[i] - 0.99))


def model_colors(data: dict[str, Any]) -> dict[str, int]:
    """Colour index per model: its position among the busiest models (the summary's order)."""
    return {row["model"]: i for i, row in enumerate(data["summary"]) if row["model"] is not None}


def group_rows(rows: list[dict[str, Any]], key: str = "model") -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row[key], []).append(row)
    return groups


def spec(chart_id: str, kind: str, title: str, x: str, y: str, note: str, series: list) -> dict[str, Any]:
    return {"id": chart_id, "kind": kind, "title": title, "x": x, "y": y, "note": note, "series": series}


def scatter_chart(data: dict[str, Any], colors: dict[str, int]) -> dict[str, Any]:
    fits = {row["model"]: row for row in data["summary"]}
    series = [
        {
            "label": model,
            "color": colors[model],
            "x": [row["x"] for row in rows],
            "y": [row["y"] for row in rows],
            "fit": [fits[model]["ttft_intercept_ms"], fits[model]["ttft_ms_per_1k_input"]],
        }
        for model, rows in group_rows(data["scatter"]).items()
    ]
    note = (f"Each dot is a request (a hashed sample of at most {SCATTER_POINTS:,} per model); lines are"
            " least-squares fits over all of them.")
    if any((row["ttft_ms_per_1k_input"] or 0) < 0 for row in data["summary"] if row["model"] in colors):
        note += " A line falling to the right is no prefill cost: caching, or too little spread in input sizes."
    return spec("ttft-input", "scatter", "TTFT against input tokens", "input tokens", "TTFT (ms)", note, series)


def cdf_chart(data: dict[str, Any], colors: dict[str, int], column: str, title: str) -> dict[str, Any]:
    percent = [round(100 * q, 2) for q in CDF_QUANTILES]
    series = [
        {"label": row["model"], "color": colors[row["model"]], "x": [round(v, 3) for v in row[column]], "y": percent}
        for row in data["cdf"]
        if row[column] is not None
    ]
    note = "Share of successful requests at or below each value; the axis ends at the largest p99."
    chart = spec(f"cdf-{column}", "cdf", f"{title} CDF", f"{title} (ms)", "requests (%)", note, series)
    chart["xMax"] = max((s["x"][P99_INDEX] for s in series), default=None)
    return chart


def time_chart(data: dict[str, Any], colors: dict[str, int], column: str, title: str) -> dict[str, Any]:
    series = []
    for model, rows in group_rows(data["series"]).items():
        points = [(row["t"], row[column]) for row in rows if row[column] is not None]
        if points:
            xs, ys = zip(*points, strict=True)
            series.append({"label": model, "color": colors[model], "x": list(xs), "y": list(ys)})
    note = f"Median of successful requests per {bucket_label(data['bucket_s'])}."
    chart = spec(f"time-{column}", "time", f"{title} over time", "time (UTC)", f"{title} (ms)", note, series)
    chart["bucket"] = data["bucket_s"]
    return chart


def histogram_chart(data: dict[str, Any], colors: dict[str, int]) -> dict[str, Any]:
    rows = data["histogram"]
    series = []
    if rows:
        width = rows[0]["hi"] / HISTOGRAM_BINS
        edges = [round(i * width, 3) for i in range(HISTOGRAM_BINS + 1)]
        for model, model_rows in group_rows(rows).items():
            counts = [0] * (HISTOGRAM_BINS + 1)
            for row in model_rows:
                counts[row["bin"]] = row["n"]
            total = sum(counts)
            share = [round(100 * n / total, 3) for n in counts]
            series.append({"label": model, "color": colors[model], "x": edges, "y": share})
    note = "Share of each model's successful requests per bin; the last bin holds everything above the p99."
    return spec("tokens-per-s", "steps", "Output tokens per second", "output tokens/s", "requests (%)", note, series)


def error_chart(data: dict[str, Any], colors: dict[str, int]) -> dict[str, Any]:
    """Stacked bars: one bar per HTTP error status or other failed outcome, one stack per model."""
    rows = data["errors_by_model"]
    totals: dict[str, int] = {}
    for row in rows:
        totals[error_category(row)] = totals.get(error_category(row), 0) + row["n"]
    categories = sorted(totals, key=lambda c: (-totals[c], c))[:12]
    series: list[dict[str, Any]] = []
    for model, model_rows in group_rows(rows).items():
        counts = {error_category(row): row["n"] for row in model_rows}
        ys = [counts.get(c, 0) for c in categories]
        if any(ys):
            color = colors.get(model, OTHER_COLOR)
            series.append({"label": model, "color": color, "x": list(range(len(categories))), "y": ys})
    series.sort(key=lambda s: s["color"] if s["color"] >= 0 else 1_000_000)
    chart = spec("errors", "bars", "Errors by outcome and status", "outcome", "requests", "", series)
    chart["categories"] = categories
    chart["note"] = "Failed requests, stacked by model." if series else "No failed requests in this selection."
    return chart


def cost_chart(data: dict[str, Any], colors: dict[str, int]) -> dict[str, Any]:
    """Stacked bars: the list price of each UTC day's requests, one stack per model."""
    rows = data.get("cost_by_day", [])
    days = sorted({row["day"] for row in rows})
    series: list[dict[str, Any]] = []
    for model, model_rows in group_rows(rows).items():
        usd = {row["day"]: round(row["usd"], 6) for row in model_rows}
        series.append({"label": model, "color": colors.get(model, OTHER_COLOR),
                       "x": list(range(len(days))), "y": [usd.get(d, 0) for d in days]})
    series.sort(key=lambda s: s["color"] if s["color"] >= 0 else 1_000_000)
    width = data.get("cost_days", 1)
    per = {1: "day", 7: "week"}.get(width, f"{width} days")
    x = "day (UTC)" if width == 1 else f"{per} from (UTC)"
    chart = spec("cost-per-day", "bars", f"Cost per {per} (USD, list price)", x, "USD", "", series)
    chart["categories"] = days
    chart["counts"] = False  # dollars: the y axis needs no whole-number ticks
    subscription = any(row["subscription"] for row in rows)
    chart["note"] = ("The tokens at genai-prices list prices, stacked by model"
                     + ("; subscription traffic is a list-price equivalent, not money spent." if subscription else ".")
                     if series else "No priced requests in this selection (unknown models have no cost).")
    return chart


def error_category(row: dict[str, Any]) -> str:
    """`HTTP 429` for an upstream's error status, else the outcome (`upstream_timeout`)."""
    if row["outcome"] == "http_error" and row["status"] is not None:
        return f"HTTP {row['status']}"
    return row["outcome"]


def bucket_label(seconds: int) -> str:
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds % size == 0:
            count = seconds // size
            return unit if count == 1 else f"{count} {unit}s"
    return "second" if seconds == 1 else f"{seconds} seconds"


def build_charts(data: dict[str, Any]) -> list[dict[str, Any]]:
    colors = model_colors(data)
    return [
        scatter_chart(data, colors),
        cdf_chart(data, colors, "ttft_ms", "TTFT"),
        cdf_chart(data, colors, "tpot_ms", "TPOT"),
        cdf_chart(data, colors, "e2e_ms", "E2E"),
        time_chart(data, colors, "ttft_ms", "TTFT"),
        time_chart(data, colors, "tpot_ms", "TPOT"),
        histogram_chart(data, colors),
        error_chart(data, colors),
        cost_chart(data, colors),
    ]
