"""Which requests a command looks at: a time window, tag/model/tool/kind filters, their exclusions,
raw SQL conditions, and whether `llmtap bench`'s traffic counts.

Commands pass SQL text to a `Source` (which may be the running proxy's HTTP
endpoint, so there are no bound parameters): every value is quoted here. A
raw condition (`--where`) is checked first as the `sql` command's queries are
through the proxy (proxy/record/sql_filter.py: one read-only SELECT, no table
function that reads a file), and then runs on the same locked-down source.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

# `llmtap bench` tags every row it sends `bench-<UTC time>-<experiment>` (analysis/bench/runner.py)
BENCH_TAG_PREFIX = "bench-"
# --exclude FIELD=VALUE: the include filters' fields and their columns
EXCLUDABLE: dict[str, str] = {"tag": "tag", "model": "request_model", "tool": "tool", "project": "project"}


class ConditionError(ValueError):
    """A --where condition that does not run: the message says why."""


def sql_string(value: str) -> str:
    """A SQL string literal (single quotes doubled)."""
    return "'" + value.replace("'", "''") + "'"


def sql_identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def sql_timestamp(value: datetime) -> str:
    return f"TIMESTAMPTZ {sql_string(value.isoformat())}"


def check_condition(condition: str) -> str:
    """`condition` when it is one SQL condition over `requests` that the proxy's SQL endpoint would
    run (read-only, no file access); else ConditionError. Parsed only (an in-memory DuckDB), so a
    column's name is checked when the query runs."""
    import duckdb

    from proxy.record import sql_filter

    if not condition.strip():
        raise ConditionError("the condition is empty")
    with duckdb.connect() as con:
        try:
            sql_filter.check(f"SELECT 1 FROM requests WHERE ({condition})", con.cursor())
        except sql_filter.Refused as exc:
            raise ConditionError(f"{condition!r}: {exc}") from None
    return condition


@dataclass(frozen=True)
class Filters:
    """since is inclusive, until exclusive; several values of one filter are OR-ed; an excluded value
    leaves out the rows that have it (a NULL stays in); conditions are AND-ed."""

    since: datetime | None = None
    until: datetime | None = None
    tags: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()  # request kinds (proxy/meter/request_kind.py); () is every kind
    exclude: tuple[tuple[str, str], ...] = ()  # (field of EXCLUDABLE, value)
    conditions: tuple[str, ...] = ()  # raw SQL, checked by check_condition
    bench: bool = True  # False: leave out `llmtap bench`'s rows (unless --tag names tags)

    def where(self, prefix: str = "") -> str:
        """A WHERE condition over the `requests` view (`prefix` is a table alias with its dot)."""
        terms = []
        if self.since is not None:
            terms.append(f"{prefix}started_at >= {sql_timestamp(self.since)}")
        if self.until is not None:
            terms.append(f"{prefix}started_at < {sql_timestamp(self.until)}")
        for column, values in (("tag", self.tags), ("request_model", self.models), ("tool", self.tools),
                               ("kind", self.kinds)):
            if values:
                terms.append(f"{prefix}{column} IN ({', '.join(sql_string(v) for v in values)})")
        for field in EXCLUDABLE:
            excluded = [v for f, v in self.exclude if f == field]
            if excluded:
                column = prefix + EXCLUDABLE[field]
                terms.append(f"({column} IS NULL OR {column} NOT IN ({', '.join(sql_string(v) for v in excluded)}))")
        if not self.bench and not self.tags:
            terms.append(f"NOT coalesce(starts_with({prefix}tag, {sql_string(BENCH_TAG_PREFIX)}), false)")
        terms += (f"({condition})" for condition in self.conditions)
        return " AND ".join(terms) or "TRUE"
