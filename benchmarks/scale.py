"""Workload 7, the reset at scale (issue 29): a real mooncake_master holding 100k to 5M keys of two
deployments (5% of them rl-a's, the deployment reset; the rest svc-b's), cleared scoped and whole.

Per size, on one master filled by a real store client (benchmarks/store_filler.py, put_batch, keys
shaped like vLLM's MooncakeStoreConnector's, ~90 bytes):

* the master's own answers: GET /get_all_keys (time to the first byte = the master building its
  answer; to the last; bytes) and GET /metrics;
* the raw removals: `remove_by_regex('^rl\\-a@', force=True)` in a client already set up (scoped),
  `POST /api/v1/remove_all?force=true` on a fresh connection (whole);
* kvctl in an instrumented child (`scale.py --child`): `hard_reset_fleet` with --connector (and
  --whole-master), one vLLM 0.32 HTTP TEST DOUBLE with cache_prefix rl-a as the replica; every master
  call timed (listing, gauge, removal), kvctl's own peak RSS (RUSAGE_SELF; the store client that
  removes the keys is a child process, counted apart) and CPU;
* the same reset as a user runs it: `kvctl reset --inventory INV --connector --json`, wall and peak
  RSS of the whole process tree.

kvctl's added time is its master phase (the receipt's master.clear.latency_s: count before, removal,
count after) less the raw removal's median. Scoped rounds refill only rl-a's keys; whole rounds
refill everything.

    .venv/bin/python benchmarks/scale.py [--sizes 100000,1000000] [--reps 3] [--out benchmarks/scale.json]
    .venv/bin/python benchmarks/scale.py --report-only      # re-render section 7 of docs/performance.md

Writes benchmarks/scale.json (every sample), section 7 of docs/performance.md and
docs/performance-scale.png (benchmarks/scale_report.py). It skips a size the machine's memory cannot
hold (the master needs ~1.7 GB per million such keys) and records a size where kvctl's reset failed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import re
import resource
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import BENCH_DIR, PY, Helper, kvctl_json, log, run_timed, summarize  # noqa: E402

MINE, OTHER = "rl-a", "svc-b"
MINE_SHARE = 0.05
PATTERN = "^" + re.escape(MINE + "@")
RESULTS = BENCH_DIR / "scale.json"
GiB = 1024 ** 3
# The fillers' segments: one segment holds at most ~4,194,000 objects (2^22 allocations: a 4 GiB one
# refused the next put with -200, an 8 GiB one made the master evict), so the keys go to two store
# clients with a segment each (~160 MB resident each at 2,500,000 keys).
SEGMENT_MB = 4096
FILLERS = 2


# -- the child: one instrumented reset ----------------------------------------------------------------
def instrumented_reset(inventory: str, whole: bool) -> dict[str, Any]:
    """One `kvctl reset --inventory INV --connector [--whole-master]` in this process, each master call
    timed. Patches by name what exists, so it measures kvctl before and after issue 29 alike."""
    from kvctl.reset import execute as R
    from kvctl.reset import master as M
    from kvctl.targets import build_fleet
    from kvctl.transport import master_admin as A
    from kvctl.transport import store_client as S

    calls: list[tuple[str, float]] = []

    def timed_async(name: str, func: Any) -> Any:
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await func(*args, **kwargs)
            finally:
                calls.append((name, time.perf_counter() - t0))
        return wrapper

    def timed_sync(name: str, func: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return func(*args, **kwargs)
            finally:
                calls.append((name, time.perf_counter() - t0))
        return wrapper

    for name in ("all_keys", "key_counts", "metrics", "remove_all"):  # key_counts: the streamed listing
        if hasattr(A.MasterAdmin, name):
            setattr(A.MasterAdmin, name, timed_async(name, getattr(A.MasterAdmin, name)))
    S.remove_matching = timed_sync("remove_by_regex", S.remove_matching)
    M.count_before = timed_async("count_before", M.count_before)
    M.clear_master = timed_async("master_phase", M.clear_master)

    fleet = build_fleet(inventory=Path(inventory))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0, c0 = time.perf_counter(), time.process_time()
    receipt = asyncio.run(R.hard_reset_fleet(fleet, R.ResetOptions(connector=True, whole_master=whole)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if not receipt.ok:
        raise SystemExit(f"reset failed: {receipt.summary}: {receipt.to_dict()['master']}")
    by_name: dict[str, dict[str, float]] = {}
    for name, seconds in calls:
        entry = by_name.setdefault(name, {"n": 0, "s": 0.0})
        entry["n"] += 1
        entry["s"] += seconds
    master = receipt.to_dict()["master"]
    return {"wall_s": wall, "cpu_s": cpu, "total_s": receipt.total_s, "calls": by_name,
            "rss_before_reset_kb": rss0, "rss_self_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            "rss_children_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
            "clear_s": master["clear"]["latency_s"],
            "master": {k: master[k] for k in ("scope", "keys_before", "others_before", "removed_count",
                                              "keys_after", "others_after")}}


# -- the parent -----------------------------------------------------------------------------------
@contextlib.contextmanager
def admin_call(admin: str, method: str, path: str, timeout: float) -> Iterator[http.client.HTTPResponse]:
    """One request to the master's admin port on a connection of its own (closed after)."""
    host, _, port = admin.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request(method, path)
        yield conn.getresponse()
    finally:
        conn.close()


def get_all_keys(admin: str) -> dict[str, float]:
    """The master's answer to GET /get_all_keys: first byte (its build), last byte, size, lines."""
    t0 = time.perf_counter()
    with admin_call(admin, "GET", "/get_all_keys", 600) as response:
        first = time.perf_counter() - t0
        size = lines = 0
        while chunk := response.read(1 << 20):
            size += len(chunk)
            lines += chunk.count(b"\n")
    return {"first_byte_s": first, "total_s": time.perf_counter() - t0, "bytes": size, "keys": lines}


def raw_http_clear(admin: str) -> tuple[float, int]:
    """POST /api/v1/remove_all?force=true on a fresh connection: (seconds, removed). The master answers
    when done, which at millions of keys takes tens of seconds (master_clear.py's 30 s is too short)."""
    start = time.perf_counter()
    with admin_call(admin, "POST", "/api/v1/remove_all?force=true", 900) as response:
        body = json.loads(response.read())
    if response.status != 200 or body.get("success") is not True:
        raise RuntimeError(f"raw clear: HTTP {response.status} {body}")
    return time.perf_counter() - start, int(body["removed_count"])


def metrics_call(admin: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    with admin_call(admin, "GET", "/metrics", 60) as response:
        text = response.read().decode()
    count = next(int(float(line.split()[1])) for line in text.splitlines() if line.startswith("master_key_count "))
    return time.perf_counter() - t0, count


def rss_kb(pid: int | None) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


class Store:
    """The master and its fillers: fills (split across them) and counts, checked against the gauge."""

    def __init__(self, admin: str, fillers: list[Helper]) -> None:
        self.admin, self.fillers = admin, fillers
        self.filler = fillers[0]  # removals: any client removes every matching key

    def fill(self, prefix: str, count: int) -> float:
        """Each filler puts its share (numbered apart), one after the other: the seconds summed."""
        share, seconds = -(-count // len(self.fillers)), 0.0
        for k, filler in enumerate(self.fillers):
            n = max(0, min(share, count - k * share))
            if n:
                seconds += float(filler.command(f"fillp {prefix} {n} {k * share}", timeout=1800)[0])
        return seconds

    def expect(self, total: int) -> None:
        count = metrics_call(self.admin)[1]
        if count != total:
            raise RuntimeError(f"the master holds {count} keys, expected {total}")


class ResetFailed(RuntimeError):
    """kvctl's reset did not succeed at this size: recorded in the row, the next size still runs."""


def child_reset(inventory: Path, whole: bool) -> dict[str, Any]:
    out = run_timed([PY, str(BENCH_DIR / "scale.py"), "--child", str(inventory), "whole" if whole else "scoped"],
                    timeout=1800, check=False)
    if out.returncode != 0:
        raise ResetFailed(f"kvctl reset (in process) failed after {out.wall_s:.1f} s (peak RSS "
                          f"{out.maxrss_kb // 1024} MB): {out.stderr.strip().splitlines()[-1][:1500] if out.stderr.strip() else out.returncode}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def process_reset(inventory: Path, whole: bool) -> dict[str, Any]:
    args = ["reset", "--inventory", str(inventory), "--connector"] + (["--whole-master"] if whole else [])
    result, receipt = kvctl_json(args, timeout=1800, ok_codes=(0, 1, 3))
    if not receipt["ok"]:
        master = receipt.get("master") or {}
        raise ResetFailed(f"kvctl reset failed after {result.wall_s:.1f} s (peak RSS {result.maxrss_kb // 1024} MB): "
                          f"{receipt['summary']}; master: {master.get('error')}")
    return {"wall_s": result.wall_s, "maxrss_kb": result.maxrss_kb, "total_s": receipt["total_s"],
            "clear_s": receipt["master"]["clear"]["latency_s"], "cpu_s": result.cpu_s}


def measure_size(size: int, reps: int, whole_reps: int, store: Store, inventory: dict[bool, Path],
                 master_pid: int | None) -> dict[str, Any]:
    """One size: fill, the master's own answers, then the scoped rounds and the whole rounds."""
    mine = round(size * MINE_SHARE)
    others = size - mine
    row: dict[str, Any] = {"keys": size, "mine": mine, "others": others}
    row["fill_s"] = store.fill(OTHER, others) + store.fill(MINE, mine)
    store.expect(size)
    row["master_rss_kb"] = rss_kb(master_pid)
    listings = [get_all_keys(store.admin) for _ in range(3)]
    if any(x["keys"] != size for x in listings):
        raise RuntimeError(f"GET /get_all_keys listed {[x['keys'] for x in listings]} keys, expected {size}")
    row["listing_bytes"] = listings[0]["bytes"]
    row["listing_first_byte_s"] = summarize([x["first_byte_s"] for x in listings])
    row["listing_s"] = summarize([x["total_s"] for x in listings])
    row["metrics_s"] = summarize([metrics_call(store.admin)[0] for _ in range(5)])
    row["scoped"] = _scope(size, "scoped", reps, lambda: _scoped_round(store, inventory[False], mine, others))
    if "failed" in row["scoped"]:
        _refill(store, size, mine, others)
    row["whole"] = _scope(size, "whole", whole_reps, lambda: _whole_round(store, inventory[True], mine, others))
    raw_http_clear(store.admin)  # the next size starts empty
    return row


def _scope(size: int, scope: str, reps: int, one: Any) -> dict[str, Any]:
    """`reps` rounds of one scope, summarised; a failed reset of kvctl is recorded, not raised."""
    series: dict[str, list[Any]] = {"raw_s": [], "child": [], "process": []}
    try:
        for _ in range(reps):
            for key, value in one().items():
                series[key].append(value)
    except ResetFailed as exc:
        log(f"scale {size:,} keys {scope}: {exc}")
        return {"failed": str(exc), "raw_s": summarize(series["raw_s"]) if series["raw_s"] else None}
    out = _summary(series)
    log(_line(size, scope, out))
    return out


def _refill(store: Store, size: int, mine: int, others: int) -> None:
    """After a failed reset: back to `size` keys, whatever it left."""
    raw_http_clear(store.admin)
    store.fill(OTHER, others)
    store.fill(MINE, mine)
    store.expect(size)


def _scoped_round(store: Store, inventory: Path, mine: int, others: int) -> dict[str, Any]:
    """The raw remove_by_regex, then kvctl in process, then as a process; rl-a's keys refilled before each."""
    removed, seconds = store.filler.command(f"rmre {PATTERN}", timeout=1800)
    if int(removed) != mine:
        raise RuntimeError(f"raw remove_by_regex removed {removed}, expected {mine}")
    out: dict[str, Any] = {"raw_s": float(seconds)}
    for kind, func in (("child", child_reset), ("process", process_reset)):
        store.fill(MINE, mine)
        store.expect(mine + others)
        out[kind] = func(inventory, False)
        store.expect(others)
    store.fill(MINE, mine)
    return out


def _whole_round(store: Store, inventory: Path, mine: int, others: int) -> dict[str, Any]:
    """The raw HTTP remove_all, then kvctl in process, then as a process; everything refilled before each."""
    store.expect(mine + others)
    seconds, removed = raw_http_clear(store.admin)
    if removed != mine + others:
        raise RuntimeError(f"raw remove_all removed {removed}, expected {mine + others}")
    out: dict[str, Any] = {"raw_s": seconds}
    for kind, func in (("child", child_reset), ("process", process_reset)):
        store.fill(OTHER, others)
        store.fill(MINE, mine)
        store.expect(mine + others)
        out[kind] = func(inventory, True)
        store.expect(0)
    store.fill(OTHER, others)
    store.fill(MINE, mine)
    return out


def _summary(series: dict[str, list[Any]]) -> dict[str, Any]:
    children, procs = series["child"], series["process"]
    out: dict[str, Any] = {"reps": len(children), "raw_s": summarize(series["raw_s"])}
    for key in ("clear_s", "total_s", "wall_s", "cpu_s"):
        out[f"kvctl_{key}"] = summarize([c[key] for c in children])
    out["kvctl_rss_self_kb"] = max(c["rss_self_kb"] for c in children)
    out["store_client_rss_kb"] = max(c["rss_children_kb"] for c in children)
    out["calls"] = children[-1]["calls"]
    out["receipt"] = children[-1]["master"]
    out["process_wall_s"] = summarize([p["wall_s"] for p in procs])
    out["process_clear_s"] = summarize([p["clear_s"] for p in procs])
    out["process_maxrss_kb"] = max(p["maxrss_kb"] for p in procs)
    out["added_s"] = out["kvctl_clear_s"]["stats"]["median"] - out["raw_s"]["stats"]["median"]
    out["added_ratio"] = out["added_s"] / out["raw_s"]["stats"]["median"] if out["raw_s"]["stats"]["median"] else None
    return out


def _line(size: int, scope: str, s: dict[str, Any]) -> str:
    med = {k: s[k]["stats"]["median"] for k in ("raw_s", "kvctl_clear_s", "kvctl_total_s", "process_wall_s")}
    return (f"scale {size:,} keys {scope}: raw {med['raw_s'] * 1000:.0f} ms, kvctl clear "
            f"{med['kvctl_clear_s'] * 1000:.0f} ms (+{s['added_s'] * 1000:.0f} ms), reset {med['kvctl_total_s']:.2f} s, "
            f"process {med['process_wall_s']:.2f} s, kvctl RSS {s['kvctl_rss_self_kb'] / 1024:.0f} MB, calls "
            + ", ".join(f"{k} {v['n']}x {v['s'] * 1000:.0f} ms" for k, v in s["calls"].items()))


def run(sizes: list[int], reps: int = 3, whole_reps: int = 2, reserve_gib: float = 8.0,
        partial: Any = None) -> dict[str, Any]:
    """Every size on one master, smallest first; a size whose master would leave less than
    `reserve_gib` GiB available (extrapolated from the last size's RSS per key) is skipped."""
    from kvctl.serve.master_process import MasterProcess

    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kvctl-bench-scale-") as tmp:
        master = MasterProcess(log_path=Path(tmp) / "master.log")
        master.start()
        try:
            # scoped: vLLM 0.32 (reads cache_prefix; kvctl clears rl-a's keys itself); whole: 0.22, whose
            # connector cannot clear the store, so kvctl plans the forced remove_all (master_clear.py)
            with Helper("fleet_server.py", "--replicas", "1", "--out", tmp, "--version", "0.32.0",
                        "--cache-prefix", MINE) as scoped, \
                    Helper("fleet_server.py", "--replicas", "1", "--out", tmp + "/whole", "--version", "0.22.0",
                           "--cache-prefix", MINE) as whole, \
                    Helper("store_filler.py", "--master", master.rpc_address, "--segment-mb", str(SEGMENT_MB)) as filler, \
                    Helper("store_filler.py", "--master", master.rpc_address, "--segment-mb", str(SEGMENT_MB)) as second:
                inventory = {False: Path(tmp) / "scoped.yaml", True: Path(tmp) / "whole.yaml"}
                for is_whole, fleet in ((False, scoped), (True, whole)):
                    inventory[is_whole].write_text(
                        f"master: {master.admin_address}\nmaster_rpc: {master.rpc_address}\n"
                        f"cache_prefix: {MINE}\nreplicas:\n  - url: {fleet.ready[0]}\n")
                store = Store(master.admin_address, [filler, second][:FILLERS])
                log(f"scale: real master rpc {master.rpc_address}, admin {master.admin_address}")
                rows.append(empty_baseline(inventory))
                for size in sizes:
                    # the master's RSS per key at the largest size measured (small sizes are its base RSS)
                    measured = [r for r in rows if r.get("master_rss_kb") and r["keys"] >= 100_000]
                    largest = max(measured, key=lambda r: r["keys"], default=None)
                    per_key = largest["master_rss_kb"] * 1024 / largest["keys"] if largest else 2000.0
                    need = per_key * size * 1.2 + reserve_gib * GiB
                    if mem_available() < need:
                        skipped.append({"keys": size, "why": f"needs ~{need / GiB:.1f} GiB available, "
                                                            f"{mem_available() / GiB:.1f} GiB are"})
                        log(f"scale: {size:,} keys skipped: {skipped[-1]['why']}")
                        continue
                    big = size >= 2_000_000
                    try:
                        rows.append(measure_size(size, 1 if big else reps, 1 if big else whole_reps, store,
                                                 inventory, master.pid))
                    except ResetFailed as exc:
                        rows.append({"keys": size, "failed": str(exc)})
                        log(f"scale {size:,} keys: {exc}")
                        raw_http_clear(master.admin_address)  # the next size starts empty
                    if partial:
                        partial({"rows": rows, "skipped": skipped})
        finally:
            master.stop()
    return {"rows": rows, "skipped": skipped, "mine_share": MINE_SHARE, "key_shape": "vLLM MooncakeStoreConnector"}


def empty_baseline(inventory: dict[bool, Path]) -> dict[str, Any]:
    """kvctl's memory and time on an empty master: the constant the scale curve is judged against."""
    row: dict[str, Any] = {"keys": 0}
    for scope, whole in (("scoped", False), ("whole", True)):
        children = [child_reset(inventory[whole], whole) for _ in range(3)]
        row[scope] = {"kvctl_rss_self_kb": max(c["rss_self_kb"] for c in children),
                      "kvctl_clear_s": summarize([c["clear_s"] for c in children]),
                      "kvctl_total_s": summarize([c["total_s"] for c in children])}
    log(f"scale: empty master: kvctl RSS {row['scoped']['kvctl_rss_self_kb'] / 1024:.0f} MB")
    return row


def main(argv: list[str] | None = None) -> int:
    from benchmarks import machine, scale_report

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000,1000000,2000000,5000000,10000000")
    parser.add_argument("--reps", type=int, default=3, help="scoped rounds per size below 2,000,000 keys")
    parser.add_argument("--whole-reps", type=int, default=2, help="whole-master rounds per size below 2,000,000 keys")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--doc", type=Path, default=scale_report.DOC, help="the page whose section 7 it writes")
    parser.add_argument("--no-doc", action="store_true", help="measure only (the baseline of another kvctl)")
    parser.add_argument("--report-only", action="store_true", help="re-render section 7 from --out")
    parser.add_argument("--merge", action="store_true", help="keep the sizes of --out that --sizes does not name")
    args, other = parser.parse_known_args(argv)
    if other:  # make bench passes BENCH_ARGS (run.py's options) to every script
        log(f"scale: ignoring {' '.join(other)} (benchmarks/run.py's options)")
    if args.report_only:
        scale_report.write_doc(json.loads(args.out.read_text()), args.doc)
        log(f"wrote section 7 of {args.doc}")
        return 0
    began = time.perf_counter()
    described = machine.describe(None)
    kept = json.loads(args.out.read_text()) if args.merge and args.out.exists() else None

    def save(part: dict[str, Any]) -> None:  # after every size: a later failure loses nothing
        args.out.write_text(json.dumps({"machine": described, **part}, indent=1) + "\n")
    sizes = [int(s) for s in args.sizes.split(",") if s]
    out = {"machine": described, **run(sizes, args.reps, args.whole_reps, partial=save)}
    if args.merge and kept:  # the sizes of the earlier run that this one did not measure again
        out["rows"] = sorted([r for r in kept["rows"] if r["keys"] and r["keys"] not in sizes] + out["rows"],
                             key=lambda r: r["keys"])
        out["skipped"] = [s for s in out["skipped"] if s["keys"] not in {r["keys"] for r in out["rows"]}]
        out["machine"]["merged"] = kept["machine"]
    out["machine"]["elapsed_s"] = round(time.perf_counter() - began, 1)
    out["machine"]["nice"] = os.nice(0)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    log(f"wrote {args.out}")
    if not args.no_doc:
        scale_report.write_doc(out, args.doc)
        log(f"wrote section 7 of {args.doc} and {scale_report.PLOT.name}")
    for t in scale_report.targets(out):
        log(f"target: {t['target']}: {t['measured']} -> {'met' if t['met'] else 'MISSED'}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(instrumented_reset(sys.argv[2], sys.argv[3] == "whole")))
    else:
        sys.exit(main())
