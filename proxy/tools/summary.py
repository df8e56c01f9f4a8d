"""What one `llmtap run` did: its requests' count, errors, TTFT, tokens and their list price.

TTFT is over generations (the `kind` column): a tool's token counts, probes
and model lists answer in milliseconds and are no first token.

Queries read the database file when no process holds it, else go to the running
`llmtap serve` that holds it (its admin endpoint POST /_llmtap/sql).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb

from proxy.common import prices
from proxy.common.instances import AdminClient, AdminError
from proxy.record.store_reader import StoreError, open_readonly
from proxy.common.schema import GENERATING_KINDS

Result = tuple[list[str], list[str], list[tuple[Any, ...]]]


class SummaryError(Exception):
    pass


def sql_string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def sql_timestamp(value: datetime) -> str:
    return f"TIMESTAMPTZ {sql_string(value.isoformat())}"


def tag_filter(tag: str) -> str:
    return f"tag = {sql_string(tag)}"


def window_filter(start: datetime, end: datetime) -> str:
    """Untagged rows that arrived while the command ran."""
    return f"tag IS NULL AND started_at >= {sql_timestamp(start)} AND started_at <= {sql_timestamp(end)}"


def totals_sql(where: str) -> str:
    return (
        "SELECT count(*) AS requests, count(*) FILTER (WHERE outcome <> 'ok') AS errors, "
        "count(*) FILTER (WHERE kind = 'generation') AS generations, "
        "quantile_cont(ttft_ms, 0.5) FILTER (WHERE kind = 'generation') AS ttft_p50_ms, "
        "quantile_cont(ttft_ms, 0.95) FILTER (WHERE kind = 'generation') AS ttft_p95_ms, "
        "sum(input_tokens) AS input_tokens, sum(output_tokens) AS output_tokens, "
        "string_agg(DISTINCT tool, ', ' ORDER BY tool) AS tools "
        f"FROM requests WHERE {where}"
    )


def errors_sql(where: str) -> str:
    return (
        "SELECT coalesce(CAST(status AS VARCHAR), '-') AS status, outcome, "
        "coalesce(error_type, '') AS error_type, path, count(*) AS n, any_value(error_message) AS message "
        f"FROM requests WHERE {where} AND outcome <> 'ok' GROUP BY ALL ORDER BY n DESC LIMIT 5"
    )


@dataclass(frozen=True)
class Totals:
    requests: int
    errors: int
    generations: int
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    input_tokens: int | None
    output_tokens: int | None
    tools: str | None
    cost: "Cost | None" = None


@dataclass(frozen=True)
class Cost:
    """The generations' tokens at list price (proxy/common/prices.py, as the views' cost_usd)."""

    usd: float | None  # None: no generation was priced (unknown models, or none reported tokens): never 0
    unpriced: int  # generations with tokens of a model genai-prices does not know
    subscription: bool  # some on a Claude or ChatGPT login: a list-price equivalent
    source: str


COST_COLUMNS = ("response_model", "request_model", "upstream_host", "started_at", "input_tokens", "output_tokens",
                "cache_read_tokens", "cache_creation_tokens", "reasoning_tokens", "credential_kind", "route")


def cost(query: "Query", where: str) -> Cost:
    columns, _, rows = query(f"SELECT {', '.join(COST_COLUMNS)} FROM requests WHERE {where} AND kind IN {GENERATING_KINDS}"
                             " AND (input_tokens IS NOT NULL OR output_tokens IS NOT NULL) LIMIT 100000")
    usd: float | None = None
    unpriced, subscription = 0, False
    for values in rows:
        row = dict(zip(columns, values))
        if isinstance(row["started_at"], str):  # over the admin endpoint
            row["started_at"] = datetime.fromisoformat(row["started_at"])
        price = prices.row_cost(row)
        if price is None:
            unpriced += 1
        else:
            usd = (usd or 0.0) + price
            subscription = subscription or row["credential_kind"] in prices.SUBSCRIPTION_KINDS
    return Cost(usd, unpriced, subscription, prices.sources())


class Query:
    """Runs read-only SQL on the run's database, however it is reachable."""

    def __init__(self, db: str | Path | None, admin: AdminClient | None = None) -> None:
        self.db, self.admin = db, admin

    def __call__(self, sql: str) -> Result:
        """The file itself when no process holds it (the run's own proxy has stopped), else the
        running proxy's admin endpoint. The SQL reads table columns only: no views needed."""
        if self.db is not None:
            try:
                con = open_readonly(self.db)
            except StoreError as exc:
                if self.admin is None:
                    raise SummaryError(str(exc)) from None
            else:
                try:
                    cursor = con.execute(sql)
                    rows = cursor.fetchall()
                    return [d[0] for d in cursor.description], [str(d[1]) for d in cursor.description], rows
                except duckdb.Error as exc:
                    raise SummaryError(str(exc)) from None
                finally:
                    con.close()
        return self._over_http(sql)

    def _over_http(self, sql: str) -> Result:
        if self.admin is None:
            raise SummaryError("no database to query")
        try:
            return self.admin.sql(sql, timeout=60)[0]
        except AdminError as exc:
            raise SummaryError(f"cannot query the proxy at {self.admin.url}: {exc}") from None


def totals(query: Query, where: str) -> Totals:
    columns, _, rows = query(totals_sql(where))
    row = dict(zip(columns, rows[0]))
    return Totals(**row, cost=cost(query, where) if row["generations"] else None)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} ms"


def _count(value: int | None) -> str:
    return "-" if value is None else f"{int(value):,}"


def cost_line(c: Cost) -> str:
    """The run's cost; unknown stays unknown (never $0.0000 for what was not priced)."""
    unknown = f"{c.unpriced} of unknown models not priced"
    if c.usd is None:
        why = unknown if c.unpriced else "no generation reported tokens"
        return f"  cost unknown ({why}; `llmtap prices MODEL`)" if c.unpriced else f"  cost - ({why})"
    usd = "<$0.0001" if 0 < c.usd < 0.0001 else f"${c.usd:,.4f}"
    line = f"  cost {usd} at list price ({c.source})"
    if c.subscription:
        line += ", a list-price equivalent on a subscription"
    if c.unpriced:
        line += f"; {unknown}, so at least that"
    return line


def render(label: str, t: Totals, errors: list[dict[str, Any]]) -> str:
    tools = f" ({t.tools})" if t.tools else ""
    lines = [
        f"llmtap run: {label}: {t.requests} request{'s' if t.requests != 1 else ''}{tools}, "
        f"{t.errors} error{'s' if t.errors != 1 else ''}",
    ]
    if t.requests:
        over = f"{t.generations} generation{'s' if t.generations != 1 else ''}"
        lines.append(f"  TTFT p50 {_ms(t.ttft_p50_ms)}, p95 {_ms(t.ttft_p95_ms)} over {over}; "
                     f"tokens in {_count(t.input_tokens)}, out {_count(t.output_tokens)}")
    if t.cost is not None:
        lines.append(cost_line(t.cost))
    for e in errors:
        kind = e["error_type"] or e["outcome"]
        message = (e.get("message") or "").replace("\n", " ")[:100]
        lines.append(f"  {e['n']} x {e['status']} {kind} {e['path']}" + (f": {message}" if message else ""))
    return "\n".join(lines)


def error_rows(query: Query, where: str) -> list[dict[str, Any]]:
    columns, _, rows = query(errors_sql(where))
    return [dict(zip(columns, r)) for r in rows]
