"""Which address a replica shows to its Mooncake master (issue 25 finding 4). Nothing here sends a
packet: route_address only asks the kernel for a route (a UDP connect)."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest
from packaging.version import Version

from kvctl.serve.vllm_launch import VllmInstall, replica_env
from kvctl.transport.addresses import LOOPBACK, advertised_address, master_hosts, route_address


def _own_address() -> str:
    """An IPv4 address of this machine other than loopback (a master "elsewhere" that needs no network)."""
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family.name == "AF_INET" and not a.address.startswith("127."):
                return a.address
    pytest.skip("this machine has no non-loopback IPv4 address")


@pytest.mark.parametrize("master, hosts", [
    ("127.0.0.1:50051", ["127.0.0.1"]), ("[::1]:50051", ["::1"]), ("node-a:50051", ["node-a"]),
    ("etcd://10.0.0.1:2379;10.0.0.2:2379", ["10.0.0.1", "10.0.0.2"]), ("etcd://[fd00::1]:2379", ["fd00::1"]),
])
def test_master_hosts(master: str, hosts: list[str]) -> None:
    assert master_hosts(master) == hosts


def test_route_to_this_machine_is_its_own_address() -> None:
    own = _own_address()
    assert route_address(own) == own
    assert route_address("127.0.0.1") == route_address("localhost") == LOOPBACK
    assert route_address("no-such-host.invalid") == LOOPBACK


def test_a_master_on_this_machine_keeps_everything_on_loopback() -> None:
    for host in ("127.0.0.1", "0.0.0.0", "::"):
        assert advertised_address(host, "127.0.0.1:50051") == LOOPBACK
        assert advertised_address(host, None) == LOOPBACK
    assert advertised_address("10.1.2.3", "127.0.0.1:50051") == LOOPBACK


def test_a_master_elsewhere_gets_the_route_toward_it_not_loopback() -> None:
    own = _own_address()
    # the default --host 127.0.0.1 with --master on another address: loopback would send every
    # other client of that master to its own localhost
    assert advertised_address("127.0.0.1", f"{own}:50051") == own
    assert advertised_address("0.0.0.0", f"etcd://{own}:2379") == own
    # a concrete --host is what the replica is reachable at
    assert advertised_address("10.9.8.7", f"{own}:50051") == "10.9.8.7"
    assert advertised_address("10.9.8.7", None) == "10.9.8.7"


def test_replica_env_sets_vllm_host_ip_toward_a_remote_master(tmp_path: Path) -> None:
    own = _own_address()
    install = VllmInstall("/envs/gpu/bin/python", "vllm", Version("0.32.0"))
    env = replica_env(install, {}, {}, tmp_path / "r0", "127.0.0.1", "0", master=f"{own}:50051")
    assert env["VLLM_HOST_IP"] == own and env["MC_TCP_BIND_ADDRESS"] == own
    env = replica_env(install, {}, {}, tmp_path / "r1", "127.0.0.1", "0", master="127.0.0.1:50051")
    assert env["VLLM_HOST_IP"] == LOOPBACK
    env = replica_env(install, {}, {}, tmp_path / "r2", "10.9.8.7", "0", master=f"{own}:50051")
    assert env["VLLM_HOST_IP"] == "10.9.8.7"
