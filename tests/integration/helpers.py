"""Helpers for the integration tests: Mooncake detection, a real store client process, sync calls."""

from __future__ import annotations

import asyncio
import ctypes
import importlib.util
import os
import select
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from kvctl.serve.master_process import INSTALL_HINT, find_master_executable
from kvctl.transport.master_admin import MasterAdmin, MasterError

T = TypeVar("T")

WRITER_SCRIPT = Path(__file__).with_name("store_writer.py")
SYSTEM_LIBS = ("libibverbs.so.1", "libnuma.so.1", "libcurl.so.4")
# Long enough that a key read during a test keeps its lease for the whole session.
LEASE_TTL = "60s"
WRITER_ENV = {"MC_LOG_LEVEL": "ERROR", "MC_TCP_BIND_ADDRESS": "127.0.0.1",
              "MC_STORE_CLIENT_SETUP_RETRIES": "1"}


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def mooncake_missing() -> str | None:
    """Why a real master and store client cannot run here, or None."""
    problems = []
    try:
        find_master_executable()
    except MasterError as exc:
        problems.append(exc.message)
    if importlib.util.find_spec("mooncake") is None:
        problems.append("the mooncake Python package is not installed")
    for lib in SYSTEM_LIBS:
        try:
            ctypes.CDLL(lib)
        except OSError:
            problems.append(f"system library {lib} is missing")
    return "; ".join(problems) or None


def require_mooncake() -> None:
    reason = mooncake_missing()
    if reason is None:
        return
    message = (f"real Mooncake needed: {reason}. Install: {INSTALL_HINT} "
               "(`make test` installs the Python package via the `test` extra; .ci/run installs "
               "the system libraries)")
    if in_ci():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(coro)  # type: ignore[arg-type]


def admin_call(address: str, method: str, *args: Any, timeout: float = 5.0, **kwargs: Any) -> Any:
    """Call one MasterAdmin method synchronously (a fresh client per call)."""
    async def go() -> Any:
        async with MasterAdmin(address, timeout=timeout) as admin:
            return await getattr(admin, method)(*args, **kwargs)
    return run(go())


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


class StoreWriter:
    """A real MooncakeDistributedStore client in its own process (tests/integration/store_writer.py)."""

    def __init__(self, rpc_address: str, count: int = 0, prefix: str = "",
                 timeout: float = 30.0, tenant: str = "default") -> None:
        env = {**os.environ, **WRITER_ENV}
        self.proc = subprocess.Popen(
            [sys.executable, str(WRITER_SCRIPT), "--master", rpc_address, "--count", str(count),
             "--prefix", prefix, "--tenant", tenant],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env)
        line = self._readline(timeout)
        if not line.startswith("READY"):
            self.kill()
            raise RuntimeError(f"store writer failed: {line!r}; stderr: {self.stderr_tail()}")
        self.keys = line.split()[1:]

    def _readline(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.kill()
            raise RuntimeError(f"store writer gave no answer within {timeout}s; "
                               f"stderr: {self.stderr_tail()}")
        return self.proc.stdout.readline().strip()

    def _command(self, command: str, timeout: float = 30.0) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        answer = self._readline(timeout)
        if not answer.startswith("OK"):
            raise RuntimeError(f"store writer: {command!r} -> {answer!r}")
        return answer[2:].strip()

    def put(self, count: int, prefix: str = "") -> list[str]:
        return self._command(f"put {count} {prefix}".rstrip()).split()

    def get(self, key: str) -> None:
        """Read a key: it then holds a read lease for the master's --default_kv_lease_ttl."""
        self._command(f"get {key}")

    def stderr_tail(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None:
            return "(still running)"
        return self.proc.stderr.read()[-2000:]

    def close(self, timeout: float = 30.0) -> None:
        """SIGTERM: the writer closes its store client, which unmounts its segment at once. (After
        a SIGKILL the master keeps the dead segment until client_ttl, ~10 s, and places other
        clients' puts in it, which then fail: vLLM's saves in that window are lost.)"""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def kill(self) -> None:
        """SIGKILL (a clean close() takes ~2 s; only at the very end of the session)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
