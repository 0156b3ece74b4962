"""kvctl's hook inside verl's CheckpointEngineManager: the one object every verl 0.9.x trainer moves
weights, pauses, sleeps and resumes its rollout fleet through (verl/checkpoint_engine/base.py:380).

Where each moment of kvctl.integrations.verl.hook lands (verl 0.9.1, base.py):
- `abort_replicas` (:477) and `sleep_replicas` (:467): the fleet stops serving the old weights
  (verl pauses it with abort_all_requests -> pause_generation, or puts it to sleep): evidence first,
  once per update cycle.
- `update_weights` (:510), other backends than "naive": evidence if none was taken yet (a fleet that
  generates until the update: the standalone fleets of separate_async and fully_async, one_step_off's);
  then verl's update. (A naive update starts with the fleet asleep, engine_workers.py:732.)
- a backend that moves weights over NCCL/NIXL (not "naive") ends its update with
  `resume_generation_replicas` (:560): kvctl resets and verifies just BEFORE it, while verl's gate is
  still closed (no verl request admitted; the engines paused by verl, so kvctl proves the store by the
  master's count and leaves the canaries pending), then checks the pending canaries once verl resumed.
- the "naive" backend (colocated, hybrid engines: :518-520) returns right after the actor loaded the
  weights and woke the engines (verl's reset has run, no rollout is scheduled): kvctl resets and
  verifies there; a trainer that resumes generation next (colocate_async, separate_async's hybrid
  switch) gets the pending canaries checked in its `resume_generation_replicas`.

`update_weights` returns verl's sync metrics with kvctl's merged in: the trainers that log that
return (one_step_off: separation/ray_trainer.py:660-664; separate_async: trainer_separate_async.py:
381-383) get them with no more wiring.

verl's methods are `@auto_await` coroutines (verl/utils/ray_utils.py:97): awaited from a coroutine
they return the coroutine, called from synchronous trainer code they run it. The overrides are
decorated the same way and await verl's own through super(), so both kinds of caller keep working.

The classes are built on first use (`manager_class()`): importing this module never imports verl.
"""

from __future__ import annotations

from typing import Any

from kvctl.integrations.verl.hook import KvctlVerlHook, current
from kvctl.integrations.verl.servers import replica_views

_BUILT: dict[type, type] = {}


def manager_class(base: type | None = None) -> type:
    """verl's CheckpointEngineManager (or `base`, a subclass of it) with kvctl's hook. Cached per base."""
    if base is None:
        from verl.checkpoint_engine import CheckpointEngineManager

        base = CheckpointEngineManager
    if getattr(base, "_kvctl_manager", False):
        return base
    if base not in _BUILT:
        _BUILT[base] = _build(base)
    return _BUILT[base]


def _build(base: type) -> type:
    from verl.utils.ray_utils import auto_await

    class KvctlCheckpointEngineManager(base):  # type: ignore[misc, valid-type]
        """A verl CheckpointEngineManager whose weight updates kvctl checks (kvctl.integrations.verl)."""

        _kvctl_manager = True
        _kvctl_hook: KvctlVerlHook | None = None
        _kvctl_label = ""
        _kvctl_updating = False
        _kvctl_done = False
        _kvctl_step: int | None = None

        def __init__(self, *args: Any, **kwargs: Any) -> None:  # built by verl (checkpoint_manager_class)
            super().__init__(*args, **kwargs)
            attach(self, current(), "")

        def _kvctl_views(self) -> list[Any]:
            return replica_views(self, self._kvctl_label)

        @auto_await
        async def abort_replicas(self, *args: Any, **kwargs: Any) -> Any:
            await self._kvctl_hook.before_stop(self._kvctl_label, self._kvctl_views())
            return await super().abort_replicas(*args, **kwargs)

        @auto_await
        async def sleep_replicas(self, *args: Any, **kwargs: Any) -> Any:
            await self._kvctl_hook.before_stop(self._kvctl_label, self._kvctl_views())
            return await super().sleep_replicas(*args, **kwargs)

        @auto_await
        async def update_weights(self, global_steps: int | None = None) -> Any:
            hook = self._kvctl_hook
            if getattr(self, "backend", None) != "naive":  # a naive update starts asleep (engine_workers.py:732)
                await hook.before_stop(self._kvctl_label, self._kvctl_views())
            self._kvctl_updating, self._kvctl_done, self._kvctl_step = True, False, global_steps
            try:
                result = await super().update_weights(global_steps)
                if not self._kvctl_done:  # the naive backend: no resume inside (base.py:518-520)
                    await self._kvctl_after_update()
            finally:
                self._kvctl_updating = False
            return {**(result or {}), **hook.metrics()}

        @auto_await
        async def resume_generation_replicas(self, *args: Any, **kwargs: Any) -> Any:
            if self._kvctl_updating and not self._kvctl_done:  # base.py:560: verl's gate still closed
                await self._kvctl_after_update()
            result = await super().resume_generation_replicas(*args, **kwargs)
            await self._kvctl_hook.after_resume(self._kvctl_label, self._kvctl_views())
            return result

        async def _kvctl_after_update(self) -> None:
            self._kvctl_done = True
            await self._kvctl_hook.after_update(self._kvctl_label, self._kvctl_views(), self._kvctl_step)

    KvctlCheckpointEngineManager.__qualname__ = KvctlCheckpointEngineManager.__name__ = (
        "KvctlCheckpointEngineManager" if base.__name__ == "CheckpointEngineManager" else f"Kvctl{base.__name__}")
    return KvctlCheckpointEngineManager


def attach(manager: Any, hook: KvctlVerlHook, label: str) -> Any:
    """Give a kvctl manager its hook and fleet label, and record its servers."""
    manager._kvctl_hook, manager._kvctl_label = hook, label
    for other, known in list(hook.fleets.items()):
        if known is manager and other != label:
            del hook.fleets[other]
    hook.fleets[label] = manager
    hook.start()
    hook.record_servers()
    return manager


def adopt(manager: Any, hook: KvctlVerlHook | None = None, label: str = "") -> Any:
    """Hook a manager verl built itself (the v1 trainers and fully_async build theirs with
    CheckpointEngineManager(...) directly, ignoring checkpoint_manager_class): its class becomes the
    kvctl subclass of its own class, in place, so every holder of the object (fully_async's dynamic
    resource controller keeps one) sees the hook. Its state is verl's, untouched."""
    if manager is None:
        return None
    if not getattr(type(manager), "_kvctl_manager", False):
        manager.__class__ = manager_class(type(manager))
    return attach(manager, hook or current(), label)


__all__ = ["adopt", "attach", "manager_class"]
