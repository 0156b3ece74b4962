"""Generated docs stay in step with the data they come from."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

from tests.lib import REPO

ROOT = REPO
sys.path.insert(0, str(ROOT / "tools"))

from update_docs import BEGIN, END, replace_section  # noqa: E402

from kvctl.facts.compat import matrix_markdown  # noqa: E402


def test_compat_md_matrix_is_current() -> None:
    text = (ROOT / "docs" / "compat.md").read_text()
    assert replace_section(text, matrix_markdown()) == text, "docs/compat.md is stale: run `make docs`"
    assert BEGIN in text and END in text


def test_compat_md_observations_are_current() -> None:
    """The "Observed on real servers" section is what tools/releases/observed/ says today."""
    from kvctl.facts.capabilities import table
    from tools.releases import docs as observed

    text = (ROOT / "docs" / "compat.md").read_text()
    assert observed.BEGIN in text and observed.END in text
    assert replace_section(text, observed.markdown(table()), observed.BEGIN, observed.END) == text, \
        "docs/compat.md's observations are stale: run `make docs`"


def test_readme_exit_codes_match_the_cli() -> None:
    from kvctl.cli import errors

    readme = (ROOT / "README.md").read_text()
    from kvctl.errors import EXIT_PARTIAL

    for code in (errors.EXIT_OK, errors.EXIT_FAILED, errors.EXIT_USAGE, EXIT_PARTIAL):
        assert re.search(rf"\|\s*`?{code}`?\s*\|", readme), f"exit code {code} missing from README"


def test_ci_doc_commands_run_as_written(tmp_path: Path, monkeypatch) -> None:
    """Every `kvctl compat check` / `kvctl config validate` line in docs/ci.md runs as written
    (no usage error) against a config like the one it names."""
    from packaging.version import Version
    from typer.testing import CliRunner

    from kvctl.cli.main import app
    from kvctl.facts.versions import InstalledVllm

    monkeypatch.chdir(tmp_path)
    # the plain-shell example reads the job's installed vLLM; stand one in through its metadata answer
    monkeypatch.setattr("kvctl.facts.versions.installed_vllm", lambda: InstalledVllm("vllm", Version("0.23.0")))
    (tmp_path / "configs").mkdir()
    rendered = CliRunner().invoke(app, ["config", "render", "mooncake-store", "--vllm-version", "0.23.0"])
    (tmp_path / "configs" / "rollout.yaml").write_text(rendered.stdout)
    text = (ROOT / "docs" / "ci.md").read_text()
    commands = re.findall(r"(?:^|run: )(kvctl (?:compat check|config validate)[^\n|&;>]*)", text, flags=re.M)
    assert len(commands) >= 4, commands
    for line in commands:
        # shell variables stand for the pinned vLLM version in the docs
        line = re.sub(r'"?\$\{?\w+\}?"?', "0.23.0", line)
        result = CliRunner().invoke(app, shlex.split(line)[1:])
        assert result.exit_code in (0, 1), f"{line}: {result.output}"
