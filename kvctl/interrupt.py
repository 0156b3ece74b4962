"""One path for every signal that ends a long fleet operation: SIGINT (Ctrl-C), SIGTERM (what
`timeout`, CI cancellation, systemd and Kubernetes send) and SIGHUP (a closed terminal).

Each of them cancels the operation's task with a message naming the signal, so the operation's own
`finally` runs (a reset resumes every replica it paused) and it returns a receipt that says it was
interrupted. Before, SIGINT resumed the fleet and SIGTERM killed kvctl with every replica left paused.
A second signal while that clean-up runs is noted, not obeyed: the resume must finish.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")
SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
_PREFIX = "kvctl interrupted by "


async def interruptible(operation: Awaitable[T]) -> T:
    """Run `operation` so that SIGINT, SIGTERM and SIGHUP cancel it (once) with `signal_of` telling which."""
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
