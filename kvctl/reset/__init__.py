"""`kvctl reset` and `kvctl probe`: a verified, version-aware hard reset of a fleet.

One walk: kvctl.api -> plan (what each replica gets) -> execute (prime, pause, reset, master clear,
resume, verify) -> receipt (the verdict). master holds the Mooncake master phase, leader the HA
leader choice, verify the canary and the content probe after a reset, probe `kvctl probe` itself.

The names below stay importable from `kvctl.reset` (loaded on first use).
"""

from __future__ import annotations

from kvctl._faces import lazy_face

_FACE = {
    "ResetOptions": "kvctl.reset.plan", "Plan": "kvctl.reset.plan", "PlannedOp": "kvctl.reset.plan",
    "ReplicaPlan": "kvctl.reset.plan", "plan_reset": "kvctl.reset.plan",
    "Receipt": "kvctl.reset.receipt", "ReplicaReceipt": "kvctl.reset.receipt",
    "MasterReceipt": "kvctl.reset.receipt", "OpResult": "kvctl.reset.receipt", "CanaryCheck": "kvctl.reset.receipt",
    "execute_plan": "kvctl.reset.execute", "hard_reset_fleet": "kvctl.reset.execute",
    "key_prefix": "kvctl.facts.cache_prefix",
    "ProbeOptions": "kvctl.reset.probe", "ProbeReport": "kvctl.reset.probe", "probe_fleet": "kvctl.reset.probe",
}

__getattr__, __dir__ = lazy_face(__name__, _FACE, globals())
