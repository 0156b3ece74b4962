"""Terminal output: Rich consoles, JSON, tables. Commands print only through here."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

STATUS_STYLE = {
    "works": "green", "yes": "green", "ok": "green", "hard-reset": "bold green",
    "silent-no-op": "bold yellow", "hard-reset-with-master-clear": "bold yellow", "warning": "yellow",
    "missing": "red", "no-hard-reset": "bold red", "error": "red", "unknown": "magenta",
    "not-applicable": "dim",
}


@lru_cache(maxsize=1)
def console() -> Console:
    return Console(highlight=False, soft_wrap=False)


@lru_cache(maxsize=1)
def err_console() -> Console:
    return Console(stderr=True, highlight=False)


def print_json(data: Any) -> None:
    """Machine output: plain JSON on stdout (no Rich markup or wrapping)."""
    console().file.write(json.dumps(data, indent=2, default=str) + "\n")


def print_text(text: str) -> None:
    """Raw text on stdout, byte for byte (rendered configs must stay pipeable)."""
    console().file.write(text)


def note(message: str) -> None:
    err_console().print(f"[dim]note:[/] {escape(message)}", soft_wrap=True)


def styled(value: str) -> str:
    style = STATUS_STYLE.get(value)
    return f"[{style}]{escape(value)}[/]" if style else escape(value)


class KvTable(Table):
    """A Rich table whose title is printed as its own unwrapped line (titles hold run folders)."""

    heading: str | None = None


def table(*columns: str, title: str | None = None, wrap: Iterable[str] = ()) -> KvTable:
    """A table whose cells are never wrapped or folded, except in the columns named in `wrap`
    (descriptions, details): names, URLs, paths and versions stay whole for grep and copy-paste."""
    wrapping = set(wrap)
    unknown = wrapping - set(columns)
    assert not unknown, f"wrap names no column: {unknown}"
    t = KvTable(header_style="bold")
    t.heading = title
    for col in columns:
        if col in wrapping:
            t.add_column(col, overflow="fold")
        else:
            t.add_column(col, no_wrap=True, overflow="ignore")
    return t


def _table_width(con: Console, t: Table) -> int:
    """Width to render `t` at: the terminal's (or $COLUMNS) when every unwrapped cell fits whole in
    it, else wider (the line runs past the edge rather than break a name); when piped with no
    $COLUMNS, the table's natural width, so nothing wraps at all."""
    wide = con.options.update_width(1_000_000)
    for column in t.columns:
        if column.no_wrap:  # Rich measures a cell's minimum as its longest word: make it the whole cell
            cells = [column.header, *column.cells]
            column.min_width = max(Measurement.get(con, wide, c).maximum for c in cells)
    measured = Measurement.get(con, wide, t)
    if not con.is_terminal and not os.environ.get("COLUMNS"):
        return max(measured.maximum, 1)
    return max(con.width, measured.minimum)


def show(renderable: Any, *, soft_wrap: bool = False) -> None:
    """Print markup or a table; soft_wrap=True for a line that must not be broken (a command)."""
    con = console()
    if not isinstance(renderable, Table):
        con.print(renderable, soft_wrap=soft_wrap)
        return
    heading = getattr(renderable, "heading", None)
    if heading:
        con.print(f"[bold]{escape(heading)}[/]", soft_wrap=True)
    width = _table_width(con, renderable)
    saved = con.width
    try:
        con.width = width
        con.print(renderable, crop=False)
    finally:
        con.width = saved
