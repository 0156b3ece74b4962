"""A Python caller is told keywords, not flags (issue 28): every message is written once in the CLI's
words and the API renders it through one table (kvctl.api.words.FLAGS), which must match the CLI.
Checked three ways: the table against the CLI's declared options; every message literal of the modules
the API runs, rendered; real errors and receipts through kvctl.hard_reset/probe/update_weights (and
the same errors through the CLI, which keeps its flags)."""

from __future__ import annotations

import ast
import inspect
import re
import typing
from pathlib import Path

import pytest
import typer

import kvctl
from kvctl.cli.probe import probe as cli_probe
from kvctl.cli.reset import reset as cli_reset
from kvctl.cli.salt import check as cli_salt_check
from kvctl.cli.weights import update as cli_weights_update
from kvctl.api.words import _COMMAND, FLAGS, for_python
from kvctl.errors import KvctlError, UsageError
from tests.doubles import DoubleFleet, SharedStore, VllmDouble

REPO = Path(__file__).resolve().parents[2]
# the API names of the CLI's parameters, where they differ (tests/unit/reset/test_api_parity.py)
RENAMED = {"url": "urls", "no_mm": "mm", "no_encoder": "encoder"}
CLI_ONLY = {"--json": "an output format: the API returns the receipt", "--output": "the same", "-o": "the same",
            "--no-headers": "a table's format"}
# flags messages name that are not kvctl's, so no keyword stands for them
FOREIGN = {
    "--enable-prompt-tokens-details": "vLLM's (start the server with it)",
    "--enable-prefix-caching": "vLLM's (the same)",
    "--no-checksums": "kvctl weights show's, which has no API twin",
    "--rpc_port": "mooncake_master's", "--metrics_port": "mooncake_master's",
    "--head": "ray start's", "--filter": "ray list actors'",
    "--serve": "kvctl's own store-client helper process (argv)", "--regex": "the same helper's argv",
    "--force": "the helper's argv, and kvctl rm's in a command built in pieces",
}
# the modules whose messages reach Python callers (kvctl.api and what it runs)
MODULES = ["kvctl/api/__init__.py", "kvctl/targets.py", "kvctl/serve/runs.py", "kvctl/serve/ray_fleet.py",
           "kvctl/facts/cache_prefix.py", "kvctl/reset/*.py", "kvctl/weights/*.py", "kvctl/transport/*.py"]
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9_-]*")


def _options(command: object) -> dict[str, tuple[str, str]]:
    """flag -> (parameter name, kind) as the command's own signature declares its options (Typer's
    OptionInfo: the same whichever click Typer bundles)."""
    hints = typing.get_type_hints(inspect.unwrap(command), include_extras=True)  # type: ignore[arg-type]
    found = {}
    for name, hint in hints.items():
        info = next((m for m in getattr(hint, "__metadata__", ()) if isinstance(m, typer.models.OptionInfo)), None)
        if info is None:
            continue
        kind = _kind(typing.get_args(hint)[0])
        # typer.Option("--run", ...) in Annotated: the first declaration arrives as the default
        first = [info.default] if isinstance(info.default, str) and info.default.startswith("-") else []
        for decl in [*first, *info.param_decls]:
            on, _, off = decl.partition("/")
            found[on] = (name, kind)
            if off:
                found[off] = (name, "false")
    return found


def _kind(annotation: object) -> str:
    inner = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    base = typing.get_origin(inner[0]) or inner[0]
    return {bool: "true", list: "list", int: "num", float: "num"}.get(base, "str")  # type: ignore[call-overload]


def test_the_table_is_the_clis_options() -> None:
    """Each option of reset, probe, weights update and salt check is in FLAGS as its API keyword, of its kind; and
    FLAGS holds nothing else (a flag renamed in the CLI fails here until the table follows)."""
    declared: dict[str, tuple[str, str]] = {}
    for command in (cli_reset, cli_probe, cli_weights_update, cli_salt_check):
        for flag, (name, kind) in _options(command).items():
            if flag in CLI_ONLY:
                continue
            kind = "false" if flag.startswith("--no-") and kind == "true" else kind
            declared[flag] = (RENAMED.get(name, name), kind)
    assert len(declared) > 25
    # the CLI reads a FILE of prompts where the API takes the list
    table = {flag: (keyword, "str" if kind == "prompts" else kind) for flag, (keyword, kind) in FLAGS.items()}
    assert {f: table.get(f) for f in declared} == declared
    assert set(FLAGS) - set(declared) == set(), "flags no command of the API's declares"
    for keyword, _ in FLAGS.values():  # and each keyword is one the API takes
        assert any(keyword in _api_keywords(name) for name in ("hard_reset_async", "probe_async",
                                                                "update_weights_async",
                                                                "check_salt_isolation_async")), keyword


def _api_keywords(name: str) -> set[str]:
    return set(inspect.signature(getattr(kvctl, name)).parameters)


def _messages(path: Path) -> list[str]:
    """Every string literal of a module but its docstrings; an f-string with X for each value."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    inside = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    found = []
    for n in ast.walk(tree):
        if isinstance(n, ast.JoinedStr):
            found.append("".join(v.value if isinstance(v, ast.Constant) else "X" for v in n.values))
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs | inside:
            found.append(n.value)
    return [text for text in found if "--" in text or " in Python" in text]


def _outside_commands(text: str) -> list[str]:
    """The flags `text` names outside a suggested `kvctl ...` command (its clause)."""
    left = []
    for m in FLAG.finditer(text):
        clause = re.split(r"[;()]|, |: ", text[:m.start()])[-1]
        if not _COMMAND.search(clause):
            left.append(m.group(0))
    return left


def test_every_message_the_api_can_raise_renders_with_keywords() -> None:
    files = sorted({p for pattern in MODULES for p in REPO.glob(pattern)})
    assert len(files) > 20
    unrendered: dict[str, list[str]] = {}
    for path in files:
        for text in _messages(path):
            rendered = for_python(text)
            for flag in _outside_commands(rendered):
                if flag not in FOREIGN:
                    unrendered.setdefault(flag, []).append(f"{path.relative_to(REPO)}: {text[:90]!r}")
            assert " in Python" not in rendered, (path, text)
    assert not unrendered, unrendered  # a flag with no keyword: add it to FLAGS (or FOREIGN, with why)


@pytest.mark.parametrize(("text", "python"), [
    ("pass --master HOST:PORT (the master's admin/metrics port) or put master: in the inventory",
     'pass master="HOST:PORT" (the master\'s admin/metrics port) or put master: in the inventory'),
    ("pass --run NAME, --url URL (repeatable), --inventory FILE, or set KVCTL_URLS",
     'pass run="NAME", urls=["URL", ...], inventory="FILE", or set KVCTL_URLS'),
    ("--ray needs --run NAME", 'ray needs run="NAME"'),
    ("the runs on that cluster: kvctl runs --ray 10.0.0.1:6379", "the runs on that cluster: kvctl runs --ray 10.0.0.1:6379"),
    ("kvctl stop --run a first, or pass --whole-master", "kvctl stop --run a first, or pass whole_master=True"),
    ("e.g. --reload-timeout=600, --version=step-2", 'e.g. reload_timeout=600, version="step-2"'),
    ("use --no-mm (mm=False) or --pause", "use mm=False or pause=True"),
    ("--inventory /a.yaml: cannot read", "inventory /a.yaml: cannot read"),
    ("give 9003 (master= in Python: the admin port)", "give 9003 (the admin port)"),
    ("start vLLM with --enable-prompt-tokens-details", "start vLLM with --enable-prompt-tokens-details"),
])
def test_rendering(text: str, python: str) -> None:
    assert for_python(text) == python


def _check(exc_or_texts: KvctlError | list[str | None], *keywords: str) -> None:
    texts = [exc_or_texts.message, exc_or_texts.hint] if isinstance(exc_or_texts, KvctlError) else exc_or_texts
    joined = " | ".join(t for t in texts if t)
    assert not _outside_commands(joined), joined
    for keyword in keywords:
        assert keyword in joined, (keyword, joined)


@pytest.fixture
def no_ambient(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in ("KVCTL_URLS", "KVCTL_MASTER", "KVCTL_MASTER_RPC"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KVCTL_STATE_DIR", str(tmp_path / "state"))
    return tmp_path


URL = "http://127.0.0.1:9"


def _weights(tmp_path: Path) -> Path:
    folder = tmp_path / "step-2"
    folder.mkdir(exist_ok=True)
    (folder / "model.safetensors").write_bytes(b"")
    return folder


@pytest.mark.parametrize(("call", "keywords"), [
    (lambda t: kvctl.hard_reset(), ['run="NAME"', 'urls=["URL", ...]', 'inventory="FILE"']),
    (lambda t: kvctl.probe(), ['run="NAME"', 'urls=["URL", ...]']),
    (lambda t: kvctl.hard_reset(urls=[URL], ray="127.0.0.1:1"), ['ray needs run="NAME"']),
    (lambda t: kvctl.probe(urls=[URL], ray="127.0.0.1:1"), ['ray needs run="NAME"']),
    (lambda t: kvctl.hard_reset(urls=[URL], master="nohost"), ["master: 'nohost' is not HOST:PORT"]),
    (lambda t: kvctl.hard_reset(urls=[URL], master_rpc="http://a:1"), ["master_rpc: "]),
    (lambda t: kvctl.hard_reset(inventory=t / "none.yaml"), ["inventory "]),
    (lambda t: kvctl.hard_reset(urls=["ftp://a:1"]), ["urls #1"]),
    (lambda t: kvctl.hard_reset(urls=[URL], pause_timeout=0), ["pause_timeout must be > 0", "concurrency >= 1"]),
    (lambda t: kvctl.hard_reset(urls=[URL], allow_mixed_weights=True), ["allow_mixed_weights=True", "add verify=True"]),
    (lambda t: kvctl.hard_reset(urls=[URL], probe_prompts=["p"]), ["add verify=True"]),
    (lambda t: kvctl.update_weights(t / "nope", urls=[URL]), ["from_path ", "add remote_path=True"]),
    (lambda t: kvctl.update_weights("rel", urls=[URL], remote_path=True), ["with remote_path=True the folder"]),
    (lambda t: kvctl.update_weights("", urls=[URL]), ["from_path must be", 'from_path="/checkpoints/step-120"']),
    (lambda t: kvctl.update_weights(_weights(t), "", urls=[URL]), ["version must be", 'version="step-120"']),
    (lambda t: kvctl.update_weights(_weights(t), urls=[URL], reload_timeout=0),
     ["reload_timeout must be", "reload_timeout=600"]),
])
def test_errors_raised_to_python_name_keywords(no_ambient: Path, call, keywords: list[str]) -> None:  # noqa: ANN001
    with pytest.raises(UsageError) as raised:
        call(no_ambient)
    _check(raised.value, *keywords)
    assert "fix:" in str(raised.value) or raised.value.hint is None  # still the error it was, with its fix


def test_receipts_returned_to_python_name_keywords(no_ambient: Path) -> None:
    """A plan refused for want of a master: the receipt's error and hint, the raised ResetFailed, and
    the weights update's refusal of the same fleet."""
    with DoubleFleet() as fleet:
        url = fleet.add(VllmDouble("0.24.0", store=SharedStore()))
        receipt = kvctl.hard_reset(urls=[url], verify=True)
        assert receipt.exit_code == 1
        _check([receipt.plan.error, receipt.plan.hint, receipt.summary], "verify=True needs", 'master="HOST:PORT"')
        with pytest.raises(kvctl.ResetFailed) as failed:
            kvctl.hard_reset(urls=[url], verify=True, raise_on_failure=True)
        _check(failed.value, 'master="HOST:PORT"')
        update = kvctl.update_weights(_weights(no_ambient), urls=[url], verify=True, dry_run=True)
        _check([update.plan.error, update.plan.hint, update.summary, update.plan.reset.error,
                update.plan.reset.hint])


def test_the_cli_keeps_its_flags(cli, no_ambient: Path) -> None:
    with DoubleFleet() as fleet:
        url = fleet.add(VllmDouble("0.24.0", store=SharedStore()))
        refused = cli("reset", "--url", url, "--verify", "--connector")
    assert refused.exit_code == 1 and "pass --master HOST:PORT" in refused.stderr, refused.stderr
    assert "master=" not in refused.stderr and "in Python" not in refused.stderr
    bad = cli("weights", "update", "--from", str(no_ambient / "nope"), "--url", URL)
    assert bad.exit_code == 2 and f"--from {no_ambient / 'nope'}" in bad.stderr and "add --remote-path" in bad.stderr
    mixed = cli("reset", "--url", URL, "--allow-mixed-weights")
    assert mixed.exit_code == 2 and "add --verify, or drop --allow-mixed-weights" in mixed.stderr
