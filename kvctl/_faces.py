"""A package's face: names importable from the package itself, loaded from their modules on first use
(PEP 562), so that `from kvctl.reset import ResetOptions` keeps working without the package importing
every module of it up front (start-up stays light, and no module cycle is made)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def lazy_face(package: str, face: dict[str, str], namespace: dict[str, Any]) -> tuple[Callable[[str], Any],
                                                                                      Callable[[], list[str]]]:
    """(__getattr__, __dir__) for `package`: each name of `face` comes from the module it maps to."""

    def __getattr__(name: str) -> Any:
        if name in face:
            from importlib import import_module

            return getattr(import_module(face[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted([*namespace, *face])

    return __getattr__, __dir__
