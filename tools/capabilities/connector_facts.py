"""KV connector facts: the registry, reset_cache and what it reaches, Mooncake config keys."""

from __future__ import annotations

import ast
import re

from tools.capabilities.source import SourceTree, callee_name, find_class, functions, imported_modules, \
    imported_names, loc, own_nodes, str_const

KV_DIR = "vllm/distributed/kv_transfer/"
# Abstract bases whose reset_cache is the "not implemented" default, not a real reset.
BASE_FILES = ("kv_connector/v1/base.py", "kv_connector/base.py")
# Calls worth reporting on a reset path: anything that clears, removes or resets.
CLEARING = re.compile(r"remove|clear|reset|delete|evict|flush|drop|invalidate|purge", re.I)
MAX_FUNCS = 600  # bound on the name-based call graph walk (a reset path reaches ~100 defs)


def registrations(tree: SourceTree) -> dict[str, dict]:
    """name -> {"v0"|"v1": {module, class, file, line}} from every register_connector(...) call."""
    found: dict[str, dict] = {}
    for path in tree.under(KV_DIR):
        module = tree.parse(path)
        for node in ast.walk(module) if module else ():
            if isinstance(node, ast.Call) and callee_name(node) == "register_connector":
                args = [str_const(a) for a in node.args[:3]]
                args += [str_const(k.value) for k in node.keywords]
                args = [a for a in args if a is not None]
                if len(args) != 3:
                    continue  # the factory's own definition or a dynamic call
                name, mod, cls = args
                gen = "v1" if ".v1." in f"{mod}." else "v0"
                found.setdefault(name, {}).setdefault(gen, {"module": mod, "class": cls, **loc(path, node)})
    return found


def find_class_def(tree: SourceTree, module: str, name: str, depth: int = 0) -> tuple[str, ast.ClassDef] | None:
    """The ClassDef of `module.name`, following re-exports (`from .x import Name`)."""
    path = tree.module_file(module)
    parsed = tree.parse(path) if path else None
    if parsed is None or depth > 3:
        return None
    node = find_class(parsed, name)
    if node is not None:
        return path, node
    origin = imported_names(path, parsed).get(name)
    return find_class_def(tree, origin[0], origin[1], depth + 1) if origin else None


def find_method(tree: SourceTree, path: str, cls: ast.ClassDef, method: str, depth: int = 0):
    """(file, def, class name) of `method` on cls or its vLLM bases, in MRO-ish order."""
    for stmt in cls.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == method:
            return path, stmt, cls.name
    if depth > 5:
        return None
    parsed = tree.parse(path)
    imports = imported_names(path, parsed) if parsed else {}
    for base in cls.bases:
        base_name = ast.unparse(base).split("[")[0]
        local = find_class(parsed, base_name) if parsed else None
        target = (path, local) if local is not None else None
        if target is None and base_name in imports:
            target = find_class_def(tree, *imports[base_name])
        if target is not None:
            hit = find_method(tree, target[0], target[1], method, depth + 1)
            if hit is not None:
                return hit
    return None


def scope_files(tree: SourceTree, path: str) -> list[str]:
    """The connector's own code: its file, its subpackage (if it has one), and the vLLM modules
    it imports from connector-specific subpackages. The shared v1/ directory is not a scope:
    a name-based call graph there would wander into unrelated connectors."""
    directory = path.rsplit("/", 1)[0]
    shared = directory.endswith(("kv_connector", "kv_connector/v1"))
    files = {path} | (set() if shared else {f for f in tree.under(directory + "/")})
    parsed = tree.parse(path)
    for mod in imported_modules(path, parsed) if parsed else ():
        target = tree.module_file(mod)
        if target and target.startswith(KV_DIR) and not target.rsplit("/", 1)[0].endswith(("kv_connector", "kv_connector/v1")):
            files.add(target)
    return sorted(files)


def _message_constants(tree: SourceTree, files: list[str]) -> set[str]:
    """Module-level ALL_CAPS str/bytes constants: messages passed between a client and a server loop."""
    names: set[str] = set()
    for path in files:
        parsed = tree.parse(path)
        for stmt in parsed.body if parsed else ():
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and isinstance(stmt.value, ast.Constant):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for t in targets:
                    if isinstance(t, ast.Name) and t.id.isupper() and isinstance(stmt.value.value, (str, bytes)):
                        names.add(t.id)
    return names


def reachable_calls(tree: SourceTree, start: ast.AST, files: list[str]) -> list[str]:
    """Clearing calls reachable from `start` through same-named functions in `files`.

    Edges: a call to `f`/`x.f` reaches every def named f in scope; a message constant used on
    the path (e.g. RESET_MSG sent over a socket) reaches every function that also uses it, which
    is how a scheduler-side reset reaches the worker loop that really talks to the store.
    """
    defs: dict[str, list[ast.AST]] = {}
    for path in files:
        parsed = tree.parse(path)
        for func in functions(parsed) if parsed else ():
            defs.setdefault(func.name, []).append(func)
    constants = _message_constants(tree, files)
    users = {c: [f for fs in defs.values() for f in fs if _uses_name(f, c)] for c in constants}
    seen: set[int] = set()
    todo: list[ast.AST] = [start]
    calls: set[str] = set()
    while todo and len(seen) < MAX_FUNCS:
        func = todo.pop(0)  # breadth first: near calls before far ones
        if id(func) in seen:
            continue
        seen.add(id(func))
        for node in own_nodes(func):
            if isinstance(node, ast.Call):
                name = callee_name(node)
                text = ast.unparse(node.func)
                if name and CLEARING.search(name) and not text.startswith("logger"):
                    calls.add(ast.unparse(node))
                todo.extend(defs.get(name or "", []))
                # Functions handed over rather than called (executor.submit(self._reset)).
                for arg in node.args:
                    ref = arg.attr if isinstance(arg, ast.Attribute) else getattr(arg, "id", None)
                    todo.extend(defs.get(ref or "", []))
            elif isinstance(node, ast.Name) and node.id in users:
                todo.extend(users[node.id])
    return sorted(calls)


def _uses_name(func: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in own_nodes(func))


def reset_fact(tree: SourceTree, module: str, cls_name: str) -> dict | None:
    """reset_cache as the registered class resolves it; None when only the abstract default exists."""
    found = find_class_def(tree, module, cls_name)
    if found is None:
        return None
    hit = find_method(tree, found[0], found[1], "reset_cache")
    if hit is None or hit[0].endswith(BASE_FILES):
        return None
    path, func, owner = hit
    calls = reachable_calls(tree, func, scope_files(tree, path))
    return {"defined_in": owner, "calls": calls, **loc(path, func)}


def reset_caveats(tree: SourceTree, module: str, cls_name: str) -> dict:
    """What the reset's own code says about how it must be called and where it runs:
    `reset_needs_pause`: the sentence of reset_cache's docstring that asks for a pause;
    `reset_served_on`: the class that runs the clearing call (e.g. LookupKeyServer, which gets the
    reset message and calls remove_all), the condition its construction sits under (the worker
    rank that owns it) and the queue joins (drains) it runs first."""
    found = find_class_def(tree, module, cls_name)
    hit = find_method(tree, found[0], found[1], "reset_cache") if found else None
    if hit is None or hit[0].endswith(BASE_FILES):
        return {}
    path, func, _owner = hit
    out: dict = {}
    doc = ast.get_docstring(func, clean=False) or ""
    lines = doc.splitlines()
    text = " ".join(" ".join(lines).split())
    for sentence in re.split(r"(?<=\.)(?<!e\.g\.)(?<!i\.e\.)\s+(?=[A-Z])", text):
        if re.search(r"\bpause", sentence, re.IGNORECASE):
            line = next((i for i, raw in enumerate(lines) if re.search(r"\bpause", raw, re.IGNORECASE)), 0)
            out["reset_needs_pause"] = {"values": {"value": sentence.replace("``", ""), "file": path,
                                                   "line": func.body[0].lineno + line}}
            break
    files = scope_files(tree, path)
    clearing = {c for c in reachable_calls(tree, func, files) if "remove_all(" in c}
    for other in files:
        parsed = tree.parse(other)
        for cls in ast.walk(parsed) if parsed else ():
            if not isinstance(cls, ast.ClassDef):
                continue
            calls = [ast.unparse(n) for n in ast.walk(cls) if isinstance(n, ast.Call)]
            if not clearing & set(calls):
                continue
            drains = sorted({c for c in calls if c.endswith(".join()") and "queue" in c})
            site = _constructed_under(tree, files, cls.name)
            if site is not None:
                out["reset_served_on"] = {"values": {"value": {"class": cls.name, "when": site[0], "drains": drains},
                                                     **site[1]}}
                return out
    return out


def _constructed_under(tree: SourceTree, files: list[str], name: str) -> tuple[str, dict] | None:
    """(the `if` test, file:line) of where `name(...)` is constructed inside an if, in `files`."""
    for path in files:
        parsed = tree.parse(path)
        for node in ast.walk(parsed) if parsed else ():
            if isinstance(node, ast.If):
                for stmt in node.body:
                    for sub in ast.walk(stmt):
                        if isinstance(sub, ast.Call) and callee_name(sub) == name:
                            return ast.unparse(node.test), loc(path, sub)
    return None


def closure(tree: SourceTree, start: str) -> list[str]:
    """`start` plus the Mooncake-specific vLLM files it imports, transitively."""
    seen, todo = set(), [start]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        parsed = tree.parse(path)
        for mod in imported_modules(path, parsed) if parsed else ():
            target = tree.module_file(mod)
            if target and "mooncake" in target and target not in seen:
                todo.append(target)
    return sorted(seen)


def _get_calls(node: ast.AST, receiver_ok) -> dict[str, str | None]:
    keys: dict[str, set] = {}
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute):
            key = str_const(sub.args[0]) if sub.args else None
            if key is None:
                continue
            if sub.func.attr == "get" and receiver_ok(sub.func.value) or sub.func.attr == "get_from_extra_config":
                default = ast.unparse(sub.args[1]) if len(sub.args) > 1 else None
                keys.setdefault(key, set()).add(default)
        elif isinstance(sub, ast.Subscript) and receiver_ok(sub.value) and str_const(sub.slice):
            keys.setdefault(str_const(sub.slice), set()).add("<subscript read>")
    # One key read in several places with different defaults: show them all.
    return {k: " | ".join(sorted(d or "None" for d in v)) if v != {None} else None for k, v in sorted(keys.items())}


def mooncake_json_keys(tree: SourceTree, files: list[str]) -> dict | None:
    """Keys read from the MOONCAKE_CONFIG_PATH file, in the class (or module) that reads it."""
    for path in files:
        parsed = tree.parse(path)
        if parsed is None or "MOONCAKE_CONFIG_PATH" not in ast.unparse(parsed):
            continue
        holder = _holder_of(parsed, "MOONCAKE_CONFIG_PATH") or parsed
        json_vars = {t.id for n in ast.walk(holder) if isinstance(n, ast.Assign)
                     and "json.load" in ast.unparse(n.value) for t in n.targets if isinstance(t, ast.Name)}
        keys = _get_calls(holder, lambda r: isinstance(r, ast.Name) and (r.id == "config" or r.id in json_vars))
        if keys:
            return {"value": keys, **loc(path, holder)}
    return None


def _holder_of(module: ast.Module, marker: str) -> ast.ClassDef | None:
    for node in ast.walk(module):
        if isinstance(node, ast.ClassDef) and marker in ast.unparse(node):
            return node
    return None


def extra_config_keys(tree: SourceTree, files: list[str]) -> dict | None:
    keys: dict = {}
    first = None
    for path in files:
        parsed = tree.parse(path)
        if parsed is None:
            continue
        found = _get_calls(parsed, lambda r: "extra_config" in ast.unparse(r))
        if found and first is None:
            first = path
        for k, v in found.items():
            keys[k] = v if k not in keys or keys[k] == v else " | ".join(sorted({str(keys[k]), str(v)}))
    return {"value": dict(sorted(keys.items())), "file": first, "line": 0} if keys else None


# vLLM-side packages a connector's key code may live in besides kv_transfer/ (SimpleCPUOffloadConnector's
# manager, OffloadingConnector's specs)
SALT_SCOPES = ("vllm/v1/simple_kv_offload/", "vllm/v1/kv_offload/")


def salt_keys(tree: SourceTree, module: str, cls_name: str, others: tuple[str, ...] = ()) -> dict | None:
    """What a connector's keys for a request are built from, as far as vLLM's own sources show:
    "cache_salt" (it reads the request's salt and hands it on: the external server's keys may carry
    it), "block_hashes" (it reads a request's block hashes, into which vLLM mixes the cache_salt from
    the first block on), or "none" (neither: keys from token ids, or no keys at all, transfer by
    request id). Where: the first read of that kind in the connector's own code (its file, its
    subpackage, the connector-specific modules it imports, and SALT_SCOPES modules it imports)."""
    found = find_class_def(tree, module, cls_name) or _alias_def(tree, module, cls_name)
    if found is None:
        return None
    # another connector's subpackage inside this one's (mooncake/store/ under mooncake/) is not its code
    own = found[0].rsplit("/", 1)[0] + "/"
    foreign = {d for o in others if (d := o.rsplit("/", 1)[0] + "/") != own and d.startswith(own)}
    files = {f for f in scope_files(tree, found[0]) if not f.startswith(tuple(foreign))}
    for path in list(files):
        parsed = tree.parse(path)
        for mod in imported_modules(path, parsed) if parsed else ():
            target = tree.module_file(mod)
            if target and target.startswith(SALT_SCOPES):
                files.add(target)
    first: dict[str, dict] = {}
    for path in sorted(files):
        parsed = tree.parse(path)
        for node in ast.walk(parsed) if parsed else ():
            if isinstance(node, ast.Attribute) and node.attr == "cache_salt" or \
                    isinstance(node, ast.Name) and node.id == "cache_salt":
                first.setdefault("cache_salt", loc(path, node))
            # a request's hashes (request.block_hashes, req.block_hashes), not an event's (e.block_hashes)
            elif isinstance(node, ast.Attribute) and node.attr == "block_hashes" \
                    and "req" in ast.unparse(node.value).lower():
                first.setdefault("block_hashes", loc(path, node))
    for kind in ("cache_salt", "block_hashes"):
        if kind in first:
            return {"value": kind, **first[kind]}
    return {"value": "none", **loc(found[0], found[1])}


def _alias_def(tree: SourceTree, module: str, name: str, depth: int = 0) -> tuple[str, ast.AST] | None:
    """A connector registered under a module-level alias: `NixlConnector = NixlPullConnector` (the
    class it names), or `LMCacheMPConnector = _resolve_lmcache_mp_connector()` (the assignment: its
    module is the connector's code), following re-exports as find_class_def does."""
    path = tree.module_file(module)
    parsed = tree.parse(path) if path else None
    if parsed is None or depth > 3:
        return None
    for stmt in parsed.body:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets):
            if isinstance(stmt.value, ast.Name):
                return find_class_def(tree, module, stmt.value.id) or (path, stmt)
            return path, stmt
    origin = imported_names(path, parsed).get(name)
    return _alias_def(tree, origin[0], origin[1], depth + 1) if origin else None


def extract(tree: SourceTree) -> dict:
    out: dict = {}
    found = registrations(tree)
    modules = tuple(p for g in found.values() for r in g.values() if (p := tree.module_file(r["module"])))
    for name, gens in found.items():
        entry: dict = dict(gens)
        for gen in ("v1", "v0"):
            if gen not in gens:
                continue
            reset = reset_fact(tree, gens[gen]["module"], gens[gen]["class"]) if gen == "v1" else None
            if reset is not None:
                entry["reset_cache"] = reset
                entry.update(reset_caveats(tree, gens[gen]["module"], gens[gen]["class"]))
            keys = salt_keys(tree, gens[gen]["module"], gens[gen]["class"], modules) if gen == "v1" else None
            if keys is not None:
                entry["salt_keys"] = {"values": keys}
            if "mooncake" in name.lower():
                _add_mooncake(tree, entry, gens[gen])
            break  # a name registered as both: the V1 class is the one a V1 engine loads
        out[name] = entry
    return out


def _add_mooncake(tree: SourceTree, entry: dict, reg: dict) -> None:
    found = find_class_def(tree, reg["module"], reg["class"])
    if found is None:
        return
    files = closure(tree, found[0])
    keys = mooncake_json_keys(tree, files)
    if keys is not None:
        entry["mooncake_json_keys"] = {"values": keys}
    extra = extra_config_keys(tree, files)
    if extra is not None:
        entry["extra_config_keys"] = {"values": extra}
