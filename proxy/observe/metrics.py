"""Prometheus metrics of the finished requests, served at `GET /_llmtap/metrics`.

`PrometheusMetrics.observe(row)` is one of the recorder's observers (`recorder.on_rows`): it runs on the
event loop once per finished request, so it only updates counters in memory
and never raises. `render()` produces the text exposition for a scrape.

The GenAI metrics follow the OpenTelemetry GenAI semantic conventions as of
open-telemetry/semantic-conventions-genai's main branch (no release since
v1.41.0 of open-telemetry/semantic-conventions; docs/gen-ai/client-inference.md,
gen-ai-token-metrics.md, client-embeddings.md and non-normative/migration.md),
named as an OpenTelemetry-to-Prometheus exporter names them, with the advised
buckets:

- `gen_ai_client_inference_duration_seconds`: e2e of a generation;
  `gen_ai_client_embeddings_duration_seconds`: of an embedding
- `gen_ai_client_inference_time_to_first_chunk_seconds`: TTFT, streams only
- `gen_ai_client_inference_time_per_output_chunk_seconds`: one sample per
  *request*, its `tpot_ms` (the convention asks for one sample per chunk;
  llmtap records the per-request TPOT, which is what dashboards compare)
- counters `gen_ai_client_inference_usage_{input_tokens,output_tokens,
  cache_read_input_tokens,cache_write_input_tokens,reasoning_output_tokens}_total`
  with `gen_ai_token_modality="unknown"` (the APIs' usage has no modality split
  that llmtap records); the cached, written and reasoning ones are parts of
  input and output
- histograms `gen_ai_client_inference_operation_{input,output}_tokens` per
  generation, `gen_ai_client_embeddings_operation_input_tokens` per embedding

llmtap extensions: `llmtap_client_inference_upstream_processing_duration_seconds`, the
time the upstream says it spent on a generation (`upstream_processing_ms`: proxy/meter/upstream_timing.py),
`llmtap_client_inference_cost_usd_total`, the
list price of the generations' tokens (proxy/common/prices.py, from genai-prices; a
subscription's is a list-price equivalent: `billing="subscription"`), and the
gauges of the latest limits each upstream stated per key fingerprint
(`llmtap_ratelimit_remaining_requests`, `_remaining_tokens`, `_limit_requests`,
`_limit_tokens`, `llmtap_ratelimit_window_utilization` by `window` = `5h`, `7d`).

The GenAI metrics leave out token counts, probes, model lists and prewarms (they
answer in milliseconds and share the model's name); `llmtap_requests_total`
counts every request, by outcome. Then the store's counters and the
event-loop lag. Labels: `route`, `model` (the requested model), `tool`,
`status_class` (`2xx`, `4xx`, `5xx`, ..., `none`). Labels with values from
clients (model, tool, route, key fingerprint, upstream) keep their first
`max_label_values` distinct values each; later ones are counted as `other`, so
a client cycling model names cannot grow the scrape without bound.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

from bisect import bisect_left

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.utils import floatToGoString

from proxy.common.prices import SUBSCRIPTION_KINDS, load as load_prices, row_cost
from proxy.common.schema import GENERATING_KINDS

# OTel GenAI advice: 0.01 s doubling to 81.92 s; tokens 1 quadrupling to 4^13.
DURATION_BUCKETS = tuple(round(0.01 * 2**k, 2) for k in range(14))
TOKEN_BUCKETS = tuple(float(4**k) for k in range(14))
LABELS = ("route", "model", "tool", "status_class")
GENAI_KINDS = frozenset({*GENERATING_KINDS, "embedding", None})  # the kinds the GenAI histograms cover (None: unknown)
# The current usage counters: (name part, row column), all with gen_ai_token_modality="unknown"
USAGE_COUNTERS = (("input_tokens", "input_tokens"), ("output_tokens", "output_tokens"),
                  ("cache_read_input_tokens", "cache_read_tokens"),
                  ("cache_write_input_tokens", "cache_creation_tokens"),
                  ("reasoning_output_tokens", "reasoning_tokens"))
MODALITY = "unknown"
LIMIT_GAUGES = (("remaining_requests", "ratelimit_requests_remaining"), ("limit_requests", "ratelimit_requests_limit"),
                ("remaining_tokens", "ratelimit_tokens_remaining"), ("limit_tokens", "ratelimit_tokens_limit"))
OTHER, NONE = "other", "none"
MAX_LABEL_CACHE = 10_000  # series remembered per raw (route, model, tool, status, outcome)
StoreStats = Callable[[], Mapping[str, Any]]
LoopLagSummary = Callable[[], Mapping[str, float | None]]


class BoundedLabel:
    """The first `limit` distinct values pass; the rest become `other`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.seen: set[str] = set()

    def __call__(self, value: Any) -> str:
        if value is None or value == "":
            return NONE
        text = str(value)
        if text in self.seen:
            return text
        if len(self.seen) < self.limit:
            self.seen.add(text)
            return text
        return OTHER


def status_class(status: Any) -> str:
    return f"{status // 100}xx" if isinstance(status, int) and 100 <= status <= 599 else NONE


def add(bounds: tuple[float, ...], series: list[float], value: float) -> None:
    """One observation into a histogram series: [sum, count per bucket..., count over the last]."""
    series[0] += value
    series[1 + bisect_left(bounds, value)] += 1  # `le` buckets: a value equal to a bound counts in it


class LabeledHistogram:
    """A Prometheus histogram per label set, updated without locks: only the event loop observes.

    prometheus_client's own histogram takes a lock and walks its buckets in Python on every
    observation, some 1.5 µs each and six per request; here an observation is `add`: a bisect
    into a series list the caller keeps (`get` gives it, PrometheusMetrics remembers it).
    A scrape (in another thread) copies each series: at worst it sees an observation's
    sum without its count, never a torn bucket list.
    """

    def __init__(self, name: str, documentation: str, labelnames: tuple[str, ...], buckets: tuple[float, ...]) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, labelnames
        self.bounds = buckets
        self.series: dict[tuple[str, ...], list[float]] = {}  # labels -> [sum, count per bucket..., count over]

    def get(self, labels: tuple[str, ...]) -> list[float]:
        """One label set's series, created empty on first use; `add` updates it."""
        series = self.series.get(labels)
        if series is None:
            series = self.series[labels] = [0.0] * (len(self.bounds) + 2)
        return series

    def collect(self) -> Metric:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        edges = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        for labels, series in list(self.series.items()):
            counts = series[:]
            if not any(counts[1:]):
                continue  # created for a label set (PrometheusMetrics._series_of), never observed
            cumulative, total = [], 0.0
            for edge, n in zip(edges, counts[1:]):
                total += n
                cumulative.append((edge, total))
            family.add_metric(list(labels), cumulative, counts[0])
        return family


class LabeledCounter:
    """A counter per label set, as lock-free as LabeledHistogram."""

    FRESH: tuple[float, ...] = (0.0,)  # a new label set's series
    SHOWN = 0  # the series item that, when non-zero, shows it

    def __init__(self, name: str, documentation: str, labelnames: tuple[str, ...]) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, labelnames
        self.series: dict[tuple[str, ...], list[float]] = {}  # labels -> [count]

    def get(self, labels: tuple[str, ...]) -> list[float]:
        """One label set's count, in a list the caller increments."""
        series = self.series.get(labels)
        if series is None:
            series = self.series[labels] = list(self.FRESH)
        return series

    def collect(self) -> Metric:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        shown = self.SHOWN
        for labels, value in list(self.series.items()):
            if value[shown]:
                family.add_metric(list(labels), value[0])
        return family


class TouchedCounter(LabeledCounter):
    """A counter per label set that shows once observed, even at 0 (a generation with no cached tokens
    still has its cache counter, as the conventions ask): `get` gives [value, observed]."""

    FRESH = (0.0, 0.0)
    SHOWN = 1


class _Series(NamedTuple):
    """What one (route, model, tool, status, outcome) updates: a row costs a dict lookup, then
    a bisect per histogram (without it, five label tuples built and hashed per row)."""

    requests: list[float]
    duration: list[float]
    ttft: list[float]
    tpot: list[float]
    tokens: tuple[list[float], ...]  # by USAGE_COUNTERS
    embed_duration: list[float]
    input_hist: list[float]
    output_hist: list[float]
    embed_input_hist: list[float]
    cost: tuple[list[float], list[float]]  # billing api, subscription
    processing: list[float]  # the upstream's stated processing time


class PrometheusMetrics:
    def __init__(self, max_label_values: int = 50, store_stats: StoreStats | None = None,
                 loop_lag: LoopLagSummary | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.bounded = {name: BoundedLabel(max_label_values) for name in ("route", "model", "tool", "key", "upstream")}
        self.observe_errors = 0
        self.duration = LabeledHistogram("gen_ai_client_inference_duration_seconds",
                                         "End-to-end duration of the request, as seen by llmtap (e2e_ms).",
                                         LABELS, DURATION_BUCKETS)
        self.ttft = LabeledHistogram("gen_ai_client_inference_time_to_first_chunk_seconds",
                                     "Time to the first output event of a stream (ttft_ms).",
                                     LABELS, DURATION_BUCKETS)
        self.tpot = LabeledHistogram("gen_ai_client_inference_time_per_output_chunk_seconds",
                                     "Per-request time per output token (tpot_ms): one sample per request.",
                                     LABELS, DURATION_BUCKETS)
        self.usage = tuple(TouchedCounter(f"gen_ai_client_inference_usage_{part}",
                                          f"Tokens used by generations ({column}).", (*LABELS, "gen_ai_token_modality"))
                           for part, column in USAGE_COUNTERS)
        self.embed_duration = LabeledHistogram("gen_ai_client_embeddings_duration_seconds",
                                               "End-to-end duration of an embedding (e2e_ms).", LABELS, DURATION_BUCKETS)
        self.input_hist = LabeledHistogram("gen_ai_client_inference_operation_input_tokens",
                                           "Input tokens per generation, cached included.", LABELS, TOKEN_BUCKETS)
        self.output_hist = LabeledHistogram("gen_ai_client_inference_operation_output_tokens",
                                            "Output tokens per generation, reasoning included.", LABELS, TOKEN_BUCKETS)
        self.embed_input_hist = LabeledHistogram("gen_ai_client_embeddings_operation_input_tokens",
                                                 "Input tokens per embedding.", LABELS, TOKEN_BUCKETS)
        self.cost = LabeledCounter("llmtap_client_inference_cost_usd",
                                   "List price of the generations' tokens in USD (genai-prices; an llmtap extension):"
                                   " billing=subscription is a list-price equivalent, not money spent.",
                                   (*LABELS, "billing"))
        self.processing = LabeledHistogram("llmtap_client_inference_upstream_processing_duration_seconds",
                                           "The time the upstream says it spent (upstream_processing_ms; an llmtap"
                                           " extension): the rest of the wait is the path.", LABELS, DURATION_BUCKETS)
        self.requests = LabeledCounter("llmtap_requests", "Finished requests by outcome.", (*LABELS, "outcome"))
        # (key fingerprint, upstream) -> the latest stated limits: LIMIT_GAUGES' values, then 5h and 7d use
        self.limits: dict[tuple[str, str], list[float | None]] = {}
        self.registry.register(_RuntimeCollector(store_stats, loop_lag, self))
        self._series: dict[tuple[Any, ...], _Series] = {}
        load_prices()  # not on the event loop's first priced row

    def observe(self, row: Mapping[str, Any]) -> None:
        """Count one finished request. Never raises: a bad row only bumps a counter."""
        try:
            self._observe(row)
        except Exception:
            self.observe_errors += 1

    def _observe(self, row: Mapping[str, Any]) -> None:
        get = row.get
        key = (get("route"), get("request_model"), get("tool"), get("status"), get("outcome"))
        series = self._series.get(key)
        if series is None:
            series = self._series_of(key)
        series.requests[0] += 1
        if get("ratelimit_requests_remaining") is not None or get("ratelimit_tokens_remaining") is not None \
                or get("ratelimit_5h_utilization") is not None:
            self._limits(get)
        kind = get("kind")
        if kind not in GENAI_KINDS:
            return
        e2e, ttft, tpot = get("e2e_ms"), get("ttft_ms"), get("tpot_ms")
        if kind == "embedding":
            if e2e is not None:
                add(DURATION_BUCKETS, series.embed_duration, e2e / 1000.0)
            if (value := get("input_tokens")) is not None:
                add(TOKEN_BUCKETS, series.embed_input_hist, value)
            return
        if e2e is not None:
            add(DURATION_BUCKETS, series.duration, e2e / 1000.0)
        for (_, column), counter in zip(USAGE_COUNTERS, series.tokens):
            counter[0] += get(column) or 0
            counter[1] = 1.0
        if (value := get("input_tokens")) is not None:
            add(TOKEN_BUCKETS, series.input_hist, value)
        if (value := get("output_tokens")) is not None:
            add(TOKEN_BUCKETS, series.output_hist, value)
        if ttft is not None and get("stream"):
            add(DURATION_BUCKETS, series.ttft, ttft / 1000.0)
        if tpot is not None:
            add(DURATION_BUCKETS, series.tpot, tpot / 1000.0)
        if (stated := get("upstream_processing_ms")) is not None:
            add(DURATION_BUCKETS, series.processing, stated / 1000.0)
        if cost := row_cost(row):
            series.cost[get("credential_kind") in SUBSCRIPTION_KINDS][0] += cost

    def _limits(self, get: Callable[[str], Any]) -> None:
        """The latest limits the upstream stated to this key (a gauge per key and upstream)."""
        key = (self.bounded["key"](get("key_fingerprint")), self.bounded["upstream"](get("upstream_host")))
        latest = self.limits.get(key)
        if latest is None:
            latest = self.limits[key] = [None] * (len(LIMIT_GAUGES) + 2)
        for i, (_, column) in enumerate(LIMIT_GAUGES):
            if (value := get(column)) is not None:
                latest[i] = value
        for i, column in ((len(LIMIT_GAUGES), "ratelimit_5h_utilization"),
                          (len(LIMIT_GAUGES) + 1, "ratelimit_7d_utilization")):
            if (value := get(column)) is not None:
                latest[i] = value

    def _series_of(self, key: tuple[Any, ...]) -> _Series:
        """The series one (route, model, tool, status, outcome) updates, remembered."""
        if len(self._series) >= MAX_LABEL_CACHE:
            self._series.clear()
        route, model, tool, status, outcome = key
        bounded = self.bounded
        labels = (bounded["route"](route), bounded["model"](model), bounded["tool"](tool), status_class(status))
        tokens = tuple(counter.get((*labels, MODALITY)) for counter in self.usage)
        series = self._series[key] = _Series(
            self.requests.get((*labels, outcome or NONE)), self.duration.get(labels), self.ttft.get(labels),
            self.tpot.get(labels), tokens, self.embed_duration.get(labels), self.input_hist.get(labels),
            self.output_hist.get(labels), self.embed_input_hist.get(labels),
            (self.cost.get((*labels, "api")), self.cost.get((*labels, "subscription"))), self.processing.get(labels),
        )
        return series

    def collect(self) -> Iterator[Metric]:
        instruments: tuple[LabeledHistogram | LabeledCounter, ...] = (
            self.duration, self.embed_duration, self.ttft, self.tpot, *self.usage, self.input_hist,
            self.output_hist, self.embed_input_hist, self.processing, self.cost, self.requests)
        for metric in instruments:
            yield metric.collect()
        yield from self._limit_gauges()

    def _limit_gauges(self) -> Iterator[Metric]:
        labels = ["key_fingerprint", "upstream"]
        families = [GaugeMetricFamily(f"llmtap_ratelimit_{name}", f"The latest {name.replace('_', ' ')} the upstream"
                                      " stated to this key (its rate-limit headers).", labels=labels)
                    for name, _ in LIMIT_GAUGES]
        windows = GaugeMetricFamily("llmtap_ratelimit_window_utilization",
                                    "How much of a subscription's window is used, 0 to 1 (the latest stated).",
                                    labels=[*labels, "window"])
        for (key, upstream), latest in list(self.limits.items()):
            for family, value in zip(families, latest):
                if value is not None:
                    family.add_metric([key, upstream], value)
            for window, value in zip(("5h", "7d"), latest[len(LIMIT_GAUGES):]):
                if value is not None:
                    windows.add_metric([key, upstream, window], value)
        yield from families
        yield windows

    def render(self) -> tuple[bytes, str]:
        """The scrape body and its Content-Type (text format 0.0.4, read by every Prometheus)."""
        return generate_latest(self.registry), CONTENT_TYPE_PLAIN_0_0_4


class _RuntimeCollector:
    """Read at scrape time: the store's counters and the event-loop lag."""

    def __init__(self, store_stats: StoreStats | None, loop_lag: LoopLagSummary | None,
                 metrics: PrometheusMetrics) -> None:
        self.store_stats, self.loop_lag, self.metrics = store_stats, loop_lag, metrics

    def describe(self) -> Iterable[Metric]:
        return []  # collected only at scrape time, never while registering

    def collect(self) -> Iterator[Metric]:
        yield from self.metrics.collect()
        yield CounterMetricFamily("llmtap_metrics_observe_errors", "Rows the metrics could not count.",
                                  value=self.metrics.observe_errors)
        if self.store_stats is not None:
            yield from _store_metrics(self.store_stats())
        if self.loop_lag is not None:
            yield _lag_metric(self.loop_lag())


def _store_metrics(stats: Mapping[str, Any]) -> Iterator[Metric]:
    yield GaugeMetricFamily("llmtap_store_write_failing_seconds",
                            "How long no write to the database has succeeded (0 while writes succeed).",
                            value=float(stats.get("write_failing_s") or 0.0))
    for key, value in stats.items():
        if not isinstance(value, int) or isinstance(value, bool):
            continue
        name = f"llmtap_store_{key}"
        if key.startswith("pending_"):
            yield GaugeMetricFamily(name, f"Rows waiting for the database writer ({key}).", value=value)
        else:
            yield CounterMetricFamily(name, f"The database writer's {key.replace('_', ' ')}.", value=value)


def _lag_metric(summary: Mapping[str, float | None]) -> Metric:
    """The loop lag over the last minute as quantile gauges, in seconds (max is quantile 1)."""
    gauge = GaugeMetricFamily("llmtap_event_loop_lag_seconds",
                              "How late the event loop woke a timer, over the last minute.", labels=["quantile"])
    for quantile, key in (("0.5", "p50_ms"), ("0.99", "p99_ms"), ("1", "max_ms")):
        value = summary.get(key)
        if value is not None:
            gauge.add_metric([quantile], value / 1000.0)
    return gauge
