"""Errors kvctl raises on purpose. Each carries what went wrong and how to fix it.

The CLI maps them to exit codes (see kvctl/cli/errors.py); the Python API lets them propagate.
"""

from __future__ import annotations


class KvctlError(Exception):
    """Base class: a failure kvctl understood. `hint` says how to fix it."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  fix: {self.hint}"

    def __reduce__(self) -> tuple[type, tuple[str, str | None]]:
        # pickled with its hint (a Ray actor's error reaches kvctl pickled)
        return (self.__class__, (self.message, self.hint))


class UsageError(KvctlError):
    """Bad input from the user: unknown template, bad --set, unparsable version or file."""

    exit_code = 2


class CheckFailed(KvctlError):
    """A check ran and its answer is "no" (validate found problems, compat requirement unmet)."""

    exit_code = 1
