"""A real second Unix user, for tests of what another user on the machine can read or plant.

Needs root (to create the user once and to act as it with `runuser`); the tests that use it skip
otherwise. The home-like directory it gives is world-traversable (0755), as a real home usually
is, so a refusal comes from the file's own mode and not from a directory on the way.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

NAME = "llmtap-other"


def _ensure_user() -> pwd.struct_passwd:
    if os.geteuid() != 0 or not shutil.which("runuser") or not shutil.which("useradd"):
        pytest.skip("needs root, runuser and useradd to act as a second Unix user")
    try:
        return pwd.getpwnam(NAME)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", NAME],
                       check=True, capture_output=True)
        return pwd.getpwnam(NAME)


@pytest.fixture
def other_user() -> pwd.struct_passwd:
    return _ensure_user()


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory under /tmp that every user can traverse (0755), removed after the test."""
    path = Path(tempfile.mkdtemp(prefix="llmtap-open-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def can_read(user: pwd.struct_passwd, path: Path) -> bool:
    """Whether `user` can read the file's bytes (it really tries, as that user)."""
    done = subprocess.run(["runuser", "-u", user.pw_name, "--", "cat", str(path)],
                          capture_output=True, timeout=30)
    return done.returncode == 0
