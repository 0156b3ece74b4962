"""kvctl's shape, kept from drifting: no import cycle inside kvctl/ (imports inside functions count:
they run too), no core module importing the CLI or the package's own face, the documented package
layers, no core module over 450 lines (a module that long holds two ideas), and at most 12 modules
directly in kvctl/ (LAYOUT.md: more is a sign that a concept wants its package)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.lib import REPO

PACKAGE = REPO / "kvctl"
MAX_LINES = 450
MAX_TOP_LEVEL = 12  # .py files directly in kvctl/, __init__ and __main__ included
# Which kvctl packages each package may import (besides its own modules and the leaves below).
LEAVES = {"kvctl._faces", "kvctl._version", "kvctl.errors", "kvctl.interrupt", "kvctl.state", "kvctl.yamlio"}
ALLOWED = {
    "kvctl.facts": set(),
    "kvctl.config": {"kvctl.facts", "kvctl.validate"},  # render checks its output with validate
    "kvctl.validate": {"kvctl.facts"},
    "kvctl.transport": {"kvctl.facts"},
    "kvctl.serve": {"kvctl.facts", "kvctl.config", "kvctl.transport"},
    "kvctl.reset": {"kvctl.facts", "kvctl.transport", "kvctl.targets"},
    "kvctl.weights": {"kvctl.facts", "kvctl.transport", "kvctl.targets", "kvctl.reset"},
}


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The kvctl modules `name` imports, anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("kvctl"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            if not base.startswith("kvctl"):
                continue
            for alias in node.names:
                out.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {m for m in out if m in known and m != name}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_no_import_cycle() -> None:
    g = graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for dep in sorted(g[node]):
            if state.get(dep) == 1:
                cycle = path[path.index(dep):] + [dep]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        path.pop()
        state[node] = 2

    for node in sorted(g):
        if node not in state:
            visit(node)


def test_the_core_never_imports_the_cli_or_the_package_face() -> None:
    for name, deps in graph().items():
        if name.startswith("kvctl.cli") or name in ("kvctl.__main__", "kvctl"):
            continue
        assert not any(d.startswith("kvctl.cli") for d in deps), f"{name} imports the CLI"
        assert "kvctl" not in deps, f"{name} imports kvctl/__init__ (take __version__ from kvctl._version)"


def test_packages_import_only_their_layers() -> None:
    for name, deps in graph().items():
        home = next((p for p in ALLOWED if name == p or name.startswith(p + ".")), None)
        if home is None:
            continue
        for dep in deps:
            if dep in LEAVES or dep == home or dep.startswith(home + "."):
                continue
            layer = next((p for p in ALLOWED[home] if dep == p or dep.startswith(p + ".")), None)
            assert layer is not None, f"{name} imports {dep}: {home} may import only {sorted(ALLOWED[home])}"


def test_no_core_module_is_over_the_limit() -> None:
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by idea): {long}"


def test_kvctl_holds_at_most_twelve_top_level_modules() -> None:
    """A thirteenth module beside the packages goes into the package of its concept (kvctl/api/ holds
    the Python API and its training-loop and wording modules)."""
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, f"{len(top)} modules directly in kvctl/ (at most {MAX_TOP_LEVEL}): {top}"


def test_the_checks_see_the_real_graph() -> None:
    """The walk finds kvctl's known edges, including one made inside a function (the canary check
    of this test would pass vacuously on an empty graph)."""
    g = graph()
    assert "kvctl.reset.plan" in g["kvctl.reset.execute"]
    assert "kvctl.serve.runs" in g["kvctl.targets"]  # imported inside resolve_targets' helpers
    assert len(g) > 60


def test_every_name_of_a_package_face_resolves() -> None:
    """`from kvctl.reset import ResetOptions` and friends keep working for users after the move: each
    name a package's face promises comes from the module it names."""
    import importlib

    for package in ("kvctl.reset", "kvctl.serve"):
        module = importlib.import_module(package)
        for name, home in module._FACE.items():  # type: ignore[attr-defined]
            assert getattr(module, name) is getattr(importlib.import_module(home), name), f"{package}.{name}"
    import kvctl

    assert callable(kvctl.hard_reset) and callable(kvctl.probe) and callable(kvctl.probe_async)
