"""Processes kvctl starts, recorded by pid AND start time, so a reused pid is never signalled.

A process is started in its own session (its own process group), with its output in a log
file. Stopping sends SIGTERM to it and, after a grace period, SIGKILL to it and to every
descendant it had (vLLM's API server has engine-core children).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

START_TIME_TOLERANCE = 0.05  # seconds; psutil's create_time is rounded to clock ticks
StopResult = Literal["stopped", "killed", "not running", "not ours"]
STOP_RESULTS = ("stopped", "killed", "not running", "not ours")


@dataclass(frozen=True)
class ProcessRef:
    pid: int
    start_time: float  # psutil create_time (epoch seconds)
    name: str  # what it is to a person, e.g. "replica r0"

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def start_time_of(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def is_ours(ref: ProcessRef) -> bool:
    """Alive and the same process we started (not a later process that got the same pid)."""
    import psutil

    try:
        proc = psutil.Process(ref.pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return abs(proc.create_time() - ref.start_time) <= START_TIME_TOLERANCE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def open_log(path: Path) -> Any:
    """Append to a process log readable by its owner only (0600, its folder 0700): vLLM logs its whole
    command line, an --api-key given after `--` included."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.fchmod(fd, 0o600)  # a log left by an older kvctl keeps its mode otherwise
    return os.fdopen(fd, "ab")


def spawn(command: list[str], env: dict[str, str], log_path: Path, name: str,
          cwd: Path | None = None) -> tuple[subprocess.Popen[bytes], ProcessRef]:
    """Start `command` in its own session with stdout+stderr appended to log_path."""
    with open_log(log_path) as log:
        proc = popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                     env=env, cwd=cwd, start_new_session=True)
    started = start_time_of(proc.pid)
    return proc, ProcessRef(proc.pid, started if started is not None else time.time(), name)


def parent_death_signal(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A preexec_fn that makes the child receive `sig` when its parent dies (prctl PR_SET_PDEATHSIG,
    Linux; None elsewhere): a Mooncake master started by a Ray actor ends with the actor, however it
    dies. libc's prctl is looked up here, in the parent, so the child only calls it between fork and
    exec. (A vLLM replica needs more: kvctl.serve.ray_actors.KEEPER.)"""
    import ctypes
    import os
    import sys

    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def set_signal() -> None:
        if prctl(1, int(sig), 0, 0, 0) != 0:  # 1 = PR_SET_PDEATHSIG
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:  # the parent died before prctl: the signal would never come
            os._exit(1)

    return set_signal


def popen(command: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """subprocess.Popen that leaves no child behind when interrupted inside it: a Ctrl-C raised
    between fork and Popen's return leaves a child nobody has a handle on, so kill it."""
    before = _children()
    try:
        return subprocess.Popen(command, **kwargs)
    except BaseException:
        _kill_new_children(before)
        raise


def _children() -> set[int]:
    """PIDs of this process's direct children."""
    import psutil

    return {c.pid for c in psutil.Process().children()}


def _kill_new_children(before: set[int]) -> None:
    """Kill this process's children that were not there `before`: a launch interrupted between
    fork and Popen's return leaves a child nobody has a handle on."""
    import psutil

    for child in psutil.Process().children():
        if child.pid in before:
            continue
        try:
            child.kill()
            child.wait(5)
        except (psutil.Error, psutil.TimeoutExpired):
            continue


def stop(ref: ProcessRef, grace: float = 10.0) -> StopResult:
    """SIGTERM, wait up to `grace`, then SIGKILL the process and its descendants. Idempotent."""
    import psutil

    if not is_ours(ref):
        # the main process is gone, but what it started may live on in its process group
        orphans = _orphans(ref)
        if orphans:
            _signal_all(orphans, signal.SIGTERM)
            _, alive = psutil.wait_procs(orphans, timeout=min(grace, 5.0))
            _signal_all(alive, signal.SIGKILL)
            psutil.wait_procs(alive, timeout=5.0)
            _reap_if_zombie(ref)
            return "stopped" if not alive else "killed"
        if _reap_if_zombie(ref):
            return "not running"
        return "not running" if start_time_of(ref.pid) is None else "not ours"
    try:
        proc = psutil.Process(ref.pid)
        family = [proc] + proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return "not running"
    _signal_all(family, signal.SIGTERM, leader_only=True)
    _, alive = psutil.wait_procs([proc], timeout=grace)
    if not alive:
        # the leader is gone; children normally follow it within moments
        _, alive_children = psutil.wait_procs(family[1:], timeout=min(grace, 5.0))
        if not alive_children:
            return "stopped"
        _signal_all(alive_children, signal.SIGKILL)
        psutil.wait_procs(alive_children, timeout=5.0)
        return "killed"
    _signal_all(family, signal.SIGKILL)
    psutil.wait_procs(family, timeout=5.0)
    return "killed"


def _orphans(ref: ProcessRef) -> list:  # noqa: ANN401 - psutil.Process
    """Live processes of the session `ref` led (kvctl starts each in its own session, so the session
    id is the leader's pid), started after it: children left behind when the leader died. A process
    that merely got the leader's pid later leads a session of its own, started later too, so the
    session id alone is not proof; the start time rules out sessions older than the record."""
    import os

    import psutil

    found = []
    for proc in psutil.process_iter(["create_time"]):
        if proc.pid == ref.pid:
            continue
        try:
            if os.getsid(proc.pid) == ref.pid and (proc.info["create_time"] or 0) >= ref.start_time - START_TIME_TOLERANCE:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
        except (OSError, psutil.Error):
            continue
    return found


def _reap_if_zombie(ref: ProcessRef) -> bool:
    """Our own child that already exited (a zombie until waited for): collect it."""
    import os

    import psutil

    try:
        proc = psutil.Process(ref.pid)
        if proc.status() != psutil.STATUS_ZOMBIE or abs(proc.create_time() - ref.start_time) > START_TIME_TOLERANCE:
            return False
        os.waitpid(ref.pid, os.WNOHANG)
    except (psutil.NoSuchProcess, ChildProcessError, OSError):
        pass
    return True


def _signal_all(procs: list, sig: int, leader_only: bool = False) -> None:  # noqa: ANN001 - psutil.Process
    import psutil

    for p in procs[:1] if leader_only else procs:
        try:
            p.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


def tail(path: Path, lines: int = 25, max_chars: int = 4000) -> str:
    """The end of a log file, for error messages: its last bytes only, printable (kvctl.serve.logtext);
    a path that is not a regular file (a named pipe) is not read."""
    from kvctl.serve.logtext import NotRegularFile, open_regular, printable

    try:
        with open_regular(path) as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - max_chars * 4))  # UTF-8: at most 4 bytes a character
            data = fh.read(max_chars * 4)
    except NotRegularFile as exc:
        return f"({exc.strerror}: {path})"
    except OSError:
        return "(no log)"
    text = printable(data.decode("utf-8", "replace")).splitlines()[-lines:]
    return "\n".join(text)[-max_chars:]


def reap(proc: subprocess.Popen[bytes]) -> None:
    """Collect a child's exit status (avoid zombies) without blocking."""
    try:
        proc.poll()
    except OSError:
        pass


__all__ = ["ProcessRef", "is_ours", "reap", "spawn", "start_time_of", "stop", "tail"]
