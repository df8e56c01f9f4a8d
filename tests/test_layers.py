"""The layers of docs/development.md, enforced on the tree: each folder of proxy/ is one layer and
leans only on the layers below it; proxy/ meets analysis/ in one place; the meter does no I/O; the
simulator checks the parsers independently; no module imports itself round a cycle."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COMPOSITION_ROOT = "proxy.cli"

# proxy/'s folders, lowest first: a module imports from its own layer and the ones before it.
LAYERS = ("common", "settings", "meter", "record", "observe", "relay", "serve", "tools")
TOP = {"proxy", "proxy.cli", "proxy.__main__"}  # the commands, above every layer
# what proxy/meter/ never imports, bare (`import aiohttp`) or in part (`from aiohttp import ClientSession`):
# testable without a socket; aiohttp's exception classes alone are allowed (redact.py names one)
NO_IO = ("asyncio", "socket", "selectors", "threading", "duckdb", "aiohttp", "urllib.request")
NO_IO_ALLOWED = ("aiohttp.http_exceptions",)
# what analysis/ may take of proxy/serve/: the in-process proxy the demo and `bench` run, as a library
# user would; nothing else of the server (its event-loop runner is proxy/common/event_loop.py)
SERVE_FOR_ANALYSIS = {"proxy.serve.server", "proxy.serve.server.RunningProxy"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for top in ("proxy", "analysis") for p in (ROOT / top).rglob("*.py")}


@cache
def imports(name: str) -> frozenset[str]:
    """Every module `name` imports anywhere in its text (lazy imports in functions too), absolute."""
    path = modules()[name]
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return frozenset(found)


def own_imports(name: str) -> set[str]:
    """The project's modules `name` imports (a `from package import module` counted as the module)."""
    return {n for n in imports(name) if n in modules() and n != name}


def layer(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if parts[0] == "proxy" and len(parts) > 2 and parts[1] in LAYERS else None


def edges(where: str, to: tuple[str, ...]) -> list[str]:
    """`name -> imported` for the modules under `where` importing a name under one of `to` (whole dotted
    parts: `aiohttp` covers `aiohttp` and `aiohttp.ClientSession`, not `aiohttp_foo`)."""
    return sorted(f"{name} -> {other}" for name in modules() if name == where or name.startswith(where + ".")
                  for other in imports(name) if any(other == t or other.startswith(t + ".") for t in to))


def test_every_module_of_proxy_is_in_a_layer_or_is_a_command() -> None:
    loose = [n for n in modules() if n.startswith("proxy") and n not in TOP and layer(n) is None
             and not n.startswith(("proxy.simulator", *(f"proxy.{f}" for f in LAYERS)))]
    assert loose == []


def test_a_layer_leans_only_on_the_layers_below_it() -> None:
    upward = [f"{name} -> {other}" for name in modules() if (mine := layer(name))
              for other in own_imports(name) if (theirs := layer(other))
              and LAYERS.index(theirs) > LAYERS.index(mine)]
    assert upward == []


def test_the_layers_never_import_the_commands_the_simulator_or_analysis() -> None:
    found = [f"{name} -> {other}" for name in modules() if layer(name) for other in own_imports(name)
             if other in TOP or other.startswith(("proxy.simulator", "analysis"))]
    assert found == []


def test_proxy_meets_analysis_only_in_its_composition_root() -> None:
    found = [e for e in edges("proxy", ("analysis",)) if not e.startswith(COMPOSITION_ROOT + " ")]
    assert found == []
    assert edges(COMPOSITION_ROOT, ("analysis",)), "the composition root is where they meet"


def test_analysis_reads_records_and_never_drives_the_relay() -> None:
    assert edges("analysis", ("proxy.relay", "proxy.tools")) == []
    serve = [e for e in edges("analysis", ("proxy.serve",)) if e.split(" -> ")[1] not in SERVE_FOR_ANALYSIS]
    assert serve == [], "analysis/ takes only RunningProxy of proxy/serve/"


def test_the_meter_does_no_io() -> None:
    assert [e for e in edges("proxy.meter", NO_IO) if not e.split(" -> ")[1].startswith(NO_IO_ALLOWED)] == []


def test_the_simulator_checks_the_parsers_independently() -> None:
    found = [e for e in edges("proxy.simulator", ("proxy.",))
             if not e.split(" -> ")[1].startswith(("proxy.simulator", "proxy.common"))]
    assert found == []


def cycles() -> list[list[str]]:
    """The import cycles among the project's modules (Tarjan's strongly connected components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        for other in own_imports(name):
            if other not in index:
                visit(other)
                low[name] = min(low[name], low[other])
            elif other in stack:
                low[name] = min(low[name], index[other])
        if low[name] == index[name]:
            component = []
            while (top := stack.pop()) != name:
                component.append(top)
            if component:
                found.append(sorted([name, *component]))

    for name in sorted(modules()):
        if name not in index:
            visit(name)
    return found


def test_no_import_cycle() -> None:
    # a package's __init__ that re-exports its modules is not a cycle of theirs
    assert [c for c in cycles() if not any(modules()[n].name == "__init__.py" for n in c)] == []


PLANTED = {
    "upward": {"proxy.meter.x": "from proxy.record import store\n"},
    "cycle": {"proxy.meter.x": "from proxy.meter import y\n", "proxy.meter.y": "from proxy.meter import x\n"},
    "bare aiohttp": {"proxy.meter.x": "import aiohttp\n"},
    "aiohttp client": {"proxy.meter.x": "from aiohttp import ClientSession\n"},
    "server loop": {"analysis.x": "from proxy.serve.server import tune_runtime\n"},
    "serve package": {"analysis.x": "from proxy.serve import workers\n"},
}
CHECK = {"upward": test_a_layer_leans_only_on_the_layers_below_it, "bare aiohttp": test_the_meter_does_no_io,
         "aiohttp client": test_the_meter_does_no_io, "server loop": test_analysis_reads_records_and_never_drives_the_relay,
         "serve package": test_analysis_reads_records_and_never_drives_the_relay}


@pytest.mark.parametrize("rule", list(PLANTED))
def test_the_rules_catch_what_they_forbid(rule: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks above fail on a planted edge: a meter importing the store or aiohttp's client, two
    modules importing each other, analysis taking more of the server than RunningProxy."""
    planted = PLANTED
    fake = dict(modules())
    for name, text in planted[rule].items():
        path = tmp_path / (name.replace(".", "_") + ".py")
        path.write_text(text)
        fake[name] = path
    monkeypatch.setattr(f"{__name__}.modules", lambda: fake)
    imports.cache_clear()
    try:
        if rule == "cycle":
            assert ["proxy.meter.x", "proxy.meter.y"] in cycles()
        else:
            with pytest.raises(AssertionError):
                CHECK[rule]()
    finally:
        imports.cache_clear()
