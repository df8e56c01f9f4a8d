"""Where llmtap keeps its files: the database, the config, the running proxy's state."""

from __future__ import annotations

import os
from pathlib import Path


def data_dir() -> Path:
    """$LLMTAP_HOME, else $XDG_DATA_HOME/llmtap, else ~/.local/share/llmtap."""
    if home := os.environ.get("LLMTAP_HOME"):
        return Path(home)
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "llmtap"


def default_db_path() -> Path:
    return data_dir() / "llmtap.duckdb"


def default_config_path() -> Path:
    """$LLMTAP_CONFIG, else $XDG_CONFIG_HOME/llmtap/config.toml, else ~/.config/llmtap/config.toml."""
    if path := os.environ.get("LLMTAP_CONFIG"):
        return Path(path)
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "llmtap" / "config.toml"


def state_path() -> Path:
    """JSON written by a running `llmtap serve`: pid, host, port, db path, admin token."""
    return data_dir() / "serve.json"
