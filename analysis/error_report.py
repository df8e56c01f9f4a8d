"""Rendering `llmtap errors`: the groups of `diagnose.py` with their causes, as text, json or csv,
and a note on the successful streams whose chunks had empty `choices`."""

from __future__ import annotations

import textwrap
from dataclasses import asdict, dataclass, field

from analysis.diagnose import ErrorGroup, diagnose, empty_choices_note, error_groups
from analysis.filters import Filters
from analysis.formatting import csv_text, dumps, layout
from analysis.report import span
from analysis.source import Source

WIDTH = 80
HEADERS = ("count", "status", "tool", "outcome", "error_type", "last (UTC)")


@dataclass
class ErrorReport:
    requests: int  # all requests in the window
    failed: int
    first: str | None
    last: str | None
    groups: list[ErrorGroup]
    empty_choices: tuple[int, int] = (0, 0)  # successful requests with empty-`choices` chunks, and the chunks
    headroom: list[str] = field(default_factory=list)  # per key with 429s: the headroom that preceded them
    slow_sessions: list[dict[str, str | None]] = field(default_factory=list)  # analysis.timeline.flag_slow


def build_error_report(source: Source, filters: Filters) -> ErrorReport:
    requests, first, last = span(source, filters)
    groups = error_groups(source, filters)
    failed = sum(g.count for g in groups)
    headroom = []
    if any(g.status == 429 for g in groups):
        from analysis.limits import LimitsUnknown, headroom_before_429s

        try:
            headroom = headroom_before_429s(source, filters)
        except LimitsUnknown:
            pass
    from analysis.timeline import a_week, slow_sessions

    slow = slow_sessions(source.query, a_week(filters).where())
    return ErrorReport(requests, failed, first, last, groups, empty_choices_note(source, filters), headroom, slow)


def slow_lines(report: ErrorReport) -> list[str]:
    """The slow sessions, as findings beside the failures (anthropics/claude-code#91413)."""
    lines = []
    for s in report.slow_sessions:
        text = f"slow session {s['session']} ({s['tool'] or 'unknown tool'}): {s['why']}; see `llmtap session {s['session']}`"
        lines += textwrap.wrap(text, WIDTH, subsequent_indent="  ", break_on_hyphens=False)
    return lines


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


def note(report: ErrorReport) -> list[str]:
    """The empty-`choices` note, wrapped, or nothing."""
    requests, chunks = report.empty_choices
    if not requests:
        return []
    streams = "stream" if requests == 1 else "streams"
    text = (f"note: {requests} successful {streams} had {chunks} chunk{'' if chunks == 1 else 's'} with empty"
            " `choices` (the usage chunk of `stream_options.include_usage`, or content-filter chunks):"
            " normal, but clients that read choices[0] unchecked break on them")
    return textwrap.wrap(text, WIDTH, subsequent_indent="  ", break_on_hyphens=False)


def to_table(report: ErrorReport) -> str:
    if not report.groups:
        if not report.requests:
            return heading(report) + "\n"
        slow = slow_lines(report)
        return "\n".join([heading(report) + ": nothing to diagnose", *note(report), *([""] + slow if slow else [])]) + "\n"
    rows = [
        [str(g.count), "-" if g.status is None else str(g.status), g.tool or "-", g.outcome or "-",
         g.error_type or "-", (g.last_seen or "-")[5:] or "-"]  # the year is in the heading
        for g in report.groups
    ]
    table = layout(HEADERS, rows, [True, True, False, False, False, False], limit=WIDTH, shrinkable=[4, 3, 2])
    header, dashes, *lines = table.splitlines()
    out = [heading(report), "", header, dashes]
    shown = False
    for line, group in zip(lines, report.groups):
        out += [line, *_hints(group)]
        if group.status == 429 and not shown:
            shown = True
            for text in report.headroom:
                out += textwrap.wrap(text, WIDTH, initial_indent="  > ", subsequent_indent="    ",
                                     break_on_hyphens=False)
    if report.empty_choices[0]:
        out += ["", *note(report)]
    if report.slow_sessions:
        out += ["", *slow_lines(report)]
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
        "empty_choices": {"requests": report.empty_choices[0], "chunks": report.empty_choices[1]},
        "headroom": report.headroom,
        "slow_sessions": report.slow_sessions,
    })


def to_csv(report: ErrorReport) -> str:
    """One row per group; list values joined with '; '."""
    records = [_record(g) for g in report.groups]
    columns = list(records[0]) if records else [*ErrorGroup.__dataclass_fields__, "causes"]
    return csv_text(columns, (["; ".join(v) if isinstance(v, list) else "" if v is None else v
                               for v in record.values()] for record in records))


RENDERERS = {"table": to_table, "json": to_json, "csv": to_csv}
