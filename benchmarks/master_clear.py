"""Workload 3, master clear: a forced clear of 10k and 100k keys that a real store client wrote into a
real mooncake_master, three ways:

* kvctl: `kvctl reset --connector --master ADMIN --url R` where R is a vLLM HTTP TEST DOUBLE of
  0.22.0 (MooncakeStoreConnector cannot clear the store there, so kvctl plans the forced master
  clear); the receipt's master.clear.latency_s is the clear as kvctl performs it.
* the raw HTTP call: POST /api/v1/remove_all?force=true on a fresh connection (in-process), and
  the same with curl (a whole process, what a shell user runs).
* the Python client: MooncakeDistributedStore.remove_all(force=True), timed around the call in a
  client that is already set up, and as a whole process (import, setup, call, close).

Before every measured clear the master is refilled by the same store client (put_batch).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import BENCH_DIR, PY, Helper, kvctl_json, log, run_timed, summarize

CLEAR_PATH = "/api/v1/remove_all?force=true"


def key_count(admin: str) -> int:
    from kvctl.transport.master_admin import MasterAdmin

    async def go() -> int:
        async with MasterAdmin(admin) as client:
            return (await client.metrics()).key_count
    return asyncio.run(go())


def raw_http_clear(admin: str) -> tuple[float, int]:
    host, _, port = admin.rpartition(":")
    start = time.perf_counter()
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", CLEAR_PATH)
        response = conn.getresponse()
        body = json.loads(response.read())
    finally:
        conn.close()
    elapsed = time.perf_counter() - start
    if response.status != 200 or body.get("success") is not True:
        raise RuntimeError(f"raw clear: HTTP {response.status} {body}")
    return elapsed, int(body["removed_count"])


def curl_clear(admin: str) -> tuple[float, int]:
    result = run_timed(["curl", "-sf", "-X", "POST", f"http://{admin}{CLEAR_PATH}"])
    return result.wall_s, int(json.loads(result.stdout)["removed_count"])


def kvctl_clear(admin: str, replica_url: str) -> tuple[float, int, float, float]:
    """(clear latency from the receipt, removed keys, receipt total_s, process wall)."""
    result, receipt = kvctl_json(["reset", "--connector", "--master", admin, "--url", replica_url])
    clear = receipt["master"]["clear"]
    if not receipt["ok"] or not receipt["plan"]["master_clear"] or clear["result"] != "ok":
        raise RuntimeError(f"kvctl forced clear: {receipt['summary']}")
    return clear["latency_s"], int(receipt["master"]["removed_count"]), receipt["total_s"], result.wall_s


def client_process_clear(rpc: str) -> dict[str, float]:
    result = run_timed([PY, str(BENCH_DIR / "store_filler.py"), "--master", rpc, "--clear-once"], timeout=120)
    data = json.loads(result.stdout.strip().splitlines()[-1])
    data["process_s"] = result.wall_s
    return data


def measure_size(size: int, reps: int, admin: str, rpc: str, filler: Helper, replica_url: str,
                 process_reps: int) -> dict[str, Any]:
    series: dict[str, list[float]] = {k: [] for k in (
        "fill_s", "raw_http_s", "curl_process_s", "kvctl_clear_s", "kvctl_total_s", "kvctl_process_s",
        "client_call_s", "client_process_s", "client_process_call_s")}

    def filled() -> None:
        series["fill_s"].append(float(filler.command(f"fill {size}")[0]))
        count = key_count(admin)
        if count != size:
            raise RuntimeError(f"master holds {count} keys after filling {size}")

    def check(removed: int, what: str) -> None:
        if removed != size:
            raise RuntimeError(f"{what} removed {removed} keys, expected {size}")

    for rep in range(reps + 1):  # the first round is the warm-up
        samples: dict[str, float] = {}
        filled()
        samples["raw_http_s"], removed = raw_http_clear(admin)
        check(removed, "raw HTTP")
        filled()
        samples["curl_process_s"], removed = curl_clear(admin)
        check(removed, "curl")
        filled()
        samples["kvctl_clear_s"], removed, samples["kvctl_total_s"], samples["kvctl_process_s"] = \
            kvctl_clear(admin, replica_url)
        check(removed, "kvctl")
        filled()
        removed_text, call = filler.command("clear")
        samples["client_call_s"] = float(call)
        check(int(removed_text), "remove_all(force=True)")
        if rep >= 1 and rep <= process_reps:
            filled()
            data = client_process_clear(rpc)
            check(int(data["removed"]), "a fresh client's remove_all(force=True)")
            samples["client_process_s"], samples["client_process_call_s"] = data["process_s"], data["call_s"]
        if rep >= 1:
            for key, value in samples.items():
                series[key].append(value)
    out: dict[str, Any] = {"keys": size, "reps": reps}
    out.update({k: summarize(v) for k, v in series.items() if v})
    med = {k: out[k]["stats"]["median"] for k in series if k in out}
    log(f"master clear {size} keys: raw {med['raw_http_s'] * 1000:.1f} ms, kvctl clear "
        f"{med['kvctl_clear_s'] * 1000:.1f} ms (process {med['kvctl_process_s']:.2f} s), client call "
        f"{med['client_call_s'] * 1000:.1f} ms, fill {med['fill_s']:.2f} s")
    return out


def run(sizes: list[int], reps: int, process_reps: int) -> dict[str, Any]:
    from kvctl.serve.master_process import MasterProcess

    with tempfile.TemporaryDirectory(prefix="kvctl-bench-master-") as tmp:
        master = MasterProcess(log_path=Path(tmp) / "master.log")
        master.start()
        try:
            with Helper("fleet_server.py", "--replicas", "1", "--out", tmp, "--version", "0.22.0") as fleet, \
                    Helper("store_filler.py", "--master", master.rpc_address) as filler:
                log(f"master clear: real master rpc {master.rpc_address}, admin {master.admin_address}")
                rows = [measure_size(n, reps, master.admin_address, master.rpc_address, filler, fleet.ready[0],
                                     process_reps) for n in sizes]
        finally:
            master.stop()
    return {"rows": rows}
