"""A parsed view of one vLLM source tree (a directory holding `vllm/`), for ast-only extraction."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path


class SourceTree:
    """Lazily parsed modules of one release, addressed by in-package path ("vllm/envs.py")."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._parsed: dict[str, ast.Module | None] = {}

    @cached_property
    def files(self) -> list[str]:
        base = self.root / "vllm"
        return sorted(str(p.relative_to(self.root)) for p in base.rglob("*.py")) if base.is_dir() else []

    def under(self, prefix: str) -> list[str]:
        return [f for f in self.files if f.startswith(prefix)]

    def parse(self, path: str) -> ast.Module | None:
        if path not in self._parsed:
            try:
                text = (self.root / path).read_text(encoding="utf-8")
                self._parsed[path] = ast.parse(text, filename=path)
            except (OSError, SyntaxError):
                self._parsed[path] = None
        return self._parsed[path]

    def module_file(self, module: str) -> str | None:
        """The file of a dotted module name, if it is in the tree."""
        base = module.replace(".", "/")
        for candidate in (base + ".py", base + "/__init__.py"):
            if (self.root / candidate).is_file():
                return candidate
        return None


def module_name(path: str) -> str:
    name = path[:-3].replace("/", ".")
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


def resolve_import(path: str, node: ast.ImportFrom) -> str:
    """The absolute module an ImportFrom names (relative imports resolved against `path`)."""
    if not node.level:
        return node.module or ""
    package = module_name(path).split(".")
    if not path.endswith("__init__.py"):
        package = package[:-1]
    package = package[: len(package) - (node.level - 1)] if node.level > 1 else package
    return ".".join(package + ([node.module] if node.module else []))


def imported_names(path: str, tree: ast.Module) -> dict[str, tuple[str, str]]:
    """alias -> (module, name) for every `from M import name as alias` anywhere in the file
    (vLLM imports lazily inside functions a lot, so nested imports count)."""
    names: dict[str, tuple[str, str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = resolve_import(path, node)
            for alias in node.names:
                names[alias.asname or alias.name] = (module, alias.name)
    return names


def imported_modules(path: str, tree: ast.Module) -> set[str]:
    """Every module a file imports (`import a.b`, `from a.b import c` counts a.b and a.b.c)."""
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = resolve_import(path, node)
            modules.add(base)
            modules.update(f"{base}.{alias.name}" for alias in node.names)
    return modules


def functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def find_class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    return None


def str_const(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def callee_name(call: ast.Call) -> str | None:
    """`f` for f(...) and a.b.f(...)."""
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    if isinstance(call.func, ast.Name):
        return call.func.id
    return None


def loc(path: str, node: ast.AST) -> dict:
    return {"file": path, "line": getattr(node, "lineno", 0)}


def constant_in(tree: SourceTree, path: str, text: str) -> dict | None:
    """{"value": text, file, line} of the first string constant `text` in `path` (e.g. where
    arg_utils.py adds a flag), or None when the file or the constant is absent."""
    module = tree.parse(path)
    for node in ast.walk(module) if module else ():
        if str_const(node) == text:
            return {"value": text, **loc(path, node)}
    return None


def own_nodes(func: ast.AST) -> Iterator[ast.AST]:
    """Nodes of a function body, not descending into nested functions or classes."""
    stack = list(ast.iter_child_nodes(func))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))
