"""kvctl inside verl (0.9.x): a verified hard reset (or a check of verl's own) after every weight
update of every verl trainer, its numbers in verl's step metrics, and the live rollout servers
recorded as a kvctl run so that `kvctl status|probe|reset --run verl-NAME` find them.

Enable it with one change to the launch line, `-m kvctl.integrations.verl` in front of verl's module:

    KVCTL_MASTER=10.0.0.1:9003 python3 -m kvctl.integrations.verl verl.trainer.main_ppo ARGS...

(docs/verl.md, section 3). Pieces, for a driver of one's own:
- KvctlVerlHook: the policy (master, policy warn|raise, mode reset|verify, attempts, budget_s, verify).
- task_runner(TaskRunnerClass, hook): for verl's `run_ppo(config, task_runner_class=...)`.
- KvctlCheckpointEngineManager: for actor_rollout_ref.rollout.checkpoint_manager_class (legacy and
  one_step_off trainers); `adopt(manager, hook)` hooks a manager verl built itself.

Importing this package imports neither verl, Ray nor torch: the verl classes are built on first
use, in the process where verl's trainer runs.
"""

from __future__ import annotations

from typing import Any

from kvctl.integrations.verl.hook import DataParallelRefused, KvctlVerlHook, ReplicaView, current, install

_LAZY = {
    "KvctlCheckpointEngineManager": ("kvctl.integrations.verl.managers", "manager_class", True),
    "manager_class": ("kvctl.integrations.verl.managers", "manager_class", False),
    "adopt": ("kvctl.integrations.verl.managers", "adopt", False),
    "task_runner": ("kvctl.integrations.verl.trainers", "task_runner", False),
    "v1_trainer_class": ("kvctl.integrations.verl.trainers", "v1_trainer_class", False),
    "legacy_trainer_class": ("kvctl.integrations.verl.trainers", "legacy_trainer_class", False),
    "fully_async_trainer_actor": ("kvctl.integrations.verl.trainers", "fully_async_trainer_actor", False),
    "ServerRecorder": ("kvctl.integrations.verl.servers", "ServerRecorder", False),
    "main": ("kvctl.integrations.verl.entry", "main", False),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'kvctl.integrations.verl' has no attribute {name!r}")
    import importlib

    module, attr, call = _LAZY[name]
    value = getattr(importlib.import_module(module), attr)
    return value() if call else value  # KvctlCheckpointEngineManager: built (imports verl) on first use


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = ["DataParallelRefused", "KvctlCheckpointEngineManager", "KvctlVerlHook", "ReplicaView", "ServerRecorder",
           "adopt", "current", "fully_async_trainer_actor", "install", "legacy_trainer_class", "main",
           "manager_class", "task_runner", "v1_trainer_class"]
