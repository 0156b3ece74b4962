"""A verified, version-aware hard reset of a vLLM fleet that offloads KV cache to Mooncake.

Read a reset in one walk: `hard_reset_fleet()` plans (kvctl.reset.plan), then `execute_plan()`
primes the canaries (with --verify, kvctl.reset.verify), pauses (with --pause), resets every replica
at once (bounded), clears the master where needed (kvctl.reset.master), always resumes, verifies,
and concludes the receipt (kvctl.reset.receipt).

A caller may run its own step on every replica while the fleet is paused (`WhilePaused`: a weight
reload, kvctl.weights): after the pause, before the cache ops, so no replica serves a request between
that step and the end of its cache clear.

Nothing here prints: the CLI and the Python API (kvctl.api) render the receipt.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kvctl.facts.versions import parse_version
from kvctl.interrupt import exit_code_for, signal_of
from kvctl.reset import master as master_clear
from kvctl.reset import plan as planning
from kvctl.reset import verify
from kvctl.reset.evidence import Evidence
from kvctl.reset.lock import Busy, reset_lock
from kvctl.reset.plan import Plan, PlannedOp, ReplicaPlan, ResetOptions, ha_group, replica_client, uses_master
from kvctl.reset.receipt import MasterReceipt, OpResult, Receipt, ReplicaReceipt, conclude, receipt_without_execution
from kvctl.reset.resuming import Paused, pause_all, resume_all
from kvctl.reset.window import accepts_requests, describe
from kvctl.targets import Fleet, Replica
from kvctl.transport.pool import HttpPool, max_concurrency, shared_pool
from kvctl.transport.vllm_client import CallOutcome, VllmClient, reset_answer_error

T = TypeVar("T")


@dataclass
class WhilePaused:
    """A step run on each live replica after the pause and before the cache ops (kvctl.weights'
    reload). A replica whose step failed is kept paused at the end (it must not serve beside
    replicas running other weights in one cache namespace, or without weights) unless `resume_failed`,
    a signal too; a signal resumes the other replicas kvctl paused. The executor fills in the timings
    and `held`: the replicas it kept paused."""

    run: Callable[[ReplicaPlan, VllmClient], Awaitable[OpResult]] | None = None
    # or one step for the whole fleet (a trainer that moves its weights itself: kvctl.api.update_window_async)
    fleet: Callable[[], Awaitable[None]] | None = None
    resume_failed: bool = False
    failed: list[str] = field(default_factory=list)  # replicas whose step failed (kept paused unless resume_failed)
    phases: dict[str, float] = field(default_factory=dict)  # seconds: pause, step, reset, resume, verify
    held: list[str] = field(default_factory=list)  # kept paused at the end: their step failed (not resume_failed)
    paused_s: float | None = None  # the fleet's paused window: first pause sent -> last resume answered


# -- execute ------------------------------------------------------------------------------
async def hard_reset_fleet(fleet: Fleet, options: ResetOptions, evidence: Evidence | None = None,
                           on_plan: Callable[[Plan], None] | None = None) -> Receipt:
    """Plan, then (unless dry-run or the plan failed) execute and verify. `evidence`: canaries primed
    before the update (kvctl.reset.evidence), checked instead of fresh ones. `on_plan`: called with
    the plan before anything is paused or sent (the CLI says its pause notes there)."""
    async with shared_pool(hosts=len(fleet.replicas)) as http:  # large fleets: the aiohttp transport
        # The clock starts once the transport is loaded: importing it is start-up (aiohttp ~70 ms,
        # once per process, as httpcore's import for small fleets), not part of a reset.
        start = time.perf_counter()
        plan = await planning.plan_reset(fleet, options, http)
        if plan.error or options.dry_run:
            return receipt_without_execution(plan, fleet, time.perf_counter() - start)
        if on_plan is not None:
            on_plan(plan)
        return await execute_plan(plan, fleet, start, http, evidence=evidence)


async def execute_plan(plan: Plan, fleet: Fleet, start: float | None = None, http: HttpPool | None = None,
                       while_paused: WhilePaused | None = None, evidence: Evidence | None = None) -> Receipt:
    """Execute under the reset lock of every replica planned (kvctl.reset.lock): a second reset of
    any of them from this machine is refused, with nothing sent. `while_paused`: see WhilePaused."""
    start = time.perf_counter() if start is None else start
    try:
        with reset_lock([r.url for r in plan.replicas if r.error is None]):
            async with shared_pool(http, len(fleet.replicas)) as shared:
                return await _execute(plan, fleet, start, shared, while_paused, evidence)
    except Busy as exc:
        plan.error = f"{exc}: two resets of one replica at once undo each other's pause"
        plan.hint = "wait for that reset to finish (or stop it), then reset again"
        return receipt_without_execution(plan, fleet, time.perf_counter() - start)


async def _execute(plan: Plan, fleet: Fleet, start: float, http: HttpPool,
                   step: WhilePaused | None = None, evidence: Evidence | None = None) -> Receipt:
    opts = plan.options
    phases: dict[str, float] = step.phases if step is not None else {}
    clock = _Clock(phases)
    by_name = {r.name: r for r in fleet.replicas}
    receipts = {r.name: ReplicaReceipt(r.name, r.url, r.version, r.layout, error=r.error, window=r.window)
                for r in plan.replicas}
    live = [r for r in plan.replicas if r.error is None]
    master = MasterReceipt(plan.master, cache_prefix=plan.cache_prefix, rpc_address=plan.master_rpc,
                           planned_address=plan.master, tenancy=plan.tenancy,
                           key_pattern=master_clear.deployment_pattern(plan),
                           scope="whole" if plan.master_wide else None) if plan.master else None
    sem = asyncio.Semaphore(max_concurrency(len(fleet.replicas), opts.concurrency))
    canaries: dict[str, verify.Canary] = {}

    async def each(func: Callable[[ReplicaPlan], Awaitable[None]], among: list[ReplicaPlan] | None = None) -> None:
        async def guarded(rp: ReplicaPlan) -> None:
            async with sem:
                await func(rp)
        await asyncio.gather(*(guarded(rp) for rp in (live if among is None else among)))

    async def prime(rp: ReplicaPlan) -> None:
        async with replica_client(by_name[rp.name], opts, http) as client:
            canaries[rp.name] = await verify.Canary.prime(client, opts, rp.version)

    async def run_phase(rp: ReplicaPlan, names: tuple[str, ...]) -> None:
        async with replica_client(by_name[rp.name], opts, http) as client:
            for op in rp.ops:
                if op.op in names:
                    receipts[rp.name].ops.append(await _run_op(client, rp, op, opts))

    async def run_step(rp: ReplicaPlan) -> None:
        assert step is not None
        async with replica_client(by_name[rp.name], opts, http) as client:
            result = await _guarded_step(step, rp, client)
        receipts[rp.name].ops.append(result)
        if result.result == "failed":
            step.failed.append(rp.name)

    if opts.verify:
        await clock.timed("prime", each(prime, _to_prime(live, evidence, canaries, receipts)))
    owner_paused = {rp.name for rp in live if not accepts_requests(rp.window)}  # left as their owner set them
    stuck: list[str] = []  # replicas whose pause failed, timed out or was cut short
    interrupted: str | None = None  # the signal that ended the reset early (kvctl.interrupt)
    paused_at: float | None = None
    paused_s: float | None = None  # the fleet's paused window: first pause sent -> last resume answered
    held: set[str] = set()  # replicas kept paused at the end: their step failed
    paused = Paused()  # the replicas whose /pause kvctl sent: the only ones it resumes (kvctl.reset.resuming)
    store = None  # the store client of a scoped clear, connected before the pause (its start is ~0.4 s)
    try:
        store = await master_clear.prepare_store_session(plan)
        if opts.pausing:
            paused_at = time.perf_counter()
            stuck = await clock.timed("pause", pause_all(live, by_name, opts, http, sem, receipts, owner_paused,
                                                         paused, _run_op))
        if stuck:
            for rp in live:
                if rp.name not in stuck:
                    receipts[rp.name].error = (f"not reset: the pause failed on {', '.join(stuck)}, so nothing "
                                               "was reset; this replica was resumed at once")
        else:
            if step is not None:
                await clock.timed("step", step.fleet() if step.fleet is not None else each(run_step))
            # nothing writes to the store while every replica is paused: only then is a key count proof
            quiet = opts.pausing or all(rp.name in owner_paused for rp in live)
            await clock.timed("reset", _reset_phase(plan, master, opts, http,
                                                    each(lambda rp: run_phase(rp, ("prefix_cache", "mm_cache",
                                                                                   "encoder_cache"))), store, quiet))
    except asyncio.CancelledError as exc:
        interrupted = signal_of(exc)
        if interrupted is None:
            raise
        _uncancel()  # the interruption is handled here: the resume below must run to its end
    finally:
        if opts.pausing:
            # kvctl resumes only what it paused; a failed step keeps its replica paused, a signal too
            if step is not None and not step.resume_failed:
                held = set(step.failed)
                step.held = sorted(held)
            resumable = [rp for rp in live if rp.name in paused.sent and rp.name not in held]
            await asyncio.shield(clock.timed("resume", resume_all(resumable, paused, by_name, opts, http, sem,
                                                                  receipts, _run_op)))
            if paused_at is not None:
                paused_s = round(time.perf_counter() - paused_at, 6)
                if step is not None:
                    step.paused_s = paused_s
            _note_held(receipts, held, by_name)
        if store is not None:  # after the resume: its child's exit is no part of the paused window
            store.close()
    if interrupted is not None:
        return _interrupted(conclude(plan, list(receipts.values()), master, time.perf_counter() - start, phases,
                                     paused_s), interrupted, opts.pausing, held)
    if opts.verify and not stuck:
        # a replica kept paused (its step failed, or its owner paused it) cannot answer a canary: its
        # check waits for the resume (kvctl evidence check)
        serving = [rp for rp in live if rp.name not in held and rp.name not in owner_paused]
        for rp in live:
            if rp.name in canaries and rp.name not in held and rp.name in owner_paused:
                receipts[rp.name].pending = (f"{describe(rp.window)}: its canary is checked after the owner "
                                             "resumes it (kvctl evidence check)")

        async def check(rp: ReplicaPlan) -> None:
            canary = canaries.get(rp.name)
            if canary is not None:
                async with replica_client(by_name[rp.name], opts, http) as client:
                    receipts[rp.name].canary = await canary.check(client, rp.version)
                if evidence is not None and evidence.canary_for(rp.url) is canary:
                    evidence.mark_checked(rp.url)
        await clock.timed("verify", _verify_phase(each(check, serving), serving, by_name, opts, http, receipts))
    return conclude(plan, list(receipts.values()), master, time.perf_counter() - start, phases, paused_s)


def _to_prime(live: list[ReplicaPlan], evidence: Evidence | None, canaries: dict[str, verify.Canary],
              receipts: dict[str, ReplicaReceipt]) -> list[ReplicaPlan]:
    """Fill `canaries` from the evidence; return the replicas that need a fresh canary now. None is
    primed on a replica that cannot be sent a request (paused by its owner, asleep), nor with
    evidence given: a canary primed after the update proves nothing about the old weights' KV."""
    fresh = []
    for rp in live:
        if evidence is not None:
            canary = evidence.canary_for(rp.url)
            if canary is not None:
                canaries[rp.name] = canary
            else:
                receipts[rp.name].unproven.append(f"content: {evidence.why_none(rp.url)}")
        elif accepts_requests(rp.window):
            fresh.append(rp)
        else:
            receipts[rp.name].unproven.append(
                f"content: {describe(rp.window)}, so no canary was sent; take evidence before the update "
                "(kvctl evidence take) to prove the content after the owner resumes it")
    return fresh


async def _guarded_step(step: WhilePaused, rp: ReplicaPlan, client: VllmClient) -> OpResult:
    """The caller's step; an exception it did not expect is its failure, not the whole fleet's."""
    try:
        return await step.run(rp, client)
    except Exception as exc:  # noqa: BLE001 - reported in the receipt, the fleet's resume must still run
        return OpResult("while_paused", "failed", error=f"{type(exc).__name__}: {exc}")


async def _reset_phase(plan: Plan, master: MasterReceipt | None, opts: ResetOptions, http: HttpPool,
                       cache_ops: Awaitable[None], store: Any = None, quiet: bool = True) -> None:
    """Every replica's cache ops at once, then the master clear where vLLM does not clear the store (its
    first count runs beside the cache ops: the paused fleet writes nothing meanwhile). `quiet`: nothing
    writes to the store now, so the count after the clear is proof; on a generating fleet new keys are
    live traffic's, and the canary proves the store instead."""
    planned = master.address if master is not None else None
    before = asyncio.ensure_future(master_clear.count_before(master, plan, http)) \
        if master is not None and plan.master_clear else None
    try:
        await cache_ops
        leading = master is None or not uses_master(plan) or not ha_group(plan) \
            or await master_clear.recheck_leader(master, plan, http)
        if master is not None and plan.master_clear and leading:
            # a leader that moved meanwhile is counted anew
            await master_clear.clear_master(master, plan, http, store, before if master.address == planned else None,
                                            quiet=quiet)
    finally:
        if before is not None:  # unused (no clear, another leader) or done: never left pending
            before.cancel()
            await asyncio.gather(before, return_exceptions=True)
    if master is not None and opts.verify and leading:
        await master_clear.count_master_keys(master, opts, http, quiet)  # counted already by a clear: judged only


async def _verify_phase(canaries: Awaitable[None], serving: list[ReplicaPlan], by_name: dict[str, Replica],
                        opts: ResetOptions, http: HttpPool, receipts: dict[str, ReplicaReceipt]) -> None:
    await canaries
    if opts.probe_prompts and serving:
        await verify.probe_after(serving, by_name, opts, http, receipts)


def _note_held(receipts: dict[str, ReplicaReceipt], held: set[str], by_name: dict[str, Replica]) -> None:
    """Say how to resume each replica kept paused because its step failed."""
    for name in sorted(held):
        rr = receipts[name]
        why = rr.error or "; ".join(f"{o.op}: {o.error}" for o in rr.ops if o.result == "failed")
        note = (f"kept paused: its step failed, and it must not serve beside the others in one cache namespace; "
                f"resume it as it is with `curl -X POST {by_name[name].url}/resume`")
        rr.error = f"{why}; {note}" if why else note


class _Clock:
    """Wall-clock seconds of each phase, into the caller's dict."""

    def __init__(self, phases: dict[str, float]) -> None:
        self.phases = phases

    async def timed(self, name: str, work: Awaitable[T]) -> T:
        started = time.perf_counter()
        try:
            return await work
        finally:
            self.phases[name] = round(time.perf_counter() - started, 6)


def _interrupted(receipt: Receipt, signal_name: str, pausing: bool, held: set[str]) -> Receipt:
    """A reset a signal ended early: nothing counts as reset (or verified), and each replica says
    whether kvctl resumed it (its resume op, in its ops), kept it paused, or never paused it."""
    receipt.exit_code = exit_code_for(signal_name)
    unconfirmed = []
    for rr in receipt.replicas:
        rr.reset = False
        resumed = next((o for o in rr.ops if o.op == "resume"), None)
        if resumed is not None and resumed.result != "ok":
            unconfirmed.append(rr.name)
        state = ("kept paused: its step failed" if rr.name in held
                 else "not paused by kvctl" if resumed is None else "resumed" if resumed.result == "ok"
                 else f"NOT confirmed resumed: {resumed.error}")
        rr.error = f"interrupted by {signal_name} before its reset was confirmed; {state}" + \
            (f" ({rr.error})" if rr.error else "")
    receipt.not_reset = [r.name for r in receipt.replicas]
    paused = ("nothing was paused" if not pausing else "see each replica" if unconfirmed or held
              else "every replica kvctl paused was resumed")
    receipt.summary = f"interrupted by {signal_name}: the reset did not finish; {paused}; nothing is verified"
    return receipt


def _uncancel() -> None:
    task = asyncio.current_task()
    if task is not None and hasattr(task, "uncancel"):  # Python >= 3.11 counts cancellations
        task.uncancel()


async def _run_op(client: VllmClient, rp: ReplicaPlan, op: PlannedOp, opts: ResetOptions) -> OpResult:
    if op.skip:
        return OpResult(op.op, "skipped", detail=op.skip)
    version = parse_version(rp.version or "0")  # parsed once per fleet (cached), not once per call
    outcome: CallOutcome
    if op.op == "pause":
        outcome = await client.pause(version, opts.pause_timeout, rp.pause_mode)
    elif op.op == "resume":
        outcome = await client.resume()
    elif op.op == "prefix_cache":
        outcome = await (client.reset_prefix_cache(version, **op.params) if op.params
                         else client.call("POST", "/reset_prefix_cache"))
    elif op.op == "mm_cache":
        outcome = await client.reset_mm_cache()
    else:
        outcome = await client.reset_encoder_cache()
    error = reset_answer_error(outcome)
    detail = ", ".join(f"{k}={v}" for k, v in op.params.items()) or None
    return OpResult(op.op, "failed" if error else "ok", outcome.status, round(outcome.latency_s, 6),
                    outcome.attempts, error, detail)


__all__ = ["WhilePaused", "execute_plan", "hard_reset_fleet"]
