"""Mooncake tenants on a REAL mooncake_master (issue 37 item 3): what a tenant isolates, what the admin
routes and the store client see of it, and kvctl counting a fleet's keys where they live or refusing.

Two real store clients in their own processes write the keys: one set up in tenant "t1" (as vLLM >= 0.28
sets its client up from mooncake.json's tenant_id), one in "default". The replicas are vLLM 0.24 HTTP
doubles (a scoped clear: kvctl's store client removes `^<cache_prefix>@`). Measured on 0.3.13.post1 and
written up in docs/reset.md, "Shared masters".
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvctl.serve.master_process import MasterProcess
from kvctl.transport import store_client
from tests.doubles import DoubleFleet, VllmDouble

from .helpers import LEASE_TTL, StoreWriter, admin_call, require_mooncake

pytestmark = pytest.mark.integration
KEY_BYTES = 1024  # store_writer's default value size


@pytest.fixture(scope="module")
def tenant_master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MasterProcess]:
    """A real master with multi-tenancy: it needs a quota policy file listing every tenant that puts
    (an unlisted tenant's puts fail with -1701; without the file the master aborts at start)."""
    require_mooncake()
    folder = tmp_path_factory.mktemp("tenants")
    quota = folder / "quota.yaml"
    quota.write_text("version: 1\ntenants:\n  - name: default\n    quota: 256MB\n  - name: t1\n    quota: 256MB\n")
    proc = MasterProcess(log_path=folder / "master.log", default_kv_lease_ttl=LEASE_TTL,
                         extra_args=["--enable_multi_tenants=true", f"--tenant_quota_connector_uri={quota}"])
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def writers(request: pytest.FixtureRequest) -> Iterator[dict[str, StoreWriter]]:
    """One writer per tenant on the master the test names (default flags, or with tenants)."""
    master: MasterProcess = request.getfixturevalue(request.param)
    admin_call(master.admin_address, "remove_all", force=True)  # without tenant_id: every tenant's keys
    made = {t: StoreWriter(master.rpc_address, tenant=t) for t in ("t1", "default")}
    yield made
    for w in made.values():
        w.close()


def _inventory(tmp_path: Path, master: MasterProcess, url: str, **fields: str) -> str:
    inv = tmp_path / "fleet.yaml"
    inv.write_text(f"master: {master.admin_address}\nmaster_rpc: {master.rpc_address}\n"
                   + "".join(f"{k}: {v}\n" for k, v in fields.items()) + f"replicas:\n  - url: {url}\n")
    return str(inv)


def _reset(cli, inv: str) -> tuple[int, dict]:
    result = cli("reset", "--inventory", inv, "--connector", "--verify", "--json")
    return result.exit_code, json.loads(result.stdout)


@pytest.mark.parametrize("writers", ["master"], indirect=True)
def test_a_default_master_ignores_tenants_and_kvctl_counts_them_all(master: MasterProcess,
                                                                    writers: dict[str, StoreWriter],
                                                                    tmp_path: Path, cli) -> None:
    """Default flags: one namespace. /get_all_keys lists t1's keys, kvctl's (default-tenant) store client
    removes them, and a fleet declaring tenant t1 is counted and cleared correctly, with a note that its
    tenant isolates nothing."""
    writers["t1"].put(4, "rl-a@")
    writers["default"].put(4, "svc-b@")
    address = master.admin_address
    assert admin_call(address, "key_count") == 8 and admin_call(address, "metrics").key_count == 8
    assert admin_call(address, "tenancy").mode == "off"
    with DoubleFleet() as fleet:
        url = fleet.add(VllmDouble("0.24.0", cache_prefix="rl-a"))
        code, data = _reset(cli, _inventory(tmp_path, master, url, cache_prefix="rl-a", tenant_id="t1"))
    assert code == 0, data
    m = data["master"]
    assert (m["keys_before"], m["keys_after"], m["others_before"], m["others_after"]) == (4, 0, 4, 4)
    assert data["plan"]["tenancy"] == "off"
    assert any("tenant 't1' isolates nothing" in n for n in data["plan"]["notes"])
    assert admin_call(address, "key_count", "rl-a@") == 0 and admin_call(address, "key_count", "svc-b@") == 4


@pytest.mark.parametrize("writers", ["tenant_master"], indirect=True)
def test_with_multi_tenancy_kvctl_counts_the_default_tenant_and_refuses_another(tenant_master: MasterProcess,
                                                                               writers: dict[str, StoreWriter],
                                                                               tmp_path: Path, cli) -> None:
    writers["t1"].put(4, "rl-a@")
    svc_keys = writers["default"].put(4, "svc-b@")
    address, rpc = tenant_master.admin_address, tenant_master.rpc_address
    # what each route sees: the listing is the default tenant's, the gauge every tenant's
    assert sorted(admin_call(address, "all_keys")) == sorted(svc_keys)
    assert admin_call(address, "key_count") == 4 and admin_call(address, "metrics").key_count == 8
    tenancy = admin_call(address, "tenancy")
    assert tenancy.mode == "on" and tenancy.charged_bytes == {"default": 4 * KEY_BYTES, "t1": 4 * KEY_BYTES}
    # why a count in the default tenant proves nothing for t1: its client (kvctl's) finds none of t1's keys
    assert store_client.remove_matching(rpc, "^rl-a@", 60).removed == 0
    assert admin_call(address, "key_count", "rl-a@") == 0 and admin_call(address, "metrics").key_count == 8

    with DoubleFleet() as fleet:
        url = fleet.add(VllmDouble("0.24.0", cache_prefix="rl-a"))
        # the fleet in t1: refused before anything is sent, t1's 4 keys untouched
        code, data = _reset(cli, _inventory(tmp_path, tenant_master, url, cache_prefix="rl-a", tenant_id="t1"))
        assert code == 1 and "this fleet's keys live in Mooncake tenant 't1'" in data["plan"]["error"], data
        assert "private master" in data["plan"]["hint"]
        # its tenant not declared, with t1's keys on the master: refused too
        code, data = _reset(cli, _inventory(tmp_path, tenant_master, url, cache_prefix="rl-a"))
        assert code == 1 and "holds keys in tenant(s) 't1' (4096 bytes)" in data["plan"]["error"], data
        assert admin_call(address, "metrics").key_count == 8
        assert admin_call(address, "tenancy").charged_bytes["t1"] == 4 * KEY_BYTES

        # the fleet in the default tenant: cleared and counted there, t1's keys kept
        other = fleet.add(VllmDouble("0.24.0", cache_prefix="svc-b"))
        code, data = _reset(cli, _inventory(tmp_path, tenant_master, other, cache_prefix="svc-b",
                                            tenant_id="default"))
    assert code == 0, data
    m = data["master"]
    assert (m["keys_before"], m["keys_after"], m["others_before"], m["others_after"]) == (4, 0, 0, 0)
    assert m["verified"] is True
    assert admin_call(address, "metrics").key_count == 4  # t1's
    assert admin_call(address, "tenancy").charged_bytes == {"default": 0, "t1": 4 * KEY_BYTES}


@pytest.mark.parametrize("writers", ["tenant_master"], indirect=True)
def test_what_removes_what_on_a_multi_tenant_master(tenant_master: MasterProcess, writers: dict[str, StoreWriter]
                                                    ) -> None:
    """The facts kvctl.reset.tenancy rests on: HTTP remove_all with tenant_id removes that tenant's keys
    only, without it every tenant's."""
    address = tenant_master.admin_address
    writers["t1"].put(3, "rl-a@")
    writers["default"].put(2, "svc-b@")
    assert admin_call(address, "metrics").key_count == 5
    from kvctl.transport.master_admin import MasterAdmin

    async def remove_all_of(tenant: str | None) -> int:
        async with MasterAdmin(address, timeout=5) as admin:
            params = {"force": "true", **({"tenant_id": tenant} if tenant else {})}
            answer = await admin._request("POST", "/api/v1/remove_all", **params)
            return int(answer.json()["removed_count"])

    from .helpers import run

    assert run(remove_all_of("t1")) == 3 and admin_call(address, "metrics").key_count == 2
    writers["t1"].put(3, "rl-a@")
    assert run(remove_all_of(None)) == 5 and admin_call(address, "metrics").key_count == 0
