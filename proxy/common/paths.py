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


def state_dir() -> Path:
    """One JSON file per running `llmtap serve`, named by its port (proxy/common/instances.py)."""
    return data_dir() / "run"


def client_key_path() -> Path:
    """llmtap's own client key, which clients present where a route injects the upstream key."""
    return data_dir() / "client-key"


def telemetry_token_path() -> Path:
    """The token the agents' OpenTelemetry exports carry to llmtap (proxy/relay/otlp.py)."""
    return data_dir() / "telemetry-token"
