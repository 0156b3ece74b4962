"""Two deployments whose cache_prefixes nest (issue 39 finding 13): `rl` and `rl@eval` (plain vLLM allows the
'@'; kvctl refuses it only where it takes a prefix itself) on one REAL mooncake_master, a real store client
writing keys shaped as vLLM's MooncakeStoreConnector writes them. A scoped reset of `rl` must remove and
count only keys of `rl`'s own shape (kvctl.facts.cache_prefix.key_pattern), never `rl@eval@...`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvctl.serve.master_process import MasterProcess
from tests.doubles import DoubleFleet, VllmDouble

from .helpers import StoreWriter, admin_call

pytestmark = pytest.mark.integration


def test_a_scoped_reset_of_rl_keeps_every_key_of_rl_at_eval(empty_master: MasterProcess, tmp_path: Path,
                                                             cli) -> None:
    writer = StoreWriter(empty_master.rpc_address)
    try:
        writer.put(4, "rl@")  # rl@tiny@tp_rank:0@...@<hex>
        eval_keys = writer.put(3, "rl@eval@")  # rl@eval@tiny@tp_rank:0@...@<hex>
        writer.put(2, "svc@")
        address = empty_master.admin_address
        assert admin_call(address, "key_count") == 9
        with DoubleFleet() as fleet:
            url = fleet.add(VllmDouble("0.24.0", cache_prefix="rl"))
            inv = tmp_path / "fleet.yaml"
            inv.write_text(f"master: {address}\nmaster_rpc: {empty_master.rpc_address}\ncache_prefix: rl\n"
                           f"replicas:\n  - url: {url}\n")
            result = cli("reset", "--inventory", str(inv), "--connector", "--verify", "--json")
        data = json.loads(result.stdout)
        assert result.exit_code == 0, data
        m = data["master"]
        assert m["scope"] == "scoped" and m["removed_count"] == 4, m
        assert (m["keys_before"], m["others_before"], m["keys_after"], m["others_after"]) == (4, 5, 0, 5), m
        assert sorted(k for k in admin_call(address, "all_keys") if k.startswith("rl@eval@")) == sorted(eval_keys)
        assert admin_call(address, "key_count") == 5
    finally:
        writer.close()
