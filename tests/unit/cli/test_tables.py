"""Tables never break a name: template names, URLs, paths and run names stay whole at any terminal
width and when piped; only description-like columns wrap (issue 14).

The terminal cases run kvctl in a real pseudo-terminal of the given size (Rich sizes itself from
the tty, as in a user's shell); the piped cases read a pipe, as `kvctl config list | grep` does.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios

import pytest

from kvctl.config.templates import load_all

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
BOX = re.compile("[\u2500-\u257f]")  # Rich's box-drawing characters
NAMES = [t.name for t in load_all(None)]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR", "TERM")}
    env.update(TERM="xterm-256color", **extra)
    return env


def run_in_tty(args: list[str], columns: int, module: bool = True, keep_ansi: bool = False,
               exit_codes: tuple[int, ...] = (0,)) -> str:
    """Run `python -m kvctl ARGS` (module=False: `python ARGS`) on a pty of `columns` x 40; return what
    it printed (no colours, unless keep_ansi)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    proc = subprocess.Popen([sys.executable, *(["-m", "kvctl"] if module else []), *args], stdin=follower, stdout=follower,
                            stderr=follower, env=_env(), close_fds=True)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the tty
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    assert proc.wait(timeout=60) in exit_codes
    text = b"".join(chunks).decode("utf-8").replace("\r\n", "\n")
    return text if keep_ansi else ANSI.sub("", text)


def run_piped(args: list[str], **env: str) -> str:
    out = subprocess.run([sys.executable, "-m", "kvctl", *args], capture_output=True, text=True,
                         env=_env(**env), timeout=60, check=True)
    return out.stdout


def first_cells(text: str) -> list[str]:
    """The first column of every table body line (box-drawing rows)."""
    cells = []
    for line in text.splitlines():
        if line.startswith("│"):
            cells.append(line.split("│")[1].strip())
    return cells


@pytest.mark.parametrize("columns", [60, 80])
def test_config_list_keeps_template_names_whole_in_a_narrow_terminal(columns: int) -> None:
    out = run_in_tty(["config", "list"], columns)
    names = [c for c in first_cells(out) if c]
    assert names == NAMES, out  # each name whole, on one line, nothing folded onto the next
    assert any(re.match(r"│ mooncake-store-standalone +│", line) for line in out.splitlines())
    # descriptions did wrap (the table is not simply printed at full width)
    assert len(first_cells(out)) > len(NAMES)


def test_config_list_wide_terminal_uses_its_width_and_wraps_descriptions_only() -> None:
    out = run_in_tty(["config", "list"], 120)
    widths = {len(line) for line in out.splitlines() if line.startswith(("┏", "│", "└"))}
    assert widths and max(widths) <= 120
    assert [c for c in first_cells(out) if c] == NAMES


def test_config_list_piped_is_plain_columns_one_line_per_template_and_greppable() -> None:
    out = run_piped(["config", "list"])
    assert not BOX.search(out), out  # no box drawing when piped (issue 28), as docker ps / kubectl get
    header, *rows = out.splitlines()
    assert header.split() == ["TEMPLATE", "VLLM", "DESCRIPTION"]
    assert [r.split()[0] for r in rows] == NAMES  # nothing wraps when piped
    line = next(r for r in rows if "standalone" in r)
    assert "mooncake-store-standalone" in line and "standalone-store mode" in line


@pytest.mark.parametrize("columns", ["60", "80"])
def test_piped_with_columns_set_wraps_descriptions_never_names(columns: str) -> None:
    out = run_piped(["config", "list"], COLUMNS=columns)
    assert [c for c in first_cells(out) if c] == NAMES
    assert len(first_cells(out)) > len(NAMES)


@pytest.mark.parametrize("columns", [60, 80])
def test_parameter_table_keeps_names_and_defaults_whole(columns: int) -> None:
    out = run_in_tty(["config", "show", "mooncake-store"], columns)
    piped = run_piped(["config", "show", "mooncake-store", "--no-headers"]).splitlines()
    params = [r.split()[0] for r in piped[3:] if r and not r.startswith(("note:", "render it:", "  FORMAT:"))]
    assert "global_segment_size" in params, piped
    assert [c for c in first_cells(out) if c] == params
