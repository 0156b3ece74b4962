"""Targets: --url, --inventory, KVCTL_URLS, --master."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvctl.errors import UsageError
from kvctl.targets import build_fleet


def test_urls_are_normalized_and_named() -> None:
    fleet = build_fleet(["127.0.0.1:8000", "http://127.0.0.1:8001/"], env={})
    assert [r.url for r in fleet.replicas] == ["http://127.0.0.1:8000", "http://127.0.0.1:8001"]
    assert [r.name for r in fleet.replicas] == ["127.0.0.1:8000", "127.0.0.1:8001"]
    assert fleet.master is None


def test_env_urls_only_when_nothing_else() -> None:
    env = {"KVCTL_URLS": "http://127.0.0.1:1, 127.0.0.1:2"}
    assert len(build_fleet(None, env=env).replicas) == 2
    assert len(build_fleet(["127.0.0.1:3"], env=env).replicas) == 1


def test_inventory(tmp_path: Path) -> None:
    inv = tmp_path / "fleet.yaml"
    inv.write_text("master: 127.0.0.1:9003\ncache_prefix: rl\nreplicas:\n"
                   "  - {url: 'http://127.0.0.1:8000', name: a, api_key_env: MY_KEY, connector: MooncakeStoreConnector}\n"
                   "  - {url: '127.0.0.1:8001'}\n")
    fleet = build_fleet(None, inv, env={})
    assert fleet.master == "127.0.0.1:9003" and fleet.cache_prefix == "rl"
    a, b = fleet.replicas
    assert (a.name, a.api_key_env, a.connector) == ("a", "MY_KEY", "MooncakeStoreConnector")
    assert b.name == "127.0.0.1:8001"
    assert build_fleet(None, inv, master="127.0.0.1:9100", env={}).master == "127.0.0.1:9100"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("replicas: [{url: 'http://127.0.0.1:1', port: 3}]", "replicas.0.port: Extra inputs are not permitted"),
        ("master: 127.0.0.1:9003", "replicas: Field required"),
        ("replicas: [{url: 'ftp://x'}]", "is not an http(s) URL"),
        ("replicas: [{url: 'http://127.0.0.1:1'}]\nmaster: nohost", "is not HOST:PORT"),
        ("replicas: [{url: 'http://127.0.0.1:1'}, {url: 'http://127.0.0.1:1/'}]", "listed twice"),
        ("replicas: [\n", "not valid YAML"),
    ],
)
def test_bad_inventories(tmp_path: Path, text: str, message: str) -> None:
    inv = tmp_path / "fleet.yaml"
    inv.write_text(text)
    with pytest.raises(UsageError) as info:
        build_fleet(None, inv, env={})
    assert message in str(info.value)


def test_nothing_targeted() -> None:
    with pytest.raises(UsageError, match="no replicas to act on"):
        build_fleet(None, env={})
    with pytest.raises(UsageError, match="is not HOST:PORT"):
        build_fleet(["127.0.0.1:1"], master="9003", env={})


def test_ha_master_groups(tmp_path: Path) -> None:
    """Several masters (an HA group): comma-separated on the command line, a YAML list (or the same
    comma form) in the inventory; RPC addresses, when several, pair with them by position."""
    fleet = build_fleet(["127.0.0.1:1"], master="127.0.0.1:9003, 127.0.0.1:9004", env={},
                        master_rpc="127.0.0.1:50051,127.0.0.1:50052")
    assert fleet.master_group == ("127.0.0.1:9003", "127.0.0.1:9004") and fleet.master == "127.0.0.1:9003"
    assert fleet.rpc_group == ("127.0.0.1:50051", "127.0.0.1:50052")
    inv = tmp_path / "fleet.yaml"
    inv.write_text("master: [127.0.0.1:9003, 'http://127.0.0.1:9004']\nreplicas: [{url: '127.0.0.1:1'}]\n")
    assert build_fleet(None, inv, env={}).master_group == ("127.0.0.1:9003", "127.0.0.1:9004")
    inv.write_text("master: 127.0.0.1:9003,127.0.0.1:9004\nmaster_rpc: 127.0.0.1:50051\nreplicas: [{url: '127.0.0.1:1'}]\n")
    one_rpc = build_fleet(None, inv, env={})
    assert one_rpc.master_group == ("127.0.0.1:9003", "127.0.0.1:9004") and one_rpc.rpc_group == ("127.0.0.1:50051",)
    single = build_fleet(["127.0.0.1:1"], master="127.0.0.1:9003", env={})
    # one representation for one master and for a group: a group of one
    assert single.master_group == single.masters == ("127.0.0.1:9003",) and single.master == "127.0.0.1:9003"


@pytest.mark.parametrize(
    ("master", "rpc", "message"),
    [
        ("127.0.0.1:9003,127.0.0.1:9003", None, "listed twice"),
        ("127.0.0.1:9003,nohost", None, "--master #2: 'nohost' is not HOST:PORT"),
        ("127.0.0.1:9003,127.0.0.1:9004", "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", "3 RPC addresses for 2 master(s)"),
        (" , ", None, "no master address"),
    ],
)
def test_bad_master_groups(master: str, rpc: str | None, message: str) -> None:
    with pytest.raises(UsageError) as info:
        build_fleet(["127.0.0.1:1"], master=master, master_rpc=rpc, env={})
    assert message in str(info.value)


# -- KVCTL_MASTER / KVCTL_MASTER_RPC, and what this machine's run records tell ------------------------------
def test_master_env_defaults_the_admin_and_rpc_addresses() -> None:
    env = {"KVCTL_MASTER": "127.0.0.1:9003", "KVCTL_MASTER_RPC": "127.0.0.1:50051"}
    fleet = build_fleet(["127.0.0.1:1"], env=env, state_dir="/nonexistent")
    assert (fleet.masters, fleet.master_rpcs) == (("127.0.0.1:9003",), ("127.0.0.1:50051",))
    assert (fleet.master_source, fleet.master_rpc_source) == ("KVCTL_MASTER", "KVCTL_MASTER_RPC")
    flagged = build_fleet(["127.0.0.1:1"], master="127.0.0.1:9100", env=env, state_dir="/nonexistent")
    assert (flagged.masters, flagged.master_source) == (("127.0.0.1:9100",), "--master")
    assert flagged.master_rpcs == ("127.0.0.1:50051",)  # a master named by flag pairs with the env's RPC
    assert build_fleet(["127.0.0.1:1"], env=env, masters_from_env=False).masters == ()  # probe reads neither


def test_the_env_rpc_address_never_pairs_with_an_inventorys_master(tmp_path: Path) -> None:
    inv = tmp_path / "fleet.yaml"
    inv.write_text("master: 10.0.0.9:9003\nreplicas:\n  - url: 127.0.0.1:8000\n")
    fleet = build_fleet(None, inv, env={"KVCTL_MASTER": "127.0.0.1:9003", "KVCTL_MASTER_RPC": "127.0.0.1:50051"},
                        state_dir=str(tmp_path))
    assert fleet.masters == ("10.0.0.9:9003",) and fleet.master_rpcs == ()  # another master's RPC port would be wrong
    assert fleet.master_source == f"--inventory {inv}"


def test_a_bad_env_master_names_the_variable() -> None:
    with pytest.raises(UsageError, match="KVCTL_MASTER: 'nonsense' is not HOST:PORT"):
        build_fleet(["127.0.0.1:1"], env={"KVCTL_MASTER": "nonsense"})
    with pytest.raises(UsageError, match="KVCTL_MASTER_RPC: 'http://h:1' is a URL"):
        build_fleet(["127.0.0.1:1"], env={"KVCTL_MASTER": "h:2", "KVCTL_MASTER_RPC": "http://h:1"})


def _live_run(state: Path, name: str, admin: str, rpc: str, run_state: str = "running") -> None:
    import time

    from kvctl.serve import runs

    runs.RunRecord(name=name, dir=str(runs.runs_dir(state) / name), state=run_state, created=time.time(),
                   template="mooncake-store", parameters={}, model="m", host="127.0.0.1", vllm={},
                   master=runs.MasterRecord(False, rpc, admin)).save()


def test_a_live_runs_record_gives_its_masters_rpc_address(tmp_path: Path) -> None:
    _live_run(tmp_path, "rl", "127.0.0.1:9003", "127.0.0.1:50051")
    _live_run(tmp_path, "old", "127.0.0.1:9004", "127.0.0.1:50052", run_state="stopped")  # gone: not asked
    fleet = build_fleet(["127.0.0.1:1"], master="127.0.0.1:9003", env={}, state_dir=str(tmp_path))
    assert fleet.master_rpcs == ("127.0.0.1:50051",) and fleet.master_rpc_source == "run rl's record"
    assert fleet.notes == ("the master's RPC address 127.0.0.1:50051: from run rl's record (its master)",)
    assert build_fleet(["127.0.0.1:1"], master="127.0.0.1:9004", env={}, state_dir=str(tmp_path)).master_rpcs == ()
    given = build_fleet(["127.0.0.1:1"], master="127.0.0.1:9003", master_rpc="127.0.0.1:7", env={},
                        state_dir=str(tmp_path))
    assert given.master_rpcs == ("127.0.0.1:7",) and not given.notes  # what the user says wins


def test_an_rpc_address_given_as_master_is_swapped_for_the_runs_admin_address(tmp_path: Path) -> None:
    _live_run(tmp_path, "rl", "127.0.0.1:9003", "127.0.0.1:50051")
    fleet = build_fleet(["127.0.0.1:1"], master="127.0.0.1:50051", env={}, state_dir=str(tmp_path))
    assert (fleet.masters, fleet.master_rpcs) == (("127.0.0.1:9003",), ("127.0.0.1:50051",))
    assert "--master 127.0.0.1:50051 is the RPC port of run rl's master, not its admin port" in fleet.notes[0]
    assert "say --master 127.0.0.1:9003 --master-rpc 127.0.0.1:50051" in fleet.notes[0]
