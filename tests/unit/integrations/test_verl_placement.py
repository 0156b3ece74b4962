"""kvctl.integrations.verl at its place in each verl 0.9.1 trainer: stand-ins replay the trainers'
call order (each step cites verl's file:line) on vLLM test doubles, with verl's real auto_await, and
a recording stand-in of kvctl's API (tests/unit/integrations/fake_api.py) notes what the fleet was
doing at each call: evidence while the old weights serve, the reset/check once the new ones are in
and before verl lets a rollout in, the pending canaries checked after verl's resume."""

from __future__ import annotations

import asyncio
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

from kvctl.integrations.verl import KvctlVerlHook, install
from tests.doubles import DoubleFleet, VllmDouble
from tests.lib import verl_stand_ins as verl
from tests.unit.integrations.fake_api import FakeApi

SERVING, PAUSED, ASLEEP = "serving", "paused", "asleep"


@pytest.fixture
def doubles() -> Iterator[list[VllmDouble]]:
    with DoubleFleet() as fleet:
        replicas = [VllmDouble("0.24.0", name=f"d{i}") for i in range(4)]
        for replica in replicas:
            fleet.add(replica)
        yield replicas


@pytest.fixture
def hook(tmp_path: Any) -> KvctlVerlHook:
    return install(KvctlVerlHook("127.0.0.1:9003", run="verl-test", state_dir=str(tmp_path)))


# -- the v1 trainers (verl/trainer/ppo/v1) ----------------------------------------------------------
def v1_base(modules: dict[str, types.ModuleType], replicas: list[verl.Replica], actor: verl.ActorGroup,
            standalone: list[verl.Replica] | None = None) -> dict[str, type]:
    """PPOTrainer (trainer_base.py) and the three registered trainers, as far as the fleet goes."""
    manager_cls = modules["verl.checkpoint_engine"].CheckpointEngineManager

    class PPOTrainer:
        def __init__(self, config: Any) -> None:
            self.config, self.global_steps, self.timing_raw = config, 0, {}
            self.actor_rollout_wg = actor

        def init(self) -> None:  # :214-224
            self._setup()
            self.on_init_end()

        def _setup(self) -> None:  # :372-391: the manager (naive backend), then every replica asleep
            self.checkpoint_manager = manager_cls(types.SimpleNamespace(backend="naive"), actor, list(replicas))
            self.checkpoint_manager.sleep_replicas()

        def fit_step(self) -> dict:  # fit, :466-514, one step
            metrics: dict = {}
            self.timing_raw = {}
            self.on_step_begin()
            self.on_sample_begin()  # _step_once, :562-574
            generate(self.rollout_replicas())
            self.on_sample_end()
            actor.events.append(f"train {self.global_steps}")
            self.on_step_end()
            metrics.update(self._consume_sync_metrics())  # :487-488
            self.global_steps += 1
            return metrics

        def rollout_replicas(self) -> list[verl.Replica]:
            return replicas

        def _consume_sync_metrics(self) -> dict:  # :674-679
            metrics = getattr(self, "_pending_sync_metrics", None) or {}
            self._pending_sync_metrics = {}
            return metrics

        def on_step_begin(self) -> None: ...

        def on_sample_begin(self) -> None: ...

    class PPOTrainerSync(PPOTrainer):  # trainer_sync.py:24-44
        def on_init_end(self) -> None:
            self.checkpoint_manager.update_weights(self.global_steps)

        def on_step_end(self) -> None:
            self.checkpoint_manager.update_weights(self.global_steps)

        def on_sample_end(self) -> None:
            self.checkpoint_manager.sleep_replicas()

    class PPOTrainerColocateAsync(PPOTrainerSync):  # trainer_colocate_async.py:24-50
        def on_step_end(self) -> None:
            self.checkpoint_manager.update_weights(self.global_steps)
            self.checkpoint_manager.resume_generation_replicas()

        def on_sample_end(self) -> None:
            self.checkpoint_manager.abort_replicas()
            self.checkpoint_manager.sleep_replicas()

    class PPOTrainerSeparateAsync(PPOTrainer):  # trainer_separate_async.py
        def _setup(self) -> None:  # :148-185
            super()._setup()
            self.standalone_checkpoint_manager = manager_cls(types.SimpleNamespace(backend="nccl"), actor,
                                                             list(standalone or []))
            self.current_mode = "rollout"

        def rollout_replicas(self) -> list[verl.Replica]:
            return (standalone or []) + (replicas if self.current_mode == "rollout" else [])

        def on_init_end(self) -> None:  # :224-228
            self.standalone_checkpoint_manager.update_weights(self.global_steps)
            self.checkpoint_manager.update_weights(self.global_steps)

        def on_step_begin(self) -> None:  # :238-253: the hybrid set goes back to training
            if self.current_mode == "rollout":
                self.switch_to_trainer()

        def on_sample_end(self) -> None: ...

        def on_step_end(self) -> None:  # :326-393, switching back to rollout this time
            self._pending_sync_metrics = dict(self.standalone_checkpoint_manager.update_weights(self.global_steps)
                                              or {})
            self.switch_to_rollout(already_registered=True)

        def switch_to_rollout(self, *, already_registered: bool = False) -> None:  # :403-411
            self.checkpoint_manager.update_weights(self.global_steps)
            self.checkpoint_manager.resume_generation_replicas()
            self.current_mode = "rollout"

        def switch_to_trainer(self) -> None:  # :413-420
            self.checkpoint_manager.abort_replicas(reject_request=True)
            self.checkpoint_manager.sleep_replicas()
            self.current_mode = "trainer"

    return {"sync": PPOTrainerSync, "colocate_async": PPOTrainerColocateAsync,
            "separate_async": PPOTrainerSeparateAsync}


def generate(replicas: list[verl.Replica]) -> None:
    """A rollout: every replica in rotation serves (and caches) a prompt with its weights."""
    import httpx

    for replica in replicas:
        assert verl.window(replica.double, replica) == SERVING, "verl generates on a serving replica only"
        answer = httpx.post(f"{replica.double.url}/v1/completions", timeout=10,
                            json={"model": replica.double.model, "prompt": "w " * 40, "max_tokens": 1})
        assert answer.status_code == 200


def run_v1(mode: str, doubles: list[VllmDouble], monkeypatch: pytest.MonkeyPatch, steps: int = 2,
           hybrid: int = 2) -> tuple[FakeApi, list[dict], Any]:
    from kvctl.integrations.verl.trainers import v1_trainer_class

    modules = verl.install(monkeypatch)
    replicas = [verl.Replica(d, i) for i, d in enumerate(doubles[:hybrid])]
    standalone = [verl.Replica(d, hybrid + i) for i, d in enumerate(doubles[hybrid:])] if mode == "separate_async" \
        else None
    api = FakeApi(doubles, replicas + (standalone or [])).install(monkeypatch)
    trainer_cls = v1_trainer_class(v1_base(modules, replicas, verl.ActorGroup(), standalone)[mode])
    trainer = trainer_cls(config=None)
    trainer.init()
    metrics = [trainer.fit_step() for _ in range(steps)]
    return api, metrics, trainer


def test_sync_evidence_before_the_sleep_reset_after_the_update(doubles: list[VllmDouble], hook: KvctlVerlHook,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """sync: the init update (trainer_sync.py:33) finds no evidence (the fleet slept in _setup before
    kvctl was there: trainer_base.py:391); each step: evidence in on_sample_end before the sleep
    (trainer_sync.py:42), old weights serving; the reset after update_weights (:38), new weights awake."""
    api, metrics, _ = run_v1("sync", doubles, monkeypatch)
    two = [SERVING, SERVING]
    assert api.ops() == [("reset", two, [0, 0]),
                         ("evidence", two, [0, 0]), ("reset", two, [0, 0]),
                         ("evidence", two, [0, 0]), ("reset", two, [1, 1])]
    assert [c.evidence for c in api.calls if c.op == "reset"] == [False, True, True]
    assert all(c.master == "127.0.0.1:9003" for c in api.calls if c.op == "reset")
    for step in metrics:  # trainer_base.py:487-488: in the step's metrics, flat floats
        assert step["kvctl/ok"] == 1.0 and step["kvctl/evidence"] == 1.0 and step["kvctl/attempts"] == 1.0
        assert all(isinstance(v, float) for k, v in step.items() if k.startswith("kvctl/"))


def test_colocate_async_reset_while_verl_holds_the_gate_then_the_pending_check(
        doubles: list[VllmDouble], hook: KvctlVerlHook, monkeypatch: pytest.MonkeyPatch) -> None:
    """colocate_async: evidence BEFORE abort_replicas (trainer_colocate_async.py:45, the fleet still
    generating with the old weights); after the naive update (:40) the engines are paused by verl's
    abort and its gate closed: kvctl resets, sends no canary (pending), and checks the canaries after
    resume_generation_replicas (:42)."""
    api, metrics, _ = run_v1("colocate_async", doubles, monkeypatch, steps=1)
    two = [SERVING, SERVING]
    assert api.ops()[1:] == [("evidence", two, [0, 0]), ("reset", [PAUSED, PAUSED], [0, 0]),
                             ("check", two, [0, 0])]
    assert metrics[0]["kvctl/pending_replicas"] == 2.0 and metrics[0]["kvctl/resume_check/ok"] == 1.0


def test_separate_async_covers_both_managers(doubles: list[VllmDouble], hook: KvctlVerlHook,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """separate_async: the standalone fleet (NCCL, trainer_separate_async.py:381-383) is checked
    inside update_weights before verl's resume (base.py:560: paused, gate closed), its canaries
    after; the hybrid set's evidence is taken when it leaves rollout (switch_to_trainer, :418-419)
    and checked when it comes back (switch_to_rollout, :407-408)."""
    api, metrics, _ = run_v1("separate_async", doubles, monkeypatch, steps=1)
    hybrid = [d.url for d in doubles[:2]]
    calls = [(c.op, "hybrid" if c.urls == hybrid else "standalone", c.windows) for c in api.calls]
    two, paused = [SERVING, SERVING], [PAUSED, PAUSED]
    assert calls[:4] == [("evidence", "standalone", two), ("reset", "standalone", paused),  # on_init_end (:226)
                         ("check", "standalone", two), ("reset", "hybrid", two)]  # (:228)
    assert calls[4:] == [("evidence", "hybrid", two),  # on_step_begin: switch_to_trainer's abort
                         ("evidence", "standalone", two),  # on_step_end: the fleet still generates
                         ("reset", "standalone", paused), ("check", "standalone", two),
                         ("reset", "hybrid", paused), ("check", "hybrid", two)]
    m = metrics[0]
    # a check pending on a fleet verl paused is no failure (kvctl's exit code 3: ok is 0 until the resume check)
    assert m["kvctl/failed"] == 0.0 and m["kvctl/hybrid/failed"] == 0.0 and m["sync/bytes"] == 1.0
    assert m["kvctl/pending_replicas"] == 2.0 and m["kvctl/hybrid/pending_replicas"] == 2.0
    assert m["kvctl/resume_check/ok"] == 1.0 and m["kvctl/hybrid/resume_check/ok"] == 1.0


# -- legacy v0 and one_step_off: checkpoint_manager_class ----------------------------------------------
def manager_by_fqn(config: Any, actor: verl.ActorGroup, replicas: list[verl.Replica], backend: str) -> Any:
    """ray_trainer.py:967-977 / separation/ray_trainer.py:119-130: the class named by
    actor_rollout_ref.rollout.checkpoint_manager_class, loaded with verl's load_class_from_fqn
    (importlib + getattr, verl/utils/import_utils.py:264-294)."""
    import importlib

    fqn = config.actor_rollout_ref.rollout.get("checkpoint_manager_class")
    module, name = fqn.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    return cls(config=types.SimpleNamespace(backend=backend), actor_wg=actor, replicas=list(replicas))


def config(**rollout: Any) -> Any:
    from omegaconf import OmegaConf

    conf = OmegaConf.create({"trainer": {"experiment_name": "gsm8k/1", "v1": {"trainer_mode": "sync"}},
                             "actor_rollout_ref": {"model": {"path": "Qwen/Qwen2.5-0.5B"}, "rollout": rollout}})
    OmegaConf.set_struct(conf, True)
    return conf


def test_legacy_trainer_through_checkpoint_manager_class(doubles: list[VllmDouble], hook: KvctlVerlHook,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """v0 (ray_trainer.py): the TaskRunner patch names kvctl's manager in checkpoint_manager_class;
    the sleep at init_workers' end (:981: evidence), the update at fit's start (:1430), the sleep after generation (:1514: evidence first), the update
    after the actor's (:1716), whose numbers reach the step through the actor's metrics (:1719)."""
    from kvctl.integrations.verl.trainers import patched

    verl.install(monkeypatch)
    replicas = [verl.Replica(d, i) for i, d in enumerate(doubles[:2])]
    api = FakeApi(doubles, replicas).install(monkeypatch)
    actor = verl.ActorGroup()

    class RayPPOTrainer:  # ray_trainer.py, the fleet's part of init_workers and fit
        def __init__(self, config: Any) -> None:
            self.config, self.global_steps = config, 0

        def init_workers(self) -> None:  # :967-981
            self.checkpoint_manager = manager_by_fqn(self.config, actor, replicas, "naive")
            self.checkpoint_manager.sleep_replicas()

        def _update_actor(self, batch: Any) -> Any:
            return types.SimpleNamespace(meta_info={"metrics": {"actor/loss": [0.5, 0.7]}})

        def fit(self) -> list[dict]:
            from verl_reduce import reduce_metrics

            self.checkpoint_manager.update_weights(self.global_steps)  # :1430
            logged = []
            for self.global_steps in (1, 2):
                metrics: dict = {}
                generate(replicas)
                self.checkpoint_manager.sleep_replicas()  # :1514
                actor_output = self._update_actor(None)  # :1690
                self.checkpoint_manager.update_weights(self.global_steps)  # :1716
                metrics.update(reduce_metrics(actor_output.meta_info["metrics"]))  # :1719-1720
                logged.append(metrics)
            return logged

    monkeypatch.setitem(sys.modules, "verl_reduce", types.SimpleNamespace(reduce_metrics=_reduce))
    main_ppo_v0 = types.ModuleType("verl.trainer.main_ppo_v0")
    main_ppo_v0.RayPPOTrainer = RayPPOTrainer  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "verl.trainer.main_ppo_v0", main_ppo_v0)
    conf = config()
    with patched("legacy", conf, hook):
        assert conf.actor_rollout_ref.rollout.checkpoint_manager_class == "kvctl.integrations.verl." \
                                                                           "KvctlCheckpointEngineManager"
        trainer = main_ppo_v0.RayPPOTrainer(conf)  # what main_ppo_v0.py:218 builds, in the TaskRunner
        trainer.init_workers()
        logged = trainer.fit()
    assert main_ppo_v0.RayPPOTrainer is RayPPOTrainer  # verl's, once the run is over
    assert type(trainer.checkpoint_manager).__name__ == "KvctlCheckpointEngineManager"
    two = [SERVING, SERVING]
    # verl builds kvctl's manager, so even init_workers' sleep (:981) comes with evidence
    assert api.ops() == [("evidence", two, [0, 0]), ("reset", two, [0, 0]), ("evidence", two, [0, 0]),
                         ("reset", two, [1, 1]), ("evidence", two, [1, 1]), ("reset", two, [2, 2])]
    assert all(c.evidence for c in api.calls if c.op == "reset")
    for metrics in logged:
        assert metrics["kvctl/ok"] == 1.0 and metrics["actor/loss"] == pytest.approx(0.6)


def _reduce(metrics: dict) -> dict:
    """verl.utils.metric.reduce_metrics (utils.py:49-57): the mean of each list, or of a number."""
    import statistics

    return {k: statistics.fmean(v) if isinstance(v, list) else float(v) for k, v in metrics.items()}


def test_one_step_off_policy_merges_the_update_s_return(doubles: list[VllmDouble], hook: KvctlVerlHook,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """one_step_off (NCCL, rollout separate): its fit is a coroutine and calls the synchronous
    _fit_update_weights (one_step_off_policy/ray_trainer.py:398-399) with a running loop: verl's
    auto_await runs the update in a thread; kvctl's reset lands before verl's resume (base.py:560)
    and the update's return carries kvctl's numbers into the step (separation/ray_trainer.py:660-664)."""
    from kvctl.integrations.verl.trainers import patched

    verl.install(monkeypatch)
    replicas = [verl.Replica(d, i) for i, d in enumerate(doubles[:2])]
    api = FakeApi(doubles, replicas).install(monkeypatch)
    conf = config()
    with patched("one_step_off", conf, hook):
        manager = manager_by_fqn(conf, verl.ActorGroup(), replicas, "nccl")
    metrics: dict = {}

    def _fit_update_weights(step: int) -> None:  # separation/ray_trainer.py:655-664
        sync_metrics = manager.update_weights(step)
        if sync_metrics:
            metrics.update(sync_metrics)

    async def fit_step() -> None:  # one_step_off_policy/ray_trainer.py:385-408
        generate(replicas)
        _fit_update_weights(1)

    asyncio.run(fit_step())
    two = [SERVING, SERVING]
    assert api.ops() == [("evidence", two, [0, 0]), ("reset", [PAUSED, PAUSED], [1, 1]), ("check", two, [1, 1])]
    assert metrics["kvctl/failed"] == 0.0 and metrics["kvctl/pending_replicas"] == 2.0
    assert metrics["kvctl/resume_check/ok"] == 1.0 and metrics["sync/bytes"] == 1.0


def test_fully_async_adopts_both_managers_and_fills_self_metrics(doubles: list[VllmDouble], hook: KvctlVerlHook,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """fully_async: its trainer actor builds its managers itself (fully_async_trainer.py:221, :258);
    kvctl's subclass adopts them and merges its numbers into self.metrics after each update (:594)."""
    import ray

    from kvctl.integrations.verl.trainers import fully_async_trainer_actor

    modules = verl.install(monkeypatch)
    manager_cls = modules["verl.checkpoint_engine"].CheckpointEngineManager
    standalone = [verl.Replica(d, i) for i, d in enumerate(doubles[:2])]
    hybrid = [verl.Replica(d, 2 + i) for i, d in enumerate(doubles[2:])]
    api = FakeApi(doubles, standalone + hybrid).install(monkeypatch)
    actor = verl.ActorGroup()

    @ray.remote(num_cpus=10)
    class FullyAsyncTrainer:  # fully_async_trainer.py:53
        def __init__(self) -> None:
            self.metrics: dict = {}
            self.current_param_version = 0

        async def _setup_checkpoint_manager(self) -> None:  # :217-224
            self.checkpoint_manager = manager_cls(types.SimpleNamespace(backend="nccl"), actor, list(standalone))

        async def _setup_hybrid_checkpoint_manager(self) -> None:  # :226-296: built, then asleep
            self.hybrid_checkpoint_manager = manager_cls(types.SimpleNamespace(backend="naive"), actor, list(hybrid))
            await self.hybrid_checkpoint_manager.sleep_replicas()

        async def _fit_update_weights(self) -> dict:  # :690-788
            await self.checkpoint_manager.update_weights(global_steps=self.current_param_version)
            return {}

    wrapped = fully_async_trainer_actor(FullyAsyncTrainer, hook)
    assert wrapped._default_options == {"num_cpus": 10}
    trainer = wrapped.__ray_actor_class__()
    asyncio.run(trainer._setup_checkpoint_manager())
    asyncio.run(trainer._setup_hybrid_checkpoint_manager())
    trainer.current_param_version = 1
    generate(standalone)
    asyncio.run(trainer._fit_update_weights())
    assert trainer.checkpoint_manager._kvctl_label == "" and trainer.hybrid_checkpoint_manager._kvctl_label == "hybrid"
    two = [SERVING, SERVING]
    assert api.ops() == [("evidence", two, [0, 0]), ("reset", [PAUSED, PAUSED], [1, 1]), ("check", two, [1, 1])]
    assert trainer.metrics["kvctl/failed"] == 0.0 and trainer.metrics["kvctl/resume_check/ok"] == 1.0


def test_the_task_runner_swaps_the_v1_registry_entry_only_inside_run(monkeypatch: pytest.MonkeyPatch,
                                                                     hook: KvctlVerlHook) -> None:
    """TaskRunnerV1.run looks the trainer up by trainer_mode (main_ppo.py:139-141): kvctl's runner
    replaces that registry entry for its run and puts verl's back after."""
    import ray

    from kvctl.integrations.verl.trainers import task_runner

    modules = verl.install(monkeypatch)
    base = modules["verl.trainer.ppo.v1"]
    registry: dict[str, type] = {"sync": type("PPOTrainerSync", (), {})}
    trainer_base = types.ModuleType("verl.trainer.ppo.v1.trainer_base")
    trainer_base.TRAINER_REGISTRY = registry  # type: ignore[attr-defined]
    base.trainer_base = trainer_base  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "verl.trainer.ppo.v1.trainer_base", trainer_base)
    seen = []

    class TaskRunnerV1:
        def run(self, config: Any) -> None:
            seen.append(registry[config.trainer.v1.trainer_mode])

    TaskRunnerV1.__module__ = "verl.trainer.main_ppo"
    runner = task_runner(ray.remote(TaskRunnerV1), hook)
    runner.__ray_actor_class__().run(config())
    assert seen[0].__name__ == "KvctlPPOTrainerSync" and registry["sync"].__name__ == "PPOTrainerSync"
    assert hook.experiment == "gsm8k/1" and hook.trainer == "sync" and hook.model == "Qwen/Qwen2.5-0.5B"
