"""Fenced blocks of README.md and docs/*.md, and the commands of sh/console/bash blocks.

A block's id is its file and first non-blank line (trailing comment dropped, spaces collapsed), with
`#2`, `#3` ... for a repeat in the same file: stable while the text above it changes, and readable in
the table of blocks not run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC_FILES = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]
SHELL_LANGS = {"sh", "bash", "console", "shell"}
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+)(?P<lang>[\w+-]*)\s*$")


@dataclass
class Command:
    """One command of a shell block: its text (continuation lines joined) and, in a console block,
    the output lines the text shows after it."""

    text: str
    expected: list[str] = field(default_factory=list)


@dataclass
class Block:
    file: str
    line: int  # 1-based line of the opening fence
    lang: str
    text: str

    @property
    def first_line(self) -> str:
        """The first non-blank line without a trailing `  # comment`, its spaces collapsed."""
        line = next((ln for ln in self.text.splitlines() if ln.strip()), "")
        return " ".join(re.sub(r"\s+#\s.*$", "", line).split())

    def commands(self) -> list[Command]:
        """console: lines after `$ ` are commands, the lines up to the next prompt their output;
        sh/bash: every line is script (comments and blank lines dropped), `\\` continues a line."""
        out: list[Command] = []
        pending = ""
        for raw in self.text.splitlines():
            line = raw.rstrip()
            if self.lang == "console":
                if line.startswith("$ ") or (pending and line.strip()):
                    if not pending:
                        line = line[2:]
                    pending = pending + line.strip() if pending else line
                    if pending.endswith("\\"):
                        pending = pending[:-1].rstrip() + " "
                        continue
                    out.append(Command(pending))
                    pending = ""
                elif out and line.strip():
                    out[-1].expected.append(line)
                continue
            stripped = line.strip()
            if not pending and (not stripped or stripped.startswith("#")):
                continue
            pending = pending + stripped if pending else stripped
            if pending.endswith("\\"):
                pending = pending[:-1].rstrip() + " "
                continue
            out.append(Command(pending))
            pending = ""
        if pending:
            out.append(Command(pending))
        return out


def blocks(files: list[str] | None = None) -> list[Block]:
    found: list[Block] = []
    for name in files or DOC_FILES:
        lines = (REPO / name).read_text().splitlines()
        i = 0
        while i < len(lines):
            m = _FENCE.match(lines[i])
            if not m:
                i += 1
                continue
            indent, fence = len(m["indent"]), m["fence"]
            body: list[str] = []
            j = i + 1
            while j < len(lines) and lines[j].strip() != fence:
                body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
                j += 1
            found.append(Block(name, i + 1, m["lang"] or "text", "\n".join(body)))
            i = j + 1
    return found


def block_ids(found: list[Block]) -> dict[tuple[str, str], Block]:
    """(file, id) -> block; a first line that repeats in one file gets `#2`, `#3` ..."""
    ids: dict[tuple[str, str], Block] = {}
    for block in found:
        key = (block.file, block.first_line)
        n = 2
        while key in ids:
            key = (block.file, f"{block.first_line} #{n}")
            n += 1
        ids[key] = block
    return ids
