"""--master is a master's admin port and --master-rpc its RPC port in every command: a REAL
mooncake_master tells the two apart before anything is sent, and a scoped clear finds the RPC port
where a run record or the replicas name it.

The replicas are vLLM doubles; the keys are written by a real store client (integration/helpers.py).
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

import kvctl
from kvctl.serve import runs
from kvctl.serve.master_process import MasterProcess
from kvctl.transport.master_admin import MasterAdmin
from tests.doubles import DoubleFleet, VllmDouble

from .helpers import StoreWriter, admin_call, run

pytestmark = pytest.mark.integration


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_each_port_of_a_real_master_says_what_it_is(master: MasterProcess) -> None:
    async def kinds() -> list[str]:
        out = []
        for address in (master.admin_address, master.rpc_address, _closed_port()):
            async with MasterAdmin(address, timeout=3) as admin:
                out.append((await admin.port_kind()).kind)
        return out

    assert run(kinds()) == ["admin", "not_http", "unreachable"]


def _resets(doubles: list[VllmDouble]) -> list[str]:
    return [c.path for d in doubles for c in d.calls if c.path.startswith(("/reset", "/pause"))]


@pytest.mark.parametrize("dry_run", [True, False])
def test_the_rpc_port_given_as_master_fails_the_plan_before_anything_is_sent(
        empty_master: MasterProcess, writer: StoreWriter, cli, dry_run: bool) -> None:
    writer.put(4, "any/")
    rpc = empty_master.rpc_address
    with DoubleFleet() as fleet:
        doubles = [VllmDouble("0.22.0")]
        url = fleet.add(doubles[0])
        result = cli("reset", "--url", url, "--master", rpc, "--connector", "--json", *(["--dry-run"] if dry_run else []))
    data = json.loads(result.stdout)
    assert result.exit_code == 1, result.stdout
    assert f"--master {rpc} answers no HTTP" in data["plan"]["error"]
    assert "is the master's RPC port, not its admin port" in data["plan"]["error"]
    assert f"pass --master-rpc {rpc} and --master ADMIN" in data["plan"]["hint"]
    assert not _resets(doubles) and admin_call(empty_master.admin_address, "key_count") == 4


def test_the_admin_port_given_as_master_rpc_fails_the_plan(empty_master: MasterProcess, cli) -> None:
    admin = empty_master.admin_address
    with DoubleFleet() as fleet:
        double = VllmDouble("0.32.0", cache_prefix="rl-a")
        result = cli("reset", "--url", fleet.add(double), "--master", admin, "--master-rpc", admin,
                     "--connector", "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == 1
    assert data["plan"]["error"] == f"--master-rpc {admin} is the master's admin port, not its RPC port"
    assert f"--master {admin}" in data["plan"]["hint"] and not _resets([double])


def test_an_admin_port_given_only_as_master_rpc_is_used_as_the_master(empty_master: MasterProcess,
                                                                      writer: StoreWriter, cli) -> None:
    writer.put(3, "any/")
    admin = empty_master.admin_address
    with DoubleFleet() as fleet:
        url = fleet.add(VllmDouble("0.22.0"))
        result = cli("reset", "--url", url, "--master-rpc", admin, "--connector", "--whole-master", "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == 0, result.stdout
    assert data["plan"]["master"] == admin and data["master"]["keys_after"] == 0
    assert any(f"--master-rpc {admin} is the master's admin port" in n for n in data["plan"]["notes"])


def test_a_vllm_url_given_as_master_is_no_master(empty_master: MasterProcess, cli) -> None:
    with DoubleFleet() as fleet:
        url = fleet.add(VllmDouble("0.22.0"))
        result = cli("reset", "--url", url, "--master", url.removeprefix("http://"), "--connector", "--dry-run")
    assert result.exit_code == 1
    assert "is not a Mooncake master's admin port: its GET /metrics has no master_key_count" in result.stderr


def _record(state: Path, master: MasterProcess) -> None:
    runs.RunRecord(name="rl", dir=str(runs.runs_dir(state) / "rl"), state="running", created=time.time(),
                   template="mooncake-store", parameters={}, model="m", host="127.0.0.1", vllm={},
                   master=runs.MasterRecord(False, master.rpc_address, master.admin_address)).save()


@pytest.mark.parametrize("given", ["admin", "rpc"])
def test_a_scoped_clear_takes_the_rpc_port_a_live_run_records(empty_master: MasterProcess, writer: StoreWriter,
                                                              tmp_path: Path, cli, given: str) -> None:
    """Only URLs and one of the master's two ports: the run that serves this master (its record)
    gives the other, and the plan and receipt say so."""
    writer.put(5, "rl-a@")
    writer.put(5, "svc-b@")
    _record(tmp_path, empty_master)
    address = empty_master.admin_address if given == "admin" else empty_master.rpc_address
    with DoubleFleet() as fleet:
        url = fleet.add(VllmDouble("0.32.0", cache_prefix="rl-a"))
        result = cli("reset", "--url", url, "--master", address, "--connector", "--verify",
                     "--state-dir", str(tmp_path), "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == 0, result.stdout
    assert data["plan"]["master_rpc"] == empty_master.rpc_address
    assert data["plan"]["master_rpc_source"] == "run rl's record"
    assert data["master"]["scope"] == "scoped" and (data["master"]["keys_after"], data["master"]["others_after"]) == (0, 5)
    if given == "rpc":
        assert any("is the RPC port of run rl's master" in n for n in data["plan"]["notes"])


def test_a_scoped_clear_takes_the_rpc_port_the_replicas_name(empty_master: MasterProcess, writer: StoreWriter,
                                                             cli) -> None:
    writer.put(5, "rl-a@")
    writer.put(5, "svc-b@")
    ktc = {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both",
           "kv_connector_extra_config": {"cache_prefix": "rl-a", "master_server_address": empty_master.rpc_address}}
    with DoubleFleet() as fleet:
        urls = [fleet.add(VllmDouble("0.32.0", kv_transfer_config=ktc, name=n)) for n in ("a", "b")]
        plan = cli("reset", *[a for u in urls for a in ("--url", u)], "--master", empty_master.admin_address,
                   "--connector", "--dry-run")
        result = cli("reset", *[a for u in urls for a in ("--url", u)], "--master", empty_master.admin_address,
                     "--connector", "--json")
    assert plan.exit_code == 0, plan.stderr
    assert f"the master's RPC address {empty_master.rpc_address}: named by" in plan.stdout
    data = json.loads(result.stdout)
    assert result.exit_code == 0, result.stdout
    assert data["plan"]["master_rpc_source"].endswith("(kv_transfer_config, GET /server_info)")
    assert (data["master"]["keys_after"], data["master"]["others_after"]) == (0, 5)


def test_master_env_variables_for_the_cli_and_the_python_api(empty_master: MasterProcess, writer: StoreWriter,
                                                             monkeypatch: pytest.MonkeyPatch, cli) -> None:
    monkeypatch.setenv("KVCTL_MASTER", empty_master.admin_address)
    monkeypatch.setenv("KVCTL_MASTER_RPC", empty_master.rpc_address)
    with DoubleFleet() as fleet:
        url = fleet.add(VllmDouble("0.32.0", cache_prefix="rl-a"))
        writer.put(3, "rl-a@")
        result = cli("reset", "--url", url, "--connector", "--json")
        assert result.exit_code == 0, result.stdout
        assert json.loads(result.stdout)["plan"]["master_rpc_source"] == "KVCTL_MASTER_RPC"
        writer.put(3, "rl-a@")
        receipt = kvctl.hard_reset(urls=[url], verify=True)
        assert receipt.ok and receipt.master is not None and receipt.master.keys_after == 0
        monkeypatch.setenv("KVCTL_MASTER", empty_master.rpc_address)  # the RPC port in the admin variable
        wrong = cli("reset", "--url", url, "--connector", "--json")
    plan = json.loads(wrong.stdout)["plan"]
    assert wrong.exit_code == 1 and plan["error"].startswith(f"KVCTL_MASTER {empty_master.rpc_address} answers no HTTP")
    assert f"set KVCTL_MASTER_RPC={empty_master.rpc_address} and KVCTL_MASTER=ADMIN" in plan["hint"]


def test_weights_update_and_status_say_so_too(master: MasterProcess, tmp_path: Path, cli) -> None:
    rpc = master.rpc_address
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "model.safetensors").write_bytes(b"")
    with DoubleFleet() as fleet:
        double = VllmDouble("0.32.0")
        url = fleet.add(double)
        weights = cli("weights", "update", "--from", str(tmp_path / "w"), "--url", url, "--master", rpc,
                      "--dry-run", "--json")
        status = cli("status", "--url", url, "--master", rpc, "--json")
    assert weights.exit_code == 1, weights.stdout
    assert "is the master's RPC port, not its admin port" in json.loads(weights.stdout)["plan"]["reset"]["error"]
    assert not _resets([double])
    masters = json.loads(status.stdout)["masters"]
    assert status.exit_code == 1 and "answers no HTTP" in masters[0]["error"]
    assert "is it the master's RPC port, not its admin port?" in masters[0]["error"]
