"""Prometheus metrics of the finished requests, served at `GET /_llmtap/metrics`.

`PrometheusMetrics.observe(row)` is a `ProxyState` listener: it runs on the
event loop once per finished request, so it only updates counters in memory
and never raises. `render()` produces the text exposition for a scrape.

The histograms are the OpenTelemetry GenAI client metrics, named as an
OpenTelemetry-to-Prometheus exporter names them, with the advised buckets:

- `gen_ai_client_operation_duration_seconds`: e2e, every request that has one
- `gen_ai_client_operation_time_to_first_chunk_seconds`: TTFT, streams only
- `gen_ai_client_operation_time_per_output_chunk_seconds`: one sample per
  *request*, its `tpot_ms` (the convention asks for one sample per chunk;
  llmtap records the per-request TPOT, which is what dashboards compare)
- `gen_ai_client_token_usage`: `gen_ai_token_type` = `input` (cached
  included), `output` (reasoning included) and `cache_read` (an llmtap
  extension: the cached part of `input`)

plus `llmtap_requests_total` by outcome, the store's counters and the
event-loop lag. Labels: `route`, `model` (the requested model), `tool`,
`status_class` (`2xx`, `4xx`, `5xx`, ..., `none`). Labels with values from
clients (model, tool, route) keep their first `max_label_values` distinct
values each; later ones are counted as `other`, so a client cycling model
names cannot grow the scrape without bound.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest

# OTel GenAI advice: 0.01 s doubling to 81.92 s; tokens 1 quadrupling to 4^13.
DURATION_BUCKETS = tuple(round(0.01 * 2**k, 2) for k in range(14))
TOKEN_BUCKETS = tuple(float(4**k) for k in range(14))
LABELS = ("route", "model", "tool", "status_class")
TOKEN_TYPES = (("input", "input_tokens"), ("output", "output_tokens"), ("cache_read", "cache_read_tokens"))
OTHER, NONE = "other", "none"
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


class PrometheusMetrics:
    def __init__(self, max_label_values: int = 50, store_stats: StoreStats | None = None,
                 loop_lag: LoopLagSummary | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.bounded = {name: BoundedLabel(max_label_values) for name in ("route", "model", "tool")}
        self.observe_errors = 0
        reg = self.registry
        self.duration = Histogram("gen_ai_client_operation_duration_seconds",
                                  "End-to-end duration of the request, as seen by llmtap (e2e_ms).",
                                  LABELS, registry=reg, buckets=DURATION_BUCKETS)
        self.ttft = Histogram("gen_ai_client_operation_time_to_first_chunk_seconds",
                              "Time to the first output event of a stream (ttft_ms).",
                              LABELS, registry=reg, buckets=DURATION_BUCKETS)
        self.tpot = Histogram("gen_ai_client_operation_time_per_output_chunk_seconds",
                              "Per-request time per output token (tpot_ms): one sample per request.",
                              LABELS, registry=reg, buckets=DURATION_BUCKETS)
        self.tokens = Histogram("gen_ai_client_token_usage",
                                "Tokens per request by gen_ai_token_type (input, output, cache_read).",
                                (*LABELS, "gen_ai_token_type"), registry=reg, buckets=TOKEN_BUCKETS)
        self.requests = Counter("llmtap_requests", "Finished requests by outcome.",
                                (*LABELS, "outcome"), registry=reg)
        reg.register(_RuntimeCollector(store_stats, loop_lag, self))
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def observe(self, row: Mapping[str, Any]) -> None:
        """Count one finished request. Never raises: a bad row only bumps a counter."""
        try:
            self._observe(row)
        except Exception:
            self.observe_errors += 1

    def _observe(self, row: Mapping[str, Any]) -> None:
        labels = (self.bounded["route"](row.get("route")), self.bounded["model"](row.get("request_model")),
                  self.bounded["tool"](row.get("tool")), status_class(row.get("status")))
        self._child(self.requests, (*labels, row.get("outcome") or NONE)).inc()
        self._seconds(self.duration, labels, row.get("e2e_ms"))
        if row.get("stream"):
            self._seconds(self.ttft, labels, row.get("ttft_ms"))
        self._seconds(self.tpot, labels, row.get("tpot_ms"))
        for token_type, column in TOKEN_TYPES:
            value = row.get(column)
            if value is not None:
                self._child(self.tokens, (*labels, token_type)).observe(value)

    def _child(self, metric: Any, labels: tuple[str, ...]) -> Any:
        """`metric.labels(*labels)`, cached: prometheus_client's lookup is slow, and labels are bounded."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def _seconds(self, histogram: Histogram, labels: tuple[str, ...], ms: Any) -> None:
        if ms is not None:
            self._child(histogram, labels).observe(ms / 1000.0)

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
        yield CounterMetricFamily("llmtap_metrics_observe_errors", "Rows the metrics could not count.",
                                  value=self.metrics.observe_errors)
        if self.store_stats is not None:
            yield from _store_metrics(self.store_stats())
        if self.loop_lag is not None:
            yield _lag_metric(self.loop_lag())


def _store_metrics(stats: Mapping[str, Any]) -> Iterator[Metric]:
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
