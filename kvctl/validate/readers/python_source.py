"""Python that builds a config: `KVTransferConfig(kv_connector=..., ...)`,
`KVTransferConfig.from_cli('{...}')`, `LLM(..., kv_transfer_config={...})`.

Read with `ast`, never run. Values that are not literals (a variable, a call) are kept as
placeholders the checks skip; `os.environ["VLLM_USE_V1"] = "0"` in the file is its environment.
"""

from __future__ import annotations

import ast
import json
from typing import Any

from kvctl.errors import UsageError
from kvctl.validate.model import Artifact, SourceLines, join
from kvctl.validate.readers.documents import loads

_ROOT = "kv_transfer_config"


def read_python(text: str, file: str) -> list[Artifact]:
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise UsageError(f"{file}:{exc.lineno}: not valid Python: {exc.msg}",
                         f"fix the syntax at line {exc.lineno}") from None
    env = _environ(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        built = _kv_transfer_config(node, file)
        if built is None:
            built = _keyword_dict(node, file)
        if built is not None:
            data, lines = built
            found.append(Artifact("kv_transfer_config", data, _ROOT, lines,
                                  origin=f"Python (line {node.lineno})", env=env))
    return found


def _name(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _kv_transfer_config(call: ast.Call, file: str) -> tuple[dict[str, Any], SourceLines] | None:
    """KVTransferConfig(**keywords) or KVTransferConfig.from_cli(json_text)."""
    if _name(call.func) == "KVTransferConfig":
        lines = SourceLines(file, {_ROOT: call.lineno})
        data = {}
        for keyword in call.keywords:
            if keyword.arg is None:
                continue  # **kwargs: not readable
            data[keyword.arg] = _value(keyword.value)
            lines[join(_ROOT, keyword.arg)] = keyword.value.lineno
        return data, lines
    if _name(call.func) == "from_cli" and isinstance(call.func, ast.Attribute) and \
            _name(call.func.value) == "KVTransferConfig" and call.args:
        value = _value(call.args[0])
        if isinstance(value, str):
            try:
                parsed = loads(value)
            except json.JSONDecodeError:
                return None
            if isinstance(parsed, dict):
                lines = SourceLines(file, {_ROOT: call.lineno})
                lines.update({join(_ROOT, k): call.args[0].lineno for k in parsed})
                return parsed, lines
    return None


def _keyword_dict(call: ast.Call, file: str) -> tuple[dict[str, Any], SourceLines] | None:
    """LLM(..., kv_transfer_config={...}) / EngineArgs(...) with a dict literal."""
    for keyword in call.keywords:
        if keyword.arg == _ROOT and isinstance(keyword.value, ast.Dict):
            data = _value(keyword.value)
            lines = SourceLines(file, {_ROOT: keyword.value.lineno})
            for key in keyword.value.keys:
                if isinstance(key, ast.Constant):
                    lines[join(_ROOT, key.value)] = key.lineno
            return data, lines
    return None


def _value(node: ast.expr) -> Any:
    """The literal value, or a `$name` placeholder for what only running the code would give."""
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        if isinstance(node, ast.Dict):
            return {_value(k) if k is not None else "**": _value(v) for k, v in zip(node.keys, node.values)}
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
