"""What kvctl may print of a log: text that cannot drive the reader's terminal, from a file that
cannot hang the reader.

A log carries what its process was given: vLLM logs prompts when asked to (--enable-log-requests), so
it can hold escape sequences. Replaced by U+FFFD: every C0 control but tab and newline (a lone
carriage return lets a line overwrite itself; CRLF stays a line end), DEL, every C1 control (U+0080 to
U+009F: U+009B is CSI and U+009D OSC on a terminal that takes 8-bit controls) and the bidirectional
controls (U+061C, U+200E, U+200F, U+202A to U+202E, U+2066 to U+2069: they reorder what a reader sees).

A log path that is not a regular file (a named pipe waits in open() for a writer, a device never ends)
is refused without a blocking open.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from typing import BinaryIO

__all__ = ["NotRegularFile", "not_regular", "open_regular", "printable"]

_BIDI = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
_CONTROLS = {c: "\ufffd" for c in (*range(0, 9), 11, 12, *range(14, 32), 127, *range(0x80, 0xA0), *_BIDI)}
_LONE_CR = re.compile(r"\r(?!\n)")


def printable(text: str) -> str:
    """`text` with every control that could drive a terminal replaced by U+FFFD (see the module)."""
    return _LONE_CR.sub("\ufffd", text.translate(_CONTROLS))


def not_regular(mode: int) -> str | None:
    """None for a regular file's st_mode, else what it is instead ("not a regular file: a named pipe")."""
    if stat.S_ISREG(mode):
        return None
    kind = ("a named pipe (FIFO)" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a folder" if stat.S_ISDIR(mode) else "not a file")
    return f"not a regular file: {kind}"


class NotRegularFile(OSError):
    """A log path that is a named pipe, a device or a socket: never read."""


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """`path` opened for reading in binary, when it is a regular file (a symlink to one is one);
    NotRegularFile otherwise, decided on the opened file (no race with a swap), whose open cannot
    block: O_NONBLOCK, which a regular file's reads ignore. OSError when it cannot be opened."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        kind = not_regular(os.fstat(fd).st_mode)
        if kind is not None:
            raise NotRegularFile(errno.EINVAL, kind, str(path))
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
