"""The live rollout servers of a verl job, recorded as a kvctl run so that the CLI finds them.

verl binds each server to port 0 (a new port every run) and keeps its server actors non-detached
in an anonymous Ray namespace: nothing outside the job can look them up. So the hook writes what
it acts on, rebuilt after every weight update (verl adds and removes replicas), as a run record
kvctl did NOT start (`owner: "verl"`): `kvctl status|probe|reset --run verl-NAME` reach the
servers from a shell on any node (local state dir: share it with KVCTL_STATE_DIR on a shared file
system; or, under Ray, `--ray ADDRESS`: the same record in the cluster's key-value store), while
`kvctl stop` and `kvctl rm` refuse to signal anything of it (kvctl.serve.lifecycle).

Never raises into the trainer: a record that cannot be written is logged once and left.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvctl._version import __version__
from kvctl.errors import KvctlError
from kvctl.serve import procs, runs
from kvctl.serve.runs import MasterRecord, ReplicaRecord, RunRecord

log = logging.getLogger("kvctl.integrations.verl")
OWNER = "verl"


@dataclass(frozen=True)
class ReplicaView:
    """What the hook needs of one of verl's rollout replicas (verl/workers/rollout/replica.py)."""

    url: str  # http://HOST:PORT of its HTTP server (RolloutReplica.server_address, replica.py:247)
    name: str
    data_parallel_size: int = 1  # rollout.data_parallel_size: engines behind that one server


def replica_views(manager: Any, label: str) -> list[Any]:
    """A verl CheckpointEngineManager's replicas (its `replicas`, verl/checkpoint_engine/base.py:420)
    as the hook sees them; a replica whose server has no address yet is left out."""
    out, names = [], set()
    for replica in list(getattr(manager, "replicas", None) or []):
        address = getattr(replica, "server_address", None)  # "host:port" or "[v6]:port" (replica.py:247)
        if not address:
            continue
        rank = getattr(replica, "replica_rank", None)
        name = f"{label or 'rollout'}-{rank}" if rank is not None else address
        if name in names:
            name = address
        names.add(name)
        config = getattr(replica, "config", None)
        dp = int(getattr(config, "data_parallel_size", 1) or 1)
        out.append(ReplicaView(f"http://{address}", name, dp))
    return out


def run_name(experiment: str | None) -> str:
    """verl-<experiment_name>, made a usable run name (kvctl.serve.runs.check_name)."""
    tail = re.sub(r"[^A-Za-z0-9._-]+", "-", experiment or "").strip("-._") or "job"
    return f"verl-{tail}"[:64]


class ServerRecorder:
    """Writes the record of one verl job's servers (see the module docstring)."""

    def __init__(self, name: str, *, state_dir: str | None = None, trainer: str = "", model: str = "",
                 experiment: str = "") -> None:
        self.name = runs.check_name(name)
        self.state_dir = state_dir
        self.trainer, self.model, self.experiment = trainer, model, experiment
        self.created = time.time()
        self.folder: Path | None = None  # claimed on the first write
        self.local, self.cluster = True, True  # False once refused or failed (said once)
        me = os.getpid()
        self.supervisor = procs.ProcessRef(me, procs.start_time_of(me) or self.created, "verl trainer")

    def build(self, hook: Any, state: str = "running", error: str | None = None) -> RunRecord:
        replicas = []
        for label, manager in hook.fleets.items():
            for view in replica_views(manager, label):
                port = int(view.url.rsplit(":", 1)[1])
                replicas.append(ReplicaRecord(view.name, view.url, port))
        master = None
        if hook.master:
            master = MasterRecord(embedded=False, rpc_address=hook.master_rpc or "", admin_address=hook.master)
        ray = _ray_cluster()
        return RunRecord(
            name=self.name, dir=str(self.folder or ""), state=state, created=self.created, template="",
            parameters={"trainer": self.trainer, "experiment": self.experiment, "step": hook.step,
                        "updated": time.time(), "policy": hook.policy, "mode": hook.mode},
            model=self.model, host=socket.gethostname(), vllm={}, master=master, replicas=replicas,
            kvctl_version=__version__, error=error, supervisor=self.supervisor,
            ray={"address": ray, "namespace": "kvctl"} if ray else None, owner=OWNER)

    def write(self, hook: Any, state: str = "running", error: str | None = None) -> None:
        record = self.build(hook, state, error)
        if self.local:
            try:
                self._write_local(record)
            except (OSError, KvctlError) as exc:
                self.local = False
                log.warning("kvctl: the servers of this job are not recorded in %s: %s",
                            runs.runs_dir(self.state_dir), exc)
        if self.cluster and record.ray:
            try:
                from kvctl.serve import ray_fleet

                ray_fleet.kv_put(record)  # never ray_fleet.connect(): it would re-init this job's Ray
            except Exception as exc:  # noqa: BLE001 - the record is a convenience; the run goes on
                self.cluster = False
                log.warning("kvctl: the servers of this job are not recorded in the Ray cluster: %s", exc)

    def _write_local(self, record: RunRecord) -> None:
        if self.folder is None:
            base = runs.runs_dir(self.state_dir)
            folder = runs.run_folder(base, self.name)
            with runs.locked(base):
                old = runs.read(folder)
                if old is not None and old.created != self.created:
                    live = runs.live_processes(old)
                    if live:
                        raise KvctlError(f"run '{self.name}' there is live ({runs.describe(live)})",
                                         "name this job's record otherwise: KVCTL_VERL_RUN=NAME")
                    runs.archive(folder, runs.stamp(old.created))
                self.folder = folder
                record.dir = str(folder)
                record.save()
            log.info("kvctl: the rollout servers of this job are recorded as run %s (kvctl status --run %s)",
                     self.name, self.name)
            return
        record.save()


def _ray_cluster() -> str | None:
    """The GCS address of the Ray cluster this process belongs to (None: not under Ray). Never
    imports Ray: a verl trainer under Ray has it imported already."""
    ray = sys.modules.get("ray")
    try:
        if ray is None or not ray.is_initialized():
            return None
        return str(ray.get_runtime_context().gcs_address)
    except Exception:  # noqa: BLE001
        return None


__all__ = ["OWNER", "ReplicaView", "ServerRecorder", "replica_views", "run_name"]
