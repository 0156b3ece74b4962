"""verl's trainers with kvctl's hook, and the TaskRunner that installs them: built on first use,
in the one process where verl's trainer runs.

verl loads code in every process it starts when asked through VERL_USE_EXTERNAL_MODULES
(verl/__init__.py:49-52: its workers and vLLM engine processes too). Its own way to bring a
recipe's code to the trainer only is `run_ppo(config, task_runner_class=...)` (verl/trainer/
main_ppo.py:34-41): the TaskRunner is the Ray actor the trainer runs in. `task_runner()` wraps
whichever TaskRunner verl's entry point passes there, and inside it, for that process only:

- v1 (`trainer.use_v1=true`, main_ppo.py:183-184): the TRAINER_REGISTRY entry of the configured
  trainer_mode (trainer_base.py:1996; looked up by main_ppo.py:141) becomes a subclass whose
  `_setup` adopts verl's managers (trainer_base.py:383; separate_async's second one, the standalone
  fleet, trainer_separate_async.py:166) and whose `on_step_end` merges kvctl's numbers into
  `_pending_sync_metrics`, which verl merges into the step's metrics (trainer_base.py:487-488).
- legacy v0 (main_ppo.py:186-192, ray_trainer.py): `actor_rollout_ref.rollout.checkpoint_manager_
  class` names kvctl's manager (ray_trainer.py:969-977), and the trainer main_ppo_v0.py:218 builds
  hands kvctl the dict of actor metrics that fit() merges after the update (ray_trainer.py:1716-1720:
  the update's own return is dropped there).
- experimental/one_step_off_policy: `checkpoint_manager_class` (separation/ray_trainer.py:119-130);
  its update's return is merged into the step (separation/ray_trainer.py:660-664).
- experimental/fully_async_policy: the trainer is its own Ray actor (fully_async_trainer.py:53-54)
  that builds its managers directly (:221, :258): the TaskRunner creates a subclass of it instead
  (fully_async_main.py:147) that adopts both and merges kvctl's numbers into `self.metrics` after
  each update (fully_async_trainer.py:594).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from kvctl.integrations.verl.hook import KvctlVerlHook, current, install
from kvctl.integrations.verl.managers import adopt

MANAGER_FQN = "kvctl.integrations.verl.KvctlCheckpointEngineManager"
# verl's TaskRunner classes, by module: what kind of trainer each runs
RUNNERS = {"verl.trainer.main_ppo": "v1", "verl.trainer.main_ppo_v0": "legacy",
           "verl.experimental.one_step_off_policy.main_ppo": "one_step_off",
           "verl.experimental.fully_async_policy.fully_async_main": "fully_async"}


def v1_trainer_class(base: type) -> type:
    """A v1 trainer (verl/trainer/ppo/v1: sync, colocate_async, separate_async) with kvctl's hook."""

    class Trainer(base):  # type: ignore[misc, valid-type]
        def _setup(self) -> None:
            super()._setup()
            hook = current()
            standalone = getattr(self, "standalone_checkpoint_manager", None)
            # separate_async: checkpoint_manager moves the hybrid set (asleep in trainer mode), the
            # standalone manager the fleet that serves rollouts (trainer_separate_async.py:164-170)
            adopt(self.checkpoint_manager, hook, "hybrid" if standalone is not None else "")
            if standalone is not None:
                adopt(standalone, hook, "")

        def on_step_end(self) -> None:
            super().on_step_end()
            pending = getattr(self, "_pending_sync_metrics", None) or {}
            self._pending_sync_metrics = {**pending, **current().consume_metrics()}

    return _named(Trainer, base)


def legacy_trainer_class(base: type) -> type:
    """verl's legacy RayPPOTrainer (trainer.use_v1=false) with kvctl's hook."""

    class Trainer(base):  # type: ignore[misc, valid-type]
        def init_workers(self) -> None:
            super().init_workers()
            adopt(self.checkpoint_manager, current(), "")  # a no-op when checkpoint_manager_class built ours

        def _update_actor(self, batch: Any) -> Any:
            output = super()._update_actor(batch)
            # fit() reduces and merges these after update_weights (ray_trainer.py:1716-1720)
            current().sink = output.meta_info.setdefault("metrics", {})
            return output

    return _named(Trainer, base)


def fully_async_trainer_actor(actor: Any, hook: KvctlVerlHook) -> Any:
    """fully_async's FullyAsyncTrainer (a Ray actor class) with kvctl's hook, as a Ray actor class."""
    base = actor.__ray_actor_class__

    class Trainer(base):  # type: ignore[misc, valid-type]
        kvctl_hook = hook

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            install(type(self).kvctl_hook)  # this actor is a process of its own
            super().__init__(*args, **kwargs)

        async def _setup_checkpoint_manager(self) -> None:
            await super()._setup_checkpoint_manager()
            adopt(self.checkpoint_manager, current(), "")

        async def _setup_hybrid_checkpoint_manager(self) -> None:
            await super()._setup_hybrid_checkpoint_manager()
            adopt(getattr(self, "hybrid_checkpoint_manager", None), current(), "hybrid")

        async def _fit_update_weights(self) -> Any:
            result = await super()._fit_update_weights()
            if isinstance(getattr(self, "metrics", None), dict):
                self.metrics.update(current().consume_metrics())
            return result

        async def fit(self) -> Any:
            try:
                result = await super().fit()
            except BaseException as exc:
                current().finish("failed", f"{type(exc).__name__}: {exc}")
                raise
            current().finish("stopped")
            return result

    return _remote(actor, _named(Trainer, base))


def task_runner(runner: Any, hook: KvctlVerlHook | None = None) -> Any:
    """verl's TaskRunner Ray actor class `runner`, with kvctl's hook installed in it (see the module
    docstring). The hook travels with the class: its settings need not reach the Ray workers."""
    hook = hook or KvctlVerlHook.from_env()
    base = runner.__ray_actor_class__
    kind = RUNNERS.get(base.__module__, "unknown")

    class Runner(base):  # type: ignore[misc, valid-type]
        kvctl_hook = hook

        def run(self, config: Any) -> Any:
            active = install(type(self).kvctl_hook)
            active.describe_job(config, kind if kind != "v1" else _v1_mode(config))
            with patched(kind, config, active):
                try:
                    result = super().run(config)
                except BaseException as exc:
                    active.finish("failed", f"{type(exc).__name__}: {exc}")
                    raise
            active.finish("stopped")
            return result

    return _remote(runner, _named(Runner, base))


@contextlib.contextmanager
def patched(kind: str, config: Any, hook: KvctlVerlHook) -> Iterator[None]:
    """Inside verl's TaskRunner: make verl build kvctl's trainer or manager (see the module docstring);
    undone after."""
    undo = []
    if kind == "v1":
        from verl.trainer.ppo.v1 import trainer_base

        registry, mode = trainer_base.TRAINER_REGISTRY, _v1_mode(config)
        original = registry[mode]
        registry[mode] = v1_trainer_class(original)
        undo.append(lambda: registry.__setitem__(mode, original))
    elif kind == "legacy":
        from verl.trainer import main_ppo_v0

        _set_manager_class(config)
        original_trainer = main_ppo_v0.RayPPOTrainer
        main_ppo_v0.RayPPOTrainer = legacy_trainer_class(original_trainer)
        undo.append(lambda: setattr(main_ppo_v0, "RayPPOTrainer", original_trainer))
    elif kind == "one_step_off":
        _set_manager_class(config)
    elif kind == "fully_async":
        from verl.experimental.fully_async_policy import fully_async_main

        original_actor = fully_async_main.FullyAsyncTrainer
        fully_async_main.FullyAsyncTrainer = fully_async_trainer_actor(original_actor, hook)
        undo.append(lambda: setattr(fully_async_main, "FullyAsyncTrainer", original_actor))
    else:
        import logging

        logging.getLogger("kvctl.integrations.verl").warning(
            "kvctl: unknown verl TaskRunner %s: only a manager named by %s is hooked", kind, MANAGER_FQN)
    try:
        yield
    finally:
        for step in reversed(undo):
            step()


def _set_manager_class(config: Any) -> None:
    """actor_rollout_ref.rollout.checkpoint_manager_class = kvctl's, unless one is set (which must
    then subclass kvctl.integrations.verl.KvctlCheckpointEngineManager to be hooked)."""
    from omegaconf import open_dict

    rollout = config.actor_rollout_ref.rollout
    if not rollout.get("checkpoint_manager_class"):
        with open_dict(rollout):
            rollout.checkpoint_manager_class = MANAGER_FQN


def _v1_mode(config: Any) -> str:
    return str(config.trainer.v1.trainer_mode)


def _remote(actor: Any, cls: type) -> Any:
    """`cls` as a Ray actor class with the options verl's @ray.remote(...) gave `actor` (num_cpus=10,
    max_concurrency=100 for one_step_off's runner, ...)."""
    import ray

    options = dict(getattr(actor, "_default_options", None) or {})
    return ray.remote(**options)(cls) if options else ray.remote(cls)


def _named(cls: type, base: type) -> type:
    cls.__name__ = f"Kvctl{base.__name__}"  # the qualname stays local: Ray pickles the class by value
    return cls


__all__ = ["MANAGER_FQN", "fully_async_trainer_actor", "legacy_trainer_class", "patched", "task_runner",
           "v1_trainer_class"]
