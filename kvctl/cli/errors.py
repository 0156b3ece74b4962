"""One place that turns kvctl errors into a message and an exit code.

Exit codes (kvctl/errors.py): 0 ok, 1 a check failed (or an operation failed), 2 bad usage or input.
Tracebacks only with --debug or KVCTL_DEBUG=1.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn, TypeVar

import typer

from kvctl.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, KvctlError

F = TypeVar("F", bound=Callable[..., Any])
__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "debug_enabled", "exit_interrupted", "finish_with_receipt",
           "handle_errors", "SignalInterrupt"]


def debug_enabled() -> bool:
    return os.environ.get("KVCTL_DEBUG", "").strip().lower() in {"1", "true", "yes", "on"}


def handle_errors(func: F) -> F:
    """Wrap a command: KvctlError -> message on stderr + its exit code; no traceback. With --json (or
    -o json: kvctl.cli.options.output_options sets json_out), every way the command can end without
    its result prints the JSON error object on stdout too: a refused command, an internal error, and
    SIGINT, SIGTERM, SIGHUP or SIGQUIT (`{"interrupted": "SIGTERM", ...}`, exit 128 + the signal's number)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        json_out = bool(kwargs.get("json_out"))
        try:
            with _signals_interrupt(json_out):
                return func(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except KeyboardInterrupt as exc:
            if not json_out:
                raise
            exit_interrupted(exc, True, "the command ended before its result")
        except KvctlError as exc:
            if json_out and not getattr(exc, "json_reported", False):
                _print_json_error(exc)  # scripts read stdout: an error there too, not an empty stream
            if debug_enabled():
                raise  # the traceback, on stderr
            _print_error(exc.message, exc.hint)
            raise typer.Exit(exc.exit_code) from None
        except Exception as exc:  # a bug: say so briefly, full story with --debug
            message = f"internal error: {type(exc).__name__}: {exc}"
            fix = "rerun with --debug for the traceback, and report it"
            if json_out:
                _print_json_fields(message, fix, EXIT_FAILED)
            if debug_enabled():
                raise  # the traceback, on stderr
            _print_error(message, fix)
            raise typer.Exit(EXIT_FAILED) from None

    return wrapper  # type: ignore[return-value]


class SignalInterrupt(KeyboardInterrupt):
    """SIGTERM, SIGHUP or SIGQUIT ending a --json command, raised where it runs as Ctrl-C's KeyboardInterrupt is."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


@contextmanager
def _signals_interrupt(json_out: bool) -> Iterator[None]:
    """With --json, SIGTERM, SIGHUP and SIGQUIT (whose defaults end Python without a word) raise SignalInterrupt,
    so that the command ends with a JSON object on stdout. SIGINT already raises KeyboardInterrupt;
    an operation under kvctl.interrupt handles all three itself meanwhile. The handlers before are put
    back (in-process callers: tests, a --watch loop)."""
    import signal

    names = ("SIGTERM", "SIGHUP", "SIGQUIT") if json_out else ()
    previous = {}

    def interrupt(signum: int, frame: Any) -> None:
        raise SignalInterrupt(signal.Signals(signum).name)

    for name in names:
        if hasattr(signal, name):
            try:
                previous[name] = signal.signal(getattr(signal, name), interrupt)
            except ValueError:  # not the main thread: the default stays
                pass
    try:
        yield
    finally:
        for name, handler in previous.items():
            signal.signal(getattr(signal, name), handler)


def exit_interrupted(exc: BaseException, json_out: bool, what: str) -> NoReturn:
    """A signal ended an operation before it had a receipt (kvctl.interrupt), or a --json command
    before its result (SignalInterrupt, KeyboardInterrupt): say so, on stdout as JSON with --json,
    and exit 128 + the signal's number."""
    from kvctl.interrupt import exit_code_for, signal_of

    named = exc.args[0] if isinstance(exc, KeyboardInterrupt) and exc.args else None  # KeyboardInterrupt("SIGTERM")
    name = getattr(exc, "signal_name", None) or signal_of(exc) or (
        named if isinstance(named, str) and named.startswith("SIG") else None) or "SIGINT"
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
    _print_json_fields(exc.message, exc.hint, exc.exit_code)


def _print_json_fields(message: str, fix: str | None, exit_code: int) -> None:
    from kvctl.cli.output import print_json

    print_json({"ok": False, "exit_code": exit_code,
                "error": {"message": message, "fix": fix, "exit_code": exit_code}})


def report_usage_error(exc: Any, json_out: bool, command: str = "kvctl") -> NoReturn:
    """A usage error of click's or Typer's (no such option, missing argument, bad value, extra
    argument, no such command) in kvctl's own style: `error:` and `  fix:` on stderr, the JSON error
    object on stdout too with --json, exit 2 (click's code for them)."""
    message, fix = describe_usage_error(exc, command)
    code = getattr(exc, "exit_code", EXIT_USAGE)
    if json_out:
        _print_json_fields(message, fix, code)
    _print_error(message, fix)
    raise typer.Exit(code)


def describe_usage_error(exc: Any, command: str = "kvctl") -> tuple[str, str]:
    """(what, how to fix it) for a click usage error; what names the command it was given to (its
    context's, else `command`: click raises some without one)."""
    command = getattr(getattr(exc, "ctx", None), "command_path", None) or command
    text = " ".join(exc.format_message().split())
    help_hint = f"{command} -h shows its usage and options"
    possibilities = getattr(exc, "possibilities", None)
    option = getattr(exc, "option_name", None)
    if possibilities and option:  # no such option: the closest one(s) instead of click's list
        import difflib

        text = f"no such option: {option}"
        best = difflib.get_close_matches(option, possibilities, n=1, cutoff=0.0)
        return f"{command}: {text}", f"did you mean {best[0]}? ({help_hint})"
    text, _, suggestion = text.partition(" Did you mean ")  # Typer's for a mistyped command name
    message = f"{command}: {text[:1].lower()}{text[1:].rstrip('.')}"
    if text.startswith("No such command"):
        help_hint = f"{command} -h lists its commands"
    if suggestion:
        return message, f"did you mean {suggestion.rstrip('?')}? ({help_hint})"
    return message, help_hint


def _print_error(message: str, hint: str | None) -> None:
    from rich.markup import escape

    from kvctl.cli.output import err_console

    # messages quote user input and server answers: never let them be read as markup
    err_console().print(f"[bold red]error:[/] {escape(message)}", highlight=False, markup=True, soft_wrap=True)
    if hint:
        err_console().print(f"  [bold]fix:[/] {escape(hint)}", highlight=False, soft_wrap=True)
