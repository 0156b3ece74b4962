"""KVTransferConfig facts: fields, their types and defaults, Literal choices, unknown-key policy."""

from __future__ import annotations

import ast

from tools.capabilities.source import SourceTree, find_class, imported_names, loc, str_const

CLASS = "KVTransferConfig"
# Literal-typed fields whose choices kvctl validates against.
LITERAL_FIELDS = ("kv_role", "kv_load_failure_policy")
DEFAULT_FIELDS = ("kv_load_failure_policy", "kv_buffer_device")


def locate(tree: SourceTree) -> tuple[str, ast.Module, ast.ClassDef] | None:
    """The file and class node of KVTransferConfig (vllm/config.py early, vllm/config/*.py later)."""
    for path in [f for f in tree.files if f == "vllm/config.py" or f.startswith("vllm/config/")]:
        module = tree.parse(path)
        node = find_class(module, CLASS) if module else None
        if node is not None:
            return path, module, node
    return None


def default_repr(value: ast.expr | None) -> str | None:
    """The default as written, with default factories shown as the value they produce."""
    if value is None:
        return None
    if isinstance(value, ast.Call) and getattr(value.func, "id", getattr(value.func, "attr", "")) in ("field", "Field"):
        for kw in value.keywords:
            if kw.arg == "default_factory":
                factory = ast.unparse(kw.value)
                return {"dict": "{}", "list": "[]", "set": "set()"}.get(factory, f"{factory}()")
            if kw.arg == "default":
                return ast.unparse(kw.value)
        if value.args:
            return ast.unparse(value.args[0])
    return ast.unparse(value)


def field_nodes(cls: ast.ClassDef) -> list[ast.AnnAssign]:
    out = []
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            if "ClassVar" not in ast.unparse(stmt.annotation):
                out.append(stmt)
    return out


def literal_values(expr: ast.expr, module: ast.Module, depth: int = 0) -> list[str]:
    """Choices of a Literal annotation, following module-level aliases (KVRole = Literal[A, B])."""
    if depth > 5:
        return []
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.BitOr):
        return _dedupe(literal_values(expr.left, module, depth + 1) + literal_values(expr.right, module, depth + 1))
    if isinstance(expr, ast.Subscript):
        head = ast.unparse(expr.value).split(".")[-1]
        items = expr.slice.elts if isinstance(expr.slice, ast.Tuple) else [expr.slice]
        if head == "Literal":
            out: list[str] = []
            for item in items:
                out += [item.value] if isinstance(item, ast.Constant) else literal_values(item, module, depth + 1)
            return _dedupe(out)
        if head in ("Optional", "Union", "Annotated"):
            chosen = items[:1] if head == "Annotated" else items
            return _dedupe([v for item in chosen for v in literal_values(item, module, depth + 1)])
    if isinstance(expr, ast.Name):
        alias = _module_assign(module, expr.id)
        if alias is not None:
            return literal_values(alias, module, depth + 1)
    return []


def _module_assign(module: ast.Module, name: str) -> ast.expr | None:
    for stmt in module.body:
        if isinstance(stmt, ast.Assign) and any(getattr(t, "id", None) == name for t in stmt.targets):
            return stmt.value
        if isinstance(stmt, ast.AnnAssign) and getattr(stmt.target, "id", None) == name and stmt.value:
            return stmt.value
    return None


def _dedupe(values: list) -> list:
    return list(dict.fromkeys(values))


def membership_list(cls: ast.ClassDef, field: str) -> tuple[list[str], ast.AST] | None:
    """Choices checked by hand (`self.kv_role not in [...]`), for releases typed as plain str."""
    for node in ast.walk(cls):
        if isinstance(node, ast.Compare) and ast.unparse(node.left) == f"self.{field}":
            for op, right in zip(node.ops, node.comparators):
                if isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.List, ast.Tuple, ast.Set)):
                    values = [str_const(e) for e in right.elts]
                    if all(values):
                        return values, node
    return None


def extra_policy(tree: SourceTree, path: str, module: ast.Module, cls: ast.ClassDef) -> tuple[str, dict]:
    """How unknown keys are treated and where that is decided.

    Returns (kind, location); kind is one of: forbid, pydantic-basemodel-ignore,
    pydantic-dataclass-ignore, stdlib-dataclass.
    """
    for stmt in cls.body:  # pydantic BaseModel: model_config = ConfigDict(extra=...)
        if isinstance(stmt, ast.Assign) and any(getattr(t, "id", None) == "model_config" for t in stmt.targets):
            if _extra_kw(stmt.value) == "forbid":
                return "forbid", loc(path, stmt)
    for deco in cls.decorator_list:
        if isinstance(deco, ast.Call) and _extra_kw(deco) == "forbid":
            return "forbid", loc(path, deco)
        name = ast.unparse(deco.func if isinstance(deco, ast.Call) else deco)
        if name == "config":
            found = _decorator_forbids(tree, path, module)
            if found is not None:
                return "forbid", found
    if any(ast.unparse(b).endswith("BaseModel") for b in cls.bases):
        return "pydantic-basemodel-ignore", loc(path, cls)
    imports = imported_names(path, module)
    for deco in cls.decorator_list:
        name = ast.unparse(deco.func if isinstance(deco, ast.Call) else deco)
        if name == "dataclass":
            origin = imports.get("dataclass", ("", ""))[0]
            kind = "pydantic-dataclass-ignore" if origin.startswith("pydantic") else "stdlib-dataclass"
            return kind, loc(path, deco)
    return "unknown", loc(path, cls)


def _extra_kw(node: ast.AST) -> str | None:
    """'forbid' if the expression contains ConfigDict(extra='forbid') or extra='forbid'."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.keyword) and sub.arg == "extra":
            return str_const(sub.value)
    return None


def _decorator_forbids(tree: SourceTree, path: str, module: ast.Module) -> dict | None:
    """Follow the `config` decorator to its definition and look for ConfigDict(extra='forbid')."""
    origin = imported_names(path, module).get("config")
    target_path, target = path, module
    if origin is not None:
        target_path = tree.module_file(origin[0]) or ""
        target = tree.parse(target_path) if target_path else None
    if target is None:
        return None
    for node in target.body:
        if isinstance(node, ast.FunctionDef) and node.name == "config":
            for sub in ast.walk(node):
                if isinstance(sub, ast.Call) and ast.unparse(sub.func).endswith("ConfigDict") and _extra_kw(sub) == "forbid":
                    return loc(target_path, sub)
    return None


def extract(tree: SourceTree) -> tuple[dict, dict]:
    """(fields, config) facts of one release, in the snapshot shape."""
    found = locate(tree)
    if found is None:
        return {}, {}
    path, module, cls = found
    fields: dict = {}
    nodes = {n.target.id: n for n in field_nodes(cls)}
    for name, node in nodes.items():
        fields[name] = {
            "spans": loc(path, node),
            "types": {"type": ast.unparse(node.annotation), "default": default_repr(node.value)},
        }
    config: dict = {}
    kind, where = extra_policy(tree, path, module, cls)
    config["class_kind"] = {"values": {"value": kind, **where}}
    if kind == "forbid":
        config["extra_forbid"] = {"spans": where}
    for name in LITERAL_FIELDS:
        node = nodes.get(name)
        values = literal_values(node.annotation, module) if node else []
        where = loc(path, node) if node else None
        if node and not values:
            checked = membership_list(cls, name)
            if checked:
                values, where = checked[0], loc(path, checked[1])
        if values:
            # A set of choices: sorted, so alias flattening order does not look like a change.
            config[f"{name}_values"] = {"values": {"value": sorted(values), **where}}
    for name in DEFAULT_FIELDS:
        node = nodes.get(name)
        if node is not None:
            config[f"{name}_default"] = {"values": {"value": _plain(default_repr(node.value)), **loc(path, node)}}
    lookup = connector_lookup(tree)
    if lookup is not None:
        config["connector_lookup"] = {"values": lookup}
    return fields, config


FACTORY = "vllm/distributed/kv_transfer/kv_connector/factory.py"


def connector_lookup(tree: SourceTree) -> dict | None:
    """Which the connector factory consults first when kv_connector_module_path is set:
    "registry" (a registered name ignores the module path) or "module_path" (the module wins).

    Read from the function that reads kv_connector_module_path: whichever comes first in its body,
    a `... in cls._registry` test or the read of the module path."""
    module = tree.parse(FACTORY)
    for func in ast.walk(module) if module else ():
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        reads = [n.lineno for n in ast.walk(func)
                 if isinstance(n, ast.Attribute) and n.attr == "kv_connector_module_path"]
        tests = [n.lineno for n in ast.walk(func) if isinstance(n, ast.Compare)
                 and any(isinstance(op, (ast.In, ast.NotIn)) for op in n.ops)
                 and "_registry" in ast.unparse(n)]
        if reads and tests:
            first = "registry" if min(tests) < min(reads) else "module_path"
            return {"value": first, "file": FACTORY, "line": min(min(tests), min(reads))}
    return None


def _plain(text: str | None) -> str | None:
    """'recompute' rather than "'recompute'" for string literals; other defaults as written."""
    if text is None:
        return None
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    return value if isinstance(value, str) else text
