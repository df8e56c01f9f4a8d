"""Number formats for the HTML report's tables (a dash for a missing value): `html_*`, apart from the
terminal's `analysis.formatting.fmt_*` (`fmt_ms` says "820ms" and "6.4s" where a table cell says "820")."""

from __future__ import annotations

DASH = "&ndash;"


def html_ms(value: float | None) -> str:
    if value is None:
        return DASH
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def html_count(value: int | None) -> str:
    return DASH if value is None else f"{value:,}"


def html_pct(value: float | None) -> str:
    if value is None:
        return DASH
    return f"{value:.1f}%" if value >= 0.1 or value == 0 else f"{value:.2f}%"


def html_rate(value: float | None) -> str:
    return DASH if value is None else f"{value:,.1f}"


def html_tokens(value: int | None) -> str:
    """Compact: 950, 12.3k, 4.56M, 1.2B."""
    if value is None:
        return DASH
    for size, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            scaled = value / size
            return f"{scaled:.3g}{suffix}" if scaled < 1000 else f"{scaled:,.0f}{suffix}"
    return f"{value:,}"


def html_span(seconds: float) -> str:
    """A duration as its two largest units: 3 d 4 h, 5 h 12 min, 42 s."""
    seconds = int(round(seconds))
    units = (("d", 86400), ("h", 3600), ("min", 60), ("s", 1))
    parts: list[str] = []
    for name, size in units:
        if seconds >= size or (name == "s" and not parts):
            parts.append(f"{seconds // size} {name}")
            seconds %= size
    return " ".join(parts[:2])
