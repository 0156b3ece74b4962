"""`kvctl reset --connector` clearing a REAL mooncake_master whose keys belong to a live store client.

The replicas are HTTP test doubles of vLLM 0.22 (whose connector reset is a silent no-op), so the
plan must add kvctl's own forced master clear; the keys are written by a real
MooncakeDistributedStore client in another process that stays alive during the reset.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from kvctl.serve.master_process import MasterProcess
from tests.doubles import DoubleFleet, VllmDouble

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
                 "--connector", "--whole-master", "--json")
    assert result.exit_code == 0, result.stdout + result.stderr
    data = json.loads(result.stdout)
    assert data["master"]["clear"]["result"] == "ok"
    assert data["master"]["removed_count"] == 50
    # a whole clear counts the keys before by the master's gauge (no listing), after by listing
    assert (data["master"]["keys_before"], data["master"]["keys_after"]) == (50, 0)
    assert admin_call(address, "key_count") == 0
    assert admin_call(address, "metrics").remove_all_requests_total == before + 1
    assert writer.proc.poll() is None  # the client was alive throughout


def _inventory(tmp_path, master: MasterProcess, urls: list[str], cache_prefix: str | None = "rl-a",
               rpc: bool = True) -> str:
    inv = tmp_path / "fleet.yaml"
    inv.write_text(f"master: {master.admin_address}\n" + (f"master_rpc: {master.rpc_address}\n" if rpc else "")
                   + (f"cache_prefix: {cache_prefix}\n" if cache_prefix else "") + "replicas:\n"
                   + "".join(f"  - url: {u}\n" for u in urls))
    return str(inv)


def _keys(master: MasterProcess, prefix: str) -> int:
    return admin_call(master.admin_address, "key_count", prefix)


@pytest.mark.parametrize("version", ["0.24.0", "0.32.0"])
def test_scoped_reset_leaves_other_deployments_keys(empty_master: MasterProcess, writer: StoreWriter,
                                                    tmp_path, cli, version: str) -> None:
    """Two deployments share one real master; resetting rl-a loses 0 of svc-b's keys. vLLM's
    connector reset is a master-wide remove_all from 0.23, so kvctl must not send
    reset_external=true and clears rl-a's keys itself (0.24 is the first release whose keys carry
    the prefix: before it a scoped clear is refused, test below)."""
    writer.put(20, "rl-a@")
    writer.put(20, "svc-b@")
    with DoubleFleet() as fleet:
        doubles = [VllmDouble(version, cache_prefix="rl-a") for _ in range(2)]
        urls = [fleet.add(d) for d in doubles]
        result = cli("reset", "--inventory", _inventory(tmp_path, empty_master, urls), "--connector",
                     "--verify", "--json")
        sent = [c.query for d in doubles for c in d.calls if c.path == "/reset_prefix_cache"]
    data = json.loads(result.stdout)
    assert result.exit_code == 0, result.stdout + result.stderr
    m = data["master"]
    assert m["scope"] == "scoped" and m["cache_prefix"] == "rl-a"
    assert (m["keys_before"], m["keys_after"]) == (20, 0)
    assert (m["others_before"], m["others_after"]) == (20, 20)
    assert _keys(empty_master, "svc-b@") == 20 and _keys(empty_master, "rl-a@") == 0
    assert sent and all(p.get("reset_external") == "false" for p in sent), sent  # never vLLM's master-wide reset
    assert writer.proc.poll() is None


def test_a_scoped_reset_of_a_release_that_ignores_cache_prefix_is_refused(empty_master: MasterProcess,
                                                                          writer: StoreWriter, tmp_path, cli) -> None:
    """vLLM 0.22 writes keys without the prefix it was given: a clear scoped to rl-a would find none
    of them and report success. Refused before anything is sent; every key stays."""
    writer.put(6, "rl-a@")
    writer.put(6, "svc-b@")
    with DoubleFleet() as fleet:
        double = VllmDouble("0.22.0", cache_prefix="rl-a")
        urls = [fleet.add(double)]
        result = cli("reset", "--inventory", _inventory(tmp_path, empty_master, urls), "--connector", "--json")
        resets = [c for c in double.calls if c.path.startswith("/reset")]
    data = json.loads(result.stdout)
    assert result.exit_code == 1 and "does not read cache_prefix" in data["plan"]["error"], result.stdout
    assert "--whole-master" in data["plan"]["hint"] and not resets
    assert _keys(empty_master, "rl-a@") == 6 and _keys(empty_master, "svc-b@") == 6


def test_whole_master_is_explicit_and_clears_everyone(empty_master: MasterProcess, writer: StoreWriter,
                                                       tmp_path, cli) -> None:
    writer.put(5, "rl-a@")
    writer.put(5, "svc-b@")
    with DoubleFleet() as fleet:
        urls = [fleet.add(VllmDouble("0.22.0", cache_prefix="rl-a"))]
        inv = _inventory(tmp_path, empty_master, urls)
        plan = cli("reset", "--inventory", inv, "--connector", "--whole-master", "--dry-run")
        assert "EVERY key on the master" in plan.stdout and "--whole-master" in plan.stdout
        result = cli("reset", "--inventory", inv, "--connector", "--whole-master", "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == 0, result.stdout
    assert data["master"]["scope"] == "whole" and admin_call(empty_master.admin_address, "key_count") == 0
    m = data["master"]
    assert (m["keys_before"], m["others_before"], m["removed_count"], m["keys_after"], m["others_after"]) == \
        (5, 5, 10, 0, 0)


def test_scoped_fleet_without_the_rpc_port_fails_before_sending(empty_master: MasterProcess,
                                                                writer: StoreWriter, tmp_path, cli) -> None:
    writer.put(3, "svc-b@")
    with DoubleFleet() as fleet:
        double = VllmDouble("0.32.0", cache_prefix="rl-a")
        urls = [fleet.add(double)]
        result = cli("reset", "--inventory", _inventory(tmp_path, empty_master, urls, rpc=False),
                     "--connector", "--json")
        resets = [c for c in double.calls if c.path.startswith("/reset")]
    data = json.loads(result.stdout)
    assert result.exit_code == 1 and "needs the master's RPC port" in data["plan"]["error"]
    assert "--master-rpc" in data["plan"]["hint"] and not resets
    assert _keys(empty_master, "svc-b@") == 3


def test_inventory_prefix_must_match_the_servers(empty_master: MasterProcess, tmp_path, cli) -> None:
    with DoubleFleet() as fleet:
        urls = [fleet.add(VllmDouble("0.32.0", cache_prefix="svc-b"))]
        result = cli("reset", "--inventory", _inventory(tmp_path, empty_master, urls, "rl-a"),
                     "--connector", "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == 1 and "run with another: " in data["plan"]["error"]


def test_prefix_is_learned_from_the_servers(empty_master: MasterProcess, writer: StoreWriter,
                                            tmp_path, cli) -> None:
    writer.put(4, "rl-a@")
    writer.put(4, "svc-b@")
    with DoubleFleet() as fleet:
        urls = [fleet.add(VllmDouble("0.24.0", cache_prefix="rl-a"))]
        result = cli("reset", "--inventory", _inventory(tmp_path, empty_master, urls, None),
                     "--connector", "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == 0, result.stdout
    assert data["plan"]["cache_prefix"] == "rl-a" and data["master"]["scope"] == "scoped"
    assert _keys(empty_master, "svc-b@") == 4 and _keys(empty_master, "rl-a@") == 0


def test_unreachable_master_fails_the_reset_clearly(replicas: list[str], cli) -> None:
    import socket

    with socket.socket() as s:  # a closed loopback port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = cli("reset", *[a for u in replicas for a in ("--url", u)], "--master", f"127.0.0.1:{port}",
                 "--connector", "--whole-master", "--json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["master"]["clear"]["result"] == "failed"
    assert all(not r["reset"] and "Mooncake store was not confirmed clear" in r["error"] for r in data["replicas"])
