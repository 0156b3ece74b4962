"""vLLM's native KV offloading settings: CacheConfig's kv_offloading_size / kv_offloading_backend
(--kv-offloading-size / --kv-offloading-backend, EngineArgs keywords) and the kv_transfer_config
VllmConfig._post_init_kv_transfer_config builds from them.

Section "offload_args" of a snapshot:
  kv_offloading_size / kv_offloading_backend: spans (the CacheConfig field), types (annotation,
      default), flag (the argparse option in vllm/engine/arg_utils.py), choices (the Literal's values)
  post_init: spans (the function), gate (the field whose None makes it return early), requires (the
      field it raises without, with vLLM's message), kv_role (what it writes), params.<backend>
      (per `kv_offloading_backend == "<backend>"` branch: connector, env_connector (an
      `if envs.X:` choice), extra (key -> expression as written), extra_mode (update / replace))
Read with ast from vllm/config/cache.py and vllm/config/vllm.py (0.11.1+); older trees give nothing.
"""

from __future__ import annotations

import ast

from tools.capabilities.config_facts import default_repr, literal_values
from tools.capabilities.source import SourceTree, constant_in, find_class, loc, str_const

FIELDS = ("kv_offloading_size", "kv_offloading_backend")
FUNCTION = "_post_init_kv_transfer_config"
ARG_UTILS = "vllm/engine/arg_utils.py"


def _config_files(tree: SourceTree) -> list[str]:
    return [f for f in tree.files if f == "vllm/config.py" or f.startswith("vllm/config/")]


def _cache_config(tree: SourceTree) -> tuple[str, ast.Module, ast.ClassDef] | None:
    for path in _config_files(tree):
        module = tree.parse(path)
        cls = find_class(module, "CacheConfig") if module else None
        if cls is not None:
            return path, module, cls
    return None


def fields(tree: SourceTree) -> dict:
    """The two CacheConfig fields of one release (empty before they exist)."""
    found = _cache_config(tree)
    if found is None:
        return {}
    path, module, cls = found
    out: dict = {}
    for stmt in cls.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                and stmt.target.id in FIELDS):
            continue
        entry: dict = {"spans": loc(path, stmt),
                       "types": {"type": ast.unparse(stmt.annotation), "default": default_repr(stmt.value)}}
        flag = constant_in(tree, ARG_UTILS, "--" + stmt.target.id.replace("_", "-"))  # where arg_utils adds it
        if flag is not None:
            entry["flag"] = {"values": flag}
        choices = literal_values(stmt.annotation, module)
        if choices:  # a set: sorted, so alias order is not a change
            entry["choices"] = {"values": {"value": sorted(choices), **loc(path, stmt)}}
        out[stmt.target.id] = entry
    return out


def _function(tree: SourceTree) -> tuple[str, ast.FunctionDef] | None:
    for path in _config_files(tree):
        module = tree.parse(path)
        for node in ast.walk(module) if module else ():
            if isinstance(node, ast.FunctionDef) and node.name == FUNCTION:
                return path, node
    return None


def _none_test(test: ast.AST) -> str | None:
    """The CacheConfig field of `self.cache_config.F is None` / `(x := self.cache_config.F) is None`."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Is)
            and ast.unparse(test.comparators[0]) == "None"):
        return None
    left = test.left.value if isinstance(test.left, ast.NamedExpr) else test.left
    name = ast.unparse(left)
    return name.rpartition(".")[2] if name.startswith("self.cache_config.") else None


def _message(raised: ast.Raise) -> str | None:
    exc = raised.exc
    return str_const(exc.args[0]) if isinstance(exc, ast.Call) and exc.args else None


def _gates(path: str, func: ast.FunctionDef) -> dict:
    """gate (an early return when a field is None) and requires (a raise when one is None)."""
    out: dict = {}
    for stmt in func.body:
        field = _none_test(stmt.test) if isinstance(stmt, ast.If) else None
        if field is None:
            continue
        if isinstance(stmt.body[0], ast.Return) and "gate" not in out:
            out["gate"] = {"values": {"value": field, **loc(path, stmt)}}
        raised = next((s for s in stmt.body if isinstance(s, ast.Raise)), None)
        if raised is not None and "requires" not in out:
            out["requires"] = {"values": {"value": field, "message": _message(raised), **loc(path, stmt)}}
    return out


def _backend_branches(func: ast.FunctionDef) -> list[tuple[str, ast.If]]:
    """(backend, branch) of `if kv_offloading_backend == "native": ... elif ... == "lmcache":`."""
    found: list[tuple[str, ast.If]] = []
    for node in ast.walk(func):
        test = node.test if isinstance(node, ast.If) else None
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq) \
                and ast.unparse(test.left).endswith("kv_offloading_backend") and str_const(test.comparators[0]):
            found.append((str_const(test.comparators[0]), node))
    return found


def _assigned_consts(stmts: list[ast.stmt], name: str) -> list[str]:
    return [str_const(s.value) for s in stmts if isinstance(s, ast.Assign) and str_const(s.value)
            and any(ast.unparse(t) == name for t in s.targets)]


def _connector(branch: ast.If) -> dict:
    """What the branch writes to kv_connector: a constant, or a name an `if envs.X:` chooses."""
    for stmt in ast.walk(ast.Module(body=branch.body, type_ignores=[])):
        if not (isinstance(stmt, ast.Assign) and ast.unparse(stmt.targets[0]).endswith(".kv_connector")):
            continue
        if str_const(stmt.value):
            return {"connector": str_const(stmt.value), "env_connector": None}
        name = ast.unparse(stmt.value)
        for choice in (s for s in branch.body if isinstance(s, ast.If)):
            chosen, default = _assigned_consts(choice.body, name), _assigned_consts(choice.orelse, name)
            env = ast.unparse(choice.test)
            if chosen and default and env.startswith("envs."):
                return {"connector": default[0],
                        "env_connector": {"env": env.partition(".")[2], "connector": chosen[0]}}
    return {"connector": None, "env_connector": None}


def _extra(branch: ast.If) -> dict:
    """The kv_connector_extra_config keys the branch writes (value as written, its local names
    followed once) and how: update (merged into the user's) or replace (the user's is dropped)."""
    local = {ast.unparse(s.targets[0]): ast.unparse(s.value) for s in branch.body
             if isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Name)}
    for node in ast.walk(ast.Module(body=branch.body, type_ignores=[])):
        mode, written = None, None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update" \
                and ast.unparse(node.func.value).endswith("kv_connector_extra_config") and node.args:
            mode, written = "update", node.args[0]
        elif isinstance(node, ast.Assign) and ast.unparse(node.targets[0]).endswith(".kv_connector_extra_config"):
            mode, written = "replace", node.value
        if isinstance(written, ast.Dict):
            extra = {str_const(k): local.get(ast.unparse(v), ast.unparse(v))
                     for k, v in zip(written.keys, written.values) if str_const(k)}
            return {"extra": extra, "extra_mode": mode}
    return {"extra": {}, "extra_mode": None}


def post_init(tree: SourceTree) -> dict:
    """What _post_init_kv_transfer_config does with the two fields (empty where it does not exist)."""
    found = _function(tree)
    if found is None:
        return {}
    path, func = found
    entry: dict = {"spans": loc(path, func), **_gates(path, func)}
    role = next((s for s in ast.walk(func) if isinstance(s, ast.Assign)
                 and ast.unparse(s.targets[0]).endswith("kv_transfer_config.kv_role") and str_const(s.value)), None)
    if role is not None:
        entry["kv_role"] = {"values": {"value": str_const(role.value), **loc(path, role)}}
    # the sizes are per rank: num_kv_ranks = tensor_parallel_size * pipeline_parallel_size (0.11.1+)
    ranks = next((s for s in ast.walk(func) if isinstance(s, ast.Assign) and len(s.targets) == 1
                  and ast.unparse(s.targets[0]) == "num_kv_ranks"), None)
    if ranks is not None:
        entry["ranks"] = {"values": {"value": ast.unparse(ranks.value), **loc(path, ranks)}}
    params = {backend: {"values": {**_connector(branch), **_extra(branch), **loc(path, branch)}}
              for backend, branch in _backend_branches(func)}
    if params:
        entry["params"] = params
    return entry


def extract(tree: SourceTree) -> dict:
    """The "offload_args" section of one release's snapshot."""
    out = fields(tree)
    if out:
        built = post_init(tree)
        if built:
            out["post_init"] = built
    return out
