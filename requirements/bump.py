"""Raise the lock and the tested caps in one command: `python requirements/bump.py` (needs uv).

requirements/lock.txt pins every package of every extra, for every Python pyproject.toml allows
(`uv pip compile --universal`); .ci/run, the Dockerfile and the README install with `-c` it. The runtime
dependencies in pyproject.toml carry a tested cap, `<=` the locked release (as mitmproxy keeps its own),
so a fresh install never gets a release no test has run on. A bump resolves the newest releases with
the caps lifted, writes the lock, and sets each cap to its new release; run the suite before committing
(a price or figure that moved fails in a test named for it: tests/test_prices.py). Extra arguments go
to `uv pip compile` (e.g. `-c FILE` to hold some packages back).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
LOCK = ROOT / "requirements" / "lock.txt"
# a runtime dependency's line in pyproject.toml: "name>=floor[,<cap or <=cap][; marker]",
DEPENDENCY = re.compile(r'^(\s*")([A-Za-z0-9_.\-]+)(>=[^,;"]+)(,<=?[^;"]+)?(;[^"]*)?(".*)$')


def name_key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_versions(text: str) -> dict[str, str]:
    """Package -> version from the lock's `name==version ; marker` lines."""
    return {name_key(m[1]): m[2] for m in re.finditer(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)", text, re.M)}


def with_caps(text: str, versions: dict[str, str] | None) -> str:
    """pyproject.toml's text with each runtime dependency capped at its locked version (None: uncapped)."""
    head, rest = text.split("dependencies = [\n", 1)
    block, tail = rest.split("\n]\n", 1)
    lines = []
    for line in block.split("\n"):
        if m := DEPENDENCY.match(line):
            cap = f",<={versions[name_key(m[2])]}" if versions is not None else ""
            line = f"{m[1]}{m[2]}{m[3]}{cap}{m[5] or ''}{m[6]}"
        lines.append(line)
    return head + "dependencies = [\n" + "\n".join(lines) + "\n]\n" + tail


def main(extra: list[str]) -> None:
    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "pyproject.toml").write_text(with_caps(PYPROJECT.read_text(), None))
        subprocess.run([uv, "pip", "compile", "--quiet", str(Path(tmp) / "pyproject.toml"), "--all-extras",
                        "--universal", "--python-version", "3.11", "--upgrade", "--no-header", "--no-annotate", "--output-file",
                        str(LOCK), *extra], check=True)
    text = LOCK.read_text()
    LOCK.write_text("# Made by `python requirements/bump.py`: every extra, every Python; pip install -c this file\n"
                    + text.replace(tmp, "."))
    PYPROJECT.write_text(with_caps(PYPROJECT.read_text(), locked_versions(text)))
    print(f"{LOCK.relative_to(ROOT)} and the caps in pyproject.toml raised; now run the suite", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
