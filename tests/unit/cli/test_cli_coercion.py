"""kvctl.cli.coercion: option values coerced without pydantic, to what Typer itself would give."""

from __future__ import annotations

import subprocess
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import pytest
import typer
from typer.testing import CliRunner

from kvctl.cli.coercion import install
from kvctl.cli.main import app as kvctl_app  # importing it installs the fast path

ACTIVE = install()  # False with a Typer < 0.26 (no pydantic coercion to route around)
needs_fast = pytest.mark.skipif(not ACTIVE, reason="Typer < 0.26: Typer coerces without pydantic itself")

PROBE = """
import atexit, sys
atexit.register(lambda: print("PYDANTIC=" + str("pydantic" in sys.modules)))
sys.argv = ["kvctl"] + %r
from kvctl.cli.main import run
run()
"""


@pytest.mark.parametrize(("args", "code"), [
    (["reset", "--dry-run", "--url", "http://127.0.0.1:9"], 1),  # a refused port: planning fails, parsing did not
    (["reset", "--dry-run", "--url", "http://127.0.0.1:9", "--concurrency", "8", "--timeout", "2.5"], 1),
    (["reset", "--dry-run", "--url", "http://127.0.0.1:9", "--no-pause", "--retries", "0"], 1),
    (["compat", "check", "--vllm-version", "0.23.0"], 0),  # an unset Optional[Enum] (--require) too
    (["status", "--url", "http://127.0.0.1:9", "--timeout", "1"], 1),
])
def test_plain_options_do_not_import_pydantic(args: list[str], code: int) -> None:
    proc = subprocess.run([sys.executable, "-c", PROBE % (args,)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == code, proc.stderr
    assert "invalid value" not in proc.stderr.lower()
    assert proc.stdout.strip().splitlines()[-1] == "PYDANTIC=False"


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--concurrency", "abc", "'abc' is not a valid integer."),
    ("--concurrency", "1.5", "'1.5' is not a valid integer."),
    ("--retries", "", "'' is not a valid integer."),
    ("--timeout", "x", "'x' is not a valid float."),
])
def test_bad_numbers_exit_2_with_clicks_message(cli, flag: str, value: str, message: str) -> None:
    result = cli("reset", "--url", "http://127.0.0.1:9", flag, value)
    assert result.exit_code == 2
    if ACTIVE:  # an older Typer words it its own way
        # kvctl's error style (cli/errors.report_usage_error): click's words, from a lower-case letter
        assert f"error: kvctl reset: invalid value for '{flag}': {message.rstrip('.')}" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_bad_numbers_in_a_real_process() -> None:
    kvctl = Path(sys.executable).parent / "kvctl"
    cmd = [str(kvctl)] if kvctl.exists() else [sys.executable, "-m", "kvctl"]
    for flag, value, message in (("--concurrency", "abc", "'abc' is not a valid integer"),
                                 ("--timeout", "x", "'x' is not a valid float")):
        proc = subprocess.run([*cmd, "reset", "--url", "http://127.0.0.1:9", flag, value],
                              capture_output=True, text=True, timeout=120, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
        assert proc.returncode == 2, proc.stderr
        if ACTIVE:
            assert message in proc.stderr


# ---- a tiny app: values arrive typed, fallbacks still work -------------------------------------------------

class Color(str, Enum):
    red = "red"
    blue = "blue"


got: dict[str, Any] = {}
tiny = typer.Typer()


@tiny.command()
def _tiny(
    i: Annotated[Optional[int], typer.Option("--i")] = None,
    f: Annotated[Optional[float], typer.Option("--f")] = None,
    s: Annotated[Optional[str], typer.Option("--s")] = None,
    p: Annotated[Optional[Path], typer.Option("--p")] = None,
    di: Annotated[int, typer.Option("--di")] = 3,
    df: Annotated[float, typer.Option("--df")] = 5,  # an int default still arrives as a float
    dp: Annotated[Path, typer.Option("--dp")] = Path("here"),
    ls: Annotated[Optional[list[str]], typer.Option("--ls")] = None,
    li: Annotated[Optional[list[int]], typer.Option("--li")] = None,
    pair: Annotated[Optional[tuple[int, str]], typer.Option("--pair")] = None,
    b: Annotated[Optional[bool], typer.Option("--b/--no-b")] = None,
    env_i: Annotated[Optional[int], typer.Option("--env-i", envvar="KVCTL_TEST_ENV_I")] = None,
    color: Annotated[Optional[Color], typer.Option("--color")] = None,
    lit: Annotated[Optional[Literal["a", "b"]], typer.Option("--lit")] = None,
    ranged: Annotated[Optional[int], typer.Option("--ranged", min=1, max=10)] = None,
    clamped: Annotated[Optional[float], typer.Option("--clamped", min=0, max=1, clamp=True)] = None,
    parsed: Annotated[Optional[str], typer.Option("--parsed", parser=lambda v: v.upper())] = None,
    existing: Annotated[Optional[Path], typer.Option("--existing", exists=True)] = None,
) -> None:
    got.clear()
    got.update(locals())


def _run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    got.clear()
    result = CliRunner().invoke(tiny, list(args), env={"COLUMNS": "200", **(env or {})})
    return result.exit_code, result.output


def test_unset_options_keep_their_defaults() -> None:
    assert _run()[0] == 0
    assert got == {"i": None, "f": None, "s": None, "p": None, "di": 3, "df": 5.0, "dp": Path("here"), "ls": None,
                   "li": None, "pair": None, "b": None, "env_i": None, "color": None, "lit": None, "ranged": None,
                   "clamped": None, "parsed": None, "existing": None}
    assert type(got["df"]) is float and type(got["di"]) is int


def test_plain_values_arrive_typed(tmp_path: Path) -> None:
    code, out = _run("--i", " 12 ", "--f", "2.5", "--s", "text", "--p", str(tmp_path), "--di", "1_000", "--df", "7",
                     "--dp", "rel/x", "--ls", "a", "--ls", "b", "--li", "1", "--li", "+2", "--pair", "3", "x", "--b")
    assert code == 0, out
    expected = {"i": 12, "f": 2.5, "s": "text", "p": tmp_path, "di": 1000, "df": 7.0, "dp": Path("rel/x"),
                "ls": ["a", "b"], "li": [1, 2], "pair": (3, "x"), "b": True}
    for name, value in expected.items():
        assert got[name] == value and type(got[name]) is type(value), (name, got[name])
    assert _run("--no-b")[0] == 0 and got["b"] is False
    assert _run("--i", "12.0")[0] == 0 and got["i"] == 12  # as Typer (pydantic) reads it
    assert _run("--f", "1e3")[0] == 0 and got["f"] == 1000.0
    assert _run(env={"KVCTL_TEST_ENV_I": "42"})[0] == 0 and got["env_i"] == 42


@pytest.mark.parametrize("args", [["--i", "abc"], ["--i", "1.5"], ["--f", "x"], ["--li", "1", "--li", "no"],
                                  ["--pair", "x", "y"], ["--i", "\u0663"]])
def test_bad_plain_values_are_usage_errors(args: list[str]) -> None:
    code, out = _run(*args)
    assert code == 2 and "Invalid value for" in out and "Traceback" not in out


def test_enum_literal_ranges_parsers_and_path_checks_still_work(tmp_path: Path) -> None:
    assert _run("--color", "blue")[0] == 0 and got["color"] is Color.blue
    assert _run("--lit", "b")[0] == 0 and got["lit"] == "b"
    assert _run("--ranged", "10")[0] == 0 and got["ranged"] == 10
    assert _run("--clamped", "5")[0] == 0 and got["clamped"] == 1.0
    assert _run("--parsed", "abc")[0] == 0 and got["parsed"] == "ABC"
    assert _run("--existing", str(tmp_path))[0] == 0 and got["existing"] == tmp_path
    for args, message in ((["--color", "green"], "'green' is not one of"), (["--lit", "c"], "'c' is not one of"),
                          (["--ranged", "11"], "--ranged"), (["--ranged", "0"], "--ranged"),
                          (["--existing", str(tmp_path / "none")], "does not exist")):
        code, out = _run(*args)
        assert code == 2 and message in out, (args, out)


@needs_fast
def test_plain_types_get_the_fast_path_and_the_rest_typers_own() -> None:
    command = typer.main.get_command(tiny)
    kinds = {p.name: type(p.get_runtime_param()).__name__ for p in command.params}
    typers = {"ranged", "clamped", "parsed", "existing"}
    assert {n for n, k in kinds.items() if k == "DeferredRuntimeParam"} == typers
    assert {n for n, k in kinds.items() if k == "FastRuntimeParam"} == set(kinds) - typers
    assert {"i", "f", "s", "p", "di", "df", "dp", "ls", "li", "pair", "b", "env_i", "color", "lit"} < set(kinds) - typers
    # a deferred parameter builds Typer's own runtime param only when a value needs it
    ranged = next(p for p in command.params if p.name == "ranged")
    assert ranged.get_runtime_param().coerce(None, param=ranged, ctx=None) is None
    assert not ranged.get_runtime_param()._built
    assert type(ranged.get_runtime_param().typer_runtime_param()).__name__ == "AdapterRuntimeParam"


@needs_fast
@pytest.mark.parametrize("annotation", [int, float, str, Path, list[int], list[str], list[Path], tuple[int, str],
                                        Color, Literal["a", "b"], list[Color]])
def test_same_values_as_typers_own_coercion(annotation: Any) -> None:
    from typer import core
    from typer._click.exceptions import BadParameter
    from typer._coercion import resolve_type_descriptor
    from typer.models import OptionInfo

    descriptor = resolve_type_descriptor(annotation, OptionInfo())
    ours = core.build_runtime_param(descriptor)
    typers = core.build_runtime_param.__wrapped__(descriptor)  # pydantic
    assert type(ours).__name__ == "FastRuntimeParam"
    texts = ["12", " 12 ", "+12", "-0", "1_000", "12.0", "12.00", "12.", "1.5", "1e3", "0x10", "", "abc", "\u0663",
             "00012", "1__0", "9" * 40, "inf", "-Infinity", "nan", ".5", "5.", "1_e3", " 1_0", "_1", "1e400", "a b",
             "\u00e9", "~/x", "-", "/", "\x1b[31m"]
    values: list[Any] = [*texts, 7, 7.0, True, Path("p")]
    if annotation is tuple[int, str]:
        values = [(t, t) for t in texts] + [(1, "a"), ("1", 2)]
    elif getattr(annotation, "__origin__", None) is list:
        values = [tuple(texts[i:i + 3]) for i in range(0, len(texts), 3)] + [(), ["1", "2"], ("red", "blue")]
    if annotation in (Color, Literal["a", "b"]):
        values += ["red", "blue", "RED", " red", "a", "b", "A", "c", Color.red]

    def outcome(runtime_param: Any, value: Any) -> Any:
        try:
            result = runtime_param._coerce_value(value, param=None, ctx=None)
        except BadParameter:
            return "error"
        return type(result), repr(result)

    for value in values:
        assert outcome(ours, value) == outcome(typers, value), value


def test_install_twice_is_harmless() -> None:
    from typer import core

    before = core.build_runtime_param
    assert install() == ACTIVE and install() == ACTIVE
    assert core.build_runtime_param is before
    if ACTIVE:
        assert not getattr(core.build_runtime_param.__wrapped__, "_kvctl_fast_coercion", False)  # wrapped once
    assert _run("--i", "5")[0] == 0 and got["i"] == 5


def test_without_typers_internals_install_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer import core

    monkeypatch.delattr(typer, "_coercion", raising=False)  # a Typer < 0.26 has no such module
    monkeypatch.setitem(sys.modules, "typer._coercion", None)
    assert install() is False
    monkeypatch.undo()
    monkeypatch.delattr(core, "build_runtime_param", raising=False)
    assert install() is False


@needs_fast
def test_every_kvctl_option_is_coerced_without_pydantic() -> None:
    """A new option of another type would bring pydantic back into that command's start-up: decide it here."""
    deferred = set()

    def walk(command: Any, path: str) -> None:
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}")
        for param in command.params:
            if hasattr(param, "get_runtime_param") and type(param.get_runtime_param()).__name__ != "FastRuntimeParam":
                deferred.add(f"{path} {param.name}")

    walk(typer.main.get_command(kvctl_app), "kvctl")
    assert deferred == set()
