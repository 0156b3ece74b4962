"""Workload 2, fan-out: `kvctl reset --connector` over N replicas, against a sequential loop of the
same calls (a shell script with curl) and against the limit (one reset's latency).

The replicas are HTTP TEST DOUBLES of vLLM 0.23.0 with MooncakeStoreConnector (so kvctl plans
reset_external=true and no master clear), served on loopback by ONE separate process
(benchmarks/fleet_server.py); each /reset_prefix_cache takes a fixed server-side delay.
"""

from __future__ import annotations

import http.client
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from benchmarks.common import BENCH_DIR, PY, Helper, kvctl_json, log, repeat, run_timed, summarize
from kvctl.reset.plan import ResetOptions

DEFAULT_CONCURRENCY = ResetOptions.__dataclass_fields__["concurrency"].default  # what `kvctl reset` uses

# A run slower than this is its own warm-up (start-up effects are noise next to it), and the
# repetitions of one (N, concurrency) stop once they have used BUDGET_S (at least one sample).
SLOW_RUN_S = 20.0
BUDGET_S = 150.0

RESET_PATH = "/reset_prefix_cache?reset_running_requests=false&reset_external=true"
# The calls kvctl sends to a vLLM >= 0.16 replica with --connector (pause is on by default), in order.
SCRIPT = """#!/usr/bin/env bash
# What a shell script does: the same calls, one replica after the other.
set -eu
while read -r u; do
  curl -sf -o /dev/null -X POST "$u/pause?mode=wait"
  curl -sf -o /dev/null -X POST "$u{reset}"
  curl -sf -o /dev/null -X POST "$u/reset_mm_cache"
  curl -sf -o /dev/null -X POST "$u/reset_encoder_cache"
  curl -sf -o /dev/null -X POST "$u/resume"
done < "$1"
""".replace("{reset}", RESET_PATH)


def single_reset_latency(url: str, reps: int) -> list[float]:
    """The limit: one POST /reset_prefix_cache on a kept-alive connection (no process start)."""
    parsed = urlparse(url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)

    def once() -> float:
        start = time.perf_counter()
        conn.request("POST", RESET_PATH)
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            raise RuntimeError(f"reset answered {response.status}")
        return time.perf_counter() - start

    try:
        return repeat(once, reps, warmup=2)
    finally:
        conn.close()


def server_cpu_s(pid: int) -> float:
    """CPU (user + system) the fleet process has used so far: what the doubles cost the rig."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def requests_sent(receipt: dict[str, Any]) -> int:
    """HTTP requests of one reset: per replica /version and /server_info (the plan), /is_paused
    before pausing, and every attempt of every call in the receipt."""
    count = 0
    for r in receipt["replicas"]:
        count += 2 + sum(o["attempts"] for o in r["ops"])
        count += any(o["op"] == "pause" and o["result"] != "skipped" for o in r["ops"])
    return count


def kvctl_fanout(inventory: Path, n: int, concurrency: int, reps: int, server_pid: int) -> dict[str, Any]:
    """Repeated `kvctl reset --inventory FILE --connector --concurrency C`. A run that leaves
    replicas not reset (exit 3) is kept and counted: it is part of what kvctl does at that scale."""
    walls, totals, rss, failed, errors, cpus, server, requests = [], [], [], [], [], [], [], []

    def once() -> float:
        before = server_cpu_s(server_pid)
        result, receipt = kvctl_json(["reset", "--inventory", str(inventory), "--connector",
                                      "--concurrency", str(concurrency)], timeout=1200, ok_codes=(0, 3))
        server.append(server_cpu_s(server_pid) - before)
        bad = [r for r in receipt["replicas"] if not r["reset"]]
        if len(receipt["replicas"]) != n or receipt["plan"]["master_clear"] or len(bad) == n:
            raise RuntimeError(f"kvctl reset over {n} replicas: {receipt['summary']}")
        walls.append(result.wall_s)
        totals.append(receipt["total_s"])
        rss.append(result.maxrss_kb / 1024)
        cpus.append(result.cpu_s)
        requests.append(requests_sent(receipt))
        failed.append(len(bad))
        errors.extend(sorted({(r["error"] or "?")[:200] for r in bad})[:3])
        return result.wall_s

    began = time.perf_counter()
    first = once()
    warmup = 0 if first > SLOW_RUN_S else 1
    while len(walls) - warmup < reps and (len(walls) == warmup
                                          or time.perf_counter() - began + walls[-1] < BUDGET_S):
        once()
    keep = slice(warmup, None)
    return {"n": n, "concurrency": concurrency, "process_s": summarize(walls[keep]),
            "total_s": summarize(totals[keep]), "peak_rss_mib": summarize(rss[keep]),
            "cpu_s": summarize(cpus[keep]), "server_cpu_s": summarize(server[keep]),
            "requests": max(requests[keep]),
            "not_reset": failed[keep], "errors": errors[:5],
            "warmup_discarded": bool(warmup), "budget_limited": len(walls) - warmup < reps}


def floor(inventory: Path, n: int, reps: int, server_pid: int) -> dict[str, Any]:
    """The rig's floor: the same requests from the leanest client (benchmarks/floor_client.py)."""
    cpus, server, requests = [], [], []

    def once() -> float:
        before = server_cpu_s(server_pid)
        result = run_timed([PY, str(BENCH_DIR / "floor_client.py"), str(inventory)], timeout=600)
        server.append(server_cpu_s(server_pid) - before)
        cpus.append(result.cpu_s)
        out = json.loads(result.stdout)
        requests.append(int(out["requests"]))
        return float(out["total_s"])

    totals = repeat(once, reps, warmup=1)
    return {"n": n, "total_s": summarize(totals), "cpu_s": summarize(cpus[1:]),
            "server_cpu_s": summarize(server[1:]), "requests": max(requests)}


def sequential_loop(inventory: Path, workdir: Path, reps: int) -> dict[str, Any]:
    urls = [r["url"] for r in yaml.safe_load(inventory.read_text())["replicas"]]
    url_file = workdir / f"urls-{len(urls)}.txt"
    url_file.write_text("\n".join(urls) + "\n")
    script = workdir / "sequential_reset.sh"
    script.write_text(SCRIPT)
    samples = repeat(lambda: run_timed(["bash", str(script), str(url_file)], timeout=3600).wall_s,
                     reps, warmup=0 if len(urls) > 64 else 1)
    return {"n": len(urls), "process_s": summarize(samples)}


def run(sizes: list[int], concurrencies: list[int], reps: int, seq_reps: dict[int, int], delay: float,
        single_reps: int = 20) -> dict[str, Any]:
    """All fan-out measurements against one fleet process serving max(sizes) doubles."""
    with tempfile.TemporaryDirectory(prefix="kvctl-bench-fanout-") as tmp:
        work = Path(tmp)
        log(f"fan-out: starting {max(sizes)} vLLM doubles (delay {delay * 1000:.0f} ms) in a separate process")
        with Helper("fleet_server.py", "--replicas", str(max(sizes)), "--out", str(work),
                    "--sizes", ",".join(map(str, sizes)), "--delay", str(delay)) as fleet:
            first_url = fleet.ready[0]
            single = single_reset_latency(first_url, single_reps)
            log(f"fan-out: one reset call {sorted(single)[len(single) // 2] * 1000:.1f} ms")
            kvctl_rows, seq_rows, floor_rows = [], [], []
            pid = fleet.proc.pid
            for n in sizes:
                inventory = work / f"inventory-{n}.yaml"
                floor_rows.append(floor(inventory, n, reps, pid))
                log(f"fan-out: rig floor N={n}: {floor_rows[-1]['total_s']['stats']['median']:.3f} s, "
                    f"CPU {floor_rows[-1]['cpu_s']['stats']['median']:.2f} s for {floor_rows[-1]['requests']} requests")
                for c in concurrencies:
                    row = kvctl_fanout(inventory, n, c, reps, pid)
                    kvctl_rows.append(row)
                    log(f"fan-out: kvctl N={n} concurrency={c}: total {row['total_s']['stats']['median']:.3f} s, "
                        f"process {row['process_s']['stats']['median']:.3f} s, "
                        f"peak RSS {row['peak_rss_mib']['stats']['median']:.0f} MiB, "
                        f"CPU {row['cpu_s']['stats']['median']:.2f} s for {row['requests']} requests"
                        + (f", NOT reset per run: {row['not_reset']}" if any(row["not_reset"]) else ""))
                if seq_reps.get(n, 0) > 0:
                    row = sequential_loop(inventory, work, seq_reps[n])
                    seq_rows.append(row)
                    log(f"fan-out: sequential curl loop N={n}: {row['process_s']['stats']['median']:.2f} s")
    return {"delay_s": delay, "sizes": sizes, "concurrencies": concurrencies,
            "default_concurrency": DEFAULT_CONCURRENCY,
            "single_reset_s": summarize(single), "kvctl": kvctl_rows, "sequential": seq_rows, "floor": floor_rows,
            "sequential_script": SCRIPT}
