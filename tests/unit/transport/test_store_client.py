"""kvctl.transport.store_client.available(): finds Mooncake's store client without importing Mooncake."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.lib import REPO

ROOT = REPO
CHECK = ("import sys; from kvctl.transport.store_client import available; "
         "print(available(), 'mooncake' in sys.modules)")


def _run(extra_path: str | None = None) -> str:
    code = CHECK if extra_path is None else f"import sys; sys.path.insert(0, {extra_path!r}); " + CHECK
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_installed_store_client_is_found_without_importing_mooncake() -> None:
    assert _run() == "True False"  # the test env installs kvctl[mooncake-cpu]


def test_a_mooncake_package_without_the_store_module_is_not_enough(tmp_path: Path) -> None:
    package = tmp_path / "mooncake"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    (package / "engine.py").write_text("")
    assert _run(str(tmp_path)) == "False False"
    (package / "store.py").write_text("")
    assert _run(str(tmp_path)) == "True False"
