"""The lock and pyproject.toml's tested caps agree (requirements/bump.py writes both; a hand edit of one fails)."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "requirements"))
from bump import locked_versions, name_key  # noqa: E402


def test_every_runtime_dependency_is_capped_at_its_locked_release() -> None:
    locked = locked_versions((ROOT / "requirements" / "lock.txt").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for spec in project["dependencies"]:
        name, cap = re.fullmatch(r"([\w.\-]+)>=[^,;]+,<=([^;]+)(;.*)?", spec).group(1, 2)  # type: ignore[union-attr]
        assert locked[name_key(name)] == cap.strip(), f"{spec}: the lock has {locked[name_key(name)]}"
    wanted = {name_key(re.match(r"[\w.\-]+", spec)[0])  # type: ignore[index]
              for specs in project["optional-dependencies"].values() for spec in specs}
    assert wanted <= set(locked), f"not in the lock (python requirements/bump.py): {wanted - set(locked)}"
