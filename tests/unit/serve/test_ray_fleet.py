"""kvctl serve --ray without a cluster: placement (a pure function of the nodes), the run record with
its Ray fields, how Ray runs are listed without asking their cluster, and the refusals that come
before any connection. The real cluster is tests/e2e/test_ray.py."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvctl.errors import KvctlError, UsageError
from kvctl.serve import lifecycle, procs, runs
from kvctl.serve.ports import free_port
from kvctl.serve.ray_fleet import Node, RayFleetError, connect
from kvctl.serve.ray_start import place

HEAD = Node("h" * 56, "10.0.0.1", head=True, resources={"CPU": 8.0})
W1 = Node("a" * 56, "10.0.0.2", resources={"CPU": 8.0})
W2 = Node("b" * 56, "10.0.0.3", resources={"CPU": 8.0, "mooncake": 1.0})


def gpu(ip: str, gpus: int, head: bool = False) -> Node:
    return Node(ip.replace(".", "") * 4, ip, head=head, gpus=gpus, resources={"GPU": float(gpus)})


def test_cpu_cluster_master_on_the_head_replicas_round_robin_workers_first() -> None:
    p = place([HEAD, W2, W1], 4)
    assert p.master == HEAD and p.gpus_per_replica == 0
    assert [n.ip for n in p.replicas] == ["10.0.0.2", "10.0.0.3", "10.0.0.1", "10.0.0.2"]
    two = place([HEAD, W1], 2)  # the loopback test's shape: one replica per node
    assert [n.id for n in two.replicas] == [W1.id, HEAD.id]
    assert {n.id for n in two.nodes} == {HEAD.id, W1.id}


def test_gpu_cluster_one_replica_per_gpu_or_per_tensor_parallel_group() -> None:
    nodes = [gpu("10.0.0.1", 0, head=True), gpu("10.0.0.2", 2), gpu("10.0.0.3", 1)]
    p = place(nodes, 3)
    assert [n.ip for n in p.replicas] == ["10.0.0.2", "10.0.0.3", "10.0.0.2"] and p.gpus_per_replica == 1
    assert p.master is not None and p.master.head  # the head hosts the master, no replica
    tp2 = place([gpu("10.0.0.2", 4), gpu("10.0.0.3", 2)], 3, gpus_per_replica=2, embedded_master=False)
    assert [n.ip for n in tp2.replicas] == ["10.0.0.2", "10.0.0.3", "10.0.0.2"] and tp2.master is None
    with pytest.raises(UsageError, match="do not fit"):
        place(nodes, 4)
    with pytest.raises(UsageError, match="do not fit"):
        place([gpu("10.0.0.2", 3)], 2, gpus_per_replica=2, embedded_master=False)


def test_master_resource_and_missing_head() -> None:
    assert place([HEAD, W1, W2], 1, master_resource="mooncake").master == W2
    with pytest.raises(UsageError, match="no alive node of the cluster has that resource"):
        place([HEAD, W1], 1, master_resource="mooncake")
    with pytest.raises(RayFleetError, match="no alive head"):
        place([W1, W2], 1)
    assert place([W1, W2], 1, embedded_master=False).master is None
    with pytest.raises(RayFleetError, match="no alive node"):
        place([], 1)


def ray_record(state: Path, name: str = "rl", state_word: str = "running") -> runs.RunRecord:
    node = {"id": W1.id, "ip": W1.ip, "host": "w1/boot"}
    ref = procs.ProcessRef(2**22 + 5, 1.0, "replica r0")  # never a live pid here
    record = runs.RunRecord(
        name=name, dir=str(runs.runs_dir(state) / name), state=state_word, created=time.time() - 30,
        template="mooncake-store", parameters={}, model="m", host=HEAD.ip, vllm={"version": "0.32.0"},
        master=runs.MasterRecord(True, "10.0.0.1:50051", "10.0.0.1:9003",
                                 procs.ProcessRef(2**22 + 6, 1.0, "mooncake_master"), "/n/master.log",
                                 node={"id": HEAD.id, "ip": HEAD.ip, "host": "h/boot"}, actor=f"{name}/master"),
        replicas=[runs.ReplicaRecord("r0", "http://10.0.0.2:8000", 8000, ref, "/n/r0.log", node=node,
                                     actor=f"{name}/r0")],
        ray={"address": "10.0.0.1:6379", "namespace": "kvctl"})
    record.save()
    return record


def test_record_round_trip_with_nodes_and_actors(tmp_path: Path) -> None:
    record = ray_record(tmp_path)
    again = runs.read(record.path)
    assert again == record and again.replicas[0].node == {"id": W1.id, "ip": W1.ip, "host": "w1/boot"}
    assert again.master is not None and again.master.actor == "rl/master" and again.ray == record.ray
    # a record written before Ray runs existed still reads
    old = record.to_dict()
    for key in ("ray",):
        old.pop(key)
    for entry in [old["master"], *old["replicas"]]:
        entry.pop("node"), entry.pop("actor")
    assert runs.RunRecord.from_dict(json.loads(json.dumps(old))).ray is None


def test_a_ray_run_is_listed_as_recorded_without_asking_its_cluster(tmp_path: Path) -> None:
    record = ray_record(tmp_path)
    (summary,) = runs.summaries(tmp_path)
    assert summary.state == "running" and not summary.checked and summary.ray == "10.0.0.1:6379"
    assert [r["alive"] for r in summary.replicas] == [None] and summary.master["alive"] is None
    # a local run's liveness needs no cluster
    local = runs.RunRecord.from_dict({**record.to_dict(), "ray": None})
    assert lifecycle.liveness(local) is procs.is_ours


def test_kvctl_runs_shows_a_ray_run_without_importing_ray(tmp_path: Path) -> None:
    ray_record(tmp_path)
    code = ("import sys; sys.argv = ['kvctl', 'runs', '--state-dir', %r]\n"
            "from kvctl.cli.main import run\n"
            "try:\n    run()\nexcept SystemExit as e:\n    print('EXIT', e.code, 'ray' in sys.modules)\n") % str(tmp_path)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert proc.stdout.strip().splitlines()[-1] == "EXIT 0 False", proc.stdout + proc.stderr
    assert "2 on Ray" not in proc.stdout and "1 on Ray" in proc.stdout
    assert "kvctl runs --ray 10.0.0.1:6379 checks it" in proc.stdout


@pytest.mark.parametrize("args", [
    ["status", "--ray", "127.0.0.1:1"], ["reset", "--ray", "127.0.0.1:1"], ["stop", "--ray", "127.0.0.1:1"],
])
def test_ray_needs_a_run_name(cli, tmp_path: Path, args: list[str]) -> None:
    result = cli(*args, "--state-dir", str(tmp_path))
    assert result.exit_code == 2 and "--ray needs --run NAME" in result.stderr


@pytest.mark.parametrize(("extra", "message"), [
    (["--host", "0.0.0.0"], "--host does not apply with --ray"),
    (["--base-port", "8000"], "--base-port does not apply with --ray"),
    (["--master", "10.0.0.9:50051", "--ray-master-resource", "x"], "--ray-master-resource places the embedded"),
])
def test_serve_ray_refusals_come_before_any_connection(cli, tmp_path: Path, extra: list[str], message: str) -> None:
    result = cli("serve", "model", "--ray", "127.0.0.1:1", *extra, "--state-dir", str(tmp_path))
    assert result.exit_code == 2 and message in result.stderr
    assert not (tmp_path / "runs").exists()


def test_connect_fails_fast_on_an_unreachable_cluster() -> None:
    began = time.monotonic()
    with pytest.raises(RayFleetError, match="unreachable"):
        connect(f"127.0.0.1:{free_port()}")
    assert time.monotonic() - began < 5
    with pytest.raises(UsageError, match="not HOST:PORT"):
        connect("head-without-port")


def test_connect_without_ray_installed_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # what connect() sets for loopback: undone after
    try:
        with pytest.raises(UsageError, match="needs Ray") as err:
            connect(f"127.0.0.1:{server.getsockname()[1]}")
    finally:
        server.close()
    assert "kvctl[ray]" in (err.value.hint or "")


def test_errors_cross_process_boundaries_with_their_fix() -> None:
    """A Ray actor's error reaches kvctl pickled: message and fix both arrive."""
    from kvctl.serve.spec import ServeError

    for error in (UsageError("bad", "do this"), ServeError("failed"), KvctlError("x", "y")):
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is type(error) and (again.message, again.hint) == (error.message, error.hint)
