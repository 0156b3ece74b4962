"""Every way JSON is asked for gets JSON (issue 39, finding 10): `--json`, `-o json`, `--output json`,
`--output=json`, `-ojson` (any case, also after other short flags) for usage errors, refused
commands, internal errors and a signal that ends a command; stdout always holds one JSON object."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
import typer.main

from kvctl.cli.main import app

SPELLINGS = [["--json"], ["-o", "json"], ["--output", "json"], ["--output=json"], ["-ojson"], ["-o", "JSON"],
             ["--output", "Json"]]


def _commands_with_output() -> list[list[str]]:
    def walk(command, path):  # type: ignore[no-untyped-def]
        if any("--output" in getattr(p, "opts", []) for p in getattr(command, "params", [])):
            yield path
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, [*path, name])

    return list(walk(typer.main.get_command(app), []))


@pytest.mark.parametrize("spelling", SPELLINGS, ids=" ".join)
@pytest.mark.parametrize("path", _commands_with_output(), ids=" ".join)
def test_every_spelling_of_json_gets_a_json_usage_error(cli, path: list[str], spelling: list[str]) -> None:
    if path == ["serve"]:
        result = cli(*path, *spelling)  # its required MODEL left out (serve hands unknown options to vLLM)
    else:
        result = cli(*path, *spelling, "--no-such-flag")
    assert result.exit_code == 2, (result.stdout, result.stderr)
    error = json.loads(result.stdout)
    assert error["ok"] is False and error["exit_code"] == 2 and error["error"]["message"].startswith("kvctl ")
    assert "error: " in result.stderr


def test_the_table_formats_keep_stdout_empty(cli) -> None:
    for spelling in (["-o", "table"], ["--output=plain"], ["-owide"]):
        result = cli("status", *spelling, "--no-such-flag")
        assert result.exit_code == 2 and result.stdout == "", spelling


@pytest.mark.parametrize(("args", "asked"), [
    (["runs", "-qo", "json"], True), (["runs", "-qojson"], True), (["status", "-wojson"], True),
    (["status", "-o", "table"], False), (["status", "--output"], False), (["status", "-o"], False),
    (["serve", "m", "--", "-o", "json"], False), (["serve", "m", "--", "--json"], False),
    (["logs", "-n", "-o", "x"], False),  # -n takes a value: that -o is its value's neighbour, not a cluster
])
def test_json_asked_reads_clusters_and_stops_at_double_dash(args: list[str], asked: bool) -> None:
    from kvctl.cli.root import json_asked

    assert json_asked(args) is asked


@pytest.mark.parametrize("spelling", [["--json"], ["-o", "json"]], ids=" ".join)
def test_an_internal_error_under_json_is_a_json_error_without_traceback(cli, monkeypatch, spelling) -> None:
    import kvctl.targets

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("boom\nTraceback (most recent call last)")

    monkeypatch.setattr(kvctl.targets, "resolve_targets", broken)
    result = cli("status", "--url", "http://127.0.0.1:9", *spelling)
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["ok"] is False and data["exit_code"] == 1
    assert data["error"]["message"].startswith("internal error: RuntimeError: boom")
    assert "--debug" in data["error"]["fix"]
    assert "Traceback" not in result.stdout.replace("Traceback (most recent call last)", "", 1)
    assert "error: internal error" in result.stderr


def _interrupted(args: list[str], name: str, ready) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    proc = subprocess.Popen([sys.executable, "-m", "kvctl", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 30
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ready(), "the command never reached the replica"
        proc.send_signal(getattr(signal, name))
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, err


@pytest.mark.parametrize(("command", "path", "spelling", "name"), [
    (["status"], "/health", ["--json"], "SIGTERM"),
    (["status"], "/health", ["-o", "json"], "SIGINT"),
    (["status", "--watch"], "/health", ["--json"], "SIGTERM"),  # Ctrl-C ends a watch with 0; SIGTERM does not
    (["weights", "show"], "/weight_info", ["--json"], "SIGINT"),
    (["weights", "show"], "/weight_info", ["--output=json"], "SIGTERM"),
    (["weights", "show"], "/weight_info", ["-ojson"], "SIGHUP"),
])
def test_a_signal_ends_a_json_command_with_a_json_object(command, path, spelling, name) -> None:  # type: ignore[no-untyped-def]
    from tests.doubles import DoubleFleet, Faults, VllmDouble

    replica = VllmDouble("0.32.0", faults=Faults(delay={path: 30}))
    with DoubleFleet() as fleet:
        url = fleet.add(replica)
        code, out, err = _interrupted([*command, "--url", url, *spelling, "--timeout", "60"], name,
                                      lambda: replica.calls_to(path))
    assert code == 128 + int(getattr(signal, name)), (out, err)
    data = json.loads(out)
    assert data["ok"] is False and data["interrupted"] == name and data["exit_code"] == code
    assert f"interrupted by {name}" in data["summary"]


def test_a_keyboard_interrupt_that_names_its_signal_exits_with_its_code(capsys) -> None:
    """kvctl.interrupt raises KeyboardInterrupt("SIGTERM") where a command runs: JSON and exit 143 name it."""
    import typer

    from kvctl.cli.errors import exit_interrupted

    with pytest.raises(typer.Exit) as ended:
        exit_interrupted(KeyboardInterrupt("SIGTERM"), True, "x")
    assert ended.value.exit_code == 143 and json.loads(capsys.readouterr().out)["interrupted"] == "SIGTERM"


def test_with_debug_json_still_gets_its_error_object_and_the_traceback_stays_off_stdout(monkeypatch) -> None:
    """--debug re-raises for the traceback (on stderr); a script that asked for JSON still reads one."""
    from typer.testing import CliRunner

    import kvctl.targets

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("boom")

    monkeypatch.setattr(kvctl.targets, "resolve_targets", broken)
    monkeypatch.setenv("KVCTL_DEBUG", "0")  # restored (removed) after the test: --debug sets it for the process
    result = CliRunner().invoke(app, ["status", "--url", "http://127.0.0.1:9", "-o", "json", "--debug"])
    assert isinstance(result.exception, RuntimeError)  # raised on: Python prints its traceback on stderr
    data = json.loads(result.stdout)
    assert data["error"]["message"] == "internal error: RuntimeError: boom" and "Traceback" not in result.stdout
