"""What a request's tokens cost at list price, from pydantic's genai-prices: no price is written here.

The package ships its price data inside the wheel, so this works offline; its hourly update from the
network is opt-in (`enable_updates`: `serve --update-prices`, `report --update-prices`, or the config
key `update_prices`), never on by default.

`lookup(model, host)` asks the package with its own matching: the provider from the upstream's URL
when the package knows that URL (an aggregator such as OpenRouter prices its own way), else from the
model name. It turns what the package holds for that model into `Segment`s: USD per million tokens for
uncached input, cached input read and write, output and reasoning (where priced apart), each with the
package's tiers (a higher rate once a prompt passes a size), over the span of dates (and hours of the
day, for off-peak prices) where they applied. Nothing is frozen in a row: `analysis/views.py` turns
the segments into SQL (`cost_sql`) so a price correction or a newer package reprices old rows, and the
metrics price a finished row with `row_cost`, the same arithmetic in Python.

Service-tier and batch variants (`price_variants`) are not applied: llmtap records neither.

Your own prices (`configure`, from the config file's `[prices]` table: proxy/settings/config.py) win
over the package's for the models they name, whatever the host; their source is "config". A markup per
route (`[price_markup]`, percent) scales every price of that route's rows. A model priced nowhere stays
unknown: its cost is NULL, never 0.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson

from proxy.common import paths
from proxy.common.private_file import write_private

# price key of genai-prices -> the part of a row's tokens it prices
PRICE_KEYS = (
    ("input", "input_mtok"),
    ("cache_read", "cache_read_mtok"),
    ("cache_write", "cache_write_mtok"),
    ("output", "output_mtok"),
    ("reasoning", "output_reasoning_mtok"),
    ("requests", "requests_kcount"),  # a fee per request (USD per thousand)
)
UNKNOWN = "unknown model"
CONFIG_SOURCE = "config"
CONFIG_KEYS = ("input", "output", "cache_read", "cache_write")  # a [prices] model's keys, USD per MTok
SUBSCRIPTION_KINDS = ("claude_login", "chatgpt_login")  # proxy.meter.fingerprint.credential_kind's subscriptions

Price = tuple[float, tuple[tuple[int, float], ...]]  # base USD/MTok, tiers (over this many input tokens, USD/MTok)


@dataclass(frozen=True)
class Segment:
    """One set of prices and when it applied: [valid_from, valid_to) in UTC (None: open), and within
    each day [day_from_s, day_to_s) seconds after UTC midnight (None: all day)."""

    prices: Mapping[str, Price]  # by PRICE_KEYS name; a key the package does not price is absent
    valid_from: datetime | None = None
    valid_to: datetime | None = None
    day_from_s: int | None = None
    day_to_s: int | None = None

    def applies(self, at: datetime) -> bool:
        if self.valid_from is not None and at < self.valid_from:
            return False
        if self.valid_to is not None and at >= self.valid_to:
            return False
        if self.day_from_s is None:
            return True
        second = int(at.timestamp()) % 86400
        return self.day_from_s <= second < (self.day_to_s or 86400)


@dataclass(frozen=True)
class Priced:
    """What the package matched for one model name (and upstream host), and its prices."""

    model_ref: str
    provider_id: str
    provider_name: str
    model_id: str
    model_name: str | None
    matched_by: str  # "upstream URL" or "model name"
    segments: tuple[Segment, ...]
    source: str  # "genai-prices 0.2.3", and the update's time when prices were fetched

    def segment_at(self, at: datetime) -> Segment:
        for segment in self.segments:
            if segment.applies(at):
                return segment
        return self.segments[-1]


_lock = threading.Lock()
_cache: dict[tuple[str, str], Priced | None] = {}
_generation = 0  # bumped when the package's prices change (an update): cached lookups are dropped
_updater: Any = None
_configured: dict[str, Priced] = {}  # model name -> your own prices (configure)
_markup: dict[str, float] = {}  # route label ("/", "/openrouter") -> factor on its rows' cost
_configured_from: str | None = None


def configure(models: Mapping[str, Mapping[str, float]], markup: Mapping[str, float] | None = None,
              origin: str | None = None) -> None:
    """Your own prices, USD per million tokens by model name (keys of CONFIG_KEYS; a key left out is
    priced as the package does: cache reads and writes as input), and a markup in percent per route
    label; they replace any configured before. Cached lookups and the views' SQL are dropped."""
    global _configured, _markup, _configured_from, _generation
    found = {}
    for model, table in models.items():
        segment = Segment({key: (float(table[key]), ()) for key in CONFIG_KEYS if table.get(key) is not None})
        found[model] = Priced(model, CONFIG_SOURCE, CONFIG_SOURCE, model, None, "config file", (segment,),
                              CONFIG_SOURCE)
    factors = {label: 1.0 + float(percent) / 100.0 for label, percent in (markup or {}).items()}
    with _lock:
        if found == _configured and factors == _markup:
            _configured_from = origin or _configured_from  # the same prices, from a file already named
            return
        _configured, _markup, _configured_from = found, factors, origin
        _cache.clear()
        _generation += 1


def configured() -> tuple[dict[str, Priced], dict[str, float], str | None]:
    """The configured prices by model, the markup factors by route label, and the file they came from."""
    return dict(_configured), dict(_markup), _configured_from


def markup(route: str | None) -> float:
    """The factor on a row's cost for its route (1.0 when none is configured)."""
    return _markup.get(route or "", 1.0) if _markup else 1.0


def _snapshot() -> Any:
    from genai_prices import data_snapshot

    return data_snapshot.get_snapshot()


class _Remembered:
    """The package's lookups kept in a file between processes: importing its data costs some 0.3 s,
    most of a quick command's time, for the handful of models a store holds. The file is valid for one
    copy of the package's data and of this module (their sizes and mtimes: an upgrade of either starts
    it afresh), and is not used while updates are on (`enable_updates`: the data moves in the process).
    A file that cannot be read or written costs the time, never a lookup."""

    def __init__(self) -> None:
        self.key: str | None = None
        self.found: dict[str, Any] = {}
        self.version: str | None = None

    def _stamp(self) -> str:
        import importlib.util

        spec = importlib.util.find_spec("genai_prices")
        folder = Path(spec.origin).parent if spec and spec.origin else Path()
        stats = [os.stat(path) for path in (folder / "data.py", __file__)]
        return " ".join(f"{s.st_size}:{s.st_mtime_ns}" for s in stats)

    def _load(self) -> None:
        if self.key is not None:
            return
        self.key = ""
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            self.key = self._stamp()
            kept = orjson.loads(self._path().read_bytes())
            if kept["key"] == self.key:
                self.found, self.version = kept["found"], kept["version"]

    @staticmethod
    def _path() -> Path:
        return paths.data_dir() / "prices-cache.json"

    def get(self, model: str, host: str) -> Priced | None | bool:
        """The lookup kept for the pair, else False."""
        self._load()
        kept = self.found.get(f"{model}\n{host}", False)
        if kept is None or kept is False or isinstance(kept, Priced):
            return kept
        return Priced(**{**kept, "segments": tuple(map(_segment, kept["segments"]))})

    def put(self, model: str, host: str, priced: Priced | None) -> None:
        self._load()
        self.found[f"{model}\n{host}"] = priced
        self.version = self.version or _package_version()
        if self.key:
            with contextlib.suppress(OSError):
                paths.data_dir().mkdir(parents=True, exist_ok=True, mode=0o700)
                text = orjson.dumps({"key": self.key, "version": self.version, "found": self.found}).decode()
                write_private(self._path(), text)


_remembered = _Remembered()


def _segment(kept: dict[str, Any]) -> Segment:
    """A Segment back from its JSON (orjson's dump of the dataclass)."""
    def moment(text: str | None) -> datetime | None:
        return datetime.fromisoformat(text) if text else None

    found = {key: (base, tuple((int(start), rate) for start, rate in tiers)) for key, (base, tiers) in kept["prices"].items()}
    return Segment(found, moment(kept["valid_from"]), moment(kept["valid_to"]), kept["day_from_s"], kept["day_to_s"])


def _package_version() -> str:
    from genai_prices import __version__

    return str(__version__)


def load() -> None:
    """Read the package's data now (some 0.2 s, once per process), not when the first row is priced."""
    _snapshot()


def source() -> str:
    """The package and version the prices come from (and the time of a fetched update)."""
    if _updater is None:
        _remembered._load()
        return f"genai-prices {_remembered.version or _package_version()}"
    snapshot = _snapshot()
    text = f"genai-prices {_package_version()}"
    if snapshot.from_auto_update:
        text += f", updated {snapshot.timestamp.astimezone(UTC):%Y-%m-%d %H:%MZ}"
    return text


def sources() -> str:
    """Where costs come from: the config file's own prices (when any), then the package."""
    if not _configured and not _markup:
        return source()
    own = f"the config file ({_configured_from})" if _configured_from else "the config file"
    return f"{own} then {source()}"


def generation() -> int:
    """Changes whenever cached prices are dropped: callers caching SQL built from lookups compare it."""
    _refresh()
    return _generation


def _refresh() -> None:
    """Drop cached lookups when an update replaced the package's snapshot."""
    global _generation, _seen_snapshot
    snapshot = _snapshot() if _updater is not None else None
    if snapshot is not None and snapshot is not _seen_snapshot:
        with _lock:
            _cache.clear()
            _seen_snapshot = snapshot
            _generation += 1


_seen_snapshot: Any = None


def lookup(model: str | None, host: str | None = None) -> Priced | None:
    """The package's match and prices for a model name as the upstream reported it; None when unknown."""
    if not model:
        return None
    if _configured and (own := _configured.get(model)) is not None:
        return own
    _refresh()
    key = (model, host or "")
    with _lock:
        if key in _cache:
            return _cache[key]
    priced = _lookup(model, host or "")
    with _lock:
        _cache[key] = priced
    return priced


def _lookup(model: str, host: str) -> Priced | None:
    if _updater is not None:
        return _looked_up(model, host)
    if (kept := _remembered.get(model, host)) is not False:
        return kept  # type: ignore[return-value]
    priced = _looked_up(model, host)
    _remembered.put(model, host, priced)
    return priced


def _looked_up(model: str, host: str) -> Priced | None:
    snapshot = _snapshot()
    found = None
    if host:
        try:
            found = snapshot.find_provider_model(model, None, None, f"https://{host}"), "upstream URL"
        except LookupError:
            found = None
    if found is None:
        try:
            found = snapshot.find_provider_model(model, None, None, None), "model name"
        except LookupError:
            return None
    (provider, info), matched_by = found
    return Priced(model, provider.id, provider.name, info.id, info.name, matched_by, segments(info), source())


def segments(info: Any) -> tuple[Segment, ...]:
    """The model's prices over time: the package's own choice (`ModelInfo.get_prices`) evaluated once
    in every span between the dates and times of day its conditional prices start or end."""
    from genai_prices import types

    conditions = [] if not isinstance(info.prices, list) else [c.constraint for c in info.prices]
    days = sorted({c.start_date for c in conditions if isinstance(c, types.StartDateConstraint)})
    seconds = sorted({0} | {_second(t) for c in conditions if isinstance(c, types.TimeOfDateConstraint)
                            for t in (c.start_time, c.end_time)})
    edges: list[datetime | None] = [None, *(datetime.combine(d, time(), UTC) for d in days), None]
    out = []
    for start, end in zip(edges, edges[1:]):
        sample_day = (start or (end or datetime(2000, 1, 1, tzinfo=UTC)) - timedelta(days=1))
        sample_day = sample_day.replace(hour=0, minute=0, second=0, microsecond=0)
        for i, second in enumerate(seconds):
            until = seconds[i + 1] if i + 1 < len(seconds) else None
            prices = _prices(info.get_prices(sample_day + timedelta(seconds=second)))
            whole_day = len(seconds) == 1
            out.append(Segment(prices, start, end, None if whole_day else second, None if whole_day else until))
    return tuple(out)


def _second(t: time) -> int:
    if t.tzinfo is not None:
        t = datetime.combine(date(1970, 1, 1), t).astimezone(UTC).time()
    return t.hour * 3600 + t.minute * 60 + t.second


def _prices(model_price: Any) -> dict[str, Price]:
    from genai_prices import types

    out: dict[str, Price] = {}
    for name, key in PRICE_KEYS:
        value = getattr(model_price, key, None)
        if value is None:
            continue
        if isinstance(value, types.TieredPrices):
            out[name] = (float(value.base), tuple((int(t.start), float(t.price)) for t in value.tiers))
        elif isinstance(value, Decimal):
            out[name] = (float(value), ())
    return out


# -- the arithmetic, in Python (row_cost) and as SQL (cost_sql) -------------------------------------

def _rate(price: Price, input_tokens: int) -> float:
    base, tiers = price
    for start, rate in reversed(tiers):
        if input_tokens > start:
            return rate
    return base


def segment_cost(segment: Segment, input_tokens: int | None, output_tokens: int | None, cache_read: int | None,
                 cache_write: int | None, reasoning: int | None) -> float | None:
    """USD for these tokens at these prices; None when the row has no token counts at all. As the
    package does: cached reads and writes leave the input's count when they are priced apart, and
    reasoning leaves the output's when it is."""
    if input_tokens is None and output_tokens is None:
        return None
    p = segment.prices
    total_in = input_tokens or 0
    uncached = total_in - (cache_read or 0 if "cache_read" in p else 0) - (cache_write or 0 if "cache_write" in p else 0)
    out = (output_tokens or 0) - ((reasoning or 0) if "reasoning" in p else 0)
    parts = ((max(uncached, 0), "input"), (cache_read or 0, "cache_read"), (cache_write or 0, "cache_write"),
             (max(out, 0), "output"), (reasoning or 0, "reasoning"), (1000, "requests"))
    return sum(n * _rate(p[name], total_in) for n, name in parts if name in p and n) / 1e6


def row_cost(row: Mapping[str, Any]) -> float | None:
    """The list price of one finished row (a dict in schema order); None for an unknown model."""
    get = row.get
    priced = lookup(get("response_model") or get("request_model"), get("upstream_host"))
    if priced is None:
        return None
    started = get("started_at") or datetime.now(UTC)
    cost = segment_cost(priced.segment_at(started), get("input_tokens"), get("output_tokens"),
                        get("cache_read_tokens"), get("cache_creation_tokens"), get("reasoning_tokens"))
    return cost * markup(get("route")) if cost is not None and _markup else cost


def fmt_usd(usd: float | None) -> str:
    """12.345 -> '$12.35', 0.161 -> '$0.16', 0.00051 -> '$0.0005', 1234.5 -> '$1235'; None -> '-'."""
    if usd is None:
        return "-"
    if usd == 0:
        return "$0"
    if abs(usd) < 0.01:
        return f"${usd:.1g}" if abs(usd) >= 1e-4 else "<$0.0001"
    return f"${usd:.2f}" if abs(usd) < 100 else f"${usd:.0f}"


def _num(x: float) -> str:
    return repr(float(x))


def _rate_sql(price: Price) -> str:
    base, tiers = price
    if not tiers:
        return _num(base)
    whens = " ".join(f"WHEN coalesce(input_tokens, 0) > {int(start)} THEN {_num(rate)}"
                     for start, rate in reversed(tiers))
    return f"(CASE {whens} ELSE {_num(base)} END)"


def segment_sql(segment: Segment) -> str:
    """`segment_cost` over a row's columns."""
    p = segment.prices
    uncached = "coalesce(input_tokens, 0)"
    if "cache_read" in p:
        uncached += " - coalesce(cache_read_tokens, 0)"
    if "cache_write" in p:
        uncached += " - coalesce(cache_creation_tokens, 0)"
    out = "coalesce(output_tokens, 0)" + (" - coalesce(reasoning_tokens, 0)" if "reasoning" in p else "")
    counts = {"input": f"greatest({uncached}, 0)", "cache_read": "coalesce(cache_read_tokens, 0)",
              "cache_write": "coalesce(cache_creation_tokens, 0)", "output": f"greatest({out}, 0)",
              "reasoning": "coalesce(reasoning_tokens, 0)", "requests": "1000"}
    terms = [f"{counts[name]} * {_rate_sql(p[name])}" for name, _ in PRICE_KEYS if name in p]
    return f"({' + '.join(terms) or '0'}) / 1e6"


def _when_sql(segment: Segment) -> str:
    conds = []
    if segment.valid_from is not None:
        conds.append(f"started_at >= TIMESTAMPTZ '{segment.valid_from.isoformat()}'")
    if segment.valid_to is not None:
        conds.append(f"started_at < TIMESTAMPTZ '{segment.valid_to.isoformat()}'")
    if segment.day_from_s is not None:
        second = "(CAST(epoch(started_at) AS BIGINT) % 86400)"
        conds.append(f"{second} >= {segment.day_from_s}")
        if segment.day_to_s is not None:
            conds.append(f"{second} < {segment.day_to_s}")
    return " AND ".join(conds) or "true"


def priced_sql(priced: Priced) -> str:
    if len(priced.segments) == 1:
        return segment_sql(priced.segments[0])
    whens = " ".join(f"WHEN {_when_sql(s)} THEN {segment_sql(s)}" for s in priced.segments[:-1])
    return f"(CASE {whens} ELSE {segment_sql(priced.segments[-1])} END)"


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


MODEL_SQL = "coalesce(response_model, request_model)"
HOST_SQL = "coalesce(upstream_host, '')"


def _by_model(found: Mapping[tuple[str, str], Priced | None], value: Any, otherwise: str) -> str:
    """CASE over the row's model (then host, where hosts match differently) of value(priced)."""
    models: dict[str, dict[str, Priced | None]] = {}
    for (model, host), priced in sorted(found.items()):
        models.setdefault(model, {})[host] = priced
    whens = []
    for model, hosts in models.items():
        if all(priced is None for priced in hosts.values()):
            continue  # unknown wherever it went: the ELSE branch (the CASE grows with known models only)
        texts = {host: value(priced) if priced is not None else otherwise for host, priced in hosts.items()}
        if len(set(texts.values())) == 1:
            whens.append(f"WHEN {_quote(model)} THEN {next(iter(texts.values()))}")
        else:
            inner = " ".join(f"WHEN {_quote(h)} THEN {t}" for h, t in texts.items())
            fallback = value(lookup(model)) if lookup(model) is not None else otherwise
            whens.append(f"WHEN {_quote(model)} THEN (CASE {HOST_SQL} {inner} ELSE {fallback} END)")
    if not whens:
        return otherwise
    return f"(CASE {MODEL_SQL} {' '.join(whens)} ELSE {otherwise} END)"


def cost_sql(pairs: Iterable[tuple[str, str]]) -> tuple[str, str]:
    """SQL expressions over a `requests` row for `cost_usd` and `price_source`, for the (model, host)
    pairs a database holds: NULL cost for an unknown model (never a silent 0), or for no token counts."""
    found = {(m, h): lookup(m, h) for m, h in pairs if m}
    tokens_known = "(input_tokens IS NOT NULL OR output_tokens IS NOT NULL)"
    cost = _by_model(found, priced_sql, "NULL")
    cost = f"CASE WHEN {tokens_known} THEN {cost} END" if found else "CAST(NULL AS DOUBLE)"
    if found and _markup:
        factors = " ".join(f"WHEN {_quote(label)} THEN {_num(f)}" for label, f in sorted(_markup.items()))
        cost = f"({cost}) * (CASE route {factors} ELSE 1.0 END)"
    src = _by_model(found, lambda p: _quote(p.source), _quote(UNKNOWN))
    src = f"CASE WHEN {MODEL_SQL} IS NULL THEN NULL ELSE {src} END"
    return f"CAST({cost} AS DOUBLE)", src


def enable_updates() -> None:
    """Start genai-prices' own hourly update from the network (opt-in); later lookups use its data."""
    global _updater
    with _lock:
        if _updater is not None:
            return
        from genai_prices import UpdatePrices

        _updater = UpdatePrices()
        _updater.start()


def wait_updated(timeout: float) -> bool:
    """After enable_updates: wait for the first fetch (a failed one raises the package's error)."""
    from genai_prices import wait_prices_updated_sync

    return wait_prices_updated_sync(timeout)
