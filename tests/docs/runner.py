"""Running a doc block's commands in one shell, and judging their output against the text's.

The output rule (what "the command's output contains the lines the text shows" means here):
- every line the text shows after a command must be found in that command's output (stdout and
  stderr together), in the order shown, each after the previous one;
- box-drawing characters are dropped and runs of whitespace are one space, on both sides: tables
  and wrapped prose compare by their words, at any terminal width and in plain or boxed output;
- `...` matches any text (within a line; a line of only `...` stands for any lines);
- VOLATILE: values that differ on every run (durations, pids, the port of a loopback address, core
  counts) match any value of their kind.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .blocks import Command

BOX = re.compile(r"[\u2500-\u257f]")
VOLATILE = [
    (re.compile(r"\b\d+(?:\\\.\d+)?\\ (ms|s)\b"), r"[\\d.]+ \1"),  # 10 ms, 32.11 s
    (re.compile(r"pid\\ \d+"), r"pid \\d+"),
    (re.compile(r"127\\\.0\\\.0\\\.1:\d+"), r"127\\.0\\.0\\.1:\\d+"),
    (re.compile(r"\b\d+\\ (CPU\\\(s\\\)|core\\\(s\\\))"), r"\\d+ \1"),
    (re.compile(r"cores\\ \d+"), r"cores \\d+"),
]
MARK = "@@DOCS-TEST"


def flatten(text: str) -> str:
    return " ".join(BOX.sub(" ", text).split())


def line_pattern(line: str) -> str:
    pattern = ".*?".join(re.escape(part) for part in flatten(line).split("..."))
    for volatile, replacement in VOLATILE:
        pattern = volatile.sub(replacement, pattern)
    return pattern


def missing_lines(expected: list[str], output: str) -> list[str]:
    """The shown lines not found in `output` in order (empty: the output says what the text says)."""
    flat, at, missing = flatten(output), 0, []
    for line in expected:
        if not flatten(line).replace("...", "").strip():
            continue
        found = re.compile(line_pattern(line)).search(flat, at)
        if found is None:
            missing.append(line)
        else:
            at = found.end()
    return missing


@dataclass
class Ran:
    command: str
    output: str
    rc: int | None  # None: the shell never got to it (`set -e` ended the script, or the timeout)


def run_commands(commands: list[Command], cwd: Path, env: dict[str, str], timeout: float = 240) -> list[Ran]:
    """All commands in ONE bash (variables, `cd`, `set -e` carry over as in a terminal), each one's
    output and exit status told apart by markers; `$?` after a command is that command's status."""
    script = ["__rc=0"]
    for i, command in enumerate(commands):
        # the marker's printf must not be the `$?` an `echo $?` after a command reads
        script.append(f"__prev=$?; printf '\\n{MARK} start {i}\\n'; (exit $__prev)")
        script.append(command.text)
        script.append(f"__rc=$?; printf '\\n{MARK} end {i} %d\\n' $__rc; (exit $__rc)")
    try:
        done = subprocess.run(["bash", "-c", "\n".join(script)], cwd=cwd, env=env, text=True,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout, check=False)
        text = done.stdout
    except subprocess.TimeoutExpired as exc:
        raw = exc.stdout or b""
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    return _split(commands, text)


def _split(commands: list[Command], text: str) -> list[Ran]:
    out = []
    for i, command in enumerate(commands):
        start = text.find(f"{MARK} start {i}\n")
        if start < 0:
            out.append(Ran(command.text, "", None))
            continue
        body = text[start + len(f"{MARK} start {i}\n"):]
        end = re.search(rf"\n?{MARK} end {i} (\d+)\n", body)
        if end is None:
            out.append(Ran(command.text, body.split(f"{MARK} start", 1)[0], None))
        else:
            out.append(Ran(command.text, body[:end.start()], int(end.group(1))))
    return out
