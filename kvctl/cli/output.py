"""Terminal output: Rich consoles, JSON, tables. Commands print only through here.

Tables print in one of four formats (-o, kvctl.cli.options.OutputOpt): `table` (Rich boxes, what a
terminal gets), `plain` (aligned columns without box drawing, a header row unless --no-headers: what a
pipe gets, as `docker ps` and `kubectl get` print), `wide` (every column, also those a table leaves
out to fit 80 columns) and `json` (the same as --json).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

FORMATS = ("table", "plain", "wide", "json")
PLAIN_GAP = "   "  # between plain columns, as docker and kubectl space theirs (awk -F '  +' splits them)

STATUS_STYLE = {
    "works": "green", "yes": "green", "ok": "green", "hard-reset": "bold green",
    "silent-no-op": "bold yellow", "hard-reset-with-master-clear": "bold yellow", "warning": "yellow",
    "missing": "red", "no-hard-reset": "bold red", "error": "red", "unknown": "magenta",
    "not-applicable": "dim",
}


@dataclass
class _Format:
    name: str | None = None  # None: chosen by where stdout goes (a terminal: table, else plain)
    headers: bool = True


_FORMAT = _Format()


def use_format(name: str | None, headers: bool = True) -> None:
    """The format of the tables the running command prints (its -o and --no-headers)."""
    assert name is None or name in FORMATS, name
    _FORMAT.name, _FORMAT.headers = name, headers


def wide() -> bool:
    """-o wide: every column, also those left out to fit 80 columns."""
    return _FORMAT.name == "wide"


def piped() -> bool:
    """stdout is no terminal and no $COLUMNS says how wide to be: a pipe, a file, a script."""
    return not console().is_terminal and not os.environ.get("COLUMNS")


def plain() -> bool:
    """Tables print as plain columns: -o plain, or piped unless -o table asks for boxes."""
    return _FORMAT.name == "plain" or (_FORMAT.name in (None, "wide") and piped())


@lru_cache(maxsize=1)
def console() -> Console:
    return Console(highlight=False, soft_wrap=False)


@lru_cache(maxsize=1)
def err_console() -> Console:
    return Console(stderr=True, highlight=False)


def print_json(data: Any) -> None:
    """Machine output: plain JSON on stdout (no Rich markup or wrapping)."""
    _write(json.dumps(data, indent=2, default=str) + "\n")


def print_json_line(data: Any) -> None:
    """One JSON object on one line (a stream of them: status --watch --json)."""
    _write(json.dumps(data, default=str) + "\n")


def redraw(heading: str, draw: Any) -> None:
    """One frame of a --watch: a terminal is cleared and `draw()` prints from the top under `heading`;
    piped, the frames follow each other, each after its heading line (a timestamp to split them on)."""
    con = console()
    if piped() or not con.is_terminal:
        show(f"[bold]{escape(heading)}[/]", soft_wrap=True)
        draw()
        return
    with con.capture() as frame:  # drawn off screen first: the clear and the new frame come together
        con.print(f"[bold]{escape(heading)}[/]", soft_wrap=True)
        draw()
    con.clear()
    with _reader_gone():
        con.file.write(frame.get())
        con.file.flush()


def per_value(label: str, values: Iterable[tuple[str, str]]) -> None:
    """A column a table leaves out to fit 80 columns, as lines under it: 'LABEL VALUE (every replica)'
    when all replicas agree, else a line per value naming the replicas. `values`: (replica, value)."""
    groups: dict[str, list[str]] = {}
    for name, value in values:
        groups.setdefault(value, []).append(name)
    for value, names in groups.items():
        which = "every replica" if len(groups) == 1 and len(names) > 1 else ", ".join(names)
        show(f"{escape(label)} {escape(value)} [dim]({escape(which)})[/]", soft_wrap=True)


def print_text(text: str) -> None:
    """Raw text on stdout, byte for byte (rendered configs must stay pipeable)."""
    _write(text)


def _write(text: str) -> None:
    with _reader_gone():
        console().file.write(text)
        console().file.flush()


@contextmanager
def _reader_gone() -> Iterator[None]:
    """`kvctl ... | head` closes the pipe early: stop quietly with exit 1, as Rich's own prints and click
    do, not with an internal error; later writes (Python's own flush at exit) go to /dev/null."""
    try:
        yield
    except BrokenPipeError:
        import typer

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, console().file.fileno())
        raise typer.Exit(1) from None


def note(message: str) -> None:
    err_console().print(f"[dim]note:[/] {escape(message)}", soft_wrap=True)


def styled(value: str) -> str:
    style = STATUS_STYLE.get(value)
    return f"[{style}]{escape(value)}[/]" if style else escape(value)


class KvTable(Table):
    """A Rich table whose title is printed as its own unwrapped line (titles hold run folders), and
    whose `wide_only` columns are printed with -o wide only."""

    heading: str | None = None
    wide_only: frozenset[str] = frozenset()


def table(*columns: str, title: str | None = None, wrap: Iterable[str] = (), wide_only: Iterable[str] = (),
          borders: bool = True) -> KvTable:
    """A table whose cells are never wrapped or folded, except in the columns named in `wrap`
    (descriptions, details): names, URLs, paths and versions stay whole for grep and copy-paste.
    `wide_only`: columns left out (to fit 80 columns) unless -o wide; borders=False: no box lines."""
    wrapping, hidden = set(wrap), frozenset(wide_only)
    unknown = (wrapping | hidden) - set(columns)
    assert not unknown, f"wrap/wide_only names no column: {unknown}"
    t = KvTable(header_style="bold", **({} if borders else {"box": None, "pad_edge": False}))
    t.heading, t.wide_only = title, hidden
    for col in columns:
        if col in wrapping:
            t.add_column(col, overflow="fold")
        else:
            t.add_column(col, no_wrap=True, overflow="ignore")
    return t


def _narrowed(t: KvTable) -> KvTable:
    """`t` without its wide-only columns (a copy: the caller's table is left as it was)."""
    keep = [c for c in t.columns if str(c.header) not in t.wide_only]
    narrow = KvTable(header_style=t.header_style, box=t.box, pad_edge=t.pad_edge)
    narrow.heading = t.heading
    for c in keep:
        narrow.add_column(c.header, no_wrap=c.no_wrap, overflow=c.overflow)
    for row in zip(*(list(c.cells) for c in keep)):
        narrow.add_row(*row)
    return narrow


def plain_lines(t: Table, headers: bool = True) -> list[str]:
    """The table as aligned plain columns: no markup, no box drawing, one line per row (a cell's
    lines joined by '; '), '-' for an empty cell so that every row has as many fields."""
    def text(cell: Any) -> str:
        flat = cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell)).plain
        return "; ".join(part.strip() for part in flat.splitlines() if part.strip()) or "-"

    rows = [[text(c) for c in column.cells] for column in t.columns]
    grid = [list(r) for r in zip(*rows)]
    if headers:
        grid.insert(0, [text(c.header).upper() for c in t.columns])
    if not grid:
        return []
    widths = [max(cell_len(row[i]) for row in grid) for i in range(len(t.columns))]
    return [PLAIN_GAP.join(cell + " " * (w - cell_len(cell)) for cell, w in zip(row, widths)).rstrip()
            for row in grid]


def _table_width(con: Console, t: Table) -> int:
    """Width to render `t` at: the terminal's (or $COLUMNS) when every unwrapped cell fits whole in
    it, else wider (the line runs past the edge rather than break a name); when piped with no
    $COLUMNS, the table's natural width, so nothing wraps at all. (-o wide adds columns, and so may
    need more than the terminal's width: only as much more as its unwrapped cells need.)"""
    unbounded = con.options.update_width(1_000_000)
    for column in t.columns:
        if column.no_wrap:  # Rich measures a cell's minimum as its longest word: make it the whole cell
            cells = [column.header, *column.cells]
            column.min_width = max(Measurement.get(con, unbounded, c).maximum for c in cells)
    measured = Measurement.get(con, unbounded, t)
    if piped():
        return max(measured.maximum, 1)
    return max(con.width, measured.minimum)


def show(renderable: Any, *, soft_wrap: bool = False) -> None:
    """Print markup or a table; soft_wrap=True for a line that must not be broken (a command).
    Piped, no line is wrapped (a path or a word broken across lines defeats grep)."""
    con = console()
    with _reader_gone():
        _show(con, renderable, soft_wrap)


def _show(con: Console, renderable: Any, soft_wrap: bool) -> None:
    if not isinstance(renderable, Table):
        con.print(renderable, soft_wrap=soft_wrap or piped())
        return
    if isinstance(renderable, KvTable) and renderable.wide_only and not wide():
        renderable = _narrowed(renderable)
    if plain():  # no title line: the header row comes first (or the first row, with --no-headers)
        for line in plain_lines(renderable, _FORMAT.headers):  # through Rich: a --watch frame captures it
            con.print(line, markup=False, emoji=False, highlight=False, soft_wrap=True)
        return
    renderable.show_header = _FORMAT.headers
    heading = getattr(renderable, "heading", None)
    if heading and _FORMAT.headers:
        con.print(f"[bold]{escape(heading)}[/]", soft_wrap=True)
    width = _table_width(con, renderable)
    saved = con.width
    try:
        con.width = width
        con.print(renderable, crop=False)
    finally:
        con.width = saved
