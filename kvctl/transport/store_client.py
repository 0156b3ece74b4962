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
import subprocess
import sys
from dataclasses import dataclass

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


def remove_matching(rpc_address: str, pattern: str | None, timeout: float) -> Removal:
    """Remove every key matching `pattern` (a regex; None: every key), forced (leases and
    replication tasks are skipped, as kvctl's HTTP clear does). StoreClientError when it fails."""
    command = [sys.executable, "-m", "kvctl.transport.store_client", "--master", rpc_address, "--force"]
    if pattern is not None:
        command += ["--regex", pattern]
    env = {**os.environ, "MC_LOG_LEVEL": os.environ.get("MC_LOG_LEVEL", "ERROR"),
           # setup() against a dead master retries for ~90 s: once is enough, the caller retries
           "MC_STORE_CLIENT_SETUP_RETRIES": os.environ.get("MC_STORE_CLIENT_SETUP_RETRIES", "1")}
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env,
                             check=False)
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
    if run.returncode != 0 or "removed" not in answer:
        detail = answer.get("error") or (run.stderr.strip().splitlines() or ["no output"])[-1]
        raise StoreClientError(f"Mooncake's store client could not clear the master at "
                               f"{rpc_address}: {detail}", answer.get("hint") or INSTALL_HINT)
    return Removal(int(answer["removed"]), float(answer.get("seconds", 0.0)))


def _local_hostname(master_host: str) -> str:
    """The address this host uses toward the master (loopback for a loopback master)."""
    return route_address(master_host)


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvctl.transport.store_client")
    parser.add_argument("--master", required=True, help="the master's RPC address, host:port")
    parser.add_argument("--regex", help="remove keys matching this regex (default: every key)")
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    import time

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
    try:
        removed = (client.remove_by_regex(args.regex, args.force) if args.regex is not None
                   else client.remove_all(args.force))
    except Exception as exc:  # noqa: BLE001 - reported as the one JSON line the parent reads
        error = f"{type(exc).__name__}: {exc}"
    else:
        error = f"the master answered error code {removed}" if removed < 0 else ""
    answer = ({"error": error} if error else
              {"removed": removed, "seconds": round(time.perf_counter() - started, 3)})
    print(json.dumps(answer), flush=True)
    # No close(): it waits ~1 s on the client's own threads (measured: 1.0 of the child's 1.06 s)
    # and has nothing to give back. A pure client mounts no segment and the master does not count
    # it (master_active_clients stays 0); the removal above is a finished, synchronous RPC.
    sys.stderr.flush()
    os._exit(1 if error else 0)


if __name__ == "__main__":
    sys.exit(_main())
