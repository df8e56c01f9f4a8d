"""docs/development.md, the map, stays true: every module of proxy/ and analysis/ has its place in the
layers table, and every `module.name` and file path the page cites exists. Read from the page, so a
module added with its line in the table passes with no change here."""

from __future__ import annotations

import functools
import importlib
import pkgutil
import re
from pathlib import Path

import aiohttp
import pytest

ROOT = Path(__file__).resolve().parent.parent
MAP = ROOT / "docs" / "development.md"
PACKAGES = ("proxy", "analysis")


def layers_table() -> dict[str, str]:
    """The table's rows by their first cell (`proxy/relay/`, `analysis/`, top), the rest of the row as text."""
    rows = re.findall(r"^\|\s*(`[^`]+/`|top)\s*\|(.*)\|\s*$", MAP.read_text(), re.M)
    return {cell.strip("`"): rest for cell, rest in rows}


def modules() -> list[Path]:
    return sorted(p.relative_to(ROOT) for package in PACKAGES for p in (ROOT / package).rglob("*.py")
                  if p.name != "__init__.py")


def row_of(module: Path) -> str:
    """The table row that must name a module: its layer folder's, `analysis/`'s, or top's (proxy/*.py)."""
    if module.parts[0] == "analysis":
        return "analysis/"
    return f"proxy/{module.parts[1]}/" if len(module.parts) > 2 else "top"


def named(row: str, module: Path, depth: int) -> bool:
    """The row names the module (`name.py`, or `name` in a list of dialects) and its sub-folders (`html/`)."""
    inner = module.parts[depth:]
    words = set(re.findall(r"`([^`]+)`", row))
    folders = all(f"{folder}/" in words or any(w.startswith(f"{folder}/") for w in words) for folder in inner[:-1])
    return folders and bool({module.name, module.stem, "/".join(inner), str(module)} & words)


def test_every_module_is_in_the_layers_table() -> None:
    table = layers_table()
    missing = []
    for module in modules():
        row = row_of(module)
        depth = 1 if row in ("analysis/", "top") else 2
        if row not in table or not named(table[row], module, depth):
            missing.append(f"{module} (row {row})")
    assert not missing, f"modules the map's table does not name: {missing}"


def test_every_module_the_table_names_exists() -> None:
    """A `name.py` in a row is a file under that row's folder (a module removed leaves the table too)."""
    gone = []
    for cell, row in layers_table().items():
        folder = ROOT / ("proxy" if cell == "top" else cell)
        present = {p.name for p in (folder.glob("*.py") if cell == "top" else folder.rglob("*.py"))}
        for word in re.findall(r"`([\w/]*\w+\.py)`", row):
            if not ((ROOT / word).exists() if word.startswith(PACKAGES) else word.rpartition("/")[2] in present):
                gone.append(f"{cell}: {word}")
    assert not gone, f"modules the map's table names that are not there: {gone}"


def cited_names() -> set[str]:
    """`a.b` and `a.b.c` names in backticks outside code blocks: modules, classes and their members."""
    text = re.sub(r"^```.*?^```", "", MAP.read_text(), flags=re.M | re.S)
    found = set()
    for token in re.findall(r"`([^`\s]+)`", text):
        token = re.sub(r"\(.*\)$", "", token)  # `Meter.finish(...)`
        if re.fullmatch(r"[A-Za-z_]\w*(\.\w+)+", token) and not re.search(r"\.(py|pyx|toml|md|yml|json|txt)$", token):
            found.add(token)
    return found


@functools.cache
def all_modules() -> dict[str, object]:
    loaded = {}
    for package in PACKAGES:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            if info.name.endswith("__main__"):
                continue
            loaded[info.name] = importlib.import_module(info.name)
    return loaded


def resolves(name: str, loaded: dict[str, object]) -> bool | None:
    """`relay.app.dispatch`, `Meter.finish`: a module of llmtap's (by its dotted tail) then attributes, or a
    class defined in one, then attributes. None for a name not llmtap's (`web.StreamResponse`,
    `Event.wait`): aiohttp's private names are the fast paths' probe's to check (tests/test_fast_paths.py)."""
    parts = name.split(".")
    if hasattr(aiohttp, parts[0]):  # `web.StreamResponse` is aiohttp's, not analysis/web/
        return None
    for cut in range(len(parts), 0, -1):
        head = ".".join(parts[:cut])
        owners = [m for path, m in loaded.items() if path == head or path.endswith(f".{head}")]
        if owners:
            return any(has_path(owner, parts[cut:]) for owner in owners)
    defined = [getattr(m, parts[0]) for m in loaded.values() if hasattr(m, parts[0])]
    ours = [obj for obj in defined if isinstance(obj, type) and obj.__module__.startswith(PACKAGES)]
    if not ours:
        return None
    return any(has_path(obj, parts[1:]) for obj in ours)


def has_path(obj: object, names: list[str]) -> bool:
    for name in names:
        if not hasattr(obj, name) and name not in getattr(obj, "__slots__", ()):
            return False
        obj = getattr(obj, name, None)
    return True


def test_every_name_the_map_cites_exists() -> None:
    loaded = all_modules()
    stale = sorted(name for name in cited_names() if resolves(name, loaded) is False)
    assert not stale, f"names docs/development.md cites that the code no longer has: {stale}"


def test_every_path_the_map_cites_exists() -> None:
    text = re.sub(r"^```.*?^```", "", MAP.read_text(), flags=re.M | re.S)
    paths = {p for p in re.findall(r"`((?:proxy|analysis|tests|benchmarks)/[\w/.]+)`", text)}
    short = {p for p in re.findall(r"`((?:common|settings|meter|record|observe|relay|serve|tools|simulator)/[\w/]+\.py)`",
                                   text)}
    missing = [p for p in paths if not (ROOT / p).exists()] + [p for p in short if not (ROOT / "proxy" / p).exists()]
    missing = [p for p in missing if "NAME" not in p]  # a placeholder: dialects/NAME.py
    assert not missing, f"paths docs/development.md cites that do not exist: {missing}"


@pytest.mark.parametrize("stale", ["relay.app.no_such_function", "Meter.no_such_method", "no_module.thing"])
def test_a_stale_name_is_caught(stale: str) -> None:
    assert resolves(stale, all_modules()) is not True
