"""A kvctl run on a Ray cluster: connect, nodes, the record in the cluster, liveness, stop, rm.

`kvctl serve --ray ADDRESS` (kvctl.serve.ray_start) starts the Mooncake master and the vLLM replicas
through named, detached Ray actors (kvctl.serve.ray_actors) in the namespace `kvctl`, one per process:
`<run>/master`, `<run>/r0`, `<run>/r1`, ... Each starts its process on its node and stops it when it
is told to or killed. kvctl has no supervisor of its own across machines: Ray places and keeps them.

This module is what every command needs to find and act on such a run from any machine that
reaches the cluster: the run record in Ray's internal key-value store (namespace `kvctl`, key
`run/<name>`, the same JSON as the local run.json), the liveness of the run's processes (what their
actors say, checked on their own node by pid and start time), and stop (each actor stops its
process, then is killed; then a task on each node checks that none of the recorded processes is
left).

Importing this module never imports Ray: `connect()` does, and only commands given --ray, or acting
on a run whose record says it is a Ray run, call it. Nothing here prints.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kvctl.errors import KvctlError, UsageError
from kvctl.serve import procs, runs
from kvctl.serve.procs import ProcessRef
from kvctl.serve.runs import RunRecord

NAMESPACE = "kvctl"
KV_PREFIX = "run/"
HEAD_RESOURCE = "node:__internal_head__"  # Ray's own marker of the head node
CALL_TIMEOUT = 60.0  # an actor method that only looks or plans (node info, CPU plan, health answer)
PING_TIMEOUT = 20.0  # all of a run's actors answering whether their process lives
RAY_HINT = ("install Ray next to kvctl, the same version as the cluster's: pip install 'kvctl[ray]' "
            "(or pip install ray==<the cluster's version>)")
_connected: dict[str, str] = {}  # the address this process connected to -> the cluster's GCS address


class RayFleetError(KvctlError):
    """The cluster could not be reached, or answered something kvctl cannot act on."""


# -- connecting ---------------------------------------------------------------------------------
def connect(address: str) -> str:
    """Connect this process to the cluster at `address` (HOST:PORT of its GCS, `auto` for the running
    one, as Ray's own `ray.init(address=...)`); returns the cluster's GCS address. Once per process."""
    if address in _connected:
        return _connected[address]
    if address != "auto" and "://" not in address:
        host, port = _split(address)
        _check_reachable(host, port, address)
        if _loopback(host):
            # Ray turns a loopback address into this machine's outward IP before connecting (its
            # resolve_ip_for_localhost), where a cluster started on 127.0.0.1 does not listen. This is
            # the switch Ray has for loopback-only clusters (named for Windows and macOS, where it is
            # the default); read when Ray is imported, which has not happened yet in this process.
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        import ray
    except ImportError:
        raise UsageError("--ray needs Ray, which is not installed for this Python", RAY_HINT) from None
    if ray.is_initialized():
        ray.shutdown()
        _connected.clear()
    try:
        ray.init(address=address, namespace=NAMESPACE, logging_level=logging.ERROR, log_to_driver=False)
    except Exception as exc:  # noqa: BLE001 - ConnectionError, version mismatch (RuntimeError), bad address
        raise RayFleetError(f"cannot connect to the Ray cluster at {address}: {type(exc).__name__}: {exc}",
                            "give the head's address HOST:PORT (its GCS port, 6379 by default; what `ray status` "
                            "uses), or auto on a node of the running cluster") from None
    gcs = str(ray.get_runtime_context().gcs_address)
    _connected[address] = _connected[gcs] = gcs
    return gcs


def _split(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--ray {address}: not HOST:PORT",
                         "give the Ray head's GCS address, e.g. 10.0.0.5:6379, or auto for the running cluster")
    return host.strip("[]"), int(port)


def _check_reachable(host: str, port: int, address: str, timeout: float = 5.0) -> None:
    """Fail fast: Ray itself keeps retrying an unreachable GCS for minutes."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        raise RayFleetError(f"the Ray cluster at {address} is unreachable ({exc})",
                            "start it (ray start --head), or check the address (the head's GCS port)") from None


def _loopback(host: str) -> bool:
    from kvctl.serve.vllm_launch import is_loopback

    return is_loopback(host)


# -- nodes ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Node:
    id: str
    ip: str  # NodeManagerAddress: the address other nodes reach it at
    head: bool = False
    gpus: int = 0
    resources: dict[str, float] = field(default_factory=dict)

    @property
    def short(self) -> str:
        return f"{self.ip} ({self.id[:8]}{', head' if self.head else ''})"


def nodes() -> list[Node]:
    """The cluster's alive nodes (needs connect())."""
    import ray

    out = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        res = {k: float(v) for k, v in (n.get("Resources") or {}).items()}
        out.append(Node(n["NodeID"], n["NodeManagerAddress"], HEAD_RESOURCE in res, int(res.get("GPU", 0)), res))
    return out


# -- the run record in the cluster ----------------------------------------------------------------
def _key(name: str) -> bytes:
    return f"{KV_PREFIX}{name}".encode()


def kv_put(record: RunRecord) -> None:
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(_key(record.name), json.dumps(record.to_dict()).encode(), overwrite=True,
                                 namespace=NAMESPACE)


def kv_get(name: str) -> RunRecord | None:
    from ray.experimental import internal_kv

    data = internal_kv._internal_kv_get(_key(name), namespace=NAMESPACE)
    return None if data is None else _parse(name, data)


def kv_list() -> list[RunRecord]:
    from ray.experimental import internal_kv

    out = []
    for key in sorted(internal_kv._internal_kv_list(KV_PREFIX, namespace=NAMESPACE) or []):
        name = key.decode()[len(KV_PREFIX):]
        data = internal_kv._internal_kv_get(key, namespace=NAMESPACE)
        if data is not None:
            out.append(_parse(name, data))
    return out


def kv_delete(name: str) -> None:
    from ray.experimental import internal_kv

    internal_kv._internal_kv_del(_key(name), namespace=NAMESPACE)


def _parse(name: str, data: bytes) -> RunRecord:
    try:
        return RunRecord.from_dict(json.loads(data))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise RayFleetError(f"the cluster's record of run '{name}' is not a kvctl run record ({exc})",
                            f"remove it: kvctl rm --ray ADDRESS {name}") from None


def save(record: RunRecord) -> None:
    """Write the record where it lives: the local run folder (when this machine has it) and the cluster."""
    if record.dir:
        record.save()
    if record.ray is not None:
        connect(record.ray["address"])
        kv_put(record)


def load(address: str, name: str, state_dir: str | Path | None = None) -> RunRecord:
    """The run as the cluster records it (connects); the local record when the cluster has none (a
    cluster restarted since). A record from the cluster that this machine did not start has no local
    folder here (dir ""), and its supervisor, a process on another machine, is left out."""
    runs.check_name(name)
    gcs = connect(address)
    remote = kv_get(name)
    local = _local(name, state_dir)
    if remote is None:
        if local is not None and local.ray is not None:
            return local
        known = ", ".join(r.name for r in kv_list()) or "none"
        raise UsageError(f"no run named '{name}' in the Ray cluster at {gcs}",
                         f"runs there: {known} (kvctl runs --ray {address})")
    if local is None or local.created != remote.created:
        remote.dir, remote.supervisor = "", None
    else:
        remote.dir = local.dir
    return remote


def _local(name: str, state_dir: str | Path | None) -> RunRecord | None:
    try:
        return runs.read(runs.runs_dir(state_dir) / name)
    except UsageError:
        return None


# -- liveness -------------------------------------------------------------------------------------
def members(record: RunRecord) -> list[tuple[str, ProcessRef | None, dict[str, str] | None]]:
    """(actor name, process, node) of every process the run started, in stop order (replicas first)."""
    out = [(r.actor, r.process, r.node) for r in record.replicas if r.actor]
    m = record.master
    if m is not None and m.embedded and m.actor:
        out.append((m.actor, m.process, m.node))
    return out


def liveness(record: RunRecord) -> Callable[[ProcessRef], bool]:
    """How to tell whether one of the run's processes lives: pid and start time on this machine for a
    local run; for a Ray run, its actor's answer (it checks the same on its node). Asks all at once. An
    external run has no actor of kvctl's: only its writer's pid, on its host (runs.live_processes)."""
    if record.ray is None or record.external:
        return procs.is_ours
    connect(record.ray["address"])
    import ray

    asked, handles = {}, []
    for name, ref, _ in members(record):
        if ref is None:
            continue
        try:
            handle = ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:  # no such actor (any more)
            continue
        handles.append(handle)  # held while its call is out (older Rays lose a call on a dropped handle)
        asked[ref] = handle.ping.remote()
    if asked:
        ray.wait(list(asked.values()), num_returns=len(asked), timeout=PING_TIMEOUT)
    alive = set()
    for ref, answer in asked.items():
        try:
            pong = ray.get(answer, timeout=0.1)
        except Exception:  # noqa: BLE001 - the actor died meanwhile, or does not answer: not alive for us
            continue
        if pong.get("alive") and pong.get("pid") == ref.pid:
            alive.add(ref)
    return alive.__contains__


def run_actors(name: str) -> list[str]:
    """Named actors of the run that Ray still knows (alive, starting or restarting) in namespace kvctl."""
    import ray

    prefix = f"{name}/"
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a["namespace"] == NAMESPACE and a["name"].startswith(prefix))


# -- stopping ---------------------------------------------------------------------------------------
def stop_processes(record: RunRecord, grace: float = 10.0,
                   on_event: Callable[..., None] | None = None) -> list[tuple[str, str]]:
    """Stop every process and actor of the run, and nothing else: each actor stops its process (SIGTERM,
    SIGKILL after `grace`) and is killed; any actor named `<run>/...` that the record does not know
    yet (an interrupted start) is killed too, which ends its process (kvctl.serve.ray_actors). Then a
    task on each node stops whatever recorded process is still there (pid AND start time) and reports.
    Raises RayFleetError if an actor of the run is still known to Ray after that."""
    emit = on_event or (lambda *a, **k: None)
    assert record.ray is not None
    if record.external:  # kvctl stops only what it started (kvctl.serve.lifecycle.refuse_external)
        raise UsageError(f"run '{record.name}' was started by {record.owner}, not by kvctl: kvctl signals none "
                         "of its processes", f"stop the {record.owner} job itself")
    connect(record.ray["address"])
    import ray

    recorded = members(record)
    names = list(dict.fromkeys([n for n, _, _ in recorded] + run_actors(record.name)))
    handles = {}
    for name in names:
        try:
            handles[name] = ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            continue
    stops = {name: h.stop.remote(grace) for name, h in handles.items()}
    if stops:
        ray.wait(list(stops.values()), num_returns=len(stops), timeout=grace + 30)
    said: dict[str, str] = {}
    for name, answer in stops.items():
        try:
            said[name] = ray.get(answer, timeout=0.1)
        except Exception as exc:  # noqa: BLE001 - a dead or stuck actor: the kill and the sweep follow
            said[name] = f"actor failed ({type(exc).__name__})"
    for handle in handles.values():
        ray.kill(handle, no_restart=True)
    swept = _sweep(recorded, grace)
    results = []
    for name, ref, _ in recorded:
        if ref is None:
            continue
        # the actor's own answer, unless the sweep found the process still there (or could not look)
        answer, found = said.get(name), swept.get(ref, "not checked")
        result = answer if answer in procs.STOP_RESULTS and found == "not running" else found
        results.append((ref.name, result))
        emit("stopped", name=ref.name, result=result)
    left = _wait_actors_gone(record.name)
    if left:
        raise RayFleetError(f"actor(s) of run {record.name} still alive after ray.kill: {', '.join(left)}",
                            "check them with `ray list actors --filter namespace=kvctl`; run kvctl stop again")
    return results


def _sweep(recorded: list[tuple[str, ProcessRef | None, dict[str, str] | None]], grace: float) -> dict[ProcessRef, str]:
    """On each node that still lives, stop the recorded processes that are still there (a process whose
    actor died without taking it along) and say what each was: stopped, killed, not running."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from kvctl.serve.ray_actors import reap

    alive_nodes = {n.id for n in nodes()}
    by_node: dict[str, list[ProcessRef]] = {}
    out: dict[ProcessRef, str] = {}
    for _, ref, node in recorded:
        if ref is None or node is None:
            continue
        if node.get("id") in alive_nodes:
            by_node.setdefault(node["id"], []).append(ref)
        else:
            out[ref] = "node gone"
    tasks = {node: reap.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
             .remote([r.to_dict() for r in refs], grace) for node, refs in by_node.items()}
    for node, task in tasks.items():
        try:
            answers = ray.get(task, timeout=grace + 60)
        except Exception as exc:  # noqa: BLE001
            answers = [f"not checked ({type(exc).__name__})"] * len(by_node[node])
        out.update(zip(by_node[node], answers))
    return out


def _wait_actors_gone(name: str, timeout: float = 30.0) -> list[str]:
    deadline = time.monotonic() + timeout
    left = run_actors(name)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = run_actors(name)
    return left


# -- listing and removal --------------------------------------------------------------------------
def summaries(address: str, state_dir: str | Path | None = None) -> tuple[str, list[runs.RunSummary]]:
    """The runs the cluster records, each checked by its actors, newest first (`kvctl runs --ray`)."""
    gcs = connect(address)
    out = []
    for record in kv_list():
        local = _local(record.name, state_dir)
        folder = runs.runs_dir(state_dir) / record.name if local and local.created == record.created else None
        if folder is None:
            record.dir, record.supervisor = "", None  # started elsewhere: no folder here (as load() says)
        out.append(runs.summarize(record, folder, alive=liveness(record)))
    return gcs, sorted(out, key=lambda s: (-(s.created or 0.0), s.name))


def forget(record: RunRecord) -> None:
    """Delete the cluster's copy of this run's record (not a later run's under the same name)."""
    assert record.ray is not None
    connect(record.ray["address"])
    current = kv_get(record.name)
    if current is not None and current.created == record.created:
        kv_delete(record.name)


def remove(address: str, names: list[str], state_dir: str | Path | None = None, *, force: bool = False,
           grace: float = 10.0, on_event: Callable[..., None] | None = None) -> list[runs.Removed]:
    """`kvctl rm --ray`: delete runs' records from the cluster, and the local folder of a run this
    machine started. All or nothing: an unknown name, or a run with a live process (unless `force`,
    which stops it first), removes none."""
    connect(address)
    names = list(dict.fromkeys(names))
    records = {n: kv_get(runs.check_name(n)) for n in names}
    unknown = [n for n, r in records.items() if r is None]
    if unknown:
        known = ", ".join(r.name for r in kv_list()) or "none"
        raise UsageError(f"no run named {', '.join(unknown)} in the Ray cluster at {address}",
                         f"runs there: {known} (kvctl runs --ray {address})")
    live = {n: runs.describe(runs.live_processes(r, liveness(r))) or ("" if r.external else ", ".join(run_actors(n)))
            for n, r in records.items() if r is not None}
    busy = [n for n, what in live.items() if what]
    external = [n for n in busy if records[n].external]  # type: ignore[union-attr]
    if external:  # never stopped by kvctl, force or not
        raise UsageError("; ".join(f"run '{n}' is recorded by a live {records[n].owner} job: {live[n]}"  # type: ignore[union-attr]
                                   for n in external), "stop that job itself, then remove its record")
    if busy and not force:
        raise UsageError("; ".join(f"run '{n}' is still running: {live[n]}" for n in busy),
                         f"kvctl stop --ray {address} {' '.join(busy)}"
                         + f" first, or kvctl rm --ray {address} --force {' '.join(names)}")
    removed = []
    for name, record in records.items():
        assert record is not None
        local = _local(name, state_dir)
        mine = local is not None and local.created == record.created
        stopped = stop_processes(record, grace, on_event) if live[name] else []
        kv_delete(name)
        base = runs.runs_dir(state_dir)
        if mine:
            with runs.locked(base):
                runs.remove_folder(runs.run_folder(base, name))
        removed.append(runs.Removed(name, str(base / name) if mine else "", record.state, stopped))
    return removed
