"""Rendering `llmtap errors`: the groups of `diagnose.py` with their causes, as text, json or csv."""

from __future__ import annotations

import csv
import io
import textwrap
from dataclasses import asdict, dataclass

from .diagnose import ErrorGroup, diagnose, error_groups
from .filters import Filters
from .formatting import dumps, layout
from .report import span
from .source import Source

WIDTH = 80
HEADERS = ("count", "status", "outcome", "error_type", "last seen (UTC)")


@dataclass
class ErrorReport:
    requests: int  # all requests in the window
    failed: int
    first: str | None
    last: str | None
    groups: list[ErrorGroup]


def build_error_report(source: Source, filters: Filters) -> ErrorReport:
    requests, first, last = span(source, filters)
    groups = error_groups(source, filters)
    failed = sum(g.count for g in groups if g.outcome != "ok")
    return ErrorReport(requests, failed, first, last, groups)


def heading(report: ErrorReport) -> str:
    if not report.requests:
        return "no requests match"
    share = 100 * report.failed / report.requests
    return (f"{report.failed} failed of {report.requests} requests ({share:.1f}%)"
            f" from {report.first} to {report.last} UTC")


def _hints(group: ErrorGroup) -> list[str]:
    lines = []
    for hint in diagnose(group):
        lines += textwrap.wrap(hint, WIDTH, initial_indent="  - ", subsequent_indent="    ",
                               break_on_hyphens=False)
    return lines


def to_table(report: ErrorReport) -> str:
    if not report.groups:
        return heading(report) + ("\n" if not report.requests else ": nothing to diagnose\n")
    rows = [
        [str(g.count), "-" if g.status is None else str(g.status), g.outcome or "-",
         g.error_type or "-", g.last_seen or "-"]
        for g in report.groups
    ]
    table = layout(HEADERS, rows, [True, True, False, False, False], limit=WIDTH, shrinkable=[3, 2])
    header, dashes, *lines = table.splitlines()
    out = [heading(report), "", header, dashes]
    for line, group in zip(lines, report.groups):
        out += [line, *_hints(group)]
    return "\n".join(out) + "\n"


def _record(group: ErrorGroup) -> dict[str, object]:
    return {**asdict(group), "causes": diagnose(group)}


def to_json(report: ErrorReport) -> str:
    return dumps({
        "requests": report.requests,
        "failed": report.failed,
        "first": report.first,
        "last": report.last,
        "groups": [_record(g) for g in report.groups],
    })


def to_csv(report: ErrorReport) -> str:
    """One row per group; list values joined with '; '."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    records = [_record(g) for g in report.groups]
    columns = list(records[0]) if records else [*ErrorGroup.__dataclass_fields__, "causes"]
    writer.writerow(columns)
    for record in records:
        writer.writerow(
            ["; ".join(v) if isinstance(v, list) else "" if v is None else v for v in record.values()]
        )
    return out.getvalue()


RENDERERS = {"table": to_table, "json": to_json, "csv": to_csv}
