"""Integration fixtures: a real mooncake_master and a real store client, on 127.0.0.1 only.

Without Mooncake installed these tests skip with how to install it, except under CI (CI set
and not "false"/"0"), where a missing master or system library is a failure.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvctl.serve.master_process import MasterProcess

from .helpers import LEASE_TTL, StoreWriter, admin_call, require_mooncake


@pytest.fixture(scope="session")
def master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MasterProcess]:
    """One real mooncake_master on 127.0.0.1 with free ports and a long read lease."""
    require_mooncake()
    log = tmp_path_factory.mktemp("mooncake") / "master.log"
    proc = MasterProcess(log_path=log, default_kv_lease_ttl=LEASE_TTL)
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def writer(master: MasterProcess) -> Iterator[StoreWriter]:
    """One store client for the session (its keys live as long as it does)."""
    w = StoreWriter(master.rpc_address)
    yield w
    w.kill()


@pytest.fixture
def empty_master(master: MasterProcess, writer: StoreWriter) -> MasterProcess:
    """The session master with every key removed (forced) before the test."""
    admin_call(master.admin_address, "remove_all", force=True)
    assert admin_call(master.admin_address, "key_count") == 0
    return master
