"""Fault injection for the HTTP test doubles: :class:`Faults`, and :class:`Call` (one recorded request).

Part of :mod:`tests.doubles` (see its docstring); imports nothing from ``kvctl``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar


# --------------------------------------------------------------------------------------------
# Shared records
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Call:
    """One request as the double received it (recorded before any fault applies).

    ``query`` keeps the last value of a repeated parameter; ``body`` is the parsed JSON body, or
    the raw text when it is not JSON, or ``None`` when empty. ``t`` is ``time.monotonic()``.
    """

    method: str
    path: str
    query: dict[str, str]
    t: float
    body: Any = None


@dataclass
class Faults:
    """Fault injection for one server; every field may be changed at runtime from any thread.

    A key of ``fail_first``/``status``/``delay`` is a route path without query
    (``"/reset_prefix_cache"``); the key ``"*"`` applies to every path without its own entry.
    Order per request: record the call -> ``delay`` -> ``status`` -> ``fail_first`` -> route.

    * ``fail_first[path] = n``: the next ``n`` requests to ``path`` answer HTTP 500 (plain text
      ``Internal Server Error``, like uvicorn), then the route behaves; the count goes down.
    * ``status[path] = code``: always answer ``code`` (500 plain text; others a FastAPI-like
      ``{"detail": ...}`` JSON for vLLM, ``"<code> <phrase>"`` text for the master).
    * ``delay[path] = seconds``: sleep before answering. The effect still happens after the
      sleep even if the client gave up (uvicorn does not cancel handlers either).
    * ``success_false``: paths that answer ``{"success": false}`` and do nothing. Meaningful for
      ``/reset_prefix_cache`` on vLLM >= 0.26 (earlier versions answer an empty 200 and *do*
      reset) and for the master's ``/api/v1/remove_all`` (200, ``success: false``, nothing
      removed).
    * ``refuse = True``: the server stops listening (connection refused) and its open
      connections are aborted, like a dead process. Cannot be undone.
    """

    fail_first: dict[str, int] = field(default_factory=dict)
    status: dict[str, int] = field(default_factory=dict)
    delay: dict[str, float] = field(default_factory=dict)
    success_false: set[str] = field(default_factory=set)
    refuse: bool = False
    # Set per instance by the server that owns these faults (not a dataclass field).
    _on_refuse: ClassVar[Callable[[], None] | None] = None

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if name == "refuse" and value:
            hook = self.__dict__.get("_on_refuse")
            if hook is not None:
                hook()

    @staticmethod
    def _lookup(mapping: dict[str, Any], path: str) -> Any:
        if path in mapping:
            return mapping[path]
        return mapping.get("*")

    def delay_for(self, path: str) -> float:
        return float(self._lookup(self.delay, path) or 0.0)

    def status_for(self, path: str) -> int | None:
        value = self._lookup(self.status, path)
        return int(value) if value else None

    def take_failure(self, path: str) -> bool:
        """Consume one ``fail_first`` failure for ``path``; True if the request must fail."""
        key = path if path in self.fail_first else "*"
        left = self.fail_first.get(key, 0)
        if left > 0:
            self.fail_first[key] = left - 1
            return True
        return False

    def says_success_false(self, path: str) -> bool:
        return path in self.success_false or "*" in self.success_false
