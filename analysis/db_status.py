"""`llmtap status`: how big the database file is, what it holds, and whether a proxy records to it.

The rows are counted through `source.open_source` (the file read-only, or the running `llmtap serve`
that holds it). What a row costs on disk is the file apportioned: DuckDB keeps the file in 256 KiB
blocks, used or free (`pragma_database_size`; free blocks are reused for new rows, and `llmtap
compact` gives them back), and each table's columns in some of the used ones (`pragma_storage_info`
names them). A table's share of the used blocks is its share of the blocks the tables occupy, and
its bytes per row that share divided by its rows. Rows not yet checkpointed live in the `.wal`
beside the file (shown apart) and occupy no block yet.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.common import instances as running

from analysis.source import Source, open_source

TABLES = ("requests", "chunks", "bodies")
ONE = {"requests": "request", "chunks": "chunk", "bodies": "body"}


@dataclass
class DbStatus:
    path: Path
    file_bytes: int
    wal_bytes: int
    used_bytes: int  # the file but its free blocks
    rows: dict[str, int]
    blocks: dict[str, int]  # storage blocks each table's columns occupy
    oldest: Any  # started_at of the oldest and newest request (a datetime, or ISO text through a proxy)
    newest: Any
    proxy: running.LiveProxy | None  # the running serve that records to this file
    others: list[str]  # the databases other running serves record to

    def bytes_per_row(self, table: str) -> float | None:
        """The file's used blocks apportioned by the blocks each table occupies, per row of `table`."""
        in_use = sum(self.blocks.values())
        if not self.rows.get(table) or not in_use:
            return None
        return self.used_bytes * self.blocks.get(table, 0) / in_use / self.rows[table]

    def as_dict(self) -> dict[str, Any]:
        return {
            "db": str(self.path), "file_bytes": self.file_bytes, "free_bytes": self.file_bytes - self.used_bytes,
            "wal_bytes": self.wal_bytes,
            **{t: self.rows.get(t, 0) for t in TABLES},
            **{f"bytes_per_{ONE[t]}": _round(self.bytes_per_row(t)) for t in TABLES},
            "oldest": _iso(self.oldest), "newest": _iso(self.newest),
            "proxy": None if self.proxy is None else {"url": self.proxy.url, "pid": self.proxy.pid,
                                                      "warnings": self.proxy.warnings,
                                                      "fast_paths": self.proxy.health.get("fast_paths")},
        }


def gather(path: Path) -> DbStatus:
    """Figures of the database at `path` (SourceError when it cannot be read)."""
    path = Path(path).expanduser()
    source = open_source(path)
    try:
        counts = _one(source, "SELECT (SELECT count(*) FROM requests), (SELECT count(*) FROM chunks), "
                              "(SELECT count(*) FROM bodies), (SELECT min(started_at) FROM requests), "
                              "(SELECT max(started_at) FROM requests)")
        # the tables by their catalog-qualified names: `requests` alone is the view of views.py
        name = str(_one(source, "SELECT current_database()")[0])
        catalog = '"' + name.replace('"', '""') + '".main.'
        free = _one(source, "SELECT free_blocks * block_size FROM pragma_database_size() "
                            f"WHERE database_name = {_literal(name)}")[0]
        blocks: dict[str, int] = dict(source.query(" UNION ALL ".join(
            f"SELECT '{t}', count(DISTINCT b) FROM (SELECT block_id AS b FROM pragma_storage_info({_literal(catalog + t)}) "
            f"UNION ALL SELECT unnest(additional_block_ids) FROM pragma_storage_info({_literal(catalog + t)})) WHERE b >= 0"
            for t in TABLES))[2])
    finally:
        source.close()
    live = running.states()
    proxy = running.find_running(path)
    size = _size(path)
    return DbStatus(path=path, file_bytes=size, wal_bytes=_size(path.with_name(path.name + ".wal")),
                    used_bytes=max(0, size - int(free or 0)),
                    rows=dict(zip(TABLES, (int(n) for n in counts[:3]))), blocks={k: int(v) for k, v in blocks.items()},
                    oldest=counts[3], newest=counts[4], proxy=proxy,
                    others=[str(s.db) for s in live if s.db and not s.holds(path)])


def render(status: DbStatus) -> str:
    free = status.file_bytes - status.used_bytes
    free_text = f", {fmt_bytes(free)} of it free (reused for new rows; llmtap compact gives it back)" if free else ""
    wal = f" and {fmt_bytes(status.wal_bytes)} in its .wal (not yet checkpointed)" if status.wal_bytes else ""
    lines = [f"database  {status.path}", f"size      {fmt_bytes(status.file_bytes)}{free_text}{wal}"]
    for table in TABLES:
        per = status.bytes_per_row(table)
        each = f"   {fmt_bytes(per)} per {ONE[table]}" if per is not None else ""
        lines.append(f"{table:<9} {status.rows.get(table, 0):,}{each}")
    lines.append(f"oldest    {_when(status.oldest)}")
    lines.append(f"newest    {_when(status.newest)}")
    if status.proxy is not None:
        lines.append(f"proxy     llmtap serve (PID {status.proxy.pid}) at {status.proxy.url} records to this file")
        if isinstance(fast := status.proxy.health.get("fast_paths"), dict):
            off = f"; off (the public path): {', '.join(fast['off'])}" if fast.get("off") else ""
            lines.append(f"fast      {', '.join(fast.get('on') or []) or 'none'} on (aiohttp {fast.get('aiohttp')}){off}")
        lines.extend(f"WARNING   {warning}" for warning in status.proxy.warnings)
    elif status.others:
        lines.append(f"proxy     none records to this file; the running llmtap serve records to {', '.join(status.others)}")
    else:
        lines.append("proxy     none running: tools pointed at llmtap fail with connection refused "
                     "(start it: llmtap service install, or llmtap serve)")
    lines.append("(per row: the file's used blocks split between the tables by the blocks each occupies)")
    return "\n".join(lines) + "\n"


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B" if n >= 10 or n == int(n) else f"{n:.1f} B"


def _one(source: Source, sql: str) -> tuple[Any, ...]:
    return source.query(sql)[2][0]


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _when(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    return value.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _iso(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return value.astimezone(dt.timezone.utc).isoformat()


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
