"""The code of docs/verl.md as the tests run it (so the page cannot drift from what is tested),
and the light verl install the tests need."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "verl.md"
# The verl release `make install` puts in .venv (Makefile, the $(STAMP) recipe).
PIN = re.search(r"'verl==([\w.]+)'", (ROOT / "Makefile").read_text())


def require_verl() -> Path:
    """verl's installed folder. Without the light install (verl, omegaconf, hydra-core): skip, or
    fail under CI (CI set and not false/0/no)."""
    missing = [m for m in ("verl", "omegaconf", "hydra") if importlib.util.find_spec(m) is None]
    if missing:
        message = (f"the light verl install is missing ({', '.join(missing)}): run `make install`, or "
                   f"pip install --no-deps 'verl=={PIN[1] if PIN else '?'}' omegaconf hydra-core")
        if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    spec = importlib.util.find_spec("verl")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent
_FENCE = re.compile(r"^```(?P<lang>\w*)\n(?P<body>.*?)^```\s*$", re.M | re.S)


def blocks(lang: str) -> list[str]:
    return [m["body"] for m in _FENCE.finditer(DOC.read_text()) if m["lang"] == lang]


def named_block(name: str) -> str:
    """The one code block whose first line is `# NAME` (a file the page asks the reader to write)."""
    found = [b for lang in ("python", "yaml") for b in blocks(lang) if b.splitlines()[0] == f"# {name}"]
    assert len(found) == 1, f"docs/verl.md: {len(found)} blocks start with '# {name}'"
    return found[0]


def commands(*prefix: str) -> list[list[str]]:
    """Every shell command of the page's bash blocks (continuation lines joined, comments dropped)
    whose words start with `prefix`."""
    found = []
    for block in blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[: len(prefix)] == list(prefix):
                found.append(words)
    return found


def hydra_overrides(argv: list[str]) -> list[str]:
    """The Hydra overrides of a `python3 -m verl.trainer.main_ppo ...` command line."""
    words = argv[argv.index("verl.trainer.main_ppo") + 1:]
    out, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word in ("--config-path", "--config-name"):
            skip = True
        else:
            out.append(word)
    return out
