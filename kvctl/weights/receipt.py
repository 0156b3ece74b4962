"""The weight update's receipt: per replica its version and checksum before and after, its reload, its
reset (kvctl.reset's receipt, embedded), what state it is left in and the commands that finish or undo
what did not complete; for the fleet each phase's time and the paused window. Data only: never printed.

Exit codes as reset's (kvctl/errors.py): 0 every replica updated (and verified when asked), 1 none,
the plan refused, or the replicas' checksums disagree, 3 some; 128 + the signal when one ended it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from kvctl.errors import EXIT_FAILED, EXIT_OK, EXIT_PARTIAL
from kvctl.reset.plan import plain_data
from kvctl.reset.receipt import Receipt, ReplicaReceipt
from kvctl.weights.plan import WeightsPlan

StepState = Literal["ok", "failed", "skipped", "not run", "interrupted"]


@dataclass
class StepResult:
    result: StepState = "not run"
    seconds: float | None = None
    error: str | None = None


@dataclass
class WeightsReplica:
    name: str
    url: str
    vllm_version: str | None
    version_before: str | None = None
    version_after: str | None = None
    checksum_before: str | None = None  # a short digest over every worker's checksums (None: not reported)
    checksum_after: str | None = None
    checksum_note: str | None = None  # why there is none, or what the checksums say beyond the digest
    reload: StepResult = field(default_factory=StepResult)
    set_version: StepResult = field(default_factory=StepResult)
    reset: ReplicaReceipt | None = None  # kvctl.reset's own record of this replica (ops, canary, probe)
    label_restored: bool = False  # its old label was set back: the reload changed no replica's weights
    label_restore_error: str | None = None  # why setting it back failed (it keeps the new label)
    # paused when kvctl finished: kept so (its reload failed), or found paused (by its owner) and left so
    left_paused: bool = False
    # what /is_paused and /is_sleeping said after the update: serving | paused | asleep | unknown (None: not read)
    window: str | None = None
    updated: bool = False  # reloaded, versioned (if asked), reset (and verified when asked)
    state: str = "not updated"  # one sentence: what it runs and whether it serves
    error: str | None = None
    next_steps: list[str] = field(default_factory=list)  # commands that finish or undo what did not complete

    def to_dict(self) -> dict[str, Any]:
        """Reset's per-replica fields (ops, canary, probe, connector, reset) beside the weights' own."""
        data = plain_data(self)
        reset = data.pop("reset") or {}
        reset.pop("name", None), reset.pop("url", None), reset.pop("version", None)
        reset_error = reset.pop("error", None)
        data.update({k: v for k, v in reset.items() if k not in data})
        data["reset"] = bool(self.reset and self.reset.reset)
        data["reset_error"] = reset_error
        return data


@dataclass
class WeightsReceipt:
    exit_code: int
    summary: str
    version: str | None  # the version label asked for (None: left as it was)
    from_path: str
    weights_path: str  # what the servers were sent
    dry_run: bool
    verify: bool
    replicas: list[WeightsReplica]
    plan: WeightsPlan
    reset: Receipt | None = None  # the hard reset's receipt (None: the update did not get that far)
    paused_seconds: float | None = None  # the fleet's paused window: first pause sent -> last resume answered
    phases: dict[str, float] = field(default_factory=dict)
    checksums_match: bool | None = None  # every replica of one parallel layout reports the same weights after
    # the reload changed some replica's weights (checksums before -> after); False: none; None: not known
    weights_changed: bool | None = None
    stale: bool = False  # it changed none, to a label none carried: not updated, labels set back
    interrupted: str | None = None  # the signal that ended it early
    notes: list[str] = field(default_factory=list)
    total_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == EXIT_OK

    @property
    def failed(self) -> bool:
        """A replica not updated (or refused, interrupted): a check left open on a replica its owner
        paused alone is not a failure, as for kvctl.hard_reset."""
        return bool(self.not_updated) or self.exit_code not in (EXIT_OK, EXIT_PARTIAL)

    @property
    def not_updated(self) -> list[str]:
        return [r.name for r in self.replicas if not r.updated]

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "exit_code": self.exit_code, "summary": self.summary, "version": self.version,
                "from_path": self.from_path, "weights_path": self.weights_path, "dry_run": self.dry_run,
                "verify": self.verify, "replicas": [r.to_dict() for r in self.replicas],
                "not_updated": self.not_updated, "paused_seconds": self.paused_seconds, "phases": dict(self.phases),
                "checksums_match": self.checksums_match, "weights_changed": self.weights_changed,
                "stale": self.stale, "interrupted": self.interrupted, "notes": list(self.notes),
                "total_s": self.total_s, "plan": self.plan.to_dict(),
                "reset": self.reset.to_dict() if self.reset is not None else None}


def receipt_without_execution(plan: WeightsPlan, elapsed: float) -> WeightsReceipt:
    """A refused plan (exit 1, nothing paused or sent) or a dry run (exit 0: the plan)."""
    opts = plan.options
    replicas = [WeightsReplica(r.name, r.url, r.vllm_version, version_before=r.version_before, error=r.error,
                               state="not touched") for r in plan.replicas]
    if plan.error:
        code, summary = EXIT_FAILED, f"refused, nothing was paused or sent: {plan.error}"
    else:
        code = EXIT_OK
        summary = (f"dry run: {len(replicas)} replica(s) would reload {opts.weights_path}"
                   + (f" as version {opts.version}" if opts.version else "") + ", then be hard-reset; nothing was sent")
    return WeightsReceipt(code, summary, opts.version, str(opts.from_path), opts.weights_path, opts.dry_run,
                          opts.verify, replicas, plan, notes=list(plan.notes), total_s=round(elapsed, 6))


def verdict(receipt: WeightsReceipt) -> None:
    """Exit code and summary from the replicas' outcomes (an interrupted receipt keeps its signal's code)."""
    done = [r for r in receipt.replicas if r.updated]
    n = len(receipt.replicas)
    # updated, but a check --verify asked for could not run (paused by its owner, asleep): not "verified"
    open_items = [r for r in done if receipt.verify and r.reset is not None and (r.reset.pending or r.reset.unproven)]
    what = "reloaded" + (f" as version {receipt.version}" if receipt.version else "") + ", hard-reset" \
        + (" and verified" if receipt.verify and not open_items else "")
    if receipt.interrupted:
        reloaded = [r.name for r in receipt.replicas if r.reload.result == "ok"]
        receipt.summary = (f"interrupted by {receipt.interrupted}: the update did not finish; reloaded: "
                           f"{', '.join(reloaded) or 'none'}; every replica kvctl paused was resumed unless said "
                           "otherwise; see each replica")
        return
    if receipt.checksums_match is False:
        receipt.exit_code = EXIT_FAILED
        receipt.summary = ("the replicas report different weights after the reload (their checksums differ): "
                           "the update failed; see each replica")
        return
    if receipt.stale:
        restored = [r.name for r in receipt.replicas if r.label_restored]
        receipt.exit_code = EXIT_FAILED
        receipt.summary = ("the reload changed no replica's weights (their checksums are the same before and after): "
                           "the folder holds the weights they already ran (a stale mirror of it?), so they are not "
                           f"version {receipt.version}; caches cleared"
                           + (f"; old labels set back on {', '.join(restored)}" if restored else "")
                           + "; see each replica")
        return
    held = [r.name for r in receipt.replicas if r.left_paused and not found_paused(r)]
    found = [r.name for r in receipt.replicas if r.left_paused and found_paused(r)]
    if len(done) == n:
        receipt.exit_code = EXIT_PARTIAL if open_items else EXIT_OK
        receipt.summary = f"{n}/{n} replica(s) {what}" + _open_words(open_items) + _weights_words(receipt) \
            + _found_words(found)
        return
    receipt.exit_code = EXIT_FAILED if not done else EXIT_PARTIAL
    receipt.summary = (f"{len(done)}/{n} replica(s) {what}; NOT updated: {', '.join(receipt.not_updated)}"
                       + (f"; kept paused: {', '.join(held)}" if held else "") + _open_words(open_items)
                       + _weights_words(receipt) + _found_words(found))


def _open_words(open_items: list[WeightsReplica]) -> str:
    """As kvctl reset says a check that could not run (kvctl.reset.receipt.conclude)."""
    if not open_items:
        return ""
    pending = [r.name for r in open_items if r.reset is not None and r.reset.pending]
    unproven = [r.name for r in open_items if r.name not in pending]
    words = "; verified as far as their window allows"
    if pending:
        words += (f"; content check PENDING on {', '.join(pending)} (paused by their owner): run `kvctl evidence "
                  "check FILE` (kvctl.check_evidence) once they resume")
    if unproven:
        words += f"; NOT fully proven on {', '.join(unproven)} (see each replica's unproven)"
    return words


def found_paused(row: WeightsReplica) -> bool:
    """Paused before the update (by its owner, or a run before this one), so kvctl neither paused nor resumed it."""
    ops = row.reset.ops if row.reset is not None else []
    return any(o.op == "pause" and o.result == "skipped" for o in ops)


def _found_words(found: list[str]) -> str:
    return (f"; left paused as found (paused before the update; they serve nothing until resumed): "
            f"{', '.join(found)}") if found else ""


def _weights_words(receipt: WeightsReceipt) -> str:
    """What the checksums say of the reload, where they do not fail it: unchanged, or not checked."""
    if receipt.weights_changed is False:
        return ("; weights unchanged (equal checksums before and after: the folder holds the weights they "
                "already ran)")
    if receipt.weights_changed is None and any(r.reload.result == "ok" for r in receipt.replicas):
        return ("; weights not checked: no replica reported checksums before and after the reload "
                "(/weight_checker, vLLM >= 0.32.0), so only vLLM's answers say they changed")
    return ""


__all__ = ["StepResult", "WeightsReceipt", "WeightsReplica", "found_paused", "receipt_without_execution", "verdict"]
