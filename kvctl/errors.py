"""Errors kvctl raises on purpose, each with what went wrong and how to fix it, and every exit code
kvctl returns (the README's table; one place, so that commands cannot drift apart).

The CLI maps the errors to these codes (kvctl/cli/errors.py); the Python API lets them propagate.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1  # a check said no, or an operation failed
EXIT_USAGE = 2  # bad usage or input
EXIT_PARTIAL = 3  # kvctl reset: some replicas were reset, some not
# kvctl probe's verdicts: every prompt matched / a replica serves STALE KV / nothing could be decided
EXIT_MATCH, EXIT_STALE, EXIT_INCONCLUSIVE = EXIT_OK, EXIT_FAILED, 3
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), as shells report it


class KvctlError(Exception):
    """Base class: a failure kvctl understood. `hint` says how to fix it."""

    exit_code = EXIT_FAILED

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

    exit_code = EXIT_USAGE


class CheckFailed(KvctlError):
    """A check ran and its answer is "no" (validate found problems, compat requirement unmet)."""

    exit_code = EXIT_FAILED
