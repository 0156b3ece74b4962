"""`kvctl weights`: new weights on every replica and every cache cleared, as one verified fleet operation.

One walk: kvctl.api.update_weights -> plan (each replica's live version: can it reload from a folder,
set a version, report checksums) -> execute (checksums before; kvctl.reset's executor with the reload
as its step while paused; versions and checksums after) -> receipt (per replica before/after, phases,
the paused window). steps says what each replica is left running and how to finish or undo it.

The names below stay importable from `kvctl.weights` (loaded on first use).
"""

from __future__ import annotations

from kvctl._faces import lazy_face

_FACE = {
    "WeightsOptions": "kvctl.weights.plan", "WeightsPlan": "kvctl.weights.plan", "plan_update": "kvctl.weights.plan",
    "WeightsReceipt": "kvctl.weights.receipt", "WeightsReplica": "kvctl.weights.receipt",
    "update_fleet": "kvctl.weights.execute",
}

__getattr__, __dir__ = lazy_face(__name__, _FACE, globals())
