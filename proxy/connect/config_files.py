"""Writing a tool's own config file: a timestamped backup first, an atomic replace, no change no write."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


class ConfigFileError(ValueError):
    """The file cannot be read or written; the message says which and why."""


@dataclass(frozen=True)
class WriteResult:
    path: Path
    changed: bool
    backup: Path | None


def read_text(path: Path) -> str | None:
    """The file's text, None when it does not exist."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigFileError(f"cannot read {path}: {exc}") from None


def read_json_object(path: Path) -> dict[str, Any] | None:
    text = read_text(path)
    if text is None:
        return None
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigFileError(f"{path} is not valid JSON ({exc}); fix or move it, then run again") from None
    if not isinstance(data, dict):
        raise ConfigFileError(f"{path} does not hold a JSON object; fix or move it, then run again")
    return data


def json_text(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def backup_name(path: Path, now: datetime) -> Path:
    stamp = now.astimezone(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    candidate = path.with_name(f"{path.name}.llmtap-backup-{stamp}")
    n = 1
    while candidate.exists():
        candidate = path.with_name(f"{path.name}.llmtap-backup-{stamp}-{n}")
        n += 1
    return candidate


def replace(path: Path, old: str | None, new: str, now: datetime | None = None) -> WriteResult:
    """Write `new` to `path` unless it already holds it; back the old file up first."""
    if old == new:
        return WriteResult(path, False, None)
    now = now or datetime.now(timezone.utc)
    path = path.resolve() if path.is_symlink() else path  # dotfile managers link these
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        backup = None
        mode = 0o600
        if old is not None:
            mode = path.stat().st_mode & 0o777
            backup = backup_name(path, now)
            fd = os.open(backup, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            with os.fdopen(fd, "wb") as f:
                f.write(path.read_bytes())
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
                f.write(new)
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as exc:
        raise ConfigFileError(f"cannot write {path}: {exc}") from None
    return WriteResult(path, True, backup)
