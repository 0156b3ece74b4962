"""Does a value pass a KVTransferConfig field's type, as vLLM's pydantic config coerces it?

vLLM declares KVTransferConfig with pydantic, in lax mode: `"1e9"` is a fine float, `"8000"` a
fine int, `"1e9"` not an int. The annotation text comes from the generated facts (as written in
vLLM's source); it is turned into a type with `ast` (never eval) and checked with pydantic itself,
so kvctl says what vLLM would say, with the same rule for every field.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from typing import Any, Literal, Optional, Union

_NAMES: dict[str, Any] = {
    "str": str, "int": int, "float": float, "bool": bool, "dict": dict, "list": list,
    "Any": Any, "None": type(None), "object": Any, "Optional": Optional, "Union": Union,
    "Literal": Literal, "Dict": dict, "List": list,
}


def type_error(annotation: str, value: Any) -> str | None:
    """Why vLLM's config would refuse `value` for a field annotated `annotation`, or None."""
    adapter = _adapter(annotation)
    if adapter is None:
        return None  # an annotation kvctl cannot read: vLLM decides, kvctl does not guess
    from pydantic import ValidationError

    try:
        adapter.validate_python(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        return f"{first['msg']} (vLLM declares it {annotation})"
    return None


@lru_cache(maxsize=None)
def _adapter(annotation: str) -> Any:
    try:
        hint = _build(ast.parse(annotation, mode="eval").body)
    except (SyntaxError, _Unknown):
        return None
    from pydantic import TypeAdapter

    return TypeAdapter(hint)


class _Unknown(Exception):
    """A name or form this reader does not know (a vLLM-specific type alias, say)."""


def _build(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant):
        if node.value is None:
            return type(None)
        if isinstance(node.value, str):  # a quoted forward reference: "KVRole"
            return _build(ast.parse(node.value, mode="eval").body)
        raise _Unknown
    if isinstance(node, ast.Name):
        if node.id not in _NAMES:
            raise _Unknown
        return _NAMES[node.id]
    if isinstance(node, ast.Attribute):  # typing.Optional, typing.Any
        return _build(ast.Name(node.attr))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return Union[_build(node.left), _build(node.right)]
    if isinstance(node, ast.Subscript):
        return _subscript(node)
    raise _Unknown


def _subscript(node: ast.Subscript) -> Any:
    base = node.value.id if isinstance(node.value, ast.Name) else \
        node.value.attr if isinstance(node.value, ast.Attribute) else None
    items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    if base == "Literal":
        if not all(isinstance(i, ast.Constant) for i in items):
            raise _Unknown
        return Literal[tuple(i.value for i in items)]  # type: ignore[index]
    args = tuple(_build(i) for i in items)
    if base in ("Optional",):
        return Optional[args[0]]
    if base == "Union":
        return Union[args]  # type: ignore[index]
    if base in ("dict", "Dict"):
        return dict[args] if len(args) == 2 else dict  # type: ignore[index]
    if base in ("list", "List"):
        return list[args[0]]  # type: ignore[index]
    raise _Unknown
