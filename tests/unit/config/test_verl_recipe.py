"""docs/verl.md's recipe, sections 3-4: the one launch line (`python3 -m kvctl.integrations.verl
VERL_MODULE ...`) and the page's own driver (`my_ppo.py`) hand verl's run_ppo kvctl's TaskRunner,
with the hook's settings; and every name of verl 0.9.1 the integration relies on is where it says
(verl's trainers need torch, Ray and GPUs: tests/unit/integrations runs the hook at its place in
each trainer on stand-ins that replay verl's call order).
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from kvctl.integrations.verl import KvctlVerlHook
from tests.lib.verl_doc import commands, named_block, require_verl


def _verl_entry(monkeypatch: pytest.MonkeyPatch, seen: list[Any]) -> None:
    """verl.trainer.main_ppo as far as its entry goes: main() calls run_ppo by name with its
    TaskRunner (main_ppo.py:183-184; Hydra reads sys.argv)."""
    import ray

    module = types.ModuleType("verl.trainer.main_ppo")

    class TaskRunnerV1:
        def run(self, config: Any) -> None: ...

    TaskRunnerV1.__module__ = "verl.trainer.main_ppo"

    def run_ppo(config: Any, task_runner_class: Any) -> None:
        seen.append((list(sys.argv), task_runner_class))

    def main() -> None:
        module.run_ppo({"argv": sys.argv[1:]}, task_runner_class=module.TaskRunnerV1)

    module.TaskRunnerV1, module.run_ppo, module.main = ray.remote(TaskRunnerV1), run_ppo, main  # type: ignore[attr-defined]
    for name in ("verl", "verl.trainer"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "verl.trainer.main_ppo", module)
    monkeypatch.setattr(sys, "argv", list(sys.argv))


def test_the_page_s_launch_line_hands_verl_kvctl_s_task_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvctl.integrations.verl.entry import main

    (argv,) = commands("python3", "-m", "kvctl.integrations.verl")
    assert argv[3] == "verl.trainer.main_ppo"
    seen: list[Any] = []
    _verl_entry(monkeypatch, seen)
    monkeypatch.setenv("KVCTL_MASTER", "10.0.0.1:9003")
    assert main(argv[3:]) == 0
    ((verl_argv, runner),) = seen
    assert verl_argv == ["verl.trainer.main_ppo", *argv[4:]]  # verl's own arguments, unchanged
    assert runner.__ray_actor_class__.__name__ == "KvctlTaskRunnerV1"
    hook = runner.__ray_actor_class__.kvctl_hook
    assert (hook.master, hook.policy, hook.mode) == ("10.0.0.1:9003", "warn", "reset")  # read in the driver


def test_the_page_s_own_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    _verl_entry(monkeypatch, seen)
    exec(compile(named_block("my_ppo.py"), "docs/verl.md:my_ppo.py", "exec"), {})  # noqa: S102 - the page's code
    ((verl_argv, runner),) = seen
    hook: KvctlVerlHook = runner.__ray_actor_class__.kvctl_hook
    assert verl_argv[:3] == ["verl.trainer.main_ppo", "--config-path", "/shared/conf"]
    assert (hook.master, hook.policy, hook.attempts, hook.budget_s) == ("10.0.0.1:9003", "raise", 2, 120.0)


# (verl file, what it must contain) for each verl name kvctl.integrations.verl relies on
VERL_FACTS = [
    # the entry: run_ppo by name, the TaskRunner as the place of the trainer
    ("trainer/main_ppo.py", r"def run_ppo\(config, task_runner_class\) -> None:"),
    ("trainer/main_ppo.py", r"run_ppo\(config, task_runner_class=TaskRunnerV1\)"),
    ("trainer/main_ppo.py", r"trainer_cls = get_trainer_cls\(config\.trainer\.v1\.trainer_mode\)"),
    ("experimental/one_step_off_policy/main_ppo.py", r"    from verl\.trainer\.main_ppo import run_ppo\n"),
    ("experimental/fully_async_policy/fully_async_main.py", r"    from verl\.trainer\.main_ppo import run_ppo\n"),
    ("__init__.py", r'os\.getenv\("VERL_USE_EXTERNAL_MODULES", ""\)'),
    # the manager: its methods, auto_await, the order of an update
    ("checkpoint_engine/base.py", r"self\.replicas = replicas"),
    ("checkpoint_engine/base.py", r"@auto_await\n    async def sleep_replicas\(self\):"),
    ("checkpoint_engine/base.py", r"@auto_await\n    async def abort_replicas\(self, reject_request: bool = False\):"),
    ("checkpoint_engine/base.py", r"@auto_await\n    async def resume_generation_replicas\(self\):"),
    ("checkpoint_engine/base.py", r"@auto_await\n    async def update_weights\(self, global_steps: int = None\):"),
    ("checkpoint_engine/base.py", r'if self\.backend == "naive":\n.*\n            return \{\}'),
    ("checkpoint_engine/base.py", r"await self\.resume_generation_replicas\(\)\n\n        return sync_metrics"),
    ("workers/rollout/replica.py", r"@property\n    def server_address\(self\) -> str:"),
    ("workers/rollout/replica.py", r"\* self\.config\.data_parallel_size"),
    # v1
    ("trainer/ppo/v1/trainer_base.py", r"TRAINER_REGISTRY: dict\[str, type\[PPOTrainer\]\] = \{\}"),
    ("trainer/ppo/v1/trainer_base.py", r"    def _setup\(self\):"),
    ("trainer/ppo/v1/trainer_base.py", r"self\.checkpoint_manager: CheckpointEngineManager = CheckpointEngineManager\("),
    ("trainer/ppo/v1/trainer_base.py", r"self\.on_step_end\(\)\n\s+metrics\.update\(self\._consume_sync_metrics\(\)\)"),
    ("trainer/ppo/v1/trainer_separate_async.py", r"self\.standalone_checkpoint_manager = CheckpointEngineManager\("),
    # legacy and one_step_off: checkpoint_manager_class
    ("workers/config/rollout.py", r"checkpoint_manager_class: Optional\[str\] = None"),
    ("trainer/ppo/ray_trainer.py", r'load_class_from_fqn\(checkpoint_manager_class_fqn, "CheckpointEngineManager"\)'),
    ("experimental/separation/ray_trainer.py", r'load_class_from_fqn\(checkpoint_manager_class_fqn, "Checkpoint'),
    ("experimental/separation/ray_trainer.py", (r"sync_metrics = self\.checkpoint_manager\.update_weights\(self\."
                                                r"global_steps\)(\n.*){1,4}\n\s+if sync_metrics:\n\s+self\.metrics\.update")),
    ("trainer/main_ppo_v0.py", r"trainer = RayPPOTrainer\("),
    ("trainer/ppo/ray_trainer.py", r"    def init_workers\(self\):"),
    ("trainer/ppo/ray_trainer.py", r"actor_output = self\._update_actor\(batch\)"),
    ("trainer/ppo/ray_trainer.py", (r"self\.checkpoint_manager\.update_weights\(self\.global_steps\)\n\n\s+actor_"
                                    r"output_metrics = reduce_metrics\(actor_output\.meta_info\[\"metrics\"\]\)")),
    # fully_async
    ("experimental/fully_async_policy/fully_async_main.py", r"trainer = FullyAsyncTrainer\.remote\("),
    ("experimental/fully_async_policy/fully_async_trainer.py", r"async def _setup_checkpoint_manager\(self\):"),
    ("experimental/fully_async_policy/fully_async_trainer.py", r"async def _setup_hybrid_checkpoint_manager\(self\):"),
    ("experimental/fully_async_policy/fully_async_trainer.py", r"rollout_reset_timing_raw = await self\._fit_update_weights"),
    ("experimental/fully_async_policy/fully_async_trainer.py", r'self\.metrics = \{"training/global_step"'),
]


@pytest.mark.parametrize(("path", "pattern"), VERL_FACTS, ids=[f"{p}:{i}" for i, (p, _) in enumerate(VERL_FACTS)])
def test_the_integration_uses_only_what_verl_has(path: str, pattern: str) -> None:
    root = require_verl()
    assert re.search(pattern, (root / path).read_text()), f"verl/{path} no longer has {pattern!r}"


def test_verl_s_auto_await_is_what_the_managers_rely_on() -> None:
    """Awaited from a coroutine it hands back the coroutine; called from sync code it runs it; called
    from sync code under a running loop (one_step_off's fit) it runs it in a thread."""
    import asyncio

    from tests.lib.verl_stand_ins import verl_auto_await

    auto_await = verl_auto_await()

    @auto_await
    async def answer() -> int:
        return 42

    async def awaited() -> int:
        return await answer()

    def sync_under_loop() -> int:
        return answer()

    async def loop() -> int:
        return sync_under_loop()

    assert answer() == 42 and asyncio.run(awaited()) == 42 and asyncio.run(loop()) == 42
    assert Path(require_verl() / "utils" / "ray_utils.py").read_text().count("def auto_await") == 1
