from __future__ import annotations

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


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Result]:
    """Run kvctl in-process; stdout and stderr kept apart (rendered configs must be pipeable)."""
    monkeypatch.delenv("KVCTL_TEMPLATE_PATH", raising=False)
    monkeypatch.delenv("KVCTL_DEBUG", raising=False)
    monkeypatch.setenv("COLUMNS", "200")
    runner = CliRunner()

    def invoke(*args: str) -> Result:
        result = runner.invoke(app, list(args), catch_exceptions=False)
        return Result(result.exit_code, result.stdout, result.stderr)

    return invoke
