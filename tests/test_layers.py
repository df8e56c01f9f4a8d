"""The layers stay apart (docs/architecture): proxy/ never imports analysis/ but in its composition
root, proxy/cli.py, and the simulator imports nothing of the proxy core."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMPOSITION_ROOT = ROOT / "proxy" / "cli.py"


def imports(path: Path) -> set[str]:
    """Every module `path` imports, absolute (relative imports resolved against its package)."""
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def edges(layer: str, forbidden: str) -> list[str]:
    return sorted(f"{path.relative_to(ROOT)} -> {name}"
                  for path in (ROOT / layer).rglob("*.py") if path != COMPOSITION_ROOT
                  for name in imports(path) if name == forbidden or name.startswith(forbidden + "."))


def test_proxy_imports_analysis_only_in_its_composition_root() -> None:
    assert edges("proxy", "analysis") == []


def test_the_composition_root_is_where_they_meet() -> None:
    assert any(name.startswith("analysis") for name in imports(COMPOSITION_ROOT))


def test_the_simulator_is_an_independent_check_of_the_parsers() -> None:
    core = ("proxy.meter", "proxy.sse", "proxy.dialects", "proxy.forward", "proxy.store", "proxy.relay_state")
    found = [e for e in edges("proxy/simulator", "proxy") if e.split(" -> ")[1].startswith(core)]
    assert found == []


if __name__ == "__main__":  # python -m tests.test_layers [ROOT]: the proxy -> analysis edges of a tree
    import sys

    if len(sys.argv) > 1:
        ROOT = Path(sys.argv[1]).resolve()
        COMPOSITION_ROOT = ROOT / "proxy" / "cli.py"
    found = edges("proxy", "analysis")
    print("\n".join(found) if found else "no proxy -> analysis edge outside proxy/cli.py")
