"""Every help screen as a user sees it: `kvctl ... -h` in a real terminal (a pty) 80 columns wide, with
the Typer installed here; no COLUMNS, so the width comes from the terminal as in a shell.

The screens come from the app itself (every command and group, those added later too). All are
spawned at once and read together: about 0.3 s of CPU each, a few seconds in all.
"""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

WIDTH = 80
# Typer's type labels where click had a metavar, and its {NAME} for a required argument; choices in
# angle brackets; the default of an option that has none
ARTEFACTS = re.compile(r"<(?:bool|str|int|float|path|datetime|uuid|file|list\[[^\]]*\]|[a-z]+ range)>"
                       r"|<[\w.-]+(?:\|[\w.-]+)+>|\[default: None\]")
USAGE_ARTEFACTS = re.compile(r"\{[A-Za-z_]+\}|\[\[")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")


def _screens() -> list[list[str]]:
    import typer.main

    from kvctl.cli.main import app

    def walk(command, path: list[str]):  # type: ignore[no-untyped-def]
        yield path
        for name, sub in getattr(command, "commands", {}).items():
            if not sub.hidden:
                yield from walk(sub, [*path, name])

    return list(walk(typer.main.get_command(app), []))


SCREENS = _screens()


def _kvctl() -> list[str]:
    script = Path(sys.executable).parent / "kvctl"
    return [str(script)] if script.exists() else [sys.executable, "-m", "kvctl"]


def _env() -> dict[str, str]:
    drop = ("COLUMNS", "LINES", "TERMINAL_WIDTH", "FORCE_COLOR", "PY_COLORS", "NO_COLOR", "GITHUB_ACTIONS",
            "_TYPER_FORCE_DISABLE_TERMINAL", "KVCTL_DEBUG")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["TERM"] = "xterm-256color"
    return env


def _spawn(args: list[str]) -> tuple[subprocess.Popen[bytes], int]:
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, WIDTH, 0, 0))
    proc = subprocess.Popen([*_kvctl(), *args], stdin=slave, stdout=slave, stderr=slave, env=_env(),
                            start_new_session=True)
    os.close(slave)
    return proc, master


def _render_all(screens: list[list[str]], timeout: float = 120.0) -> dict[str, tuple[int, str]]:
    """`kvctl <screen> -h` for every screen at once in its own pty: {screen: (exit code, text)}."""
    running = {" ".join(s): _spawn([*s, "-h"]) for s in screens}
    chunks: dict[int, list[bytes]] = {fd: [] for _, fd in running.values()}
    open_fds = set(chunks)
    deadline = time.monotonic() + timeout
    while open_fds and time.monotonic() < deadline:
        ready, _, _ = select.select(list(open_fds), [], [], 1.0)
        for fd in ready:
            try:
                data = os.read(fd, 65536)
            except OSError:  # EIO: the process closed its side of the pty
                data = b""
            if data:
                chunks[fd].append(data)
            else:
                open_fds.discard(fd)
    out = {}
    for name, (proc, fd) in running.items():
        try:
            code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            code = -9
        os.close(fd)
        text = ANSI.sub("", b"".join(chunks[fd]).decode("utf-8", "replace")).replace("\r\n", "\n")
        out[name] = (code, text)
    return out


@pytest.fixture(scope="module")
def rendered() -> dict[str, tuple[int, str]]:
    started = time.monotonic()
    screens = _render_all(SCREENS)
    # what "fast" means here: every screen at once, on a loaded 2-core machine too
    assert time.monotonic() - started < 60, "rendering every help screen took over a minute"
    return screens


def _cells(line: str) -> int:
    from rich.cells import cell_len

    return cell_len(line)


def test_the_screens_come_from_the_app() -> None:
    names = {" ".join(s) for s in SCREENS}
    assert {"", "reset", "serve", "config", "config validate", "weights update"} <= names


@pytest.mark.parametrize("screen", [" ".join(s) for s in SCREENS], ids=lambda s: s or "kvctl")
def test_help_screen_in_a_terminal_80_columns_wide(rendered: dict[str, tuple[int, str]], screen: str) -> None:
    code, text = rendered[screen]
    where = f"kvctl {screen} -h".replace("  ", " ")
    assert code == 0, f"{where} exited {code}:\n{text}"
    assert "Traceback" not in text, f"{where}:\n{text}"
    lines = text.splitlines()
    assert any(line.strip().startswith(f"Usage: {where[:-3]}") for line in lines), f"{where}: no usage line:\n{text}"
    wide = [(n, _cells(line), line) for n, line in enumerate(lines, 1) if _cells(line) > WIDTH]
    assert not wide, f"{where}: lines wider than {WIDTH} cells: {wide}"
    # the terminal's width reached kvctl (the panels span it): a check made at another width proves nothing
    assert max(_cells(line) for line in lines) == WIDTH, f"{where}: not rendered {WIDTH} wide:\n{text}"
    found = [(n, m.group(0)) for n, line in enumerate(lines, 1) for m in ARTEFACTS.finditer(line)]
    assert not found, f"{where}: type artefacts {found}:\n{text}"
    usage = next(line for line in lines if "Usage:" in line)
    assert not USAGE_ARTEFACTS.search(usage), f"{where}: {usage.strip()!r}"
    _assert_paragraphs_flow(where, lines)


def _assert_paragraphs_flow(where: str, lines: list[str]) -> None:
    """The command's description (between the usage line and the first panel) wraps as paragraphs:
    no line ends where the next line's first word would still have fitted (a hard line break of the
    docstring kept), unless that line is an example (`kvctl ...`, `$ ...`) or a list item."""
    start = next(n for n, line in enumerate(lines) if "Usage:" in line) + 1
    end = next((n for n, line in enumerate(lines) if line.startswith("╭")), len(lines))
    text_width = WIDTH - 2  # one column of padding on each side
    block = [line.rstrip() for line in lines[start:end]]
    for line, following in zip(block, block[1:]):
        if not line.strip() or not following.strip():
            continue
        nxt = following.strip()
        if re.match(r"(kvctl |\$ |[-*•] )", nxt) or following[:3].isspace():
            continue
        first_word = nxt.split()[0]
        assert len(line.strip()) + 1 + len(first_word) > text_width, (
            f"{where}: a hard line break in a paragraph, after {line.strip()!r}")
