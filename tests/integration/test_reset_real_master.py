"""`kvctl reset --connector` clearing a REAL mooncake_master whose keys belong to a live store client.

The replicas are HTTP test doubles of vLLM 0.22 (whose connector reset is a silent no-op), so the
plan must add kvctl's own forced master clear; the keys are written by a real
MooncakeDistributedStore client in another process that stays alive during the reset.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from kvctl.mooncake_master import MasterProcess

from ..doubles import DoubleFleet, VllmDouble
from .helpers import StoreWriter, admin_call

pytestmark = pytest.mark.integration


@pytest.fixture
def replicas() -> Iterator[list[str]]:
    with DoubleFleet() as fleet:
        yield [fleet.add(VllmDouble("0.22.0")), fleet.add(VllmDouble("0.22.0"))]


def test_reset_forces_the_clear_of_leased_keys(empty_master: MasterProcess, writer: StoreWriter,
                                               replicas: list[str], cli) -> None:
    address = empty_master.admin_address
    keys = writer.put(50, "deploy/")
    writer.get(keys[0])  # a read lease: a non-forced remove_all would leave this key
    before = admin_call(address, "metrics").remove_all_requests_total
    result = cli("reset", *[a for u in replicas for a in ("--url", u)], "--master", address,
                 "--connector", "--json")
    assert result.exit_code == 0, result.stdout + result.stderr
    data = json.loads(result.stdout)
    assert data["master"]["clear"]["result"] == "ok"
    assert data["master"]["removed_count"] == 50
    assert admin_call(address, "key_count") == 0
    assert admin_call(address, "metrics").remove_all_requests_total == before + 1
    assert writer.proc.poll() is None  # the client was alive throughout


def test_verify_checks_the_deployment_prefix(empty_master: MasterProcess, writer: StoreWriter,
                                                  replicas: list[str], tmp_path, cli) -> None:
    address = empty_master.admin_address
    writer.put(5, "mine/")
    inv = tmp_path / "fleet.yaml"
    inv.write_text(f"master: {address}\ncache_prefix: mine/\nreplicas:\n"
                   + "".join(f"  - url: {u}\n" for u in replicas))
    result = cli("reset", "--inventory", str(inv), "--connector", "--verify", "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == 0, result.stdout
    assert data["master"]["removed_count"] == 5
    assert data["master"]["cache_prefix"] == "mine/" and data["master"]["keys_after"] == 0
    assert data["master"]["verified"] is True
    assert all(r["canary"]["ok"] for r in data["replicas"])


def test_unreachable_master_fails_the_reset_clearly(replicas: list[str], cli) -> None:
    import socket

    with socket.socket() as s:  # a closed loopback port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = cli("reset", *[a for u in replicas for a in ("--url", u)], "--master", f"127.0.0.1:{port}",
                 "--connector", "--json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["master"]["clear"]["result"] == "failed"
    assert all(not r["reset"] and "Mooncake store was not confirmed clear" in r["error"] for r in data["replicas"])
