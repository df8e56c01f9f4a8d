"""`llmtap status`, `llmtap prune`, `llmtap compact`: the database's size, and keeping it small.

`status` reads through `source.open_source`, locked down like every query of the CLI. `prune` and
`compact` write the file, so they run only while no `llmtap serve` holds it (proxy/record/retention.py):
`prune` opens it read-write and locks the connection down (lock-down allows the open database
itself); `compact` attaches a second, new file, which a locked-down connection refuses, so its
connection is its own and runs no SQL but retention's.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from proxy.common import duck
from proxy.record import retention
from proxy.common.terminal_text import echo

from analysis.cli import default_or_demo, db_option, output_options
from analysis.db_status import fmt_bytes, gather, render
from analysis.source import SourceError
from analysis.timewindow import WindowError, parse_time, utc_now


@click.command()
@db_option
@output_options("table", "json")
def status(db_path: Path, fmt: str) -> None:
    """Show the database's size, rows, oldest and newest, and the proxy recording to it."""
    try:
        found = gather(default_or_demo(db_path))
    except SourceError as exc:
        raise click.ClickException(str(exc)) from None
    echo(json.dumps(found.as_dict(), indent=2) if fmt == "json" else render(found), nl=fmt == "json")


@click.command()
@click.option("--older-than", "older_than", required=True, metavar="WHEN",
              help="Delete requests started before WHEN: a span before now (30d, 2w, 12h) or an ISO date-time.")
@click.option("--bodies-only", is_flag=True, help="Delete only the captured bodies of those requests; keep the rows.")
@db_option
def prune(older_than: str, bodies_only: bool, db_path: Path) -> None:
    """Delete old requests, with their chunks and bodies (stop serve first)."""
    try:
        before = parse_time(older_than, utc_now())
    except WindowError as exc:
        raise click.BadParameter(str(exc), param_hint="--older-than") from None
    try:
        con = retention.open_for_writing(db_path, "prune")
    except retention.RetentionError as exc:
        raise click.ClickException(str(exc)) from None
    size_before = _on_disk(db_path)
    try:
        duck.lock_down(con)
        done = retention.prune(con, rows_before=None if bodies_only else before,
                               bodies_before=before if bodies_only else None)
        if done.requests or done.bodies:
            con.execute("CHECKPOINT")  # the deletes into the file, so the size printed is the file's
    finally:
        con.close()
    echo(f"deleted {done.describe()} of requests started before {before:%Y-%m-%d %H:%M:%S} UTC from {db_path}")
    if done.requests or done.bodies:
        size_after = _on_disk(db_path)
        change = "grew" if size_after > size_before else "shrank" if size_after < size_before else "kept its size"
        echo(f"the file {change}: {fmt_bytes(size_before)} -> {fmt_bytes(size_after)} with its .wal (DuckDB marks the"
             " deleted rows' space free for new rows and writes the changed row groups anew, so a prune"
             " does not shrink it); to shrink it: llmtap compact")


def _on_disk(path: Path) -> int:
    """The database file's bytes and its write-ahead log's."""
    return sum(p.stat().st_size for p in (path, path.with_name(path.name + ".wal")) if p.exists())


@click.command()
@db_option
def compact(db_path: Path) -> None:
    """Rewrite the database file so that it shrinks (stop serve first)."""
    try:
        before, after = retention.compact(db_path)
    except retention.RetentionError as exc:
        raise click.ClickException(str(exc)) from None
    echo(f"compacted {db_path}: {fmt_bytes(before)} -> {fmt_bytes(after)}")
