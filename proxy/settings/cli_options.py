"""The options every command shares, declared once: `--db` and `--config` (and serve's `--workers`).

Every command resolves the database the same way (`config.resolve_db`): `--db`, else
`$LLMTAP_DB`, else the config file's `db`, else ~/.local/share/llmtap/llmtap.duckdb. So
`LLMTAP_DB=x llmtap serve` and `LLMTAP_DB=x llmtap sql` look at the same file, and so do
`serve` and `report` under a config file that names one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])
DB_DEFAULT = "$LLMTAP_DB, else the config file's db, else ~/.local/share/llmtap/llmtap.duckdb"


def db_option(dest: str = "db_path", what: str = "DuckDB file", resolve: bool = True) -> Callable[[F], F]:
    """`--db`; the command gets the resolved Path (`resolve=False`: the value as given, or None,
    for a command that resolves it with its own --config)."""
    def resolved(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
        from proxy.settings.config import resolve_db

        return resolve_db(value) if resolve else value

    return click.option("--db", dest, type=click.Path(dir_okay=False, path_type=Path), default=None,
                        callback=resolved, help=f"{what} (default: {DB_DEFAULT}).")


def config_option(f: F) -> F:
    return click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
                        help="TOML config file (default: $LLMTAP_CONFIG, else ~/.config/llmtap/config.toml).")(f)


def workers_option(f: F) -> F:
    """`serve --workers N` (proxy/serve/workers.py): N processes relay and measure, this one writes the database."""
    return click.option("--workers", type=click.IntRange(min=1, max=64), default=1, show_default=True,
                        help="Processes that relay and measure, on the same port (SO_REUSEPORT); this one "
                             "also writes the database, the others send it their rows.")(f)
