"""Writing a tool's own config file: a timestamped backup first, an atomic replace, no change no write.

Backups are owner-only (0600) from the moment they exist: the old file may hold a key. A file
that will hold a secret (`secret=True`: llmtap's client key) is made owner-only too, whatever
its mode was, and the result says so (`tightened`); other files keep their mode.
"""

from __future__ import annotations

import glob
import json
import os
import stat
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


class ConfigFileError(ValueError):
    """The file cannot be read or written; the message says which and why."""


PRIVATE = 0o600
OTHERS = 0o077  # group and other bits: none on a file that holds a secret


@dataclass(frozen=True)
class WriteResult:
    path: Path
    changed: bool
    backup: Path | None
    tightened: list[tuple[Path, int]] = field(default_factory=list)  # (file, its mode before), now owner-only

    def tightened_lines(self) -> list[str]:
        return [f"{p} was readable by others ({mode:04o}): now {mode & ~OTHERS | PRIVATE:04o}, owner-only,"
                " as it holds llmtap's client key" for p, mode in self.tightened]


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


def replace(path: Path, old: str | None, new: str, now: datetime | None = None,
            secret: bool = False) -> WriteResult:
    """Write `new` to `path` unless it already holds it; back the old file up first.
    `secret`: `new` holds a key, so the file ends owner-only (so do earlier backups of it)."""
    path = path.resolve() if path.is_symlink() else path  # dotfile managers link these
    if old == new:
        return WriteResult(path, False, None, make_private(path) if secret else [])
    now = now or datetime.now(timezone.utc)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        backup = None
        mode, before = PRIVATE, None
        if old is not None:
            before = path.stat().st_mode & 0o777
            mode = before & ~OTHERS | PRIVATE if secret else before
            backup = backup_name(path, now)
            fd = os.open(backup, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE)
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), PRIVATE)  # whatever the umask
                f.write(path.read_bytes())
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # 0600
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
    tightened = [(path, before)] if before is not None and before & OTHERS and not mode & OTHERS else []
    return WriteResult(path, True, backup, tightened + (_tighten_backups(path) if secret else []))


def make_private(path: Path) -> list[tuple[Path, int]]:
    """Take group and other bits off `path` and its earlier backups; (file, mode before) for each changed."""
    path = path.resolve() if path.is_symlink() else path
    return _tighten([path]) + _tighten_backups(path)


def _tighten_backups(path: Path) -> list[tuple[Path, int]]:
    return _tighten(sorted(path.parent.glob(glob.escape(path.name) + ".llmtap-backup-*")))


def _tighten(paths: list[Path]) -> list[tuple[Path, int]]:
    done = []
    for p in paths:
        try:
            st = p.lstat()
            if not stat.S_ISREG(st.st_mode) or not st.st_mode & OTHERS:
                continue
            os.chmod(p, st.st_mode & 0o777 & ~OTHERS | PRIVATE)
        except OSError as exc:
            raise ConfigFileError(f"cannot make {p} owner-only: {exc}") from None
        done.append((p, st.st_mode & 0o777))
    return done
