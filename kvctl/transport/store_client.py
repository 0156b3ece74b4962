"""Scoped removal on a Mooncake master through Mooncake's own store client, in a child process.

The master's HTTP admin API can only clear everything (`POST /api/v1/remove_all`, from Mooncake
0.3.12.post1); removing one deployment's keys (`^<cache_prefix>@`) or clearing an older master
needs the store client's `remove_by_regex` / `remove_all`, which talks to the master's RPC port.
kvctl never imports mooncake itself (the CLI stays light, and a client that hangs in setup must not
hang kvctl): `python -m kvctl.transport.store_client` runs it and prints one JSON line.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import os
import select
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from kvctl.errors import KvctlError
from kvctl.transport.addresses import route_address

INSTALL_HINT = ("install Mooncake's store client next to kvctl: pip install 'kvctl[mooncake-cpu]' (the wheel for this "
                "machine's CUDA instead where kvctl shares a GPU environment: kvctl[mooncake-cuda12] or [mooncake-cuda13])")
# A pure client: no memory contributed to the store, a small transfer buffer.
_BUFFER_BYTES = 1 << 20


class StoreClientError(KvctlError):
    """Mooncake's store client could not be run or could not remove the keys (exit code 1)."""


@dataclass(frozen=True)
class Removal:
    removed: int
    seconds: float


def available() -> bool:
    """Is Mooncake's Python store client importable here (without importing it)?"""
    try:
        package = importlib.util.find_spec("mooncake")  # a top-level lookup executes nothing
        if package is None or not package.submodule_search_locations:
            return False
        # find_spec("mooncake.store") would import the package (13 ms: its buffer pool); look in its folder
        locations = list(package.submodule_search_locations)
        return importlib.machinery.PathFinder.find_spec("mooncake.store", locations) is not None
    except (ImportError, ValueError):
        return False


def remove_matching(rpc_address: str, pattern: str | None, timeout: float,
                    session: StoreSession | None = None) -> Removal:
    """Remove every key matching `pattern` (a regex; None: every key), forced (leases and
    replication tasks are skipped, as kvctl's HTTP clear does). StoreClientError when it fails.
    Through `session` when one is open for this master (started ahead, see StoreSession), else a
    child process of its own."""
    if session is not None and session.alive and session.rpc_address == rpc_address:
        return session.remove(pattern, timeout)
    command = _command(rpc_address)
    if pattern is not None:
        command += ["--regex", pattern]
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=_env(), check=False)
    except subprocess.TimeoutExpired:
        raise StoreClientError(f"Mooncake's store client did not finish within {timeout:g}s "
                               f"against the master at {rpc_address}",
                               "check that the address is the master's RPC port (not its admin "
                               "port) and that the master is up") from None
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    try:
        answer = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        answer = {}
    if run.returncode != 0:
        answer.pop("removed", None)
    return _removal(answer, rpc_address, run.stderr)


class StoreSession:
    """Mooncake's store client in a child process started, and connected to the master, before it is
    needed: a reset starts it before it pauses the fleet, since the start (interpreter, import, setup())
    takes ~0.4 s, most of a scoped clear, and a paused fleet serves nothing meanwhile. Removals are then
    sent one JSON line at a time; close() ends the child. Not thread-safe: one removal at a time."""

    def __init__(self, rpc_address: str, timeout: float = 30.0, *, wait: bool = True) -> None:
        """`wait`: until connected (StoreClientError if not within `timeout`); False: only started, for
        a caller that waits in short steps (ready_within) so that it can give up at any moment (kill)."""
        self.rpc_address = rpc_address
        self._deadline = time.monotonic() + timeout
        self._proc = subprocess.Popen(_command(rpc_address) + ["--serve"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=_env(), text=True)
        if wait:
            while not self.ready_within(timeout):
                pass

    def ready_within(self, seconds: float) -> bool:
        """True once connected; False when not yet after `seconds` (at most); StoreClientError (the child
        ended) when it failed or the start's timeout has passed."""
        assert self._proc.stdout is not None
        left = self._deadline - time.monotonic()
        if left > 0 and not select.select([self._proc.stdout], [], [], min(seconds, left))[0]:
            if time.monotonic() < self._deadline:
                return False
        answer = self._answer(0)
        if not answer.get("ready"):
            self.close()
            raise StoreClientError(f"Mooncake's store client could not connect to the master at {self.rpc_address}: "
                                   f"{answer.get('error', 'no answer')}", answer.get("hint") or INSTALL_HINT)
        return True

    def kill(self) -> None:
        """End the child now (a start given up)."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def remove(self, pattern: str | None, timeout: float) -> Removal:
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(json.dumps({"regex": pattern}) + "\n")
            self._proc.stdin.flush()
        except OSError as exc:
            raise StoreClientError(f"Mooncake's store client for {self.rpc_address} is gone ({exc})") from None
        return _removal(self._answer(timeout), self.rpc_address, "")

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                assert self._proc.stdin is not None
                self._proc.stdin.close()  # the child exits at the end of its input
                self._proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()

    def _answer(self, timeout: float) -> dict[str, Any]:
        """The child's next JSON line; {} (and the child killed) when none comes within `timeout`."""
        assert self._proc.stdout is not None
        ready, _, _ = select.select([self._proc.stdout], [], [], timeout)
        line = self._proc.stdout.readline() if ready else ""
        if not line:
            self._proc.kill()
            self._proc.wait()
            return {}
        try:
            answer = json.loads(line)
        except json.JSONDecodeError:
            return {"error": line.strip()[:200]}
        return answer if isinstance(answer, dict) else {}


def _command(rpc_address: str) -> list[str]:
    return [sys.executable, "-m", "kvctl.transport.store_client", "--master", rpc_address, "--force"]


def _env() -> dict[str, str]:
    return {**os.environ, "MC_LOG_LEVEL": os.environ.get("MC_LOG_LEVEL", "ERROR"),
            # setup() against a dead master retries for ~90 s: once is enough, the caller retries
            "MC_STORE_CLIENT_SETUP_RETRIES": os.environ.get("MC_STORE_CLIENT_SETUP_RETRIES", "1")}


def _removal(answer: dict[str, Any], rpc_address: str, stderr: str) -> Removal:
    if "removed" not in answer:
        detail = answer.get("error") or (stderr.strip().splitlines() or ["no answer"])[-1]
        raise StoreClientError(f"Mooncake's store client could not clear the master at {rpc_address}: {detail}",
                               answer.get("hint") or INSTALL_HINT)
    return Removal(int(answer["removed"]), float(answer.get("seconds", 0.0)))


def _local_hostname(master_host: str) -> str:
    """The address this host uses toward the master (loopback for a loopback master)."""
    return route_address(master_host)


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvctl.transport.store_client")
    parser.add_argument("--master", required=True, help="the master's RPC address, host:port")
    parser.add_argument("--regex", help="remove keys matching this regex (default: every key)")
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--serve", action="store_true",
                        help='answer {"ready": true}, then one removal per JSON line on stdin ({"regex": R|null})')
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as exc:
        print(json.dumps({"error": f"cannot import mooncake.store: {exc}", "hint": INSTALL_HINT}))
        return 1
    client = MooncakeDistributedStore()
    host = args.master.rpartition(":")[0].strip("[]")
    code = client.setup(_local_hostname(host), "P2PHANDSHAKE", 0, _BUFFER_BYTES, "tcp", "", args.master)
    if code != 0:
        print(json.dumps({"error": f"setup against {args.master} returned {code}",
                          "hint": "check the master's RPC address and that it is up"}))
        return 1
    if args.serve:
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:  # until the parent closes our input
            started = time.perf_counter()
            try:
                regex = json.loads(line).get("regex")
            except (json.JSONDecodeError, AttributeError):
                print(json.dumps({"error": f"not a request: {line.strip()[:100]}"}), flush=True)
                continue
            print(json.dumps(_remove_once(client, regex, args.force, started)), flush=True)
        sys.stderr.flush()
        os._exit(0)
    answer = _remove_once(client, args.regex, args.force, started)
    error = answer.get("error")
    print(json.dumps(answer), flush=True)
    # No close(): it waits ~1 s on the client's own threads (measured: 1.0 of the child's 1.06 s)
    # and has nothing to give back. A pure client mounts no segment and the master does not count
    # it (master_active_clients stays 0); the removal above is a finished, synchronous RPC.
    sys.stderr.flush()
    os._exit(1 if error else 0)


def _remove_once(client: Any, regex: str | None, force: bool, started: float) -> dict[str, Any]:
    """One removal, as the JSON line the parent reads."""
    try:
        removed = client.remove_by_regex(regex, force) if regex is not None else client.remove_all(force)
    except Exception as exc:  # noqa: BLE001 - reported as the one JSON line the parent reads
        return {"error": f"{type(exc).__name__}: {exc}"}
    if removed < 0:
        return {"error": f"the master answered error code {removed}"}
    return {"removed": removed, "seconds": round(time.perf_counter() - started, 3)}


if __name__ == "__main__":
    sys.exit(_main())
