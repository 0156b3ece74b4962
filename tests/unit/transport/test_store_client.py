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


def test_a_session_started_ahead_removes_on_the_real_master(tmp_path: Path) -> None:
    """StoreSession: Mooncake's store client connected before it is needed (a reset opens it before
    the pause), then asked for removals; the same answers as a one-off child (a real master)."""
    import psutil
    import pytest

    from kvctl.serve.master_process import MasterProcess
    from kvctl.serve.ports import free_port
    from kvctl.transport.store_client import StoreClientError, StoreSession, remove_matching
    from tests.integration.helpers import StoreWriter, require_mooncake

    require_mooncake()
    with MasterProcess(log_path=tmp_path / "master.log") as master:
        writer = StoreWriter(master.rpc_address)
        try:
            writer.put(12, "rl-a@")
            writer.put(5, "svc-b@")
            session = StoreSession(master.rpc_address)
            pid = session._proc.pid
            assert remove_matching(master.rpc_address, "^rl\\-a@", 30, session).removed == 12
            assert session.remove("^rl\\-a@", 30).removed == 0 and session.alive
            assert remove_matching(master.rpc_address, "^svc\\-b@", 30).removed == 5  # no session: its own child
            session.close()
            assert not session.alive and not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
        finally:
            writer.kill()
    closed = f"127.0.0.1:{free_port('127.0.0.1')}"
    with pytest.raises(StoreClientError, match="could not connect"):
        StoreSession(closed, timeout=60)
