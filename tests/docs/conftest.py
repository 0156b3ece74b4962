"""The servers and the sandbox the docs' commands run against, shared by the whole session.

- vLLM TEST DOUBLES (tests/doubles, speaking vLLM's real endpoints) standing at the addresses the
  docs name (docs_placeholders.ADDRESSES says which double stands for which address);
- one REAL mooncake_master (tests/integration's MasterProcess) for every master address the docs name;
- a stand-in `vllm` on PATH (tests/docs/stand_in_vllm.py) and a stand-in vLLM interpreter for
  `kvctl serve` (tests/doubles/fake_vllm.py, through KVCTL_VLLM_PYTHON and $VLLM_PY);
- HOME, the state dir and each doc file's working folder in a temporary folder, so nothing a
  command writes (run records, `--out` folders, shell completion) touches the user's own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kvctl.serve.master_process import MasterProcess
from tests.doubles import DoubleFleet, VllmDouble
from tests.integration.helpers import require_mooncake

from .blocks import REPO

HERE = Path(__file__).resolve().parent
FAKE_VLLM = REPO / "tests" / "doubles" / "fake_vllm.py"


@dataclass
class Sandbox:
    root: Path
    env: dict[str, str]
    values: dict[str, str]  # placeholder name -> what it stands for here (docs_placeholders)
    doubles: dict[str, VllmDouble] = field(default_factory=dict)

    def workdir(self, doc: str) -> Path:
        path = self.root / "work" / doc.replace("/", "_")
        path.mkdir(parents=True, exist_ok=True)
        return path

    def kvctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(REPO / ".venv" / "bin" / "kvctl"), *args], env=self.env, text=True,
                              capture_output=True, timeout=120, check=False)


def _script(path: Path, target: Path) -> Path:
    path.write_text(f"#!/bin/sh\nexec {sys.executable} {target} \"$@\"\n")
    path.chmod(0o755)
    return path


def _replicas() -> dict[str, VllmDouble]:
    """One double per replica the docs name (docs_placeholders.ADDRESSES); 0.22.0 where the text
    shows what kvctl does with a store connector that cannot clear its store, 0.32.0 elsewhere."""
    return {
        "replica_a": VllmDouble("0.22.0", name="a"),
        "replica_b": VllmDouble("0.22.0", name="b"),
        # answers derived from their weights, with log-probabilities, as vLLM's (kvctl probe reads them)
        "replica_c": VllmDouble("0.32.0", name="c", weight_answers=True),
        "replica_d": VllmDouble("0.32.0", name="d", weight_answers=True),
        # docs/reset.md's fleet.yaml names 10.0.0.11:8000 with cache_prefix rl-run-7; weights.md both
        "replica_w0": VllmDouble("0.32.0", name="w0", cache_prefix="rl-run-7"),
        "replica_w1": VllmDouble("0.32.0", name="w1", cache_prefix="rl-run-7"),
    }


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    require_mooncake()
    root = tmp_path_factory.mktemp("docs")
    home, bin_dir, models = root / "home", root / "bin", root / "models"
    for folder in (home, bin_dir, models / "MODEL", home / ".cache/kvctl/models/tiny-llama-0",
                   root / "checkpoints/step-120"):
        folder.mkdir(parents=True, exist_ok=True)
    (root / "checkpoints/step-120/model.safetensors").write_bytes(b"step-120 weights")
    # "with vLLM installed in the job's environment" (docs/ci.md): its package metadata, as pip writes it
    info = root / "site" / "vllm-0.32.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0\n")
    fake_python = _script(bin_dir / "fake-vllm-python", FAKE_VLLM)
    _script(bin_dir / "vllm", HERE / "stand_in_vllm.py")
    master = MasterProcess(log_path=root / "mooncake_master.log").start()
    replicas = _replicas()
    fleet = DoubleFleet(list(replicas.values())).start()
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("KVCTL_", "VLLM_", "MOONCAKE_", "XDG_"))}
    env.update({
        "HOME": str(home), "PATH": f"{bin_dir}:{REPO / '.venv' / 'bin'}:/usr/bin:/bin",
        "KVCTL_VLLM_PYTHON": str(fake_python), "VLLM_PY": str(fake_python),
        "KVCTL_VLLM_ENV": str(root / "no-built-vllm-env"), "COLUMNS": "200", "SHELL": "/bin/bash",
        "PYTHONPATH": f"{REPO}:{root / 'site'}",
    })
    values = {
        "master_admin": master.admin_address, "master_rpc": master.rpc_address,
        "model": str(models / "MODEL"), "home": str(home), "checkpoint": str(root / "checkpoints/step-120"),
        **{name: replica.address for name, replica in replicas.items()},
    }
    box = Sandbox(root, env, values, replicas)
    try:
        yield box
    finally:
        box.kvctl("stop", "--all")
        fleet.stop()
        master.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The count of what ran (the issue's closing note quotes it)."""
    from .test_docs_run import COUNTS

    if COUNTS["blocks run"] or COUNTS["blocks not run"]:
        terminalreporter.write_line("docs run as written: " + ", ".join(f"{v} {k}" for k, v in COUNTS.items()))
