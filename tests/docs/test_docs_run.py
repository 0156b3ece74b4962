"""Every fenced block of README.md and docs/*.md runs as written, or is declared not run, with why.

Shell blocks (sh, bash, console) run command by command in one bash per block, in a working folder
of their doc file (blocks of one file run in order and see each other's files), against the
sandbox of conftest.py: vLLM doubles, a real mooncake_master, a stand-in `vllm`. Each command must
exit 0 (or as EXIT_CODES declares, or as the `echo $?` after it shows), and its output must contain
the lines the text shows after it (runner.py's rule). Python snippets run in a fresh interpreter,
after their placeholders are substituted (CALLS: how a snippet that only defines a function is
called; SNIPPET_CONTEXT: the names snippets use without defining them). The `run:` steps of the
GitHub Actions snippets run as Actions runs them ($GITHUB_ENV carried from step to step).

NOT_RUN (declared.py, with the rest of what the test declares) is the one table of what does not
run: a whole block, or one command of it. The test
fails when a block is neither run nor declared there, and when a declared entry no longer matches
a block or command (so the table shrinks as the docs change).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from .blocks import DOC_FILES, REPO, SHELL_LANGS, Block, Command, block_ids, blocks
from .conftest import Sandbox
from .declared import (CALLS, EXIT_CODES, FILE_CHECKS, FILES, NOT_RUN, OUTPUT_AS_OF, PLACEHOLDERS, SETUP,
                       SNIPPET_CONTEXT, TESTED_BELOW)
from .runner import Ran, missing_lines, run_commands


COUNTS = {"blocks run": 0, "commands run": 0, "snippets run": 0, "blocks used as files": 0, "blocks not run": 0,
          "commands not run": 0}


def substitute(text: str, values: dict[str, str]) -> str:
    for pattern, key in PLACEHOLDERS:
        value = key[1:] if key.startswith("=") else values[key]
        text = re.sub(pattern, lambda _m, v=value: v, text, flags=re.M)
    return text


def resolve(file: str, bid: str) -> tuple[str, str] | None:
    """The block a table names: by its id, or by the start of its id where only one block has it."""
    if (file, bid) in ALL:
        return (file, bid)
    found = [key for key in ALL if key[0] == file and key[1].startswith(bid)]
    return found[0] if len(found) == 1 else None


def declared(key: tuple[str, str], prefix: str = "") -> str | None:
    """NOT_RUN's reason for this block (prefix ""), or for the command of it that starts with prefix."""
    for (file, bid, pre), reason in NOT_RUN.items():
        if resolve(file, bid) == key and ((not prefix and not pre) or (prefix and pre and prefix.startswith(pre))):
            return reason
    return None


def is_actions_snippet(block: Block) -> bool:
    return block.file == "docs/ci.md" and block.lang == "yaml" and "run:" in block.text


def actions_steps(block: Block) -> list[str]:
    data = yaml.safe_load(block.text)
    steps = data["jobs"]["hard-reset"]["steps"] if isinstance(data, dict) else data
    return [step["run"] for step in steps if "run" in step]


def command_texts(block: Block) -> list[str]:
    return actions_steps(block) if is_actions_snippet(block) else [c.text for c in block.commands()]


def used_as_file(doc: str, block_id: str) -> bool:
    return any(src == (doc, block_id) for files in FILES.values() for src in files.values())


def runnable(key: tuple[str, str], block: Block) -> bool:
    return (block.lang in SHELL_LANGS or block.lang == "python" or is_actions_snippet(block)
            or used_as_file(*key) or key in FILE_CHECKS or key in TESTED_BELOW)


ALL = block_ids(blocks())


def coverage_problems() -> list[str]:
    """Blocks neither run nor declared, and NOT_RUN entries that name no block or command."""
    problems = []
    for key, block in ALL.items():
        if declared(key) is None and not runnable(key, block):
            problems.append(f"{block.file}:{block.line} [{block.lang}] {key[1]!r}: neither run nor in NOT_RUN")
    for (file, bid, prefix) in NOT_RUN:
        found = resolve(file, bid)
        block = ALL[found] if found else None
        if block is None:
            problems.append(f"NOT_RUN names no block (or more than one) of {file}: {bid!r}")
        elif prefix and not any(c.startswith(prefix) for c in command_texts(block)):
            problems.append(f"NOT_RUN names a command that {file}:{block.line} no longer has: {prefix!r}")
    for table, keys in (("SETUP", SETUP), ("CALLS", CALLS), ("FILE_CHECKS", FILE_CHECKS),
                        ("TESTED_BELOW", TESTED_BELOW)):
        problems += [f"{table} names no block of {f}: {bid!r}" for f, bid in keys if resolve(f, bid) is None]
    return problems


def test_every_block_is_run_or_declared() -> None:
    problems = coverage_problems()
    assert not problems, "\n".join(problems)


def test_the_coverage_check_fails_on_an_undeclared_block_and_a_stale_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    key = ("docs/x.md", "frobnicate --now")
    monkeypatch.setitem(ALL, key, Block("docs/x.md", 3, "yaml", "frobnicate --now"))
    monkeypatch.setitem(NOT_RUN, ("docs/gone.md", "no such block", ""), "stale")
    monkeypatch.setitem(NOT_RUN, ("README.md", "make demo", "make nothing"), "stale command")
    problems = "\n".join(coverage_problems())
    assert "docs/x.md:3 [yaml] 'frobnicate --now': neither run nor in NOT_RUN" in problems
    assert "names no block (or more than one) of docs/gone.md" in problems
    assert "no longer has: 'make nothing'" in problems


def _write_files(doc: str, box: Sandbox, cwd: Path) -> None:
    for rel, source in FILES.get(doc, {}).items():
        text = source if isinstance(source, str) else ALL[source].text + "\n"
        (cwd / rel).parent.mkdir(parents=True, exist_ok=True)
        (cwd / rel).write_text(substitute(text, box.values))


def _judge(doc: str, commands: list[Command], ran: list[Ran], box: Sandbox) -> list[str]:
    problems = []
    for i, (command, result) in enumerate(zip(commands, ran)):
        where = f"$ {command.text}"
        if result.rc is None:
            problems.append(f"{where}\n  did not run to its end (an earlier command stopped the script, or the "
                            f"timeout); output:\n{result.output[-2000:]}")
            continue
        COUNTS["commands run"] += 1
        nxt = commands[i + 1] if i + 1 < len(commands) else None
        want = _exit_wanted(doc, command, nxt, box.values)
        if result.rc != want:
            problems.append(f"{where}\n  exit {result.rc}, the text implies {want}; output:\n{result.output[-3000:]}")
        as_of = any(f == doc and command.text.startswith(substitute(p, box.values)) for f, p in OUTPUT_AS_OF)
        expected = [] if as_of else command.expected
        missing = missing_lines([substitute(line, box.values) for line in expected], result.output)
        if missing:
            problems.append(f"{where}\n  output lacks these lines of the text (first: {missing[0]!r}); "
                            f"output:\n{result.output[-3000:]}")
    return problems


def _exit_wanted(doc: str, command: Command, nxt: Command | None, values: dict[str, str]) -> int:
    if nxt is not None and nxt.text.strip() == "echo $?" and nxt.expected:
        return int(nxt.expected[0].strip())
    for (file, prefix), code in EXIT_CODES.items():
        if file == doc and command.text.startswith(substitute(prefix, values)):
            return code
    return 0


def _shell(doc: str, key: tuple[str, str], block: Block, box: Sandbox, cwd: Path) -> list[str]:
    commands = []
    for command in block.commands():
        if declared(key, command.text):
            COUNTS["commands not run"] += 1
            continue
        commands.append(Command(substitute(command.text, box.values), command.expected))
    if not commands:
        return []
    setup = [f"{substitute(c, box.values)} >/dev/null 2>&1 || echo 'setup failed: {c}'"
             for c in next((cmds for (f, bid), cmds in SETUP.items() if resolve(f, bid) == key), [])]
    if setup:
        commands[0] = Command("\n".join([*setup, commands[0].text]), commands[0].expected)
    ran = run_commands(commands, cwd, box.env)
    box.kvctl("stop", "--all")  # a block that starts a fleet and stops it not leaves it to no other block
    return [f"{doc}:{block.line}: {p}" for p in _judge(doc, commands, ran, box)]


def _actions(doc: str, block: Block, box: Sandbox, cwd: Path) -> list[str]:
    """The `run:` steps as GitHub Actions runs them: each in its own bash, `$GITHUB_ENV` read before."""
    commands = []
    for run in actions_steps(block):
        if declared((doc, block.first_line), run):
            COUNTS["commands not run"] += 1
            continue
        commands.append(Command(f'set -a; . "$GITHUB_ENV"; set +a; {substitute(run, box.values)}'))
    env = {**box.env, "GITHUB_ENV": str(cwd / "github_env")}
    (cwd / "github_env").touch()
    ran = run_commands(commands, cwd, env)
    return [f"{doc}:{block.line}: {p}" for p in _judge(doc, commands, ran, box)]


def _python(key: tuple[str, str], block: Block, box: Sandbox, cwd: Path) -> list[str]:
    body = substitute(block.text, box.values)
    call = CALLS.get(key)
    if call:
        body += f"\n{call}\n"
    if re.search(r"\bawait\b", body) and "async def" not in body:
        body = "async def __snippet():\n" + "\n".join("    " + ln for ln in body.splitlines()) + \
            "\n\nasyncio.run(__snippet())\n"
    source = SNIPPET_CONTEXT.format(**box.values) + body
    path = cwd / f"snippet_{block.line}.py"
    path.write_text(source)
    done = subprocess.run([sys.executable, str(path)], cwd=cwd, env=box.env, text=True, capture_output=True,
                          timeout=240, check=False)
    COUNTS["snippets run"] += 1
    if done.returncode != 0:
        return [f"{key[0]}:{block.line}: python snippet exit {done.returncode}:\n{done.stdout[-2000:]}"
                f"{done.stderr[-3000:]}"]
    return []


def _file_check(key: tuple[str, str], block: Block, cwd: Path, box: Sandbox) -> list[str]:
    path = cwd / FILE_CHECKS[key]
    if not path.exists():
        return [f"{key[0]}:{block.line}: {FILE_CHECKS[key]} was not written by the blocks above"]
    missing = missing_lines(block.text.splitlines(), path.read_text())
    return [f"{key[0]}:{block.line}: {FILE_CHECKS[key]} lacks {missing[0]!r}"] if missing else []


@pytest.mark.parametrize("doc", DOC_FILES)
def test_doc_runs_as_written(doc: str, sandbox: Sandbox) -> None:
    cwd = sandbox.workdir(doc)
    _write_files(doc, sandbox, cwd)
    problems: list[str] = []
    for key, block in ALL.items():
        if key[0] != doc:
            continue
        if declared(key) is not None:
            COUNTS["blocks not run"] += 1
            continue
        before = len(problems)
        if block.lang in SHELL_LANGS:
            problems += _shell(doc, key, block, sandbox, cwd)
        elif block.lang == "python":
            problems += _python(key, block, sandbox, cwd)
        elif is_actions_snippet(block):
            problems += _actions(doc, block, sandbox, cwd)
        elif key in FILE_CHECKS:
            problems += _file_check(key, block, cwd, sandbox)
        else:  # a file the blocks read (FILES) or a block tested below
            COUNTS["blocks used as files"] += used_as_file(*key)
            continue
        COUNTS["blocks run"] += len(problems) == before
    assert not problems, "\n\n".join(problems)


def test_user_template_example_writes_a_bundle_that_points_at_itself(sandbox: Sandbox) -> None:
    """docs/templates.md's template, as a user copies it: listed, shown, rendered with --out DIR;
    the kvctl.env it writes must name the mooncake.json in DIR (what vLLM reads)."""
    (key,) = TESTED_BELOW
    folder = sandbox.root / "user-templates"
    folder.mkdir(exist_ok=True)
    (folder / "my-store.yaml").write_text(ALL[key].text + "\n")
    out = sandbox.root / "my-store-out"
    for args in (["config", "list"], ["config", "show", "my-store"],
                 ["config", "render", "my-store", "--vllm-version", "0.32.0", "--out", str(out)]):
        done = sandbox.kvctl(*args, "--template-path", str(folder))
        assert done.returncode == 0, (args, done.stdout, done.stderr)
    env = (out / "kvctl.env").read_text()
    assert f"MOONCAKE_CONFIG_PATH={out / 'mooncake.json'}" in env.replace("'", "").replace('"', ""), env
    COUNTS["blocks run"] += 1
    COUNTS["commands run"] += 3


def test_no_doc_installs_a_distribution_that_does_not_exist() -> None:
    """kvctl is not on PyPI: a block that runs `pip install kvctl` (or kvctl[extra]) fails at that line."""
    text = (REPO / "pyproject.toml").read_text()
    extras = set(re.findall(r"^([a-z0-9-]+) = \[", text.split("[project.optional-dependencies]")[1].split("\n[")[0],
                            re.M))
    problems = []
    for key, block in ALL.items():
        for m in re.finditer(r"pip install\s+(?:--?\S+\s+)*['\"]?(kvctl|\.)(?:\[([\w,-]+)\])?", block.text):
            if m.group(1) == "kvctl":
                problems.append(f"{key[0]}:{block.line}: `{m.group(0)}`: no distribution kvctl on the index")
            for extra in (m.group(2) or "").split(","):
                if extra and extra not in extras:
                    problems.append(f"{key[0]}:{block.line}: extra [{extra}] is not in pyproject.toml")
    assert not problems, "\n".join(problems)


def test_the_readme_names_every_command_without_json() -> None:
    """README.md: "Every command that reports something takes --json, except ..." stays true."""
    import typer.main

    from kvctl.cli.main import app

    def walk(group: Any, path: tuple[str, ...] = ()) -> list[tuple[str, Any]]:
        if hasattr(group, "commands"):  # a group (Typer's click may be its own copy: no isinstance)
            return [pair for name, sub in group.commands.items() for pair in walk(sub, (*path, name))]
        return [(" ".join(path), group)]

    without = sorted(name for name, command in walk(typer.main.get_command(app))
                     if not any("--json" in p.opts for p in command.params))
    readme = (REPO / "README.md").read_text()
    claim = readme[readme.index("Every command that reports something takes `--json`"):][:400]
    named = sorted(n for n in without if f"`{n}`" in claim or f"`kvctl {n}`" in claim)
    assert named == without, f"commands without --json: {without}; the README's sentence names {named}"
