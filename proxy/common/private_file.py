"""Writing a file only its owner can read (0600), whatever the umask: the HTML report, for one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_private(path: Path, text: str) -> None:
    """Put `text` at `path`, owner-only from the first byte: a temporary file beside it (0600 from
    its creation), then renamed over the path, so a file that was there before ends 0600 too."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
