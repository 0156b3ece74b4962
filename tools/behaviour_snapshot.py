"""What a fixed set of kvctl commands prints, written to a folder, for before/after comparisons of a
change that must not change behaviour (a refactor, a move): `diff -r BEFORE AFTER` must be empty.

    python tools/behaviour_snapshot.py OUT_DIR

Covered, each as `<name>.txt` holding the exit code, stdout and stderr: `--help` of every command
and group; `config list/show`; `config render` of every template in every format for a spread of
vLLM versions; `compat matrix` (table, markdown, JSON) and `compat check` per template and version;
`config validate --json` of every file of the corpus; and `reset`, `reset --dry-run`, `status` and
`probe` receipts (JSON) against the HTTP test doubles (tests/doubles) with a master double. Values
that differ from run to run (ports, durations, timestamps, temp paths) are replaced by
placeholders. Runs in-process with Typer's CliRunner, at 100 columns, in a private state dir.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VERSIONS = ("0.13.0", "0.16.0", "0.21.0", "0.22.0", "0.23.0", "0.32.0")
FORMATS = ("verl", "vllm-args", "json", "env", "mooncake")
# keys whose values are clocks, durations or ids that change from run to run
VOLATILE_KEYS = re.compile(r"(^|_)(ms|s|seconds|elapsed|duration|started|finished|at|time|took|"
                           r"window|latency|pid|when|age|created)(_|$)|_ms$|_s$|^t$", re.I)


def main(out: Path) -> int:
    os.environ["COLUMNS"] = "100"
    os.environ.pop("KVCTL_TEMPLATE_PATH", None)
    os.environ.pop("KVCTL_DEBUG", None)
    state = Path(tempfile.mkdtemp(prefix="kvctl-snapshot-state-"))
    os.environ["KVCTL_STATE_DIR"] = str(state)
    os.environ["KVCTL_VLLM_ENV"] = str(state / "no-built-vllm-env")
    out.mkdir(parents=True, exist_ok=True)
    from typer.testing import CliRunner

    from kvctl.cli.main import app

    runner = CliRunner()

    def run(name: str, *args: str) -> None:
        result = runner.invoke(app, list(args), catch_exceptions=True)
        err = result.stderr if result.stderr_bytes is not None else ""
        exc = "" if result.exception is None or isinstance(result.exception, SystemExit) else \
            f"\n--- exception\n{type(result.exception).__name__}: {result.exception}"
        text = f"$ kvctl {' '.join(args)}\nexit {result.exit_code}\n--- stdout\n{result.stdout}--- stderr\n{err}{exc}"
        (out / f"{_slug(name)}.txt").write_text(_normalise(text, state))

    for path in _command_paths(app):
        run("help " + " ".join(path), *path, "--help")
    run("config list", "config", "list")
    templates = _templates()
    for t in templates:
        run(f"config show {t}", "config", "show", t)
        for v in VERSIONS:
            for f in FORMATS:
                run(f"render {t} {v} {f}", "config", "render", t, "--vllm-version", v, "--format", f)
            run(f"compat check {t} {v}", "compat", "check", "--vllm-version", v, "--template", t, "--json")
    run("compat matrix", "compat", "matrix")
    run("compat matrix markdown", "compat", "matrix", "--markdown")
    run("compat matrix json", "compat", "matrix", "--json")
    for f in sorted((ROOT / "tests" / "corpus" / "files").iterdir()):
        run(f"validate {f.name}", "config", "validate", str(f), "--json")
    for name, args in _fleet_commands():
        run(name, *args)
    return 0


def _command_paths(app: object) -> Iterator[tuple[str, ...]]:
    import typer.main

    root = typer.main.get_command(app)  # type: ignore[arg-type]

    def walk(cmd: object, path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
        yield path
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            yield from walk(sub, (*path, name))

    yield from walk(root, ())


def _templates() -> list[str]:
    names = []
    for p in sorted((ROOT / "templates").glob("*.yaml")):
        names.append(p.stem)
    return names


def _fleet_commands() -> Iterator[tuple[str, tuple[str, ...]]]:
    """Receipts against doubles: two 0.32 replicas and a 0.22 one sharing a master double."""
    try:
        from tests.doubles import DoubleFleet, MasterDouble, SharedStore, VllmDouble
    except ImportError:  # pragma: no cover - the doubles moved
        from tests.doubles.vllm import (  # type: ignore
            DoubleFleet,
            MasterDouble,
            SharedStore,
            VllmDouble,
        )
    import httpx

    store = SharedStore()
    replicas = [VllmDouble("0.32.0+cpu", store=store), VllmDouble("0.32.0+cpu", store=store),
                VllmDouble("0.22.0", store=store)]
    with DoubleFleet(replicas=replicas, masters=[MasterDouble(store)]) as fleet:
        urls = [a for u in fleet.urls for a in ("--url", u)]
        master = ("--master", fleet.master_addresses[0])
        prompt = " ".join(f"w{i}" for i in range(40))
        for r in replicas:
            httpx.post(f"{r.url}/v1/completions", json={"model": r.model, "prompt": prompt, "max_tokens": 1})
        yield "status json", ("status", *urls, *master, "--json")
        yield "status table", ("status", *urls, *master)
        yield "reset dry-run json", ("reset", *urls, *master, "--connector", "--dry-run", "--json")
        yield "reset json", ("reset", *urls, *master, "--connector", "--verify", "--json")
        yield "reset table", ("reset", *urls, *master, "--connector", "--pause")
        yield "reset local only json", ("reset", *urls, "--json")
        yield "reset bad url", ("reset", "--url", "http://127.0.0.1:1", "--json")
        prompts = Path(tempfile.mkdtemp(prefix="kvctl-snapshot-prompts-")) / "prompts.txt"
        prompts.write_text(prompt + "\n")
        yield "probe json", ("probe", *urls[:4], "--prompts", str(prompts), "--json")


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", name).strip("-") or "root"


def _normalise(text: str, state: Path) -> str:
    text = text.replace(str(state), "<STATE>").replace(str(ROOT), "<ROOT>")
    text = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:<PORT>", text)
    text = re.sub(r"/tmp/kvctl-snapshot-prompts-[^/\s\"]+", "<PROMPTS>", text)
    text = re.sub(r"\b\d+(\.\d+)? ?(ms|s)\b", "<DUR>", text)
    text = re.sub(r"\d{4}-\d\d-\d\dT[\d:.]+(Z|[+-]\d\d:\d\d)?", "<TIME>", text)
    return _normalise_json(text)


def _normalise_json(text: str) -> str:
    """Volatile values inside JSON documents of stdout (receipts) become placeholders."""
    head, sep, rest = text.partition("--- stdout\n")
    body, sep2, tail = rest.partition("--- stderr\n")
    try:
        doc = json.loads(body)
    except ValueError:
        return text

    def clean(v: object, key: str = "") -> object:
        if isinstance(v, dict):
            return {k: clean(x, k) for k, x in v.items()}
        if isinstance(v, list):
            return [clean(x, key) for x in v]
        if isinstance(v, (int, float)) and not isinstance(v, bool) and VOLATILE_KEYS.search(key):
            return "<NUM>"
        return v

    return head + sep + json.dumps(clean(doc), indent=1, sort_keys=True) + "\n" + sep2 + tail


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(main(Path(sys.argv[1])))
