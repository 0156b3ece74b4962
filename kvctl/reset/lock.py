"""One kvctl reset at a time per replica, on this machine.

Two resets of one fleet at once harm each other: the second sees the first's pause, takes it for
the owner's, resets without pausing and leaves the replica to the first, which resumes it while the
second still works. So a reset holds an exclusive lock per replica URL from before its pause to after
its resume, and a second reset of any of those replicas is refused. The locks are POSIX byte-range
locks on one file (the state dir's locks/reset.lock), one byte per URL (at an offset from its hash):
one open file whatever the fleet's size (a 1024-replica reset must stay within the open-file
limit), released by the kernel when the process ends, however it ends. Resets started from other
machines are not seen: run a fleet's resets from one place.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kvctl.state import state_dir

LOCKS = "locks"


class Busy(Exception):
    """Another process holds the reset lock of a replica."""

    def __init__(self, url: str) -> None:
        super().__init__(f"{url} is being reset by another kvctl (another process on this machine)")
        self.url = url


@contextmanager
def reset_lock(urls: list[str], override: str | Path | None = None) -> Iterator[None]:
    """Hold the reset lock of every URL; Busy at once when another process holds one."""
    import fcntl

    folder = state_dir(override) / LOCKS
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(folder / "reset.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        for url in sorted(set(urls)):
            offset = int(hashlib.sha1(url.encode()).hexdigest()[:10], 16)  # < 2**40: one byte per URL
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, offset)
            except OSError:  # EAGAIN / EACCES: held by another process
                raise Busy(url) from None
        yield
    finally:
        os.close(fd)  # releases every lock this process holds on the file
