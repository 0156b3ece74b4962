"""New weights on every replica and every cache cleared, as one fleet operation.

One walk: plan (kvctl.weights.plan: each replica's live version, refused before anything is paused
where a step is missing) -> read each replica's checksums -> kvctl.reset's executor, with the reload
as its step while paused: pause every replica, reload the folder (`collective_rpc reload_weights`),
set the version label, hard-reset (local prefix cache, the Mooncake store scoped as reset scopes it,
mm and encoder caches), resume, verify -> read versions and checksums after -> the receipt. No
replica serves a request between its reload and the end of its cache clear; one whose reload failed
stays paused (kvctl.reset.execute.WhilePaused). Nothing here prints.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable

from kvctl.interrupt import signal_of
from kvctl.reset.execute import WhilePaused, execute_plan
from kvctl.reset.lock import Busy, reset_lock
from kvctl.reset.plan import ReplicaPlan, replica_client
from kvctl.reset.receipt import OpResult
from kvctl.targets import Fleet, Replica
from kvctl.transport.pool import HttpPool, max_concurrency, shared_pool
from kvctl.transport.vllm_client import CallOutcome, ServerError, VllmClient, reset_answer_error
from kvctl.transport.vllm_weights import WeightChecksums, summarise_checksums
from kvctl.weights import readback, steps
from kvctl.weights.plan import ReplicaWeightsPlan, WeightsOptions, WeightsPlan, plan_update
from kvctl.weights.receipt import StepResult, WeightsReceipt, WeightsReplica, receipt_without_execution, verdict

PHASES = ("pause", "reload", "version", "reset", "resume", "verify")  # always in the receipt (0.0: did not run)


async def update_fleet(fleet: Fleet, options: WeightsOptions,
                       on_plan: Callable[[WeightsPlan], None] | None = None) -> WeightsReceipt:
    """Plan, then (unless dry-run or refused) reload, reset, verify; the receipt says what happened.
    `on_plan`: called with the plan before anything is paused (the CLI says its pause notes there)."""
    options.check()
    async with shared_pool(hosts=len(fleet.replicas)) as http:
        start = time.perf_counter()
        plan = await plan_update(fleet, options, http)
        if plan.error or options.dry_run:
            return receipt_without_execution(plan, time.perf_counter() - start)
        if on_plan is not None:
            on_plan(plan)
        try:  # from the checksums before to the labels after: the reset's executor takes it again (re-entrant)
            with reset_lock([r.url for r in plan.replicas]):
                return await _update(plan, fleet, start, http)
        except Busy as exc:
            plan.error = f"{exc}: two updates (or resets) of one replica at once undo each other's pause"
            plan.hint = "wait for that one to finish (or stop it), then update again"
            return receipt_without_execution(plan, time.perf_counter() - start)


async def _update(plan: WeightsPlan, fleet: Fleet, start: float, http: HttpPool) -> WeightsReceipt:
    opts = plan.options
    by_name = {r.name: r for r in fleet.replicas}
    rows = {r.name: WeightsReplica(r.name, r.url, r.vllm_version, version_before=r.version_before)
            for r in plan.replicas}
    plans = {r.name: r for r in plan.replicas}
    phases: dict[str, float] = {}
    began = time.perf_counter()
    before = await _read_checksums(plan, by_name, http)  # outside the pause: hashing every weight takes a while
    phases["checksums_before"] = round(time.perf_counter() - began, 6)
    reload = _Reload(opts, plans, rows)
    step = WhilePaused(reload.run, resume_failed=opts.resume_failed)
    reset = await execute_plan(plan.reset, fleet, start, http, while_paused=step)
    if reset.plan.error and not any(rr.ops for rr in reset.replicas):  # refused by the reset lock: nothing sent
        plan.error, plan.hint = reset.plan.error, reset.plan.hint
        return receipt_without_execution(plan, time.perf_counter() - start)
    interrupted = _signal_name(reset.exit_code)
    after: readback.Checksums = {}
    changed, stale = None, False
    if interrupted is None:
        began = time.perf_counter()
        try:
            after = await _read_checksums(plan, by_name, http)
            changed = readback.weights_changed(before, after, list(rows.values()))
            stale = readback.stale_reload(list(rows.values()), opts.version, changed)
            if stale:  # the old weights must not keep the new label
                await readback.restore_labels(plan, by_name, http, rows)
            await readback.read_after(plan, by_name, http, rows)
        except asyncio.CancelledError as exc:  # the update itself had finished: only the reading was cut short
            interrupted = signal_of(exc)
            if interrupted is None:
                raise
            _uncancel()
            after = {}
        phases["checksums_after"] = round(time.perf_counter() - began, 6)
    receipt = WeightsReceipt(0, "", opts.version, str(opts.from_path), opts.weights_path, False, opts.verify,
                             list(rows.values()), plan, reset, step.paused_s, interrupted=interrupted,
                             notes=list(plan.notes))
    receipt.exit_code = reset.exit_code
    receipt.weights_changed, receipt.stale = changed, stale
    _fill_phases(receipt, step, phases)
    _judge(receipt, before, after, fleet, step)
    receipt.total_s = round(time.perf_counter() - start, 6)
    return receipt


class _Reload:
    """The step while paused: reload the folder, then set the version label, on one replica."""

    def __init__(self, opts: WeightsOptions, plans: dict[str, ReplicaWeightsPlan],
                 rows: dict[str, WeightsReplica]) -> None:
        self.opts, self.plans, self.rows = opts, plans, rows

    async def run(self, rp: ReplicaPlan, client: VllmClient) -> OpResult:
        row = self.rows[rp.name]
        row.reload = StepResult("interrupted")  # until it answers: a signal now leaves it in flight
        outcome = await _timed(row.reload, client.collective_rpc(
            "reload_weights", {"weights_path": self.opts.weights_path}, timeout=self.opts.reload_timeout))
        error = _reload_error(outcome, self.opts.reload_timeout)
        row.reload.result, row.reload.error = ("failed", error) if error else ("ok", None)
        detail = f"weights_path={self.opts.weights_path}"
        if error:
            return _op(outcome, f"reload_weights failed: {error}", detail)
        if not self.plans[rp.name].sets_version or self.opts.version is None:
            row.set_version = StepResult("skipped")
            return _op(outcome, None, detail)
        row.set_version = StepResult("interrupted")
        answer = await _timed(row.set_version, readback.set_version(client, self.opts.version))
        error = reset_answer_error(answer)
        row.set_version.result, row.set_version.error = ("failed", error) if error else ("ok", None)
        detail += f", version={self.opts.version}"
        return _op(answer, f"reloaded, but /update_weight_version failed: {error}" if error else None, detail)


async def _timed(record: StepResult, call: Awaitable[CallOutcome]) -> CallOutcome:
    started = time.perf_counter()
    try:
        return await call
    finally:
        record.seconds = round(time.perf_counter() - started, 6)


def _op(outcome: CallOutcome, error: str | None, detail: str) -> OpResult:
    return OpResult("reload", "failed" if error else "ok", outcome.status, round(outcome.latency_s, 6),
                    outcome.attempts, error, detail)


def _reload_error(outcome: CallOutcome, timeout: float) -> str | None:
    """vLLM answers {"results": [null, ...]} (one per worker) or an empty 200 (serve/dev/rpc/api_router.py
    in 0.32.0); a worker's exception is a 500."""
    if outcome.error:
        if outcome.status is None and "timed out" in outcome.error:
            return (f"{outcome.error}: the reload may still be running on the server (raise --reload-timeout, "
                    f"now {timeout:g} s; its log says when it is done)")
        return outcome.error
    if outcome.body == "" or (isinstance(outcome.body, dict) and isinstance(outcome.body.get("results"), list)):
        return None
    return f"unexpected answer: {str(outcome.body)[:200]!r}"


async def _read_checksums(plan: WeightsPlan, by_name: dict[str, Replica], http: HttpPool
                          ) -> dict[str, tuple[WeightChecksums | None, dict[str, str] | None, str | None]]:
    """name -> (summary, raw checksums, why there are none) for every replica that reports them."""
    opts = plan.reset.options
    sem = asyncio.Semaphore(max_concurrency(len(plan.replicas), opts.concurrency))
    out: dict[str, tuple[WeightChecksums | None, dict[str, str] | None, str | None]] = {}

    async def one(rp: ReplicaWeightsPlan) -> None:
        if not rp.reports_checksums:
            why = f"vLLM {rp.vllm_version} reports no weight checksums (/weight_checker: 0.32.0+)"
            out[rp.name] = (None, None, why)
            return
        async with sem, replica_client(by_name[rp.name], opts, http) as client:
            try:
                raw = await client.weight_checksums()
            except ServerError as exc:
                out[rp.name] = (None, None, f"its checksums could not be read: {exc.message}")
                return
        out[rp.name] = (summarise_checksums(raw), raw, None) if raw else (None, None, "it reports no checksums")

    await asyncio.gather(*(one(rp) for rp in plan.replicas))
    return out


def _fill_phases(receipt: WeightsReceipt, step: WhilePaused, phases: dict[str, float]) -> None:
    """The fleet's phases: the executor's wall clocks, and the slowest replica's reload and version call."""
    rows = receipt.replicas
    out = {name: 0.0 for name in PHASES}
    out.update({k: v for k, v in step.phases.items() if k in ("pause", "reset", "resume", "verify")})
    out["reload"] = max((r.reload.seconds or 0.0 for r in rows), default=0.0)
    out["version"] = max((r.set_version.seconds or 0.0 for r in rows), default=0.0)
    out["while_paused_step"] = step.phases.get("step", 0.0)
    out.update(phases)
    receipt.phases = out


def _judge(receipt: WeightsReceipt, before: dict, after: dict, fleet: Fleet, step: WhilePaused) -> None:
    """Per replica: its checksums, whether it is updated, its state and next steps; then the verdict."""
    resets = {rr.name: rr for rr in (receipt.reset.replicas if receipt.reset else [])}
    reloaded = {r.name for r in receipt.replicas if r.reload.result == "ok"}  # a failed one differs, and says so
    odd = _odd_checksums({name: a for name, a in after.items() if name in reloaded}, receipt)
    for row in receipt.replicas:
        row.reset = resets.get(row.name)
        b, a = before.get(row.name, (None, None, None)), after.get(row.name, (None, None, None))
        row.checksum_before = b[0].digest if b[0] else None
        row.checksum_after = a[0].digest if a[0] else None
        row.checksum_note = _checksum_note(b, a, receipt.interrupted, row.reload.result)
        held = row.name in step.held  # kept paused by the executor: its reload failed (a signal too)
        row.left_paused = row.window == "paused" if row.window in ("paused", "serving") else held  # as it says
        reset_ok = bool(row.reset and row.reset.reset)
        label = (_stale_error(row, receipt.version) if receipt.stale and row.reload.result == "ok"
                 else _label_error(row, receipt.version))
        row.updated = (receipt.interrupted is None and row.reload.result == "ok" and label is None
                       and row.set_version.result in ("ok", "skipped") and reset_ok and row.name not in odd)
        row.error = _row_error(row, odd.get(row.name) or label, reset_ok)
        steps.describe(row, receipt, fleet)
    verdict(receipt)


def _label_error(row: WeightsReplica, version: str | None) -> str | None:
    """A label set (and read back) inside the pause that /weight_info no longer reports after the resume."""
    if version is None or row.set_version.result != "ok" or row.version_after in (None, version):
        return None
    return f"its /weight_info reports version {row.version_after!r} after the update, not {version!r}"


def _stale_error(row: WeightsReplica, version: str | None) -> str:
    same = f" (checksum {row.checksum_after} before and after)" if row.checksum_after else ""
    return (f"its weights did not change{same}, and no replica's did: the folder holds the weights they already "
            f"ran (a stale mirror of it?), so they are not version {version!r}")


def _row_error(row: WeightsReplica, odd: str | None, reset_ok: bool) -> str | None:
    """The first thing that went wrong on this replica, or None."""
    if odd:
        return odd
    if row.reload.error:
        return f"reload failed: {row.reload.error}"
    if row.set_version.error:
        return f"version not set: {row.set_version.error}"
    if reset_ok:
        return None
    return row.reset.error if row.reset is not None else "not reached"


def _odd_checksums(after: dict, receipt: WeightsReceipt) -> dict[str, str]:
    """Replicas whose weights after the reload differ from the others' of the same parallel layout (or
    whose own workers disagree): name -> why. Sets receipt.checksums_match (None: nothing to compare)."""
    odd: dict[str, str] = {}
    groups: dict[frozenset[str], list[tuple[str, WeightChecksums]]] = {}
    for name, (summary, raw, _) in after.items():
        if summary is None or raw is None:
            continue
        if summary.disagreeing:
            odd[name] = (f"its own workers hold different weights after the reload ({len(summary.disagreeing)} "
                         f"shard(s), e.g. {summary.disagreeing[0]})")
        groups.setdefault(frozenset(raw), []).append((name, summary))
    compared = False
    for members in groups.values():
        if len(members) < 2:
            continue
        compared = True
        counts = Counter(s.digest for _, s in members)
        top, n = counts.most_common(1)[0]
        clear_majority = n > len(members) / 2
        for name, summary in members:
            if summary.digest != top or not clear_majority:
                odd.setdefault(name, f"its weights after the reload (checksum {summary.digest}) differ from the "
                                     f"other replicas' ({', '.join(d for d in counts if d != summary.digest)})")
    receipt.checksums_match = False if odd else (True if compared else None)
    if len(groups) > 1:
        receipt.notes.append("replicas of different parallel layouts report checksums of different shards: "
                             "only replicas of one layout are compared")
    return odd


def _checksum_note(before: tuple, after: tuple, interrupted: str | None, reload: str) -> str | None:
    if after[0] is None and interrupted is not None:
        return before[2] or "not read after: the update was interrupted"
    if after[0] is None:
        return after[2] or before[2]
    if before[0] is not None and before[0].digest == after[0].digest:
        return ("unchanged: the folder holds the weights it already ran" if reload == "ok"
                else f"unchanged: its reload {reload}")
    return None


def _signal_name(exit_code: int) -> str | None:
    """The signal behind an interrupted reset's exit code (128 + its number, kvctl.interrupt)."""
    if exit_code <= 128:
        return None
    try:
        return signal.Signals(exit_code - 128).name
    except ValueError:
        return "SIGINT"


def _uncancel() -> None:
    task = asyncio.current_task()
    if task is not None and hasattr(task, "uncancel"):  # Python >= 3.11 counts cancellations
        task.uncancel()


__all__ = ["update_fleet"]
