"""Which requests a command looks at: a time window and tag/model/tool/kind filters.

Commands pass SQL text to a `Source` (which may be the running proxy's HTTP
endpoint, so there are no bound parameters): every value is quoted here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


def sql_string(value: str) -> str:
    """A SQL string literal (single quotes doubled)."""
    return "'" + value.replace("'", "''") + "'"


def sql_identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def sql_timestamp(value: datetime) -> str:
    return f"TIMESTAMPTZ {sql_string(value.isoformat())}"


@dataclass(frozen=True)
class Filters:
    """since is inclusive, until exclusive; several values of one filter are OR-ed."""

    since: datetime | None = None
    until: datetime | None = None
    tags: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()  # request kinds (proxy/meter/request_kind.py); () is every kind
    conditions: tuple[str, ...] = ()  # more SQL conditions, AND-ed, already quoted (the web UI's session, outcome)

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
        terms += [f"({condition})" for condition in self.conditions]
        return " AND ".join(terms) or "TRUE"
