"""A reset receipt (kvctl.reset.receipt.Receipt; not imported: it imports this) as flat numbers, for a trainer's metric logger (verl's `metrics` dict, wandb, TensorBoard).

Every value is a float and every key a fixed name under one prefix, so a logger takes the dict as it
is and a dashboard can chart the reset's cost and verdict step by step. A phase that did not run is
0.0 (a step without a pause paused nothing), never missing: a chart's series stay continuous.
"""

from __future__ import annotations

from typing import Any

PHASES = ("prime", "pause", "step", "reset", "resume", "verify")


def receipt_metrics(receipt: Any, prefix: str = "kvctl/") -> dict[str, float]:
    replicas = receipt.replicas
    stale = [r for r in replicas if r.stale]
    inconclusive = [r for r in replicas if not r.reset and not r.stale and receipt.verify]
    master = receipt.master
    values: dict[str, float] = {
        "ok": float(receipt.ok),
        # nothing failed and nothing stale: a step whose content check is only pending counts as clean so far
        "clean": float(not receipt.not_reset),
        "verified": float(receipt.ok and receipt.verify),
        "exit_code": float(receipt.exit_code),
        "replicas": float(len(replicas)),
        "reset_replicas": float(sum(r.reset for r in replicas)),
        "stale_replicas": float(len(stale)),
        "inconclusive_replicas": float(len(inconclusive)),
        "pending_replicas": float(len(receipt.pending)),
        "owner_paused_replicas": float(sum(r.window in ("paused", "asleep") for r in replicas)),
        "total_s": float(receipt.total_s),
        "paused_s": float(receipt.paused_s or 0.0),
        # replicas whose new requests kvctl's pause answered with 503 (vLLM >= 0.33, mode wait), and for how long
        "rejecting_replicas": float(len(receipt.rejecting)),
        "rejecting_s": float(max((r.rejecting_s or 0.0 for r in replicas), default=0.0)),
        "keys_before": float(master.keys_before or 0) if master else 0.0,
        "keys_removed": float(master.removed_count or 0) if master else 0.0,
        "keys_after": float(master.keys_after or 0) if master else 0.0,
    }
    values.update({f"{phase}_s": float(receipt.phases.get(phase, 0.0)) for phase in PHASES})
    return {prefix + key: value for key, value in values.items()}


__all__ = ["receipt_metrics"]
