"""The reset's receipt: per replica and operation what happened, the master clear, the verdict.

A replica counts as reset only when every step for it succeeded (and, when asked, was verified:
with probe prompts, only a probe that matched verifies); `conclude()` judges that once every phase
ran. Receipts are data (`to_dict()`), never printed here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from kvctl.errors import EXIT_FAILED, EXIT_OK, EXIT_PARTIAL
from kvctl.facts.pausing import REJECTED_UNCOUNTED, pause_rejection_source, pause_rejects
from kvctl.reset.leader import MasterNode
from kvctl.reset.plan import Plan, plain_data
from kvctl.targets import Fleet

Result = Literal["ok", "failed", "skipped"]


# -- receipt ------------------------------------------------------------------------------
@dataclass
class OpResult:
    op: str
    result: Result
    http_status: int | None = None
    latency_s: float | None = None
    attempts: int = 0
    error: str | None = None
    detail: str | None = None


@dataclass
class CanaryCheck:
    ok: bool
    signal: str  # "cached_tokens" (per request) or "metrics" (counter deltas)
    prompt_tokens: int | None = None
    primed_cached_tokens: float | None = None  # the hit before the reset (proves the signal works)
    cached_tokens: float | None = None  # after the reset (must be 0)
    local_hits: float | None = None
    external_hits: float | None = None
    error: str | None = None
    stale: bool = False  # it hit the cache after the reset: KV computed before it survives
    note: str | None = None  # how its count was read (vLLM < 0.24 omits a zero: kvctl.reset.cached_tokens)


@dataclass
class ReplicaReceipt:
    name: str
    url: str
    version: str | None
    connector: list[str] | None
    ops: list[OpResult] = field(default_factory=list)
    canary: CanaryCheck | None = None
    # kvctl probe's verdict, error, hint, tolerance and why, per-prompt results (--probe-prompts)
    probe: dict[str, Any] | None = None
    reset: bool = False  # every step confirmed
    error: str | None = None
    # The weights it was cleared for, read while planning: /weight_info's version and (with verify)
    # the digest of /weight_checker's checksums; weight_note says why either is not known.
    weight_version: str | None = None
    weight_digest: str | None = None
    weight_note: str | None = None
    # The window it was in (kvctl.reset.window), what was proven and how, what could not be, and a
    # check left for after its owner resumes it (its canary, kvctl evidence check)
    window: str | None = None
    proven: list[str] = field(default_factory=list)
    unproven: list[str] = field(default_factory=list)
    pending: str | None = None
    stale: bool = False  # seen serving KV from before the reset (canary hit, STALE probe, keys left in a quiet store)
    # Seconds kvctl's pause made this replica answer every new request with 503 engine_paused (vLLM >= 0.33 in
    # mode wait/abort), and the sentence saying so: vLLM counts no such request, so no number of them exists
    rejecting_s: float | None = None
    rejected: str | None = None


@dataclass
class MasterReceipt:
    address: str
    clear: OpResult | None = None
    removed_count: int | None = None  # what the master said it removed (not proof: counted again)
    keys_after: int | None = None  # of this deployment (cache_prefix) when one is set
    cache_prefix: str | None = None
    verified: bool | None = None
    error: str | None = None
    scope: str | None = None  # "scoped" (<cache_prefix>@ keys only) | "whole" (every key)
    # the regex of this deployment's keys, whole (kvctl.reset.master.deployment_pattern): what a scoped clear
    # removes and what is counted as this deployment's; None: no cache_prefix
    key_pattern: str | None = None
    # "on": the master keeps tenants apart (kvctl.reset.tenancy): its master_key_count gauge then counts every
    # tenant's keys, so it is no count of this fleet's (the default tenant's listing is)
    tenancy: str | None = None
    keys_before: int | None = None  # this deployment's (or, unscoped, all) keys before the clear; None: not counted
    others_before: int | None = None  # keys of other deployments sharing the master; None: not counted
    # Before a clear on a large master (kvctl.reset.master.EXACT_BEFORE_MAX) the split above is not
    # counted: total_before is then the only count (the master_key_count gauge: every key, all
    # deployments) and, scoped, keys_before_min says at least how many of this deployment's keys were there.
    total_before: int | None = None
    keys_before_min: int | None = None
    others_after: int | None = None
    remaining: str | None = None  # why keys survived the clear's retries, when they did
    rpc_address: str | None = None  # where a scoped clear went (the leader's RPC port)
    planned_address: str | None = None  # the master the plan chose (differs after a leader change)
    leader_changed: str | None = None  # "old -> new" when leadership moved before or during the clear
    roles: list[MasterNode] = field(default_factory=list)  # what each master said just before the clear
    # What kvctl saw of Mooncake's known gaps (a failover that started empty, keys that survived forced
    # clears): facts for the reader, each in one sentence; the verdict itself is judged by the counts
    notes: list[str] = field(default_factory=list)


@dataclass
class Receipt:
    exit_code: int
    summary: str
    dry_run: bool
    verify: bool
    replicas: list[ReplicaReceipt]
    master: MasterReceipt | None
    plan: Plan
    total_s: float
    not_reset: list[str] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)  # seconds: prime, pause, step, reset, resume, verify
    paused_s: float | None = None  # kvctl's paused window: first pause sent -> last resume answered

    @property
    def ok(self) -> bool:
        return self.exit_code == EXIT_OK

    @property
    def pending(self) -> list[str]:
        """Replicas reset (and proven as far as their window allows) whose canary waits for their owner's resume."""
        return [r.name for r in self.replicas if r.reset and r.pending]

    @property
    def rejecting(self) -> list[str]:
        """Replicas whose new requests kvctl's pause answered with 503 engine_paused while it lasted."""
        return [r.name for r in self.replicas if r.rejecting_s is not None]

    @property
    def stale(self) -> list[str]:
        """Replicas seen serving KV from before the reset (a canary hit, a STALE probe)."""
        return [r.name for r in self.replicas if r.stale]

    @property
    def failed(self) -> bool:
        """Something was not reset or not clean: a pending check alone is not a failure."""
        return bool(self.not_reset)

    def metrics(self, prefix: str = "kvctl/") -> dict[str, float]:
        """Flat numbers for a trainer's metric logger (wandb, verl's `metrics`, TensorBoard) as they are."""
        from kvctl.reset.metrics import receipt_metrics

        return receipt_metrics(self, prefix)

    def to_dict(self) -> dict[str, Any]:
        data = plain_data(self)
        data["ok"] = self.ok
        return data


def receipt_without_execution(plan: Plan, fleet: Fleet, elapsed: float) -> Receipt:
    replicas = [ReplicaReceipt(r.name, r.url, r.version, r.layout, error=r.error) for r in plan.replicas]
    _record_weights(plan, replicas)
    master = MasterReceipt(plan.master, cache_prefix=plan.cache_prefix) if plan.master else None
    if plan.error:
        summary = f"plan failed, nothing was sent: {plan.error}"
        return Receipt(EXIT_FAILED, summary, plan.options.dry_run, plan.options.verify, replicas, master, plan,
                       elapsed, [r.name for r in plan.replicas])
    summary = f"dry run: {len(plan.replicas)} replica(s) planned, nothing was sent"
    unplanned = [r.name for r in plan.replicas if r.error]
    code = EXIT_OK if not unplanned else EXIT_PARTIAL
    return Receipt(code, summary, True, plan.options.verify, replicas, master, plan, elapsed, unplanned)


def conclude(plan: Plan, replicas: list[ReplicaReceipt], master: MasterReceipt | None, elapsed: float,
             phases: dict[str, float] | None = None, paused_s: float | None = None) -> Receipt:
    opts = plan.options
    master_ok: bool | None = True
    if plan.master_clear:
        master_ok = master is not None and master.clear is not None and master.clear.result == "ok"
    if opts.verify and master is not None:
        # None: counted on a generating fleet, where a count proves nothing (the canary judges)
        master_ok = master_ok and master.verified if master.verified is not None else (master_ok and None)
    plans = {r.name: r for r in plan.replicas}
    _record_weights(plan, replicas)
    _record_rejections(plans, replicas, paused_s)
    mixed = {} if opts.allow_mixed_weights or not opts.verify else \
        {name: m.problem for m in plan.weights_mixed for name in m.replicas}
    for rr in replicas:
        rp = plans[rr.name]
        failed = [o for o in rr.ops if o.result == "failed"]
        needs_master = plan.master_clear and (rp.store_cleared_by_vllm is False)
        canary_ok = rr.canary.ok if rr.canary is not None else not opts.verify
        # the content proof asked for (--verify --probe-prompts) verifies only when it ran and
        # matched: inconclusive means it proved nothing
        probe_ok = rr.probe["verdict"] == "match" if rr.probe is not None \
            else not (opts.verify and opts.probe_prompts)
        judged = needs_master or (opts.verify and master is not None)
        store_ok = (master_ok if master_ok is not None else canary_ok) if judged else True
        deferred = rr.canary is None and (rr.pending is not None or any(u.startswith("content:") for u in rr.unproven))
        if deferred:
            # no canary could run (paused by its owner, asleep, none in the evidence): the reset counts
            # as done when its calls and the store's count hold; the receipt says what stays unproven
            canary_ok = probe_ok = True
            store_ok = True if master_ok is None and judged else store_ok
        rr.stale = _is_stale(rr) or bool(judged and master is not None and master.verified is False
                                         and (master.keys_after or 0) > 0)
        rr.reset = rr.error is None and not failed and canary_ok and probe_ok and bool(store_ok) \
            and rr.name not in mixed and not rr.stale
        _record_proof(rr, master, master_ok, opts.verify, bool(judged))
        if rr.error is None and rr.name in mixed and not failed:  # cleared, but its store mixes again on resume
            rr.error = (f"verification failed: {mixed[rr.name]}; fix: kvctl weights update on them, or "
                        "--allow-mixed-weights where they are meant to differ")
        if rr.error is None and not rr.reset:
            rr.error = _replica_error(failed, rr.canary, opts.verify, bool(store_ok), master, rr.probe,
                                      bool(opts.probe_prompts))
    not_reset = [r.name for r in replicas if not r.reset]
    open_items = [r for r in replicas if r.reset and (r.pending or r.unproven)]
    done = len(replicas) - len(not_reset)
    did = ("checked (nothing was reset by kvctl)" if opts.check_only else "hard-reset" if opts.connector
           else "reset (local caches only; the external store was not touched: --connector clears it)")
    if not not_reset and not open_items:
        code = EXIT_OK
        summary = f"{done}/{len(replicas)} replica(s) {did}" + (" and verified" if opts.verify else "")
    elif not not_reset:
        code = EXIT_PARTIAL
        pending = [r.name for r in open_items if r.pending]
        unproven = [r.name for r in open_items if not r.pending]
        summary = f"{done}/{len(replicas)} replica(s) {did}; proven as far as their window allows"
        if pending:
            summary += (f"; content check PENDING on {', '.join(pending)} (paused by their owner): run `kvctl "
                        "evidence check FILE` (kvctl.check_evidence) once they resume")
        if unproven:
            summary += f"; NOT fully proven on {', '.join(unproven)} (see each replica's unproven)"
    else:
        code = EXIT_FAILED if done == 0 else EXIT_PARTIAL
        verb = "verified clean" if opts.check_only else "reset" + (" and verified" if opts.verify else "")
        summary = f"{done}/{len(replicas)} replica(s) {verb}; NOT {'clean' if opts.check_only else 'reset'}: " \
                  f"{', '.join(not_reset)}"
        stale = [r.name for r in replicas if r.stale]
        if stale:
            summary += f" (STALE KV served by {', '.join(stale)})"
    return Receipt(code, summary, False, opts.verify, replicas, master, plan, round(elapsed, 6), not_reset,
                   dict(phases or {}), paused_s)


def _is_stale(rr: ReplicaReceipt) -> bool:
    """Seen serving KV from before the reset: its canary hit, or its probe found STALE."""
    return bool((rr.canary is not None and rr.canary.stale) or (rr.probe and rr.probe.get("verdict") == "STALE"))


def _record_proof(rr: ReplicaReceipt, master: MasterReceipt | None, master_ok: bool | None, verify: bool,
                  judged: bool) -> None:
    """What was proven for this replica, and how, in words (the receipt's `proven` list)."""
    if not verify:
        return
    if rr.canary is not None and rr.canary.ok:
        how = ("its canary's cached_tokens" if rr.canary.signal == "cached_tokens" else "its hit counters")
        how += f"; {rr.canary.note}" if rr.canary.note else ""
        rr.proven.append(f"local and store: a prompt cached before the reset shows 0 cached tokens after it ({how})")
    if judged and master is not None and master.verified:
        scope = f"under '{master.cache_prefix}'" if master.cache_prefix else "in total"
        rr.proven.append(f"store: 0 keys {scope} on the master {master.address} while no replica wrote")
    if rr.probe is not None and rr.probe.get("verdict") == "match":
        rr.proven.append("content: kvctl probe's answers match a fresh computation")
    if judged and master_ok is None and (rr.canary is None or not rr.canary.ok):
        rr.unproven.append("store: the fleet was generating, so the master's count proves nothing, and no canary "
                           "proved it either")


def _record_rejections(plans: dict[str, Any], replicas: list[ReplicaReceipt], paused_s: float | None) -> None:
    """Where kvctl's pause rejected new requests (its mode on its release), say for how long. The count cannot
    be known: vLLM finishes a request rejected on arrival before any statistic (REJECTED_UNCOUNTED)."""
    for rr in replicas:
        rp = plans[rr.name]
        paused = any(o.op == "pause" and o.result == "ok" for o in rr.ops)
        if paused and paused_s is not None and rp.version and rp.pause_mode and pause_rejects(rp.version,
                                                                                               rp.pause_mode):
            rr.rejecting_s = paused_s
            rr.rejected = (f"every request that reached it during kvctl's {paused_s:.2f} s pause (mode "
                           f"{rp.pause_mode}) was answered HTTP 503 engine_paused ({pause_rejection_source(rp.version)}); "
                           f"how many cannot be known: {REJECTED_UNCOUNTED}")


def _record_weights(plan: Plan, replicas: list[ReplicaReceipt]) -> None:
    weights = {r.name: r.weights for r in plan.replicas if r.weights is not None}
    for rr in replicas:
        state = weights.get(rr.name)
        if state is not None:
            rr.weight_version, rr.weight_digest = state.version, state.digest
            rr.weight_note = state.note


def _probe_inconclusive(probe: dict[str, Any]) -> str:
    """Why the probe proved nothing (its first inconclusive reason) and how to fix it."""
    if probe.get("error"):
        where, why, fix = "", probe["error"], probe.get("hint")
    else:
        first = next((r for r in probe["results"] if r["verdict"] != "match"), None)
        where, why, fix = (f" for '{first['prompt']}'", first["reason"], first.get("hint")) if first \
            else ("", "no prompt was probed", None)
    return (f"not verified: kvctl probe was inconclusive{where}: {why}; fix: "
            + (fix or "run kvctl probe --prompts FILE on this replica to see why"))


def _replica_error(failed: list[OpResult], canary: CanaryCheck | None, verify: bool, store_ok: bool,
                   master: MasterReceipt | None, probe: dict[str, Any] | None = None,
                   probe_asked: bool = False) -> str:
    if failed:
        return "; ".join(f"{o.op}: {o.error}" for o in failed)
    if verify and (canary is None or not canary.ok):
        return f"verification failed: {canary.error if canary else 'no canary result'}"
    if probe is not None and probe["verdict"] == "STALE":
        stale = next(r for r in probe["results"] if r["verdict"] == "STALE")
        return f"verification failed: kvctl probe found STALE KV for '{stale['prompt']}': {stale['reason']}"
    if probe is not None and probe["verdict"] != "match":
        return _probe_inconclusive(probe)
    if probe is None and verify and probe_asked:
        return ("not verified: the content probe (--probe-prompts) did not run on this replica; fix: run "
                "kvctl probe --prompts FILE on it")
    if not store_ok:
        return f"the Mooncake store was not confirmed clear: {master.error if master else 'no master'}"
    return "not confirmed"


__all__ = ["CanaryCheck", "MasterReceipt", "OpResult", "Receipt", "ReplicaReceipt"]
