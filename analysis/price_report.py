"""`llmtap prices MODEL`: what genai-prices matched for a model name, and the prices the views use.

The lookup is `proxy.common.prices.lookup`, the one the `cost_usd` column and the cost metric use: the
provider from the upstream's URL when the package knows it, else from the model name.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from proxy.common import prices

from analysis.formatting import dumps, fmt_usd

NAMES = {"input": "input", "cache_read": "cached input read", "cache_write": "cached input write",
         "output": "output", "reasoning": "reasoning", "requests": "per 1000 requests"}
EXAMPLE = dict(input_tokens=10_000, cache_read=8_000, cache_write=0, output_tokens=500, reasoning=0)


def _price(name: str, price: prices.Price) -> str:
    base, tiers = price
    unit = "" if name == "requests" else "/MTok"
    text = f"{NAMES[name]} ${base:g}{unit}"
    for start, rate in tiers:
        text += f" (${rate:g} over {start:,} input tokens)"
    return text


def _span(segment: prices.Segment) -> str:
    parts = []
    if segment.valid_from is not None:
        parts.append(f"from {segment.valid_from:%Y-%m-%d}")
    if segment.valid_to is not None:
        parts.append(f"before {segment.valid_to:%Y-%m-%d}")
    if segment.day_from_s is not None:
        end = segment.day_to_s or 86400
        parts.append(f"{segment.day_from_s // 3600:02d}:{segment.day_from_s % 3600 // 60:02d}-"
                     f"{end // 3600:02d}:{end % 3600 // 60:02d} UTC")
    return ", ".join(parts) or "always"


def describe(model: str, host: str | None, at: datetime | None = None, route: str | None = None) -> dict[str, Any]:
    """The match and its prices as a dict (the json output; the text output reads it)."""
    at = at or datetime.now(UTC)
    priced = prices.lookup(model, host)
    if priced is None:
        return {"model": model, "upstream_host": host, "matched": False, "source": prices.source()}
    segment = priced.segment_at(at)
    factor = prices.markup(route) if route else 1.0
    example = prices.segment_cost(segment, EXAMPLE["input_tokens"], EXAMPLE["output_tokens"],
                                  EXAMPLE["cache_read"], EXAMPLE["cache_write"], EXAMPLE["reasoning"])
    if example is not None:
        example *= factor
    _, _, origin = prices.configured()
    source = f"{priced.source} ({origin})" if priced.source == prices.CONFIG_SOURCE and origin else priced.source
    return {
        "model": model, "upstream_host": host, "matched": True, "source": source,
        **({"route": route, "markup_pct": round((factor - 1) * 100, 6)} if route else {}),
        "provider": priced.provider_id, "provider_name": priced.provider_name,
        "matched_model": priced.model_id, "matched_model_name": priced.model_name,
        "matched_by": priced.matched_by, "at": at.isoformat(),
        "prices_at": {name: {"usd_per_mtok" if name != "requests" else "usd_per_1000": base,
                             "tiers": [{"over_input_tokens": s, "usd": r} for s, r in tiers]}
                      for name, (base, tiers) in segment.prices.items()},
        "periods": [{"when": _span(s), "prices": {n: p[0] for n, p in s.prices.items()}} for s in priced.segments],
        "example": {**EXAMPLE, "cost_usd": example},
    }


def to_text(info: dict[str, Any]) -> str:
    model = info["model"]
    where = f" at {info['upstream_host']}" if info.get("upstream_host") else ""
    if not info["matched"]:
        return (f"{model}{where}: no price in {info['source']}, so its cost_usd is NULL (never 0).\n"
                "A newer genai-prices, or --update-prices (fetches the package's latest data), may know it;\n"
                "an aggregator's model is matched by the upstream's URL (--upstream).\n")
    lines = [f"{model}{where}",
             f"  matched   {info['provider']} / {info['matched_model']}"
             + (f" ({info['matched_model_name']})" if info.get("matched_model_name") else "")
             + f", by {info['matched_by']}",
             f"  source    {info['source']}",
             f"  prices    on {info['at'][:10]}:"]
    priced = prices.lookup(model, info.get("upstream_host"))
    assert priced is not None
    at = datetime.fromisoformat(info["at"])
    segment = priced.segment_at(at)
    lines += [f"            {_price(name, price)}" for name, price in segment.prices.items()]
    if len(priced.segments) > 1:
        lines.append(f"  periods   {len(priced.segments)}: " + "; ".join(_span(s) for s in priced.segments))
    ex = info["example"]
    if info.get("route"):
        lines.append(f"  markup    {info['markup_pct']:g} % on route {info['route']}")
    lines.append(f"  example   {ex['input_tokens']:,} input tokens ({ex['cache_read']:,} cached), "
                 f"{ex['output_tokens']:,} output: {fmt_usd(ex['cost_usd'])}")
    return "\n".join(lines) + "\n"


def configured() -> dict[str, Any]:
    """The config file's own prices and markups (`llmtap prices` without a model)."""
    models, markups, origin = prices.configured()
    return {"source": prices.CONFIG_SOURCE, "file": origin, "genai_prices": prices.source(),
            "models": {m: {n: p[0] for n, p in priced.segments[0].prices.items()} for m, priced in models.items()},
            "markup_pct": {label: round((f - 1) * 100, 6) for label, f in markups.items()}}


def configured_text(info: dict[str, Any]) -> str:
    if not info["models"] and not info["markup_pct"]:
        return (f"no prices in the config file: every cost is from {info['genai_prices']}.\n"
                "Add your own (USD per million tokens) as [prices.\"MODEL\"] input = …, output = …,"
                " cache_read = …, cache_write = … (docs/cost-and-limits.md).\n")
    lines = [f"prices from the config file {info['file']} (source \"config\"), before {info['genai_prices']}:"]
    for model, table in info["models"].items():
        lines.append(f"  {model:<24} " + ", ".join(_price(n, (v, ())) for n, v in table.items()))
    for label, pct in info["markup_pct"].items():
        lines.append(f"  markup {pct:g} % on route {label}")
    return "\n".join(lines) + "\n"


def to_json(info: dict[str, Any]) -> str:
    return dumps(info)


RENDERERS = {"table": to_text, "json": to_json}
CONFIGURED_RENDERERS = {"table": configured_text, "json": to_json}
