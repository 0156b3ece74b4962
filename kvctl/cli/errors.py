"""One place that turns kvctl errors into a message and an exit code.

Exit codes (kvctl/errors.py): 0 ok, 1 a check failed (or an operation failed), 2 bad usage or input.
Tracebacks only with --debug or KVCTL_DEBUG=1.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Coroutine
from typing import Any, NoReturn, TypeVar

import typer

from kvctl.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, KvctlError

F = TypeVar("F", bound=Callable[..., Any])
__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "debug_enabled", "exit_interrupted", "finish_with_receipt",
           "handle_errors"]


def debug_enabled() -> bool:
    return os.environ.get("KVCTL_DEBUG", "").strip().lower() in {"1", "true", "yes", "on"}


def handle_errors(func: F) -> F:
    """Wrap a command: KvctlError -> message on stderr + its exit code; no traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except KvctlError as exc:
            if debug_enabled():
                raise
            if kwargs.get("json_out") and not getattr(exc, "json_reported", False):
                _print_json_error(exc)  # scripts read stdout: an error there too, not an empty stream
            _print_error(exc.message, exc.hint)
            raise typer.Exit(exc.exit_code) from None
        except Exception as exc:  # a bug: say so briefly, full story with --debug
            if debug_enabled():
                raise
            _print_error(f"internal error: {type(exc).__name__}: {exc}",
                         "rerun with --debug for the traceback, and report it")
            raise typer.Exit(EXIT_FAILED) from None

    return wrapper  # type: ignore[return-value]


def exit_interrupted(exc: BaseException, json_out: bool, what: str) -> NoReturn:
    """A signal ended an operation before it had a receipt (kvctl.interrupt): say so, on stdout as
    JSON with --json, and exit 128 + the signal's number."""
    from kvctl.interrupt import exit_code_for, signal_of

    name = signal_of(exc) or "SIGINT"
    code = exit_code_for(name)
    summary = f"interrupted by {name}: {what}"
    if json_out:
        from kvctl.cli.output import print_json

        print_json({"ok": False, "exit_code": code, "interrupted": name, "summary": summary})
    else:
        _print_error(summary, None)
    raise typer.Exit(code)


def finish_with_receipt(operation: Coroutine[Any, Any, Any], json_out: bool, before_receipt: str,
                        show: Callable[[Any], None]) -> NoReturn:
    """Run a fleet operation (reset, weights update, probe) to its receipt under kvctl.interrupt's
    signal handling, print it (JSON, or `show`) and exit with its exit code. `before_receipt`: what a
    signal that comes before the operation has a receipt leaves ("nothing was changed")."""
    import asyncio  # lazily: --help and other commands do not need it

    from kvctl.interrupt import interruptible

    try:
        receipt = asyncio.run(interruptible(operation))
    except asyncio.CancelledError as exc:
        exit_interrupted(exc, json_out, before_receipt)
    if json_out:
        from kvctl.cli.output import print_json

        print_json(receipt.to_dict())
    else:
        show(receipt)
    raise typer.Exit(receipt.exit_code)


def _print_json_error(exc: KvctlError) -> None:
    """The --json shape of every refused command (as `config validate` has it): ok false, the exit
    code, and the error with its fix."""
    from kvctl.cli.output import print_json

    print_json({"ok": False, "exit_code": exc.exit_code,
                "error": {"message": exc.message, "fix": exc.hint, "exit_code": exc.exit_code}})


def _print_error(message: str, hint: str | None) -> None:
    from rich.markup import escape

    from kvctl.cli.output import err_console

    # messages quote user input and server answers: never let them be read as markup
    err_console().print(f"[bold red]error:[/] {escape(message)}", highlight=False, markup=True, soft_wrap=True)
    if hint:
        err_console().print(f"  [bold]fix:[/] {escape(hint)}", highlight=False, soft_wrap=True)
