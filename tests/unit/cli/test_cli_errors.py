"""One error style: click's and Typer's usage errors print as kvctl's own (`error:` / `  fix:`, exit 2),
with --json anywhere also the JSON error object on stdout; --debug after the command; help panels
from one table; help paragraphs reflowed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

from kvctl.cli import panels
from kvctl.cli.main import app
from kvctl.cli.root import command_words, hoist_debug

HELP_NAMES = ["-h", "--help"]


def _commands() -> list[tuple[list[str], object]]:
    def walk(command, path):  # type: ignore[no-untyped-def]
        yield path, command
        for name, sub in getattr(command, "commands", {}).items():
            if not sub.hidden:
                yield from walk(sub, [*path, name])

    return list(walk(typer.main.get_command(app), []))


def _bad_usage(path: list[str], command: object) -> list[str]:
    """A usage error for `command` that stops before it does anything: an unknown option, or (where
    the command hands unknown options on, as serve does to vLLM) its required argument left out."""
    if not (getattr(command, "context_settings", None) or {}).get("ignore_unknown_options"):
        return [*path, "--no-such-flag"]
    required = [p for p in command.params if p.param_type_name == "argument" and p.required]  # type: ignore[attr-defined]
    assert required, f"kvctl {' '.join(path)} takes unknown options and has no required argument: no usage error to test"
    return list(path)


def _error_lines(stderr: str) -> tuple[str, str]:
    lines = stderr.rstrip("\n").split("\n")
    assert len(lines) == 2, stderr
    assert lines[0].startswith("error: ") and lines[1].startswith("  fix: "), stderr
    return lines[0].removeprefix("error: "), lines[1].removeprefix("  fix: ")


def _assert_kvctl_style(result, path: list[str]) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert "╭" not in result.stderr and "Usage:" not in result.stderr and "Try '" not in result.stderr
    message, fix = _error_lines(result.stderr)
    assert message.startswith(" ".join(["kvctl", *path]) + ": "), message
    return message, fix


@pytest.mark.parametrize(("path", "command"), _commands(), ids=lambda v: " ".join(v) or "kvctl" if isinstance(v, list) else "")
def test_every_commands_usage_error_in_kvctls_style(cli, path: list[str], command: object) -> None:
    args = _bad_usage(path, command)
    plain = cli(*args)
    message, fix = _assert_kvctl_style(plain, path)
    assert plain.stdout == ""
    assert " ".join(["kvctl", *path, "-h"]) in fix
    as_json = cli(*args, "--json")
    assert as_json.exit_code == 2
    assert json.loads(as_json.stdout) == {"ok": False, "exit_code": 2,
                                          "error": {"message": message, "fix": fix, "exit_code": 2}}
    assert _error_lines(as_json.stderr) == (message, fix)  # stderr says the same for a person


@pytest.mark.parametrize(("args", "message", "fix"), [
    (["reset", "--conector"], "kvctl reset: no such option: --conector", "did you mean --connector?"),
    (["reset", "--url", "http://127.0.0.1:9", "--retries", "abc"],
     "kvctl reset: invalid value for '--retries': 'abc' is not a valid integer", "kvctl reset -h"),
    (["reset", "--url"], "kvctl reset: option '--url' requires an argument", "kvctl reset -h"),
    (["config", "show"], "kvctl config show: missing argument 'NAME'", "kvctl config show -h"),
    (["config", "show", "a", "b"], "kvctl config show: got unexpected extra argument", "kvctl config show -h"),
    (["weights", "update", "--url", "http://127.0.0.1:9"], "kvctl weights update: missing option '--from'",
     "kvctl weights update -h"),
    (["confg"], "kvctl: no such command 'confg'", "did you mean 'config'?"),
    (["config", "shwo"], "kvctl config: no such command 'shwo'", "did you mean 'show'?"),
    (["serve"], "kvctl serve: missing argument 'MODEL'", "kvctl serve -h"),
])
def test_usage_errors_say_what_and_how_to_fix(cli, args: list[str], message: str, fix: str) -> None:
    # --json right after the command's words (after a mistyped subcommand's too)
    words = command_words(typer.main.get_command(app), args)
    at = len(words) + (1 if "no such command" in message else 0)
    for extra in ([], ["--json"]):
        result = cli(*args[:at], *extra, *args[at:])
        assert result.exit_code == 2, result.stderr
        got_message, got_fix = _error_lines(result.stderr)
        assert got_message.startswith(message) and fix in got_fix, (got_message, got_fix)
        if extra:
            error = json.loads(result.stdout)["error"]
            assert (error["message"], error["fix"]) == (got_message, got_fix)
        else:
            assert result.stdout == ""


def test_a_json_after_double_dash_is_vllms_not_kvctls(cli) -> None:
    result = cli("serve", "--replicas", "x", "m", "--", "--json")  # vLLM's flags come after --
    _assert_kvctl_style(result, ["serve"])
    assert result.stdout == ""


def test_kvctl_alone_still_shows_its_help(cli) -> None:
    result = cli()
    assert "Usage: kvctl" in result.stdout + result.stderr and "error:" not in result.stderr


def test_the_plan_failure_is_an_error_line(cli) -> None:
    result = cli("reset", "--url", "http://127.0.0.1:9", "--retries", "0", "--timeout", "1")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: plan failed, nothing was sent: "), result.stderr
    assert "\n  fix: " in result.stderr


def _kvctl(*args: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).parent / "kvctl"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "kvctl"]
    env = {"PATH": "/usr/bin:/bin", "COLUMNS": "200", "HOME": str(Path.home())}
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120, env=env)


def test_debug_after_the_command_as_before_it() -> None:
    plain = _kvctl("config", "render", "no-such")
    assert plain.returncode == 2 and plain.stderr.startswith("error: ") and "Traceback" not in plain.stderr
    before = _kvctl("--debug", "config", "render", "no-such")
    after = _kvctl("config", "render", "no-such", "--debug")
    for result in (before, after):
        assert "Traceback" in result.stderr and "unknown template 'no-such'" in result.stderr, result.stderr
        assert result.returncode == before.returncode != 0


def test_debug_moves_in_front_but_not_from_after_double_dash() -> None:
    assert hoist_debug(["reset", "--url", "u", "--debug"]) == ["--debug", "reset", "--url", "u"]
    assert hoist_debug(["serve", "m", "--", "--debug"]) == ["serve", "m", "--", "--debug"]
    assert hoist_debug(["serve", "m", "--debug", "--", "--debug"]) == ["--debug", "serve", "m", "--", "--debug"]
    root = typer.main.get_command(app)
    assert command_words(root, ["--debug", "weights", "update", "--from", "x"]) == ["weights", "update"]
    assert command_words(root, ["rm", "config"]) == ["rm"]  # a run named like a group is a run


def test_every_option_of_a_paneled_command_has_a_panel() -> None:
    root = typer.main.get_command(app)
    missing = panels.unpaneled(root, HELP_NAMES)
    assert not missing, f"give these options a panel in kvctl/cli/panels.py PANELS: {missing}"
    names = {" ".join(path) for path, _ in _commands()}
    assert set(panels.PANELS) <= names, f"PANELS names commands that do not exist: {set(panels.PANELS) - names}"


def test_reset_help_groups_its_options(cli) -> None:
    text = cli("reset", "--help").stdout
    titles = [line.split("─ ", 1)[1].split(" ─", 1)[0] for line in text.splitlines() if line.startswith("╭─ ")]
    assert titles == ["Arguments", "Targets", "What to clear", "Verification", "Safety and timing", "Output"]
    assert "--dry-run" in text.split("Safety and timing", 1)[1].split("╰", 1)[0]


def test_reflow_joins_lines_and_keeps_marked_paragraphs() -> None:
    text = """First line
    goes on.

    Second paragraph
    wrapped in the source.

    \b
    kvctl reset rl
    kvctl status rl
    \f
    not shown"""
    assert panels.reflow(text) == ("First line goes on.\n\nSecond paragraph wrapped in the source.\n\n"
                                   "kvctl reset rl\nkvctl status rl\f\nnot shown")
