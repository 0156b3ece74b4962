"""kvctl version [--json]: kvctl's version, the releases its facts cover (read from the shipped facts
files, not restated here), what it runs on; light (no vllm, torch, mooncake, httpx imported)."""

from __future__ import annotations

import json
import platform
import re
import subprocess
import sys
from importlib import metadata

from kvctl._version import __version__
from tests.lib import REPO

DATA = REPO / "kvctl" / "data"


def test_version_json_names_what_the_facts_cover(cli) -> None:
    result = cli("version", "--json")
    assert result.exit_code == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["kvctl"] == __version__
    for project, file in (("vllm", "vllm_facts.json"), ("mooncake", "mooncake_facts.json")):
        releases = json.loads((DATA / file).read_text())["releases"]
        got = info["facts"][project]
        assert (got["first"], got["last"], got["count"], got["releases"]) == (
            releases[0], releases[-1], len(releases), releases)
    assert info["python"]["version"] == platform.python_version()
    assert info["typer"] == metadata.version("typer") and info["rich"] == metadata.version("rich")
    assert info["vllm_installed"] is None or set(info["vllm_installed"]) == {"distribution", "version"}


def test_version_text_and_the_flag(cli) -> None:
    facts = json.loads((DATA / "vllm_facts.json").read_text())["releases"]
    text = cli("version")
    assert text.exit_code == 0

    def value(label: str) -> str:
        found = re.search(rf"^{label}\s+(.+)$", text.stdout, re.M)
        assert found, text.stdout
        return found.group(1)

    assert value("kvctl") == __version__
    assert value("vLLM facts") == f"{facts[0]} to {facts[-1]} ({len(facts)} releases)"
    assert value("typer") == metadata.version("typer")
    assert cli("--version").stdout == f"kvctl {__version__}\n"  # the flag stays as it was


def test_version_imports_nothing_heavy() -> None:
    code = ("import sys; sys.argv = ['kvctl', 'version']\nfrom kvctl.cli.main import run\ntry:\n    run()\n"
            "except SystemExit:\n    pass\nprint(sorted({'vllm', 'torch', 'mooncake', 'httpx', 'psutil', 'ray'} & set(sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout
