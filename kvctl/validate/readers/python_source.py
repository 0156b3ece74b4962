"""Python that builds a config: `KVTransferConfig(kv_connector=..., ...)`,
`KVTransferConfig.from_cli('{...}')`, `LLM(..., kv_transfer_config={...})`, a dict with a
"kv_transfer_config" key (Ray Serve's engine_kwargs), and a dict assigned to a variable first.

Read with `ast`, never run. A name is followed to the literal assigned to it (a dict, a JSON
string, json.dumps of a dict); values that are not literals (a call, an f-string) are kept as
placeholders the checks skip; `os.environ["VLLM_USE_V1"] = "0"` in the file is its environment.
A dict holding kv_connector / kv_role assigned to a variable is a config even when nothing in the
file passes it on (a launcher imports it).
"""

from __future__ import annotations

import ast
import json
from typing import Any

from kvctl.errors import UsageError
from kvctl.validate.model import Artifact, SourceLines, join
from kvctl.validate.readers.documents import loads
from kvctl.validate.readers.merge import merge_held
from kvctl.validate.readers.offload_args import key_of, located

_ROOT = "kv_transfer_config"
# Recorded in Artifact.calls, with the call's line under this name in Artifact.lines.
FROM_CLI = "KVTransferConfig.from_cli"
_MAX_HOPS = 4  # a = b; b = c; ... : names followed at most this far
_MAX_DEPTH = 32  # literals nested (through names) at most this deep
Built = tuple[dict[str, Any], SourceLines, str]  # data, lines, what it came through ("" or a name)


def read_python(text: str, file: str) -> list[Artifact]:
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise UsageError(f"{file}:{exc.lineno}: not valid Python: {exc.msg}",
                         f"fix the syntax at line {exc.lineno}") from None
    except (RecursionError, MemoryError):
        raise UsageError(f"{file}: not valid Python: nested too deeply to read",
                         "give the part that builds the config") from None
    return _Module(_DictCalls().visit(tree), file).artifacts()


class _DictCalls(ast.NodeTransformer):
    """`dict(a=1, b=dict(c=2))` read as the literal it builds (Ray's docs write engine_kwargs so):
    keyword-only calls of `dict` become ast.Dict nodes, each key at its keyword's line."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if not (isinstance(node.func, ast.Name) and node.func.id == "dict" and not node.args
                and node.keywords and all(k.arg is not None for k in node.keywords)):
            return node
        keys: list[ast.expr | None] = [ast.copy_location(ast.Constant(k.arg), k) for k in node.keywords]
        return ast.copy_location(ast.Dict(keys=keys, values=[k.value for k in node.keywords]), node)


class _Module:
    def __init__(self, tree: ast.Module, file: str) -> None:
        self.tree, self.file = tree, file
        self.env = _environ(tree)
        # NAME -> (line, value) of every `NAME = value`, in line order
        self.assigned: dict[str, list[tuple[int, ast.expr]]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                self.assigned.setdefault(node.targets[0].id, []).append((node.lineno, node.value))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                self.assigned.setdefault(node.target.id, []).append((node.lineno, node.value))
        for rows in self.assigned.values():
            rows.sort(key=lambda row: row[0])

    def artifacts(self) -> list[Artifact]:
        found = []
        for node in ast.walk(self.tree):
            built, calls = None, ()
            if isinstance(node, ast.Call):
                built = self._kv_transfer_config(node)
                if built is not None and _is_from_cli(node):
                    calls = (FROM_CLI,)
                    built[1][FROM_CLI] = node.lineno  # the call's own line, for python_api.py
                built = built or self._keyword(node)
            elif isinstance(node, ast.Dict):
                built = self._dict_key(node)
            if built is not None:
                data, lines, via = built
                origin = f"Python (line {node.lineno})" + (f", its value from {via}" if via else "")
                found.append(Artifact("kv_transfer_config", data, _ROOT, lines, origin=origin,
                                      env=self.env, calls=calls))
            found += self._offloading(node, built)
        return merge_held(found, self._held())

    def _offloading(self, node: ast.AST, built: Built | None) -> list[Artifact]:
        """LLM(kv_offloading_size=8, ...) / {"kv_offloading_size": 8} (engine_kwargs), linked to the
        kv_transfer_config the same call or dict sets (`built`)."""
        if isinstance(node, ast.Call):
            pairs = [(k.arg, k.value) for k in node.keywords]
        elif isinstance(node, ast.Dict):
            pairs = [(k.value, v) for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant)]
        else:
            return []
        settings = {key: (self.value(value), value.lineno) for name, value in pairs
                    if (key := key_of(name)) is not None}
        if not settings:
            return []
        config = Artifact("kv_transfer_config", built[0], _ROOT, built[1]) if built else None
        return [located(settings, self.file, "", f"Python (line {getattr(node, 'lineno', 1)})", config, self.env)]

    # -- following names ---------------------------------------------------------------
    def value(self, node: ast.expr, depth: int = 0) -> Any:
        """The literal `node` stands for, names followed to the literal assigned to them (in
        dicts and lists too); what only running the code gives (a call, os.environ, an
        f-string) is a `${expression}` placeholder the checks do not judge."""
        target = self.resolve(node)[0] if isinstance(node, ast.Name) else node
        if depth > _MAX_DEPTH:
            return _placeholder(node)
        if isinstance(target, ast.Dict):
            return {self.value(k, depth + 1) if k is not None else "**": self.value(v, depth + 1)
                    for k, v in zip(target.keys, target.values)}
        if isinstance(target, (ast.List, ast.Tuple)) and not any(isinstance(e, ast.Starred) for e in target.elts):
            return [self.value(e, depth + 1) for e in target.elts]
        try:
            return ast.literal_eval(target)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return _placeholder(target)

    def resolve(self, node: ast.expr, hops: int = 0) -> tuple[ast.expr, str]:
        """The literal a name stands for (the last assignment before its use), and the name with
        its line; other expressions as they are."""
        via = ""
        while isinstance(node, ast.Name) and hops < _MAX_HOPS and node.id in self.assigned:
            rows = self.assigned[node.id]
            before = [row for row in rows if row[0] < node.lineno] or rows
            line, value = before[-1]
            via, node, hops = via or f"{node.id} (line {line})", value, hops + 1
        if isinstance(node, ast.Call) and _name(node.func) == "dumps" and node.args:
            inner, inner_via = self.resolve(node.args[0], hops + 1)
            return inner, via or inner_via
        return node, via

    def _dict(self, node: ast.expr) -> Built | None:
        """A dict literal (after names) as data with the line of every key."""
        target, via = self.resolve(node)
        if not isinstance(target, ast.Dict):
            return None
        data = self.value(target)
        return (data, _dict_lines(target, self.file), via) if isinstance(data, dict) else None

    def _json_text(self, node: ast.expr) -> Built | None:
        """A JSON string (or json.dumps of a dict) after names, parsed."""
        target, via = self.resolve(node)
        if isinstance(target, ast.Dict):  # from_cli(json.dumps({...}))
            built = self._dict(target)
            return (built[0], built[1], via) if built else None
        value = self.value(target)
        if not isinstance(value, str):
            return None
        try:
            parsed = loads(value)
        except json.JSONDecodeError:
            return None
        if not isinstance(parsed, dict):
            return None
        lines = SourceLines(self.file, {_ROOT: target.lineno})
        lines.update({join(_ROOT, k): target.lineno for k in parsed})
        return parsed, lines, via

    # -- where configs are built ---------------------------------------------------------
    def _kv_transfer_config(self, call: ast.Call) -> Built | None:
        """KVTransferConfig(**keywords) or KVTransferConfig.from_cli(json_text)."""
        if _name(call.func) == "KVTransferConfig":
            spread = [k for k in call.keywords if k.arg is None]
            named = [k for k in call.keywords if k.arg is not None]
            base = self._dict(spread[0].value) if len(spread) == 1 else None
            if base is not None and not named:
                return base  # KVTransferConfig(**cfg): located in cfg's literal
            data, lines = (dict(base[0]), base[1]) if base else ({}, SourceLines(self.file))
            lines[_ROOT] = call.lineno
            for keyword in named:
                data[keyword.arg] = self.value(keyword.value)
                lines[join(_ROOT, keyword.arg)] = keyword.value.lineno
            return data, lines, base[2] if base else ""
        if _is_from_cli(call) and call.args:
            return self._json_text(call.args[0])
        return None

    def _keyword(self, call: ast.Call) -> Built | None:
        """LLM(..., kv_transfer_config={...} or a name bound to one) / EngineArgs(...)."""
        for keyword in call.keywords:
            if keyword.arg == _ROOT:
                return self._dict(keyword.value)
        return None

    def _dict_key(self, node: ast.Dict) -> Built | None:
        """{"kv_transfer_config": {...}} (Ray Serve LLMConfig engine_kwargs, a kwargs dict)."""
        for key, value in zip(node.keys, node.values):
            if isinstance(key, ast.Constant) and key.value == _ROOT:
                return self._dict(value)
        return None

    def _held(self) -> list[Artifact]:
        """Dicts with kv_connector / kv_role assigned to a variable."""
        held = []
        for name, rows in self.assigned.items():
            for line, value in rows:
                built = self._dict(value) if isinstance(value, ast.Dict) else None
                if built is not None and ("kv_connector" in built[0] or "kv_role" in built[0]):
                    held.append(Artifact("kv_transfer_config", built[0], _ROOT, built[1],
                                         origin=f"variable {name} (line {line})", env=self.env))
        return sorted(held, key=lambda a: a.lines[_ROOT])


def _is_from_cli(call: ast.Call) -> bool:
    return _name(call.func) == "from_cli" and isinstance(call.func, ast.Attribute) and \
        _name(call.func.value) == "KVTransferConfig"


def _name(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _dict_lines(node: ast.Dict, file: str, path: str = _ROOT) -> SourceLines:
    """The line of the dict and of each key, nested dicts included."""
    lines = SourceLines(file, {path: node.lineno})
    for key, value in zip(node.keys, node.values):
        if isinstance(key, ast.Constant):
            child = join(path, key.value)
            lines[child] = key.lineno
            lines.update(_nested_lines(value, file, child))
    return lines


def _nested_lines(node: ast.expr, file: str, path: str) -> SourceLines:
    if isinstance(node, ast.Dict):
        return _dict_lines(node, file, path)
    lines = SourceLines(file)
    if isinstance(node, (ast.List, ast.Tuple)):  # MultiConnector's connectors: [{...}, {...}]
        for index, item in enumerate(node.elts):
            lines[f"{path}[{index}]"] = item.lineno
            lines.update(_nested_lines(item, file, f"{path}[{index}]"))
    return lines


def _value(node: ast.expr) -> Any:
    """The literal value, or a placeholder for what only running the code would give."""
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        if isinstance(node, ast.Dict):
            return {_value(k) if k is not None else "**": _value(v) for k, v in zip(node.keys, node.values)}
        return _placeholder(node)


def _placeholder(node: ast.expr) -> str:
    """`${expression}`: a value only running the code gives (kvctl.validate.unknown says so)."""
    return f"${{{ast.unparse(node)}}}"


def _environ(tree: ast.Module) -> dict[str, str]:
    """os.environ["X"] = "v" assignments anywhere in the file."""
    env = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Subscript) and "environ" in ast.unparse(target.value):
                key, value = _value(target.slice), _value(node.value)
                if isinstance(key, str) and isinstance(value, str):
                    env[key] = value
    return env

