"""The docs test's own machinery: how commands and shown output are read from a block, how the
output is compared, and that the shell keeps each command's exit status (tests/docs/runner.py)."""

from __future__ import annotations

from pathlib import Path

from .blocks import Block, block_ids
from .runner import missing_lines, run_commands


def test_console_blocks_give_commands_continuations_and_their_output() -> None:
    block = Block("x.md", 1, "console", "$ kvctl reset --url A \\\n    --connector\nplan ok\n  fix: none\n$ echo $?\n0")
    commands = block.commands()
    assert [c.text for c in commands] == ["kvctl reset --url A --connector", "echo $?"]
    assert commands[0].expected == ["plan ok", "  fix: none"] and commands[1].expected == ["0"]


def test_sh_blocks_drop_comments_and_keep_inline_ones_for_the_shell() -> None:
    block = Block("x.md", 1, "sh", "#!/bin/sh\n# a comment\nkvctl runs   # every run\n\nkvctl stop \\\n  --all")
    assert [c.text for c in block.commands()] == ["kvctl runs   # every run", "kvctl stop --all"]
    assert block.first_line == "#!/bin/sh"


def test_block_ids_number_repeats() -> None:
    ids = block_ids([Block("a.md", 1, "sh", "make demo  # x"), Block("a.md", 9, "sh", "make demo")])
    assert list(ids) == [("a.md", "make demo"), ("a.md", "make demo #2")]


def test_output_lines_are_found_in_order_by_their_words() -> None:
    output = ("┏━━┓\n┃ replica  ┃ reset ┃\n│ r0 │ ok 12 ms │\nmaster 127.0.0.1:41234: keys 0\n"
              "wrapped line\ncontinued here")
    shown = ["┃ replica ┃ reset ┃", "│ r0 │ ok 3 ms │", "master 127.0.0.1:9003: keys 0"]
    assert missing_lines(shown, output) == []
    assert missing_lines(["wrapped line continued here"], output) == []
    assert missing_lines(["... keys ..."], output) == []
    assert missing_lines(["keys 0", "replica"], output) == ["replica"]  # order matters
    assert missing_lines(["keys 1"], output) == ["keys 1"]
    assert missing_lines(["master 10.0.0.5:9003: keys 0"], output) == ["master 10.0.0.5:9003: keys 0"]


def test_each_command_keeps_its_own_output_and_exit_status(tmp_path: Path) -> None:
    block = Block("x.md", 1, "console", "$ echo one; (exit 3)\n$ echo $?\n$ X=5\n$ echo $X\n$ false && echo no")
    ran = run_commands(block.commands(), tmp_path, {"PATH": "/usr/bin:/bin"})
    assert [(r.output.strip(), r.rc) for r in ran] == [("one", 3), ("3", 0), ("", 0), ("5", 0), ("", 1)]


def test_a_command_the_shell_never_reached_has_no_status(tmp_path: Path) -> None:
    block = Block("x.md", 1, "sh", "set -e\nfalse\necho after")
    ran = run_commands(block.commands(), tmp_path, {"PATH": "/usr/bin:/bin"})
    assert [r.rc for r in ran] == [0, None, None]
