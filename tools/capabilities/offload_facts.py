"""KV offloading facts: OffloadingConnector's spec registry and the kv_connector_extra_config keys
each spec (and SimpleCPUOffloadConnector) reads, with what vLLM does about each key.

A key's fact: required (vLLM raises when it is absent: `when` says absent, None or falsy, with
vLLM's message), cast (int(...)/float(...)/bool(...)/str(...) applied to it: int/float raise on a
value they cannot convert), annotation, default (as written), choices (a `not in` test that
raises). Read from the AST: `<...extra_config>.get("k", d)`, `<...extra_config>["k"]` and
`"k" in <...extra_config>`, in the spec class and its vLLM bases (0.11: vllm/v1/kv_offload/cpu.py
+ spec.py; 0.19+: cpu/spec.py; 0.21+: base.py), and in the connectors' own files.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from tools.capabilities.connector_facts import find_class_def, registrations, scope_files
from tools.capabilities.source import SourceTree, callee_name, find_class, imported_names, loc, str_const

SPEC_FACTORY = "vllm/v1/kv_offload/factory.py"
TIER_FACTORY = "vllm/v1/kv_offload/tiering/factory.py"
CONNECTORS = ("OffloadingConnector", "SimpleCPUOffloadConnector")
CASTS = ("int", "float", "bool", "str")
MAX_BASES = 6  # CPUOffloadingSpec -> OffloadingSpec -> ABC: a short chain


def _is_extra(node: ast.AST) -> bool:
    """A receiver that is the connector's extra config (self.extra_config, extra_config,
    kv_transfer_config.kv_connector_extra_config, config.extra_config, ...)."""
    return ast.unparse(node).split(".")[-1].split(" ")[0].endswith("extra_config")


def _read_key(node: ast.AST) -> str | None:
    """The key an extra-config read names: .get("k"), ["k"], "k" in ..."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
            and node.args and _is_extra(node.func.value):
        return str_const(node.args[0])
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _is_extra(node.value):
        return str_const(node.slice)
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn)) \
            and _is_extra(node.comparators[0]):
        return str_const(node.left)
    return None


def _parents(scope: ast.AST) -> dict[int, ast.AST]:
    return {id(child): parent for parent in ast.walk(scope) for child in ast.iter_child_nodes(parent)}


def _message(raise_node: ast.Raise) -> str | None:
    """What vLLM raises, as its source writes it (an f-string keeps its {placeholders})."""
    exc = raise_node.exc
    arg = exc.args[0] if isinstance(exc, ast.Call) and exc.args else None
    if arg is None:
        return None
    text = str_const(arg)
    if text is not None:
        return text
    if isinstance(arg, ast.JoinedStr):
        return "".join(str_const(v) or "{" + ast.unparse(getattr(v, "value", v)) + "}" for v in arg.values)
    return ast.unparse(arg)


def _first_raise(body: list[ast.stmt]) -> ast.Raise | None:
    return next((s for s in body if isinstance(s, ast.Raise)), None)


def _key_facts(path: str, scope: ast.AST, module: ast.Module | None = None) -> dict[str, dict]:
    """Every extra-config key read in `scope` (a class or module of `module`) and what it says."""
    parents = _parents(scope)
    facts: dict[str, dict] = {}
    names: dict[str, str] = {}  # local variable or self attribute -> the key it holds
    for node in ast.walk(scope):
        key = _read_key(node)
        if key is None:
            continue
        fact = facts.setdefault(key, {"defaults": set(), **loc(path, node)})
        fact["line"] = min(fact["line"], node.lineno)
        if isinstance(node, ast.Call):
            fact["defaults"].add(ast.unparse(node.args[1]) if len(node.args) > 1 else None)
        elif isinstance(node, ast.Subscript) and not _guarded(scope, key):
            fact.update(required=True, when="absent", message=f"KeyError: '{key}'")
        _note_use(fact, parents.get(id(node)), key, names, parents)
    _note_names(scope, facts, names, module or scope)
    return facts


def _guarded(scope: ast.AST, key: str) -> bool:
    """`"k" in extra_config` somewhere in the scope: a subscript read of k is then optional."""
    return any(isinstance(n, ast.Compare) and _read_key(n) == key for n in ast.walk(scope))


def _note_use(fact: dict, parent: ast.AST | None, key: str, names: dict[str, str],
              parents: dict[int, ast.AST]) -> None:
    """What the expression around a read does with it: a cast, an assignment, a test that raises."""
    if isinstance(parent, ast.Call) and callee_name(parent) in CASTS and isinstance(parent.func, ast.Name):
        fact.setdefault("cast", parent.func.id)
        parent = parents.get(id(parent))
    if isinstance(parent, (ast.Assign, ast.AnnAssign, ast.NamedExpr)):
        targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
        for target in targets:
            names[ast.unparse(target)] = key
        if isinstance(parent, ast.AnnAssign):
            fact.setdefault("annotation", ast.unparse(parent.annotation))
    if isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.Not):
        _test_raises(fact, parents.get(id(parent)), "falsy")


def _test_raises(fact: dict, node: ast.AST | None, when: str) -> None:
    if isinstance(node, ast.If):
        raised = _first_raise(node.body)
        if raised is not None:
            fact.update(required=True, when=when, message=_message(raised))


def _note_names(scope: ast.AST, facts: dict[str, dict], names: dict[str, str], module: ast.AST) -> None:
    """Uses of a variable that holds a key's value: `if not x: raise`, `x is None`, int(x),
    `self.n: int = x`, `if x not in CHOICES: raise`."""
    for node in ast.walk(scope):
        if isinstance(node, ast.If):
            _name_test(node, facts, names, module)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in CASTS \
                and node.args and ast.unparse(node.args[0]) in names:
            facts[names[ast.unparse(node.args[0])]].setdefault("cast", node.func.id)
        elif isinstance(node, ast.AnnAssign) and node.value is not None and ast.unparse(node.value) in names:
            facts[names[ast.unparse(node.value)]].setdefault("annotation", ast.unparse(node.annotation))


def _name_test(node: ast.If, facts: dict[str, dict], names: dict[str, str], module: ast.AST) -> None:
    test, raised = node.test, _first_raise(node.body)
    if raised is None:
        return
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and ast.unparse(test.operand) in names:
        facts[names[ast.unparse(test.operand)]].update(required=True, when="falsy", message=_message(raised))
    elif isinstance(test, ast.Compare) and len(test.ops) == 1 and ast.unparse(test.left) in names:
        key, op, right = names[ast.unparse(test.left)], test.ops[0], test.comparators[0]
        if isinstance(op, ast.Is) and ast.unparse(right) == "None":
            facts[key].update(required=True, when="none", message=_message(raised))
        elif isinstance(op, ast.NotIn):
            choices = _choices(right, module)
            if choices:
                facts[key].update(choices=choices, choices_message=_message(raised))


def _choices(node: ast.AST, scope: ast.AST) -> list[str] | None:
    """The strings of a literal list/tuple/set, or of a module constant naming one."""
    if isinstance(node, ast.Name) and isinstance(scope, ast.Module):
        for stmt in scope.body:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else \
                [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
            if any(getattr(t, "id", None) == node.id for t in targets) and stmt.value is not None:
                return _choices(stmt.value, scope)
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        values = [str_const(e) for e in node.elts]
        return sorted(v for v in values if v is not None) if all(values) else None
    return None


def _finish(facts: dict[str, dict]) -> dict[str, dict]:
    """Snapshot leaves ({"spans": fact}), defaults joined as connector_facts words them."""
    out = {}
    for key, fact in sorted(facts.items()):
        defaults = fact.pop("defaults")
        fact["default"] = " | ".join(sorted(d or "None" for d in defaults)) if defaults - {None} else None
        fact.setdefault("required", False)
        out[key] = {"spans": fact}
    return out


def _merge(into: dict[str, dict], more: dict[str, dict]) -> None:
    """Keys read in several places: required if any place requires it, the first place's line."""
    for key, fact in more.items():
        if key not in into:
            into[key] = fact
            continue
        have = into[key]
        have["defaults"] |= fact["defaults"]
        for attr, value in fact.items():
            if attr in ("required", "when", "message") and fact.get("required") and not have.get("required"):
                have[attr] = value
            elif attr not in ("defaults", "file", "line"):
                have.setdefault(attr, value)


def class_chain(tree: SourceTree, path: str, cls: ast.ClassDef) -> Iterator[tuple[str, ast.ClassDef]]:
    """The class and its bases defined in vLLM's tree (nearest first)."""
    todo, seen = [(path, cls)], 0
    while todo and seen < MAX_BASES:
        path, cls = todo.pop(0)
        seen += 1
        yield path, cls
        parsed = tree.parse(path)
        imports = imported_names(path, parsed) if parsed else {}
        for base in cls.bases:
            name = ast.unparse(base).split("[")[0].split(".")[-1]
            local = find_class(parsed, name) if parsed else None
            found = (path, local) if local is not None else \
                find_class_def(tree, *imports[name]) if name in imports else None
            if found is not None:
                todo.append(found)


def spec_registrations(tree: SourceTree) -> dict[str, dict]:
    """name -> {module, class, file, line} of every OffloadingSpecFactory.register_spec(...)."""
    module = tree.parse(SPEC_FACTORY)
    found: dict[str, dict] = {}
    for node in ast.walk(module) if module else ():
        if isinstance(node, ast.Call) and callee_name(node) == "register_spec":
            args = [str_const(a) for a in node.args[:3]]
            if len(args) == 3 and all(args):
                found[args[0]] = {"module": args[1], "class": args[2], **loc(SPEC_FACTORY, node)}
    return found


def spec_keys(tree: SourceTree, module: str, cls_name: str) -> dict[str, dict]:
    """The extra-config keys a spec class (and the vLLM bases it inherits) reads."""
    found = find_class_def(tree, module, cls_name)
    keys: dict[str, dict] = {}
    for path, cls in class_chain(tree, *found) if found else ():
        _merge(keys, _key_facts(path, cls, tree.parse(path)))
    return keys


def tiers(tree: SourceTree) -> dict | None:
    """The secondary tier types TieringOffloadingSpec accepts (SecondaryTierFactory), whether an
    out-of-tree tier may name its module, and what vLLM raises for a tier without / with an unknown type."""
    module = tree.parse(TIER_FACTORY)
    if module is None:
        return None
    names, first = [], None
    for node in ast.walk(module):
        if isinstance(node, ast.Call) and callee_name(node) == "register_tier" and node.args \
                and str_const(node.args[0]):
            names.append(str_const(node.args[0]))
            first = first or node
    if first is None:
        return None
    raises = [_message(n) for n in ast.walk(module) if isinstance(n, ast.Raise)
              and "tier" in (_message(n) or "").lower() and "already registered" not in (_message(n) or "")]
    reads_module_path = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get"
                            and n.args and str_const(n.args[0]) == "module_path" for n in ast.walk(module))
    return {"value": sorted(names), "module_path": reads_module_path,
            "missing_message": next((m for m in raises if "must include" in m), None),
            "unknown_message": next((m for m in raises if "Unknown" in m), None), **loc(TIER_FACTORY, first)}


def connector_keys(tree: SourceTree, name: str, registered: dict) -> dict[str, dict]:
    """Keys a connector reads itself (for OffloadingConnector: also the spec factory's spec_name /
    spec_module_path and, 0.26+, offloading/config.py's block_size), whatever spec it runs."""
    found = find_class_def(tree, registered["module"], registered["class"])
    if found is None:
        return {}
    files = scope_files(tree, found[0]) + ([SPEC_FACTORY] if name == "OffloadingConnector" else [])
    keys: dict[str, dict] = {}
    for path in files:
        parsed = tree.parse(path)
        if parsed is None:
            continue
        found_keys = _key_facts(path, parsed)
        if path == SPEC_FACTORY:  # its one raise is the unknown-spec one (spec_lookup), not a missing key
            for fact in found_keys.values():
                for attr in ("required", "when", "message"):
                    fact.pop(attr, None)
        _merge(keys, found_keys)
    return keys


def spec_lookup(tree: SourceTree) -> dict | None:
    """How the factory picks a spec: the key naming it and its default, the key naming an
    out-of-tree spec's module, and what vLLM raises for an unregistered name without one."""
    module = tree.parse(SPEC_FACTORY)
    for func in ast.walk(module) if module else ():
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        reads = [n for n in ast.walk(func) if isinstance(n, ast.Call) and _read_key(n)]
        raised = next((_message(n) for n in ast.walk(func) if isinstance(n, ast.Raise)
                       and "Unsupported" in (_message(n) or "")), None)
        if len(reads) >= 2 and raised:
            name, module_key = reads[0], reads[1]
            default = ast.literal_eval(name.args[1]) if len(name.args) > 1 else None
            return {"key": _read_key(name), "default": default, "module_key": _read_key(module_key),
                    "message": raised, **loc(SPEC_FACTORY, name)}
    return None


def extract(tree: SourceTree) -> tuple[dict, dict]:
    """(offload_specs, offload_connectors) sections of one release's snapshot."""
    specs: dict = {}
    for name, reg in spec_registrations(tree).items():
        entry: dict = {"spans": reg, "params": _finish(spec_keys(tree, reg["module"], reg["class"]))}
        if "secondary_tiers" in entry["params"]:
            found = tiers(tree)
            if found is not None:
                entry["tiers"] = {"values": found}
        specs[name] = entry
    connectors: dict = {}
    registered = registrations(tree)
    for name in CONNECTORS:
        reg = registered.get(name, {}).get("v1")
        params = _finish(connector_keys(tree, name, reg)) if reg else {}
        if params:
            connectors[name] = {"params": params}
    lookup = spec_lookup(tree)
    if lookup is not None and "OffloadingConnector" in connectors:
        connectors["OffloadingConnector"]["spec_lookup"] = {"values": lookup}
    return specs, connectors
