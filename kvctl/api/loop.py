"""The Python API inside a training loop: proof split across a weight update, and a paused window
for loops that move the weights themselves (DESIGN.md, "Inside the training loop").

    evidence = await kvctl.take_evidence_async(urls=urls)            # before the update: old weights
    ...                                                              # the trainer updates (and may pause)
    receipt = await kvctl.hard_reset_async(urls=urls, master=m, verify=True, evidence=evidence)
    if receipt.pending:                                              # it was paused by the trainer
        receipt = await kvctl.check_evidence_async(evidence, master=m)   # after the trainer resumes

    async with kvctl.update_window_async(urls=urls, master=m) as window:
        await push_weights()          # NCCL, /update_weights, ...: kvctl moves no tensor
    window.receipt.metrics()          # paused, reset, resumed and verified around it

Every function returns a reset receipt (`.metrics()` for a logger); none raises on a failed check
unless raise_on_failure (a run is never killed by an inconclusive check unless asked).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from kvctl.api import ResetFailed, _address, _blocking, _urls, check_keyword_types, typed_keywords
from kvctl.api.words import python_errors, receipt_for_python
from kvctl.errors import UsageError
from kvctl.reset.evidence import Evidence
from kvctl.reset.evidence import take_evidence as prime_evidence
from kvctl.reset.execute import WhilePaused, execute_plan
from kvctl.reset.options import ResetOptions
from kvctl.reset.plan import plan_reset
from kvctl.reset.receipt import Receipt, receipt_without_execution
from kvctl.targets import Fleet, build_fleet
from kvctl.transport.pool import shared_pool


def _fleet(urls: object, inventory: str | Path | None, master: object = None, master_rpc: object = None,
           run: str | None = None, state_dir: str | Path | None = None, ray: str | None = None,
           masters_from_env: bool = True) -> Fleet:
    return build_fleet(_urls(urls), Path(inventory) if inventory else None, _address(master, "master"), run=run,
                       state_dir=str(state_dir) if state_dir else None, master_rpc=_address(master_rpc, "master_rpc"),
                       ray=ray, masters_from_env=masters_from_env)


@typed_keywords
async def take_evidence_async(urls: list[str] | None = None, *, inventory: str | Path | None = None,
                              run: str | None = None, state_dir: str | Path | None = None, ray: str | None = None,
                              timeout: float = 10.0, concurrency: int = 256) -> Evidence:
    """Before a weight update, while the fleet serves the old weights: a canary primed on every
    serving replica (none on a replica paused by its owner or asleep; `.replicas[url].note` says
    why). Pass it to hard_reset_async(evidence=...) and check_evidence_async after the update."""
    with python_errors():
        options = ResetOptions(verify=True, timeout=timeout, concurrency=concurrency).check()
        fleet = _fleet(urls, inventory, run=run, state_dir=state_dir, ray=ray, masters_from_env=False)
        return await prime_evidence(fleet, options)


def take_evidence(urls: list[str] | None = None, **kwargs: object) -> Evidence:
    """Blocking twin of take_evidence_async."""
    return _blocking("take_evidence", take_evidence_async, urls, **kwargs)


@typed_keywords
async def check_evidence_async(evidence: Evidence | dict, urls: list[str] | None = None, *,
                               inventory: str | Path | None = None, master: str | None = None,
                               master_rpc: str | None = None, run: str | None = None,
                               state_dir: str | Path | None = None, ray: str | None = None,
                               timeout: float = 10.0, concurrency: int = 256,
                               raise_on_failure: bool = False) -> Receipt:
    """Check only, nothing is reset: every canary of `evidence` not yet checked must show no cached
    token now (a hit is KV from before the update: STALE), and with a master, this deployment's keys
    are counted (proof only while every replica is paused). For a reset someone else ran (the
    trainer's own), or the checks a reset left pending on a paused fleet. Targets default to the
    replicas the evidence was taken on. A replica still paused stays pending (exit code 3)."""
    with python_errors():
        evidence = _as_evidence(evidence)
        options = ResetOptions(verify=True, check_only=True, timeout=timeout, concurrency=concurrency,
                               allow_mixed_weights=True).check()
        if urls is None and inventory is None and run is None:
            urls = list(evidence.replicas)
        fleet = _fleet(urls, inventory, master, master_rpc, run, state_dir, ray)
        receipt = receipt_for_python(await _run(fleet, options, evidence=evidence))
    if raise_on_failure and receipt.failed:
        raise ResetFailed(receipt)
    return receipt


def check_evidence(evidence: Evidence | dict, urls: list[str] | None = None, **kwargs: object) -> Receipt:
    """Blocking twin of check_evidence_async."""
    return _blocking("check_evidence", check_evidence_async, evidence, urls, **kwargs)


@dataclass
class UpdateWindow:
    """What `update_window_async` yields: the receipt is set once the window has closed."""

    receipt: Receipt | None = None
    paused_at: float | None = None  # time.time() when every replica was paused (the body's start)


@asynccontextmanager
async def update_window_async(urls: list[str] | None = None, *, inventory: str | Path | None = None,
                              master: str | None = None, master_rpc: str | None = None, run: str | None = None,
                              state_dir: str | Path | None = None, ray: str | None = None, verify: bool = True,
                              pause_mode: str = "wait", timeout: float = 10.0, retries: int = 2,
                              pause_timeout: float = 120.0, whole_master: bool = False, clear_timeout: float = 15.0,
                              resume_failed: bool = False, raise_on_failure: bool = False,
                              ) -> AsyncIterator[UpdateWindow]:
    """For loops that move the weights themselves (NCCL, vLLM's /update_weights): kvctl primes its
    canaries (verify), pauses every replica (pause_mode "wait": in-flight requests finish first; "keep"
    freezes them, and a reset under frozen requests fails on a fleet with a KV connector, whose
    engines cannot be preempted safely: kvctl/reset/plan.py), runs the body, then, still paused, resets every cache (prefix, Mooncake store, mm,
    encoder), resumes and verifies. No replica serves between the body and the end of its clear.

    If the plan or the pause fails, the body never runs: ResetFailed (the trainer must not update a
    serving fleet). If the body raises, the caches are still cleared, the fleet stays paused (it may
    hold half-updated weights) unless resume_failed, and the body's exception propagates."""
    check_keyword_types(update_window_async.__wrapped__, {  # type: ignore[attr-defined]
        "verify": verify, "timeout": timeout, "retries": retries, "pause_timeout": pause_timeout,
        "whole_master": whole_master, "clear_timeout": clear_timeout, "resume_failed": resume_failed,
        "raise_on_failure": raise_on_failure})
    with python_errors():
        options = ResetOptions(connector=True, verify=verify, pause=True, pause_mode=pause_mode, timeout=timeout,
                               retries=retries, pause_timeout=pause_timeout, whole_master=whole_master,
                               clear_timeout=clear_timeout, allow_mixed_weights=verify).check()
        fleet = _fleet(urls, inventory, master, master_rpc, run, state_dir, ray)
    window = UpdateWindow()
    entered = asyncio.Event()
    body_done: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
    step = WhilePaused(resume_failed=resume_failed)

    async def body_step() -> None:
        window.paused_at = time.time()
        entered.set()
        if await asyncio.shield(body_done) is not None:
            step.failed.extend(r.name for r in fleet.replicas)

    step.fleet = body_step
    task = asyncio.create_task(_run(fleet, options, step=step))
    opened = asyncio.create_task(entered.wait())
    await asyncio.wait({task, opened}, return_when=asyncio.FIRST_COMPLETED)
    if not entered.is_set():  # the plan or the pause failed: the fleet is not paused
        opened.cancel()
        window.receipt = receipt_for_python(await task)
        raise ResetFailed(window.receipt)
    try:
        yield window
    except BaseException as exc:
        body_done.set_result(exc)
        window.receipt = receipt_for_python(await asyncio.shield(task))
        raise
    body_done.set_result(None)
    window.receipt = receipt_for_python(await task)
    if raise_on_failure and window.receipt.failed:
        raise ResetFailed(window.receipt)


async def _run(fleet: Fleet, options: ResetOptions, evidence: Evidence | None = None,
               step: WhilePaused | None = None) -> Receipt:
    async with shared_pool(hosts=len(fleet.replicas)) as http:
        start = time.perf_counter()
        plan = await plan_reset(fleet, options, http)
        unplanned = [r for r in plan.replicas if r.error]
        if step is not None and unplanned and not plan.error:  # a window pauses the whole fleet or nothing
            plan.error = (f"{', '.join(r.name for r in unplanned)} could not be planned ({unplanned[0].error}): the "
                          "window would leave it serving while the weights change")
            plan.hint = "fix or leave out that replica, then open the window again"
        if plan.error:
            return receipt_without_execution(plan, fleet, time.perf_counter() - start)
        return await execute_plan(plan, fleet, start, http, while_paused=step, evidence=evidence)


def _as_evidence(evidence: object) -> Evidence:
    if isinstance(evidence, dict):
        return Evidence.from_dict(evidence)
    if not isinstance(evidence, Evidence):
        raise UsageError(f"evidence must be what kvctl.take_evidence() returned, got {type(evidence).__name__}")
    return evidence


__all__ = ["UpdateWindow", "check_evidence", "check_evidence_async", "take_evidence", "take_evidence_async",
           "update_window_async"]
