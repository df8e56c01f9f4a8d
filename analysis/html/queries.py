"""The SQL behind the HTML report, and the plain data it returns.

Every query reads the `requests` table through one predicate (`where`, trusted
SQL from the CLI) and returns bounded data whatever the database's size:
quantile lists for CDFs, time buckets for series and the cost's bars, a hashed
sample of at most `SCATTER_POINTS` per model for the scatter, each aggregated in
DuckDB over the rows `where` selects. Latencies and tokens/s are taken
over requests whose outcome is `ok`, so fast failures do not pull them down,
and TTFT only over streams (as in `analysis.views`).
Charts show the `CHART_MODELS` busiest models; the tables show all of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Query = Callable[[str], tuple[list[str], list[str], list[tuple]]]

CHART_MODELS = 12
SCATTER_POINTS = 2000
TIME_BUCKETS = 200
HISTOGRAM_BINS = 40
MIN_FIT_POINTS = 10
CDF_QUANTILES = [i / 200 for i in range(199)] + [0.995, 0.999]
BUCKET_SECONDS = (1, 5, 10, 30, 60, 300, 600, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400)
NO_MODEL = "(none)"
OK = "outcome = 'ok'"
OK_STREAM = "outcome = 'ok' AND stream"  # TTFT means something only for streams
SCATTERED = f"{OK_STREAM} AND input_tokens IS NOT NULL AND ttft_ms IS NOT NULL"
UNIT_HASH = "hash(id) / 18446744073709551616.0"  # a request's hash as a fraction in [0, 1)
COST_BARS = 62  # days per bar: 1, 7, 30 or more, so a long window still gives a few dozen bars


def rows_as_dicts(query: Query, sql: str) -> list[dict[str, Any]]:
    columns, _types, rows = query(sql)
    return [dict(zip(columns, row, strict=True)) for row in rows]


def base_cte(where: str) -> str:
    """`r`: the selected requests with a non-null `model`; `top`: the charted models by rank. `r` is
    read by each of its consumers (NOT MATERIALIZED): DuckDB would otherwise buffer the window's rows
    (every column of `requests` a query names) once, which cost more than scanning them again."""
    return f"""
    WITH r AS NOT MATERIALIZED (
        SELECT coalesce(request_model, '{NO_MODEL}') AS model, *
        FROM requests WHERE ({where})
    ),
    top AS (
        SELECT model, row_number() OVER (ORDER BY count(*) DESC, model) AS rank,
            count(*) FILTER (WHERE {SCATTERED}) AS scattered
        FROM r GROUP BY model
        QUALIFY rank <= {CHART_MODELS}
    )"""


def fit(aggregate: str) -> str:
    """A term of the least-squares line TTFT = a + b * input tokens, when enough requests back it."""
    over = f"(ttft_ms, input_tokens) FILTER (WHERE {OK_STREAM})"
    return f"CASE WHEN regr_count{over} >= {MIN_FIT_POINTS} THEN {aggregate}{over} END"


def summary_sql(where: str) -> str:
    """One row per model and a last row (model NULL) for all of them together."""
    return f"""{base_cte(where)}
    SELECT
        CASE WHEN grouping(model) = 1 THEN NULL ELSE model END AS model,
        count(*) AS requests,
        100.0 * count(*) FILTER (WHERE outcome IS DISTINCT FROM 'ok') / count(*) AS error_pct,
        quantile_cont(ttft_ms, [0.5, 0.9, 0.99]) FILTER (WHERE {OK_STREAM}) AS ttft_ms,
        quantile_cont(tpot_ms, [0.5, 0.99]) FILTER (WHERE {OK}) AS tpot_ms,
        quantile_cont(e2e_ms, [0.5, 0.99]) FILTER (WHERE {OK}) AS e2e_ms,
        median(output_tokens_per_s) FILTER (WHERE {OK}) AS tokens_per_s,
        sum(input_tokens)::BIGINT AS input_tokens,
        sum(output_tokens)::BIGINT AS output_tokens,
        {fit("1000 * regr_slope")} AS ttft_ms_per_1k_input,
        {fit("regr_intercept")} AS ttft_intercept_ms
    FROM r
    GROUP BY GROUPING SETS ((model), ())
    ORDER BY grouping(model), requests DESC, model"""


def totals_sql(where: str) -> str:
    return f"""{base_cte(where)}
    SELECT count(*) AS requests,
        count(*) FILTER (WHERE outcome IS DISTINCT FROM 'ok') AS errors,
        count(DISTINCT model) AS models,
        epoch(min(started_at)) AS first_s, epoch(max(started_at)) AS last_s,
        sum(input_tokens)::BIGINT AS input_tokens, sum(output_tokens)::BIGINT AS output_tokens
    FROM r"""


def scatter_sql(where: str) -> str:
    """The `SCATTER_POINTS` requests of smallest hash per model. The hash is uniform, so keeping the
    ones under twice the share needed first leaves the same points and sorts a few thousand, not all."""
    return f"""{base_cte(where)}
    SELECT model, input_tokens AS x, round(ttft_ms, 1) AS y
    FROM r JOIN top USING (model)
    WHERE {SCATTERED} AND {UNIT_HASH} < 2.0 * {SCATTER_POINTS} / scattered
    QUALIFY row_number() OVER (PARTITION BY model ORDER BY hash(id)) <= {SCATTER_POINTS}
    ORDER BY rank, x"""


def cdf_sql(where: str) -> str:
    """Empirical CDF points, the values `quantile_disc` picks (rank ceil(q * n)), from one sorted list
    per model and metric: about half the CPU of `quantile_disc` with 200 quantiles (2M requests)."""
    qs = ", ".join(repr(q) for q in CDF_QUANTILES)

    def picked(metric: str) -> str:
        return f"CASE WHEN len({metric}) > 0 THEN list_transform([{qs}], lambda q: {metric}[greatest(1, ceil(q * len({metric})))::BIGINT]) END"
    return f"""{base_cte(where)},
    sorted AS (
        SELECT model, rank,
            list_sort(list(ttft_ms) FILTER (WHERE stream AND ttft_ms IS NOT NULL)) AS ttft,
            list_sort(list(tpot_ms) FILTER (WHERE tpot_ms IS NOT NULL)) AS tpot,
            list_sort(list(e2e_ms) FILTER (WHERE e2e_ms IS NOT NULL)) AS e2e
        FROM r JOIN top USING (model)
        WHERE {OK}
        GROUP BY model, rank)
    SELECT model, {picked("ttft")} AS ttft_ms, {picked("tpot")} AS tpot_ms, {picked("e2e")} AS e2e_ms
    FROM sorted ORDER BY rank"""


def series_sql(where: str, bucket_s: int) -> str:
    return f"""{base_cte(where)}
    SELECT model, {bucket_s} * floor(epoch(started_at) / {bucket_s}) AS t,
        round(median(ttft_ms) FILTER (WHERE stream), 1) AS ttft_ms, round(median(tpot_ms), 3) AS tpot_ms
    FROM r JOIN top USING (model)
    WHERE {OK}
    GROUP BY model, rank, t ORDER BY rank, t"""


def histogram_sql(where: str) -> str:
    """Shared bins from 0 to the p99 of all charted models; faster requests land in the last bin."""
    return f"""{base_cte(where)},
    ok AS (SELECT model, rank, output_tokens_per_s AS v FROM r JOIN top USING (model)
           WHERE {OK} AND output_tokens_per_s IS NOT NULL),
    hi AS (SELECT quantile_cont(v, 0.99) AS hi FROM ok)
    SELECT model, (SELECT hi FROM hi) AS hi,
        least(floor(v / ((SELECT hi FROM hi) / {HISTOGRAM_BINS})), {HISTOGRAM_BINS - 1})::INTEGER AS bin,
        count(*) AS n
    FROM ok WHERE (SELECT hi FROM hi) > 0
    GROUP BY model, rank, bin ORDER BY rank, bin"""


def errors_by_model_sql(where: str) -> str:
    return f"""{base_cte(where)}
    SELECT coalesce(outcome, '(none)') AS outcome, status,
        CASE WHEN top.rank IS NULL THEN '(other models)' ELSE r.model END AS model,
        coalesce(top.rank, {CHART_MODELS + 1}) AS rank, count(*) AS n
    FROM r LEFT JOIN top USING (model)
    WHERE outcome IS DISTINCT FROM 'ok'
    GROUP BY ALL ORDER BY n DESC"""


def cost_by_day_sql(where: str, days: int = 1) -> str:
    """The list price of each bar's priced requests (`days` UTC days from the first), by model (the
    charted ones, then the rest): summed per day first, so only the few day rows are put in bars."""
    return f"""{base_cte(where)},
    daily AS (
        SELECT day, CASE WHEN top.rank IS NULL THEN '(other models)' ELSE r.model END AS model,
            coalesce(top.rank, {CHART_MODELS + 1}) AS rank, sum(cost_usd) AS usd,
            bool_or(billing = 'subscription') AS subscription
        FROM r LEFT JOIN top USING (model)
        WHERE cost_usd IS NOT NULL
        GROUP BY ALL)
    SELECT strftime(time_bucket(INTERVAL {days} DAY, day, first), '%Y-%m-%d') AS day, model, rank,
        sum(usd) AS usd, bool_or(subscription) AS subscription
    FROM (SELECT *, min(day) OVER () AS first FROM daily)
    GROUP BY ALL ORDER BY day, rank"""


def error_table_sql(where: str) -> str:
    return f"""{base_cte(where)}
    SELECT coalesce(outcome, '(none)') AS outcome, status, error_type,
        count(*) AS n, count(DISTINCT model) AS models,
        left(any_value(error_message), 160) AS example
    FROM r WHERE outcome IS DISTINCT FROM 'ok'
    GROUP BY ALL ORDER BY n DESC, outcome LIMIT 20"""


def _has(query: Query, column: str) -> bool:
    """Whether `requests` has this column (the views' derived ones are absent from a bare table)."""
    return column in query("SELECT * FROM requests LIMIT 0")[0]


def bucket_seconds(span_s: float, requests: int) -> int:
    """The smallest round bucket giving at most `TIME_BUCKETS` buckets, and fewer for
    sparse data (about 20 requests per bucket), so medians are not single requests.
    Buckets start at multiples of their size, so a span of k buckets' length may touch k + 1."""
    buckets = max(10, min(TIME_BUCKETS, requests // 20)) - 1
    for seconds in BUCKET_SECONDS:
        if span_s / seconds <= buckets:
            return seconds
    return int(span_s // buckets) + 1


def cost_days(span_s: float) -> int:
    """Days per bar of the cost chart: 1, 7, 30 or more, the first giving at most `COST_BARS` bars."""
    days = span_s / 86400
    return next((d for d in (1, 7, 30) if days < COST_BARS * d), int(days // COST_BARS) + 1)


def fetch_report_data(query: Query, where: str = "TRUE") -> dict[str, Any]:
    """Everything the page needs, as plain Python values (no chart data when nothing matches)."""
    totals = rows_as_dicts(query, totals_sql(where))[0]
    data: dict[str, Any] = {"totals": totals}
    if not totals["requests"]:
        return data
    span_s = (totals["last_s"] or 0) - (totals["first_s"] or 0)
    bucket_s, days = bucket_seconds(span_s, totals["requests"]), cost_days(span_s)
    data |= {
        "summary": rows_as_dicts(query, summary_sql(where)),
        "scatter": rows_as_dicts(query, scatter_sql(where)),
        "cdf": rows_as_dicts(query, cdf_sql(where)),
        "series": rows_as_dicts(query, series_sql(where, bucket_s)),
        "bucket_s": bucket_s,
        "histogram": rows_as_dicts(query, histogram_sql(where)),
        "errors_by_model": rows_as_dicts(query, errors_by_model_sql(where)),
        "cost_by_day": rows_as_dicts(query, cost_by_day_sql(where, days)) if _has(query, "cost_usd") else [],
        "cost_days": days,
        "error_table": rows_as_dicts(query, error_table_sql(where)),
    }
    return data
