"""The Ray side of `kvctl serve --ray`: one actor per process, on the node kvctl chose for it.

A `ProcessActor` is created named (`<run>/master`, `<run>/r0`, ...), detached and in the namespace
`kvctl` by kvctl.serve.ray_start. On its node it picks a free port, writes the rendered config it is
given (as text) into a node-local run folder, and starts its process (the Mooncake master, or a
vLLM replica through kvctl.serve.vllm_launch, as `kvctl serve` does locally) in its own session, tied to
the actor's life: when the actor dies, even by `ray.kill`, a replica gets SIGTERM and stops its
whole tree (KEEPER says how), and the master ends too. `stop()` stops the process tree gracefully
(kvctl.serve.procs.stop); kvctl then kills the actor.

The actor asks Ray for no CPU (num_cpus=0): it only waits, and the vLLM process it starts is not
Ray-scheduled work, so reserving Ray's CPU slots for it would only keep other tasks off the node
(kvctl gives CPU replicas their cores itself, VLLM_CPU_OMP_THREADS_BIND). GPU replicas do reserve
their GPUs (num_gpus = GPUs per replica, kvctl.serve.parallel): Ray sets CUDA_VISIBLE_DEVICES for the actor, the
replica inherits it, and Ray gives those GPUs to nothing else.

This module imports Ray: only Ray workers and `kvctl ... --ray` import it. kvctl must be installed
on every node, in the Python that Ray runs there.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import ray

from kvctl.serve import cpu_binding, gpus, procs, runs
from kvctl.serve.ports import free_port
from kvctl.serve.procs import ProcessRef
from kvctl.serve.spec import ServeError

NODE_DIR = "ray-runs"  # <node's kvctl state dir>/ray-runs/<run>/<start>/<process>/: config, log, private dirs
KEEPER_START_TIMEOUT = 30.0
# A replica runs under a small keeper process, the actor's only child. When a Ray worker dies, Ray
# SIGKILLs its children (kill_child_processes_on_worker_exit): a vLLM API server killed so has no
# time to stop its engine processes, which live on as orphans. Ray kills the keeper instead, and the
# server, the keeper's child, gets SIGTERM from its parent-death signal and stops its whole tree.
# The keeper itself dies with the actor even where Ray does not kill children. It writes the
# server's pid to a file and exits with the server.
KEEPER = r"""
import ctypes, os, signal, subprocess, sys
pidfile, command = sys.argv[1], sys.argv[2:]
prctl = ctypes.CDLL(None, use_errno=True).prctl
prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: the keeper dies with the actor
if os.getppid() != int(os.environ.pop("KVCTL_KEEPER_PARENT")):
    sys.exit(1)  # the actor died before prctl
keeper = os.getpid()
def arm():
    prctl(1, signal.SIGTERM, 0, 0, 0)  # the server: SIGTERM when the keeper dies
    if os.getppid() != keeper:
        os._exit(1)
server = subprocess.Popen(command, start_new_session=True, preexec_fn=arm)
with open(pidfile + ".tmp", "w") as out:
    out.write(str(server.pid))
os.replace(pidfile + ".tmp", pidfile)
sys.exit(server.wait())
"""


def node_folder(run: str, stamp: str, name: str) -> Path:
    return runs.state_dir() / NODE_DIR / run / stamp / name


def host_id() -> str:
    """This machine, as opposed to this Ray node (several nodes can share a machine): hostname and boot."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


@ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0, concurrency_groups={"ping": 1})
class ProcessActor:
    """Starts one process on this node, answers for it, and stops it. Its methods run one at a time,
    except ping(), which has a thread of its own: a status check gets its answer while start waits for
    the replica's health."""

    def __init__(self, run: str, name: str, stamp: str) -> None:
        self.name = name
        self.folder = node_folder(run, stamp, name)
        self.ip = ray.util.get_node_ip_address()
        self.ref: ProcessRef | None = None
        self.proc: Any = None  # a replica's keeper process (our child; the replica is its child)
        self.master: Any = None  # MasterProcess
        self.install: Any = None  # VllmInstall
        self.port: int | None = None
        self.url: str | None = None
        self.log: Path | None = None

    def node(self) -> dict[str, str]:
        return {"id": ray.get_runtime_context().get_node_id(), "ip": self.ip, "host": host_id()}

    # -- the Mooncake master
    def start_master(self, extra_args: list[str] | None = None) -> dict[str, Any]:
        """mooncake_master bound to this node's IP on free ports, ready (its /health) when this returns."""
        from kvctl.serve.master_process import MasterProcess

        self.folder.mkdir(parents=True, exist_ok=True)
        self.log = self.folder / "mooncake_master.log"
        master = MasterProcess(host=self.ip, log_path=self.log, die_with_parent=True, extra_args=extra_args or ())

        def launched(m: MasterProcess) -> None:
            self.ref = ProcessRef(m.pid or 0, m.start_time or time.time(), "mooncake_master")

        master.on_launch = launched
        master.start()
        self.master = master
        assert self.ref is not None
        return {"rpc_address": master.rpc_address, "admin_address": master.admin_address,
                "process": self.ref.to_dict(), "log": str(self.log), "node": self.node(),
                "seconds": master.ready_seconds}

    # -- a vLLM replica
    def prepare(self, vllm_python: str | None) -> dict[str, Any]:
        """Which vLLM this node has (default: this Python's, or $KVCTL_VLLM_PYTHON here) and a free port."""
        from kvctl.serve.vllm_launch import find_vllm

        self.install = find_vllm(vllm_python)
        self.port = free_port(self.ip)
        return {"node": self.node(), "install": self.install.to_dict(), "port": self.port,
                "folder": str(self.folder)}

    def cpu_binds(self, count: int) -> dict[str, Any]:
        """VLLM_CPU_OMP_THREADS_BIND for `count` CPU replicas about to start on this machine."""
        plan = cpu_binding.plan(count, os.environ)
        return {"binds": plan.binds, "reason": plan.reason}

    def start_replica(self, model: str, kv_transfer_config: dict[str, Any], extra_args: list[str],
                      files: dict[str, str], bundle_env: dict[str, str], cpus: str | None) -> dict[str, Any]:
        """Write the config files, start the replica on this node's IP; returns at once (wait_ready waits)."""
        from kvctl.serve.vllm_launch import replica_command, replica_env

        config = self.folder / "config"
        config.mkdir(parents=True, exist_ok=True)
        for file, text in files.items():
            (config / Path(file).name).write_text(text, "utf-8")
        # shows Mooncake the address Ray knows this node by (kvctl.transport.addresses)
        env = replica_env(self.install, _node_env(), bundle_env, self.folder, self.ip, None)
        if cpus is not None:
            env[cpu_binding.BIND_ENV] = cpus
        command = replica_command(self.install, model, self.ip, self.port, kv_transfer_config, extra_args)
        self.log = self.folder / f"{self.name}.log"
        self.proc, self.ref = _start_kept(command, env, self.log, f"replica {self.name}", self.folder)
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        self.url = f"http://{host}:{self.port}"
        return {"url": self.url, "port": self.port, "process": self.ref.to_dict(), "log": str(self.log),
                "node": self.node(), "gpu": None if self.install.cpu else gpus.normalized(env.get(gpus.VISIBLE_ENV)),
                "cpus": env.get(cpu_binding.BIND_ENV) if self.install.cpu else None}

    def wait_ready(self, timeout: float) -> dict[str, Any]:
        """Poll the replica's /health until 200; fails at once if it exits (with the tail of its log)."""
        import httpx

        began = time.monotonic()
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            while True:
                if self.ref is None or not procs.is_ours(self.ref):
                    return {"ok": False, "error": f"replica {self.name} ({self.url}, node {self.ip}) exited while "
                                                  f"starting; log {self.log} there:\n" + procs.tail(self.log or Path())}
                try:
                    if client.get(f"{self.url}/health").status_code == 200:
                        return {"ok": True, "seconds": time.monotonic() - began}
                except httpx.HTTPError:
                    pass
                if time.monotonic() - began > timeout:
                    return {"ok": False, "error": f"replica {self.name} ({self.url}) not healthy within "
                                                  f"{timeout:g} s; log {self.log} on node {self.ip}"}
                time.sleep(0.5)

    # -- for every kind
    @ray.method(concurrency_group="ping")
    def ping(self) -> dict[str, Any]:
        """Is the process this actor started still the one running (pid AND start time, on this node)?"""
        if self.ref is None:
            return {"alive": False, "pid": None}
        if self.proc is not None:
            procs.reap(self.proc)  # an exited keeper stays a zombie until we collect it
        return {"alive": procs.is_ours(self.ref), "pid": self.ref.pid}

    def stop(self, grace: float = 10.0) -> str:
        """SIGTERM, SIGKILL to the tree after `grace`; then kvctl kills this actor."""
        if self.ref is None:
            return "not running"
        result = procs.stop(self.ref, grace)
        if self.proc is not None:  # a replica's keeper exits with it
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self.master is not None:
            self.master.stop(0)  # closes its log file; the process is gone already
        return result


def _node_env() -> dict[str, str]:
    """The environment a replica starts from: this worker's (with the CUDA_VISIBLE_DEVICES Ray gave a GPU
    actor), less the OMP_NUM_THREADS=1 Ray sets for a worker that asked for no CPU (kept when the
    node's own environment, the raylet's, sets it)."""
    import psutil

    env = dict(os.environ)
    try:
        node = psutil.Process(int(env["RAY_RAYLET_PID"])).environ()
    except (KeyError, ValueError, psutil.Error):
        return env
    if "OMP_NUM_THREADS" in env and "OMP_NUM_THREADS" not in node:
        del env["OMP_NUM_THREADS"]
    return env


def _start_kept(command: list[str], env: dict[str, str], log: Path, name: str,
                cwd: Path) -> tuple[subprocess.Popen[bytes], ProcessRef]:
    """Start `command` (in its own session, output appended to `log`) under a keeper process (KEEPER);
    returns the keeper and the server's ProcessRef."""
    pidfile = cwd / "server.pid"
    pidfile.unlink(missing_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        keeper = procs.popen([sys.executable, "-c", KEEPER, str(pidfile), *command], stdin=subprocess.DEVNULL,
                             stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                             env={**env, "KVCTL_KEEPER_PARENT": str(os.getpid())})
    deadline = time.monotonic() + KEEPER_START_TIMEOUT
    while not pidfile.exists():
        if keeper.poll() is not None or time.monotonic() > deadline:
            keeper.kill()
            keeper.wait()
            raise ServeError(f"could not start {name}: its keeper process exited (code {keeper.returncode}); "
                             f"log {log}:\n" + procs.tail(log))
        time.sleep(0.02)
    pid = int(pidfile.read_text())
    return keeper, ProcessRef(pid, procs.start_time_of(pid) or time.time(), name)


@ray.remote(num_cpus=0, max_retries=0)
def reap(refs: list[dict[str, Any]], grace: float) -> list[str]:
    """On one node: stop each of these processes that is still there (pid AND start time), and say
    what it was (kvctl.serve.procs.stop's answer: stopped, killed, not running, not ours)."""
    return [procs.stop(ProcessRef(int(r["pid"]), float(r["start_time"]), str(r["name"])), grace) for r in refs]
