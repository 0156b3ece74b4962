"""One path for every signal that ends a long fleet operation: SIGINT (Ctrl-C), SIGTERM (what
`timeout`, CI cancellation, systemd and Kubernetes send), SIGHUP (a closed terminal) and SIGQUIT (Ctrl-\\).

Each of them cancels the operation's task with a message naming the signal, so the operation's own
`finally` runs (a reset resumes every replica it paused) and it returns a receipt that says it was
interrupted. Before, SIGINT resumed the fleet and SIGTERM killed kvctl with every replica left paused.
A second signal while that clean-up runs is noted, not obeyed: the resume must finish.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")
# Every signal that ends a process in the foreground of a terminal: Ctrl-C, Ctrl-\ (SIGQUIT), a closed
# terminal or a dropped SSH session (SIGHUP), and kill / timeout / systemd (SIGTERM).
TERMINAL_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")
                         if hasattr(signal, name))
SIGNALS = TERMINAL_SIGNALS  # what interruptible() turns into a cancellation (SIGQUIT too since issue 39)
_PREFIX = "kvctl interrupted by "


async def interruptible(operation: Awaitable[T]) -> T:
    """Run `operation` so that SIGINT, SIGTERM, SIGHUP and SIGQUIT cancel it (once) with `signal_of` telling which."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(operation)
    seen: list[str] = []

    def on_signal(sig: signal.Signals) -> None:
        if not seen:
            task.cancel(_PREFIX + sig.name)
        seen.append(sig.name)

    installed = []
    for sig in SIGNALS:
        try:
            loop.add_signal_handler(sig, on_signal, sig)
            installed.append(sig)
        except (ValueError, RuntimeError, NotImplementedError):  # not the main thread, or not Unix
            pass
    try:
        return await task
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


def run_blocking(operation: Awaitable[T]) -> T:
    """asyncio.run(operation) for a blocking Python API call (kvctl.hard_reset, kvctl.update_weights, ...):
    for the call's duration, in the main thread only, the terminal signals (each one the caller does not
    ignore) interrupt it as they interrupt the CLI, so its own clean-up runs (a reset resumes what it
    paused) and it returns its interrupted receipt. The handlers found are restored after; then the
    signal is raised again for them, doing what it would have done: the default SIGTERM, SIGHUP or SIGQUIT
    ends the process, SIGINT raises KeyboardInterrupt (its `.receipt`: the interrupted receipt), a
    caller's own handler is called. Outside the main thread nothing changes (plain asyncio.run)."""
    if threading.current_thread() is not threading.main_thread():
        return asyncio.run(operation)
    previous = {sig: signal.getsignal(sig) for sig in TERMINAL_SIGNALS}
    caught = [sig for sig, handler in previous.items() if handler is not signal.SIG_IGN]
    got: list[signal.Signals] = []

    async def main() -> T:
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(operation)

        def on_signal(sig: signal.Signals) -> None:
            if not got:
                task.cancel(_PREFIX + sig.name)
            got.append(sig)

        for sig in caught:
            loop.add_signal_handler(sig, on_signal, sig)
        try:
            return await task
        finally:
            for sig in caught:
                loop.remove_signal_handler(sig)

    try:
        result = asyncio.run(main())
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    if got:
        try:
            signal.raise_signal(got[0])  # its handler of before runs now: the default action, or the caller's
        except KeyboardInterrupt as exc:
            exc.receipt = result  # type: ignore[attr-defined]
            raise
    return result


def signal_of(exc: BaseException) -> str | None:
    """"SIGTERM" when `exc` is the cancellation `interruptible` made for that signal, else None."""
    if isinstance(exc, asyncio.CancelledError) and exc.args and isinstance(exc.args[0], str) \
            and exc.args[0].startswith(_PREFIX):
        return exc.args[0][len(_PREFIX):]
    return None


def exit_code_for(signal_name: str) -> int:
    """128 + the signal's number, as shells report a process a signal ended (SIGINT 130, SIGTERM 143)."""
    try:
        return 128 + int(signal.Signals[signal_name])
    except KeyError:
        return 130


@contextmanager
def raising_once(signals: tuple[signal.Signals, ...] = TERMINAL_SIGNALS) -> Iterator[list[str]]:
    """The first of `signals` raises KeyboardInterrupt where the code runs (as Ctrl-C does), so that its
    clean-up runs (kvctl serve stops everything it started); a later one while that clean-up runs is
    noted in the yielded list, not obeyed. Outside the main thread nothing changes. Handlers restored after."""
    seen: list[str] = []

    def on_signal(signum: int, frame: Any) -> None:
        seen.append(signal.Signals(signum).name)
        if len(seen) == 1:
            raise KeyboardInterrupt(signal.Signals(signum).name)

    with _handlers(signals, on_signal):
        yield seen


@contextmanager
def deferred(signals: tuple[signal.Signals, ...] = TERMINAL_SIGNALS) -> Iterator[None]:
    """Hold `signals` until the block ends, then deliver them to the handlers of before: a child process
    started inside the block is kept (recorded, given to whoever stops it) before a handler can raise,
    which between a child's start and the caller's assignment would leave it running with no handle."""
    held: list[int] = []
    try:
        with _handlers(signals, lambda signum, frame: held.append(signum)):
            yield
    finally:
        for signum in dict.fromkeys(held):
            signal.raise_signal(signum)  # the restored handler runs now (KeyboardInterrupt, or the default action)


@contextmanager
def _handlers(signals: tuple[signal.Signals, ...], handler: Callable[[int, Any], None]) -> Iterator[bool]:
    previous: dict[signal.Signals, Any] = {}
    try:
        for sig in signals:
            previous[sig] = signal.signal(sig, handler)
    except ValueError:  # not the main thread: signals are not ours to handle here
        pass
    try:
        yield bool(previous)
    finally:
        for sig, before in previous.items():
            signal.signal(sig, before if before is not None else signal.SIG_DFL)
