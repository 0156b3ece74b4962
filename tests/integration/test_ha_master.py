"""`kvctl reset` against a REAL Mooncake HA pair: two mooncake_master processes with --enable_ha on
an etcd backend (a real etcd on 127.0.0.1), a real store client writing through the pair.

Why etcd and not redis: the published wheels (mooncake-transfer-engine-non-cuda 0.3.13.post1) are
built without STORE_USE_REDIS; `--ha_backend_type=redis` logs "Failed to parse HA backend config:
UNAVAILABLE_IN_CURRENT_MODE" and the master exits. etcd is compiled in.

What the masters answered here (0.3.13.post1): the leader's /health has role "leader", ha_state
"serving" (after ~5 s of "leader_warmup"), leader_address = its own RPC address; a standby's has
role "standby", ha_state "standby", service_ready false, the same leader_address, and answers 503
(error_code -1011, "service plane is not active") to get_all_keys and remove_all; it binds no RPC
port. A store client given `etcd://HOST:PORT` follows the leader. Keys do NOT survive a failover
(the new leader starts empty: its writers must put again).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvctl.reset.execute import execute_plan
from kvctl.reset.plan import ResetOptions, plan_reset
from kvctl.serve import runs
from kvctl.serve.master_process import MasterProcess
from kvctl.serve.ports import free_port
from kvctl.targets import build_fleet
from kvctl.transport import store_client
from kvctl.transport.master_admin import MasterAdmin
from tests.doubles import DoubleFleet, VllmDouble

from .ha import LOOPBACK, EtcdServer, require_etcd, start_ha_pair
from .helpers import StoreWriter, admin_call, run, wait_for

pytestmark = pytest.mark.integration

TAKEOVER_S = 40.0  # seen: ~5 s until the lease lapses, ~5 s of warm-up


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    require_etcd()
    with EtcdServer(tmp_path_factory.mktemp("etcd")) as server:
        yield server


@pytest.fixture(scope="module")
def pair(etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MasterProcess, MasterProcess]]:
    """(leader, standby) for the tests that do not kill anyone."""
    leader, standby = start_ha_pair(etcd, tmp_path_factory.mktemp("ha-masters"))
    yield leader, standby
    standby.stop()
    leader.stop()


@pytest.fixture(scope="module")
def ha_writer(etcd: EtcdServer, pair: tuple[MasterProcess, MasterProcess]) -> Iterator[StoreWriter]:
    writer = StoreWriter(etcd.master_server_address)  # follows the leader through the HA backend
    yield writer
    writer.kill()


@pytest.fixture
def clears(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every address kvctl sends a clear to: HTTP remove_all (admin address) and the store
    client's removal (RPC address). The real calls still run."""
    sent: list[str] = []
    real_remove_all, real_matching = MasterAdmin.remove_all, store_client.remove_matching

    async def remove_all(self: MasterAdmin, force: bool = True) -> int:
        sent.append(self.base_url.removeprefix("http://"))
        return await real_remove_all(self, force)

    def remove_matching(rpc: str, pattern: str | None, timeout: float, session: Any = None) -> Any:
        sent.append(rpc)
        return real_matching(rpc, pattern, timeout, session)

    monkeypatch.setattr(MasterAdmin, "remove_all", remove_all)
    monkeypatch.setattr(store_client, "remove_matching", remove_matching)
    return sent


def _inventory(tmp_path: Path, masters: list[str], urls: list[str], cache_prefix: str = "rl-a") -> Path:
    inv = tmp_path / "fleet.yaml"
    inv.write_text("master:\n" + "".join(f"  - {m}\n" for m in masters) + f"cache_prefix: {cache_prefix}\n"
                   + "replicas:\n" + "".join(f"  - url: {u}\n" for u in urls))
    return inv


def _keys(master: MasterProcess, prefix: str) -> int:
    return admin_call(master.admin_address, "key_count", prefix)


def _empty(master: MasterProcess) -> None:
    admin_call(master.admin_address, "remove_all", force=True)


def test_the_real_pair_answers_as_documented(pair: tuple[MasterProcess, MasterProcess]) -> None:
    leader, standby = pair
    info_l = admin_call(leader.admin_address, "ha_info")
    info_s = admin_call(standby.admin_address, "ha_info")
    assert (info_l.role, info_l.ha_state, info_l.service_ready) == ("leader", "serving", True)
    assert (info_s.role, info_s.ha_state, info_s.service_ready) == ("standby", "standby", False)
    assert info_l.leader_rpc == info_s.leader_rpc == leader.rpc_address
    assert admin_call(standby.admin_address, "leader_rpc") == leader.rpc_address


def test_plan_picks_the_leader_and_names_the_standby(pair: tuple[MasterProcess, MasterProcess],
                                                     tmp_path: Path, cli) -> None:
    leader, standby = pair
    with DoubleFleet() as fleet:
        urls = [fleet.add(VllmDouble("0.24.0", cache_prefix="rl-a"))]
        # the standby first: kvctl must not simply take the first address
        inv = _inventory(tmp_path, [standby.admin_address, leader.admin_address], urls)
        plan = run(plan_reset(build_fleet(None, inv, env={}), ResetOptions(connector=True)))
        shown = cli("reset", "--inventory", str(inv), "--connector", "--dry-run")
    assert plan.error is None, plan.error
    assert (plan.master, plan.master_rpc) == (leader.admin_address, leader.rpc_address)
    assert "/leader" in (plan.master_rpc_source or "")
    assert {n.address: n.role for n in plan.master_nodes} == {standby.admin_address: "standby",
                                                              leader.admin_address: "leader"}
    assert plan.master_clear and plan.master_clear_scope == "scoped"
    assert shown.exit_code == 0, shown.stdout + shown.stderr
    assert f"{standby.admin_address}: standby" in shown.stdout
    assert f"{leader.admin_address}: leader" in shown.stdout and "<- used" in shown.stdout


def test_scoped_reset_through_the_pair_clears_only_rl_a_on_the_leader(
        pair: tuple[MasterProcess, MasterProcess], ha_writer: StoreWriter, clears: list[str],
        tmp_path: Path, cli) -> None:
    leader, standby = pair
    _empty(leader)
    ha_writer.put(20, "rl-a@")
    ha_writer.put(20, "svc-b@")
    assert (_keys(leader, "rl-a@"), _keys(leader, "svc-b@")) == (20, 20)
    clears.clear()  # the setup's own clear above
    with DoubleFleet() as fleet:
        doubles = [VllmDouble("0.32.0", cache_prefix="rl-a") for _ in range(2)]
        urls = [fleet.add(d) for d in doubles]
        # no master_rpc: the leader reports its own RPC address
        inv = _inventory(tmp_path, [standby.admin_address, leader.admin_address], urls)
        result = cli("reset", "--inventory", str(inv), "--connector", "--verify", "--json")
        sent = [c.query for d in doubles for c in d.calls if c.path == "/reset_prefix_cache"]
    assert result.exit_code == 0, result.stdout + result.stderr
    m = json.loads(result.stdout)["master"]
    assert (m["address"], m["rpc_address"], m["leader_changed"]) == (leader.admin_address, leader.rpc_address, None)
    assert m["scope"] == "scoped" and (m["keys_before"], m["keys_after"]) == (20, 0)
    assert (m["others_before"], m["others_after"]) == (20, 20)
    assert {r["address"]: r["role"] for r in m["roles"]}[standby.admin_address] == "standby"
    assert (_keys(leader, "rl-a@"), _keys(leader, "svc-b@")) == (0, 20)
    assert clears and set(clears) == {leader.rpc_address}  # never the standby
    assert all(p.get("reset_external") == "false" for p in sent), sent  # never vLLM's master-wide reset
    assert ha_writer.proc.poll() is None


def test_whole_master_clear_never_goes_to_the_standby(pair: tuple[MasterProcess, MasterProcess],
                                                      ha_writer: StoreWriter, clears: list[str],
                                                      tmp_path: Path, cli) -> None:
    leader, standby = pair
    _empty(leader)
    ha_writer.put(5, "rl-a@")
    before = admin_call(standby.admin_address, "metrics").remove_all_requests_total
    clears.clear()
    with DoubleFleet() as fleet:  # 0.22: vLLM's own reset clears nothing, so kvctl clears the master
        urls = [fleet.add(VllmDouble("0.22.0", cache_prefix="rl-a"))]
        masters = f"{standby.admin_address},{leader.admin_address}"  # comma-separated --master
        result = cli("reset", "--url", urls[0], "--master", masters, "--connector", "--whole-master", "--json")
    assert result.exit_code == 0, result.stdout + result.stderr
    data = json.loads(result.stdout)
    assert data["master"]["address"] == leader.admin_address and data["master"]["scope"] == "whole"
    assert clears == [leader.admin_address]
    assert admin_call(standby.admin_address, "metrics").remove_all_requests_total == before
    assert _keys(leader, "") == 0


def test_no_leader_fails_the_plan_before_anything_is_sent(pair: tuple[MasterProcess, MasterProcess],
                                                          tmp_path: Path, cli) -> None:
    _, standby = pair
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    with DoubleFleet() as fleet:
        double = VllmDouble("0.24.0", cache_prefix="rl-a")
        urls = [fleet.add(double)]
        result = cli("reset", "--inventory", str(_inventory(tmp_path, [standby.admin_address, dead], urls)),
                     "--connector", "--json")
        resets = [c for c in double.calls if c.path.startswith(("/reset", "/pause"))]
    assert result.exit_code == 1
    error = json.loads(result.stdout)["plan"]["error"]
    assert "no master leads" in error and f"{standby.admin_address}: standby" in error
    assert f"{dead}: no answer" in error and not resets


# -- a leader change between plan and execute (each test its own pair: it kills the leader) -----------
@pytest.fixture
def failover(tmp_path: Path) -> Iterator[tuple[MasterProcess, MasterProcess, StoreWriter]]:
    """(leader, standby, writer): a fresh pair on its own etcd, and a store client following it."""
    require_etcd()
    with EtcdServer(tmp_path / "etcd") as own:
        leader, standby = start_ha_pair(own, tmp_path / "masters")
        own_writer = StoreWriter(own.master_server_address)
        try:
            yield leader, standby, own_writer
        finally:
            own_writer.kill()
            standby.stop()
            leader.stop()


def _kill_and_wait_for_takeover(leader: MasterProcess, standby: MasterProcess, restart_old: bool) -> None:
    os.kill(leader.pid, signal.SIGKILL)  # a crash: no lease release
    leader.stop()
    assert wait_for(lambda: _serving(standby), timeout=TAKEOVER_S, interval=0.25), "the standby never took over"
    if restart_old:  # the old leader comes back on the same ports, now as a standby (it answers 503)
        leader.start()
        assert admin_call(leader.admin_address, "ha_info").role == "standby"


def _serving(master: MasterProcess) -> bool:
    try:
        info = admin_call(master.admin_address, "ha_info")
    except Exception:  # noqa: BLE001 - not up yet
        return False
    return info.role == "leader" and info.service_ready is True


def _put_after_failover(writer: StoreWriter, count: int, prefix: str) -> None:
    """The first put after a failover can fail (-200) while the client switches leader."""
    for _ in range(20):
        try:
            writer.put(count, prefix)
            return
        except RuntimeError:
            import time

            time.sleep(0.5)
    raise AssertionError("the store client could not put on the new leader")


@pytest.mark.parametrize("stale_check", [False, True], ids=["rechecked-before-clear", "503-then-retry"])
def test_leader_change_between_plan_and_execute(failover, clears: list[str], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch, stale_check: bool) -> None:
    """rechecked-before-clear: kvctl asks again just before the clear and uses the new leader.
    503-then-retry: the check just before the clear is made stale on purpose (as if leadership moved
    right after it), so the clear hits the old leader, now a standby answering 503; kvctl asks once
    more and clears on the new leader."""
    old, new, writer = failover
    _put_after_failover(writer, 10, "rl-a@")
    with DoubleFleet() as fleet:
        urls = [fleet.add(VllmDouble("0.24.0", cache_prefix="rl-a")) for _ in range(2)]
        fleet_spec = build_fleet(None, _inventory(tmp_path, [old.admin_address, new.admin_address], urls), env={})
        options = ResetOptions(connector=True, verify=False, clear_timeout=30.0)

        plan = run(plan_reset(fleet_spec, options))
        assert plan.error is None and plan.master == old.admin_address, plan.error
        _kill_and_wait_for_takeover(old, new, restart_old=stale_check)
        carried = _keys(new, "rl-a@")  # seen: 0 (keys do not survive a failover: writers put again)
        _put_after_failover(writer, 12, "rl-a@after-")
        _put_after_failover(writer, 7, "svc-b@")
        checks = _first_check_is_stale(monkeypatch, plan) if stale_check else None
        receipt = run(execute_plan(plan, fleet_spec))
    m = receipt.master
    assert receipt.ok, receipt.summary + str(m)
    assert plan.master == old.admin_address and m.planned_address == old.admin_address
    assert m.address == new.admin_address and m.rpc_address == new.rpc_address
    assert m.leader_changed == f"{old.admin_address} -> {new.admin_address}"
    assert (m.keys_before, m.keys_after, m.others_before, m.others_after) == (carried + 12, 0, 7, 7)
    assert (_keys(new, "rl-a@"), _keys(new, "svc-b@")) == (0, 7)
    assert clears == [new.rpc_address]  # the old leader's RPC port was never used
    if checks is not None:  # the stale check, then (after the old leader's 503) a real one
        assert checks["n"] == 2 and admin_call(old.admin_address, "ha_info").role == "standby"


def _first_check_is_stale(monkeypatch: pytest.MonkeyPatch, plan: Any) -> dict[str, int]:
    """Make the check just before the clear return what the plan saw (the old leader), once."""
    from kvctl.reset import leader as master_select

    real = master_select.choose_serving
    calls = {"n": 0}

    async def stale(*args: Any, **kwargs: Any) -> master_select.MasterChoice:
        calls["n"] += 1
        if calls["n"] == 1:
            return master_select.MasterChoice(list(plan.master_nodes), plan.master, plan.master_rpc,
                                              plan.master_rpc_source, plan.master_ha)
        return await real(*args, **kwargs)

    monkeypatch.setattr(master_select, "choose_serving", stale)
    return calls



def test_serve_joins_an_ha_group_through_etcd_and_reset_finds_its_leader(
        pair: tuple[MasterProcess, MasterProcess], etcd: EtcdServer, ha_writer: StoreWriter, tmp_path: Path,
        cli) -> None:
    """kvctl serve --master etcd://... (issue 25): replicas get the etcd address, the run records every
    master's admin port, and a reset of the run clears this run's keys on whichever master leads."""
    from tests.unit.serve.test_serve import gone, serve_args

    leader, standby = pair
    _empty(leader)
    result = cli(*serve_args(tmp_path, "ha", "--detach", "--master", etcd.master_server_address,
                             "--master-admin", f"{standby.admin_address},{leader.admin_address}"))
    assert result.exit_code == 0, result.stdout + result.stderr
    record = runs.load("ha", tmp_path / "state")
    try:
        bundle = json.loads((Path(record.dir) / "config" / "mooncake.json").read_text())
        assert bundle["master_server_address"] == etcd.master_server_address
        ha_writer.put(10, "ha@")
        ha_writer.put(10, "svc-b@")
        out = cli("reset", "--run", "ha", "--state-dir", str(tmp_path / "state"), "--connector", "--json")
        assert out.exit_code == 0, out.stdout + out.stderr
        receipt = json.loads(out.stdout)
        assert receipt["master"]["address"] == leader.admin_address, receipt["master"]
        assert (_keys(leader, "ha@"), _keys(leader, "svc-b@")) == (0, 10)
    finally:
        cli("stop", "--run", "ha", "--state-dir", str(tmp_path / "state"))
    assert gone(record) and leader.running and standby.running  # kvctl stops only what it started
    _empty(leader)


def test_serve_refuses_an_unreachable_etcd_and_a_malformed_group(tmp_path: Path, cli) -> None:
    from tests.unit.serve.test_serve import serve_args

    port = free_port(LOOPBACK)
    result = cli(*serve_args(tmp_path, "ha2", "--master", f"etcd://127.0.0.1:{port}"))
    assert result.exit_code != 0 and f"etcd endpoint at 127.0.0.1:{port} is unreachable" in result.stderr
    for bad, says in ((f"etcd://127.0.0.1:{port};nope", "'nope' is not HOST:PORT"),
                      ("redis://127.0.0.1:6379", "only etcd:// names an HA group")):
        result = cli(*serve_args(tmp_path, "ha3", "--master", bad))
        assert result.exit_code == 2 and says in result.stderr, result.stderr
