"""Start and stop a local fleet: an embedded Mooncake master and N vLLM replicas with the connector.

`start_run()` does the error-prone parts in order (ports, configs, env, master, replicas, health)
and records everything in a run folder as it goes; on any failure, or Ctrl-C, it stops what it
started before raising. Stopping, reusing a run's name and removing a run are in kvctl.serve.lifecycle.
Nothing here prints: progress goes to an `on_event` callback.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvctl._version import __version__
from kvctl.errors import KvctlError, UsageError
from kvctl.facts.compat import layout_of
from kvctl.interrupt import deferred
from kvctl.serve import cpu_binding, procs, runs
from kvctl.serve.gpus import allocate, allocation_lock, held_by_runs
from kvctl.serve.lifecycle import claim_run, stop_run
from kvctl.serve.memory import check_host_memory, mooncake_memory
from kvctl.serve.mooncake_wheel import check_wheel
from kvctl.serve.parallel import dp_rpc_ports, parallel_layout
from kvctl.serve.ports import free_port, port_in_use
from kvctl.serve.runs import MasterRecord, ReplicaRecord, RunRecord
from kvctl.serve.spec import ServeError, ServeSpec, check_servable, check_spec, master_endpoints
from kvctl.serve.vllm_launch import VllmInstall, find_vllm, replica_command, replica_env
from kvctl.transport.addresses import advertised_address

Event = Callable[..., None]


def start_run(spec: ServeSpec, on_event: Event | None = None) -> RunRecord:
    """Start the master (embedded) and the replicas on this machine, wait until all are healthy, record
    the run. (On a Ray cluster, spec.ray: kvctl.serve.ray_start.start_ray_run.)"""
    if spec.ray is not None:
        raise UsageError("a Ray run is started by kvctl.serve.ray_start.start_ray_run")
    emit = on_event or (lambda *a, **k: None)
    check_spec(spec)
    check_servable(spec)
    if Path(spec.model).expanduser().exists():  # a local folder: absolute, since replicas run elsewhere
        spec.model = str(Path(spec.model).expanduser().resolve())
    install = find_vllm(spec.vllm_python)
    check_wheel(install)  # a GPU vLLM without the Mooncake wheel its CUDA needs: refused before anything starts
    emit("vllm", install=install)
    name = runs.check_name(spec.name or runs.new_name())
    record = RunRecord(name=name, dir=str(runs.runs_dir(spec.state_dir) / name), state="starting",
                       created=time.time(), template=spec.template, parameters={}, model=spec.model, host=spec.host,
                       vllm=install.to_dict(), master=None, kvctl_version=__version__)
    claim_run(record, replace=spec.replace, on_event=emit)  # the folder and its record exist before anything starts
    run_dir = record.path
    try:
        ports = _replica_ports(spec)
        record.master = _start_master(spec, run_dir, record, emit)
        bundle = render_config(spec, install, record, run_dir)
        _start_replicas(spec, install, bundle, ports, record, emit)
        _wait_healthy(record, spec.health_timeout, emit)
    except BaseException as exc:
        record.error = str(exc) if isinstance(exc, KvctlError) else f"{type(exc).__name__}: {exc}"
        stop_run(record, on_event=emit)
        record.state = "failed"
        record.save()
        raise
    record.state = "running"
    if not spec.foreground:
        record.supervisor = None  # nobody watches it any more: kvctl stop and rm need not wait for us
    record.save()
    return record


def _replica_ports(spec: ServeSpec) -> list[int]:
    if spec.base_port is None:
        ports: list[int] = []
        for _ in range(20 * spec.replicas + 100):  # the OS hands out free ports; a bound, not a spin
            if len(ports) == spec.replicas:
                return ports
            port = free_port(spec.host)
            if port not in ports:
                ports.append(port)
        if len(ports) == spec.replicas:
            return ports
        raise UsageError(f"found only {len(ports)} free port(s) on {spec.host} for {spec.replicas} replicas",
                         "free some ports, start fewer replicas, or give --base-port")
    ports = [spec.base_port + i for i in range(spec.replicas)]
    busy = [p for p in ports if port_in_use(spec.host, p)]
    if busy:
        raise UsageError(f"port(s) {', '.join(map(str, busy))} on {spec.host} are in use",
                         "pick another --base-port, or leave it out to use free ports")
    return ports


def _start_master(spec: ServeSpec, run_dir: Path, record: RunRecord, emit: Event) -> MasterRecord:
    from kvctl.serve.master_process import MasterProcess

    if spec.master != "embedded":
        check_master_reachable(spec.master)
        return MasterRecord(False, spec.master, master_admin_of(spec))
    emit("master_starting")
    extra: list[str] = []
    if spec.metadata == "http":
        spec.overrides.setdefault("metadata_server", f"http://{spec.host}:{(port := free_port(spec.host))}/metadata")
        extra = ["--enable_http_metadata_server=true", f"--http_metadata_server_port={port}",
                 f"--http_metadata_server_host={spec.host}"]
    master = MasterProcess(host=spec.host, log_path=run_dir / "logs" / "mooncake_master.log",
                           extra_args=extra + list(spec.master_args))
    run_dir.joinpath("logs").mkdir(mode=0o700, parents=True, exist_ok=True)

    def recorded(m: MasterProcess) -> None:  # in run.json as soon as it exists: kvctl stop finds it
        ref = procs.ProcessRef(m.pid or 0, m.start_time or time.time(), "mooncake_master")
        record.master = MasterRecord(True, m.rpc_address, m.admin_address, ref, str(m.log_path))
        record.save()

    master.on_launch = recorded
    master.start()  # stops what it launched on any exception, Ctrl-C included
    assert record.master is not None
    emit("master_ready", master=record.master, seconds=master.ready_seconds)
    return record.master


def _reads_cache_prefix(kv_transfer_config: Any, version: Any) -> bool:
    """Whether the template's connector reads kv_connector_extra_config.cache_prefix in `version`
    (True where the template names no fixed connector or the facts do not list its keys)."""
    from kvctl.facts.capabilities import table

    name = kv_transfer_config.get("kv_connector") if isinstance(kv_transfer_config, dict) else None
    if not isinstance(name, str) or "${" in name:
        return True
    keys = table().extra_config_keys(version, name)
    return keys is None or "cache_prefix" in keys


def render_config(spec: ServeSpec, install: VllmInstall, record: RunRecord, run_dir: Path) -> Any:
    """Render the template for the run (its master, cache_prefix=<run name>) into run_dir/config."""
    from kvctl.config import templates
    from kvctl.config.render import render, write_bundle

    template = templates.load(spec.template, spec.template_path)
    overrides = dict(spec.overrides)
    if "master" in template.parameters and "master" not in overrides and record.master is not None:
        overrides["master"] = record.master.rpc_address
    if "cache_prefix" in template.parameters and "cache_prefix" not in overrides \
            and _reads_cache_prefix(template.kv_transfer_config, install.version):
        # Runs sharing a master are scoped by default: a reset of this run clears only its keys. Not where
        # the connector ignores the key (MooncakeStoreConnector before 0.24.0): its keys carry no prefix,
        # the run's embedded master is its own, and a prefix kvctl set itself must not fail the start.
        overrides["cache_prefix"] = record.name
    if "local_hostname" in template.parameters and "local_hostname" not in overrides:
        # LMCache's Mooncake backend passes mooncake.json's local_hostname to the store's setup()
        overrides["local_hostname"] = advertised_address(spec.host, record.master.rpc_address if record.master else None)
    bundle_dir = run_dir / "config"
    bundle = render(template, overrides, install.version, f"{install.distribution} at {install.python}",
                    bundle_dir=bundle_dir)
    write_bundle(bundle, bundle_dir)
    record.parameters = bundle.parameters
    record.bundle = str(bundle_dir)
    record.connector = layout_of(bundle.kv_transfer_config)
    record.cache_prefix = bundle.parameters.get("cache_prefix")
    record.save()
    return bundle


def _start_replicas(spec: ServeSpec, install: VllmInstall, bundle: Any, ports: list[int], record: RunRecord,
                    emit: Event) -> None:
    base_env = dict(os.environ)
    layout = parallel_layout(spec.extra_args)
    # every worker rank (GPU or CPU) runs its own Mooncake client with its own segment and buffer
    check_host_memory(mooncake_memory(bundle.mooncake, spec.replicas, layout.gpus_per_replica))
    # what live runs hold is read, and this run's replicas recorded, under one lock: two serves at once
    # would otherwise both read the same GPUs free (issue 39)
    with allocation_lock(spec.state_dir):
        _allocate_and_spawn(spec, install, bundle, ports, record, emit, base_env, layout)


def _allocate_and_spawn(spec: ServeSpec, install: VllmInstall, bundle: Any, ports: list[int], record: RunRecord,
                        emit: Event, base_env: dict[str, str], layout: Any) -> None:
    per, dp_ports = layout.gpus_per_replica, dp_rpc_ports(layout, ports)  # a DP replica's own RPC port
    held = held_by_runs(spec.state_dir, record.name)
    # one CUDA_VISIBLE_DEVICES per GPU replica, off the GPUs live kvctl runs or other processes use
    gpus = None if install.cpu else allocate(spec.replicas, per, base_env, held)
    binds: list[str | None] = [None] * spec.replicas
    if install.cpu:  # off the cores other vLLM workers are pinned to and live runs' replicas are bound to
        cpus = cpu_binding.allowed_cpus()
        taken = cpu_binding.bound_by_other_workers(cpus) | (held.cpus & set(cpus))
        cpu_plan = cpu_binding.plan(spec.replicas, base_env, cpus, taken)
        binds = cpu_plan.binds
        emit("cpu_binding", plan=cpu_plan)
    for i, port in enumerate(ports):
        name = f"r{i}"
        gpu = gpus[i] if gpus else None
        private = record.path / "replicas" / name
        env = replica_env(install, base_env, bundle.env, private, spec.host, gpu,
                          master=record.master.rpc_address if record.master else None)
        if binds[i] is not None:
            env[cpu_binding.BIND_ENV] = binds[i]
        if i < len(spec.replica_env):
            env.update(spec.replica_env[i])
        command = replica_command(install, spec.model, spec.host, port, bundle.kv_transfer_config, spec.extra_args,
                                  dp_rpc_port=dp_ports[i])
        log = record.path / "logs" / f"{name}.log"
        with deferred():  # a signal is held until the replica is in the record that stop_run reads
            _, ref = procs.spawn(command, env, log, f"replica {name}", cwd=private)
            record.replicas.append(ReplicaRecord(name, f"http://{_url_host(spec.host)}:{port}", port, ref,
                                                 str(log), gpu, env.get(cpu_binding.BIND_ENV) if install.cpu else None))
        try:  # recorded before anything else can interrupt: stop_run must know every process
            record.save()
        except BaseException:
            procs.stop(ref, grace=0)
            raise
        emit("replica_started", replica=record.replicas[-1])


def _wait_healthy(record: RunRecord, timeout: float, emit: Event) -> None:
    """Poll every replica's /health until 200; a replica that exits fails the start at once."""
    import httpx

    deadline = time.monotonic() + timeout
    began = time.monotonic()
    pending = {r.name: r for r in record.replicas}
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        while pending:
            for name, rep in list(pending.items()):
                if rep.process is None or not procs.is_ours(rep.process):
                    raise ServeError(f"replica {name} ({rep.url}) exited while starting; log {rep.log}:\n"
                                     + procs.tail(Path(rep.log)),
                                     "read the log above (model path, port, master address, flags)")
                try:
                    ok = client.get(f"{rep.url}/health").status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok:
                    del pending[name]
                    emit("replica_healthy", replica=rep, seconds=time.monotonic() - began)
            if pending and time.monotonic() > deadline:
                names = ", ".join(pending)
                raise ServeError(f"replica(s) {names} not healthy within {timeout:g} s",
                                 "read their logs in " + str(record.path / "logs") + "; raise --health-timeout")
            if pending:
                emit("waiting", pending=list(pending), seconds=time.monotonic() - began)
                time.sleep(0.5)


def master_admin_of(spec: ServeSpec) -> str | None:
    """--master (the admin port) as the run records it: one master's admin HOST:PORT, or an HA group's,
    comma-separated."""
    if not spec.master_admin:
        return None
    parts = [p.strip() for p in spec.master_admin.replace(" ", ",").split(",") if p.strip()]
    for part in parts:
        host, _, port = part.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(f"--master {spec.master_admin}: '{part}' is not HOST:PORT",
                             "give the master's admin/metrics port, e.g. 127.0.0.1:9003 (an HA group: every "
                             "master's, comma-separated)")
    return ",".join(parts)


def check_master_reachable(master: str, timeout: float = 3.0) -> None:
    """Fail fast: vLLM itself waits ~100 s before it gives up on an unreachable master. An HA group's
    etcd endpoints: every one must answer (Mooncake's clients are given them all)."""
    for host, port in master_endpoints(master):
        try:
            with socket.create_connection((host, port), timeout=timeout):
                pass
        except OSError as exc:
            what = "etcd endpoint" if master.startswith("etcd://") else "Mooncake master"
            raise ServeError(f"the {what} at {host}:{port} is unreachable ({exc})",
                             "start it first, check --master-rpc (the master's RPC port, or etcd://HOST:PORT of an "
                             "HA group), or use --master embedded") from None


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host
