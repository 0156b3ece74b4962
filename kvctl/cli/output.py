"""Terminal output: Rich consoles, JSON, tables. Commands print only through here."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from rich.console import Console
from rich.markup import escape
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


def table(*columns: str, title: str | None = None) -> Table:
    t = Table(title=title, title_justify="left", header_style="bold")
    for col in columns:
        t.add_column(col, overflow="fold")
    return t


def show(renderable: Any) -> None:
    console().print(renderable)
