"""`kvctl reset --connector` against a master without the HTTP remove_all (Mooncake < 0.3.12.post1).

OldMasterFront is a TEST DOUBLE answering 404 to `POST /api/v1/remove_all` in front of a REAL
master (every other admin call reaches the real one); the keys are a real store client's, and
kvctl's fallback, Mooncake's store client on the RPC port, clears the real master.
"""

from __future__ import annotations

import json

import pytest

from kvctl.serve.master_process import MasterProcess
from tests.doubles import DoubleFleet, OldMasterFront, VllmDouble

from .helpers import StoreWriter, admin_call

pytestmark = pytest.mark.integration


def test_old_master_is_cleared_through_the_store_client(empty_master: MasterProcess, writer: StoreWriter,
                                                        cli) -> None:
    writer.put(12, "")
    with DoubleFleet() as fleet:
        old = fleet.add_master(OldMasterFront(empty_master.admin_address))
        urls = [fleet.add(VllmDouble("0.22.0"))]
        result = cli("reset", "--url", urls[0], "--master", old, "--master-rpc", empty_master.rpc_address,
                     "--connector", "--whole-master", "--verify", "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == 0, result.stdout + result.stderr
    m = data["master"]
    assert m["scope"] == "whole" and m["keys_before"] == 12 and m["keys_after"] == 0
    assert "no HTTP remove_all on this master" in m["clear"]["detail"]
    assert admin_call(empty_master.admin_address, "key_count") == 0


def test_old_master_without_its_rpc_port_names_the_version_needed(empty_master: MasterProcess,
                                                                  writer: StoreWriter, cli) -> None:
    writer.put(3, "")
    with DoubleFleet() as fleet:
        old = fleet.add_master(OldMasterFront(empty_master.admin_address))
        urls = [fleet.add(VllmDouble("0.22.0"))]
        result = cli("reset", "--url", urls[0], "--master", old, "--connector", "--whole-master", "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == 1
    assert "Mooncake < 0.3.12.post1" in data["master"]["error"] and "--master-rpc" in data["master"]["error"]
    assert admin_call(empty_master.admin_address, "key_count") == 3  # nothing removed, nothing lost
