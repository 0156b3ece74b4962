"""A real Mooncake HA pair for the integration tests: an etcd on 127.0.0.1 and two mooncake_master
processes with --enable_ha on it.

etcd, not redis: the published Mooncake wheels are built without the redis HA backend (the master
exits with "Failed to parse HA backend config: UNAVAILABLE_IN_CURRENT_MODE, backend_type=redis").
Without etcd these tests skip with how to install it, except under CI, where that is a failure.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from kvctl.serve.master_process import MasterProcess
from kvctl.serve.ports import free_port
from kvctl.transport.master_admin import MasterAdmin, MasterError

from .helpers import LEASE_TTL, in_ci, require_mooncake, run

ETCD = "etcd"
ETCD_INSTALL = "apt-get install -y etcd-server (Debian/Ubuntu; .ci/run installs it)"
LOOPBACK = "127.0.0.1"


def require_etcd() -> None:
    require_mooncake()
    if shutil.which(ETCD):
        return
    message = f"a real Mooncake HA pair needs etcd as its HA backend, not found on PATH: {ETCD_INSTALL}"
    if in_ci():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


class EtcdServer:
    """One etcd member on free loopback ports, its data in `workdir` (removed with it)."""

    def __init__(self, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.client_port = free_port(LOOPBACK)
        self.peer_port = free_port(LOOPBACK)
        while self.peer_port == self.client_port:
            self.peer_port = free_port(LOOPBACK)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"{LOOPBACK}:{self.client_port}"

    @property
    def master_server_address(self) -> str:
        """What a store client (and vLLM's mooncake.json) gives to follow the HA leader."""
        return f"etcd://{self.endpoint}"

    def start(self, timeout: float = 20.0) -> EtcdServer:
        client, peer = f"http://{self.endpoint}", f"http://{LOOPBACK}:{self.peer_port}"
        log = open(self.workdir / "etcd.log", "ab")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(
            [ETCD, "--name", "kvctl-test", "--data-dir", str(self.workdir / "data"),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"kvctl-test={peer}"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}: see {self.workdir / 'etcd.log'}")
            try:
                if httpx.get(f"{client}/health", timeout=0.5, trust_env=False).json().get("health") == "true":
                    return self
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"etcd not healthy within {timeout}s: see {self.workdir / 'etcd.log'}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def __enter__(self) -> EtcdServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def ha_master(etcd: EtcdServer, log: Path) -> MasterProcess:
    """A mooncake_master in HA mode on `etcd` (default cluster_id: a store client given
    etcd://... looks the leader up under the default one)."""
    rpc = free_port(LOOPBACK)
    admin = free_port(LOOPBACK)
    while admin == rpc:
        admin = free_port(LOOPBACK)
    # fixed ports: a test restarts a killed leader on the same addresses (then it is a standby)
    return MasterProcess(log_path=log, default_kv_lease_ttl=LEASE_TTL, rpc_port=rpc, metrics_port=admin,
                         extra_args=["--enable_ha=true", "--ha_backend_type=etcd",
                                     f"--ha_backend_connstring={etcd.endpoint}"])


def role_of(master: MasterProcess) -> tuple[str | None, bool | None]:
    async def ask() -> tuple[str | None, bool | None]:
        async with MasterAdmin(master.admin_address, timeout=2.0) as admin:
            info = await admin.ha_info()
            return info.role, info.service_ready
    return run(ask())


def _role_or_none(master: MasterProcess) -> tuple[str | None, bool | None]:
    """role_of, or (None, None) while the admin port does not answer yet: an HA master may bind it
    only after it has joined the election (seen under load: connection refused just after start)."""
    try:
        return role_of(master)
    except MasterError:
        return None, None


def start_ha_pair(etcd: EtcdServer, workdir: Path, timeout: float = 30.0) -> tuple[MasterProcess, MasterProcess]:
    """(leader, standby): the first master started wins the election; the second starts once the
    first serves (a new leader warms up ~5 s first), so the roles are known."""
    workdir.mkdir(parents=True, exist_ok=True)
    leader = ha_master(etcd, workdir / "a.log").start()
    try:
        deadline = time.monotonic() + timeout
        while _role_or_none(leader) != ("leader", True):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the first HA master never served: log {leader.log_path}")
            time.sleep(0.2)
        standby = ha_master(etcd, workdir / "b.log").start()
    except BaseException:
        leader.stop()
        raise
    role = _role_or_none(standby)[0]
    while role is None and time.monotonic() < deadline:
        time.sleep(0.2)
        role = _role_or_none(standby)[0]
    if role != "standby":
        standby.stop()
        leader.stop()
        raise RuntimeError(f"the second HA master is not a standby: log {standby.log_path}")
    # a new standby reports its role before it has read the leader's view from etcd (seen in CI:
    # role standby, leader_rpc None): the pair is ready once the standby names the leader
    while _leader_known_by(standby) != leader.rpc_address:
        if time.monotonic() > deadline:
            standby.stop()
            leader.stop()
            raise RuntimeError(f"the standby never named the leader: log {standby.log_path}")
        time.sleep(0.2)
    return leader, standby


def _leader_known_by(master: MasterProcess) -> str | None:
    async def ask() -> str | None:
        async with MasterAdmin(master.admin_address, timeout=2.0) as admin:
            return (await admin.ha_info()).leader_rpc
    try:
        return run(ask())
    except MasterError:
        return None
