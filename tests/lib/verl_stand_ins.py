"""Stand-ins of verl 0.9.1's rollout machinery, for kvctl.integrations.verl's tests: verl's trainers
need torch, Ray and GPUs, so these replay verl's CALL ORDER (each cited file:line is verl 0.9.1's)
on vLLM test doubles, with verl's real `auto_await` compiled from the installed verl.

- `Replica`: a RolloutReplica (verl/workers/rollout/replica.py) whose server is a VllmDouble: sleep,
  wake_up, abort_all_requests (verl's gate closes, the engine pauses: pause_generation(clear_cache=
  True), vllm_async_server.py:931-1000), resume_generation (:1017), release/resume_kv_cache (:875-892).
- `CheckpointEngineManager`: verl/checkpoint_engine/base.py:380-562, method for method.
- `ActorGroup`: the actor worker group's update_weights (naive: engine_workers.py:728-823, the new
  weights loaded, then verl's own reset, vllm_rollout.py:246-248) and the NCCL transfer (base.py:536-554).

The state each double carries for the tests: `weights` (the step whose weights it serves), `asleep`,
`paused` (the double's own), and the replica's `gate_closed` (verl's submission gate).
"""

from __future__ import annotations

import ast
import asyncio
import concurrent.futures
import functools
import inspect
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.doubles import VllmDouble
from tests.lib.verl_doc import require_verl


def verl_auto_await() -> Any:
    """verl's own auto_await (verl/utils/ray_utils.py:97), compiled from the installed file (its module
    imports Ray)."""
    path = require_verl() / "utils" / "ray_utils.py"
    tree = ast.parse(path.read_text())
    (node,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "auto_await"]
    namespace = {"asyncio": asyncio, "concurrent": concurrent, "functools": functools, "inspect": inspect}
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102
    return namespace["auto_await"]


def _post(double: VllmDouble, path: str, **params: str) -> None:
    answer = httpx.post(f"{double.url}{path}", params=params, timeout=10)
    assert answer.status_code == 200, (path, answer.status_code, answer.text)


class Replica:
    """verl's RolloutReplica over one VllmDouble (see the module docstring)."""

    def __init__(self, double: VllmDouble, rank: int, *, data_parallel_size: int = 1) -> None:
        self.double, self.replica_rank = double, rank
        self._server_address = double.url.removeprefix("http://")
        self.config = types.SimpleNamespace(data_parallel_size=data_parallel_size)
        self.gate_closed = False
        double.weights, double.asleep = 0, False  # type: ignore[attr-defined]

    @property
    def server_address(self) -> str:  # replica.py:247
        return self._server_address

    async def sleep(self) -> None:  # vllm_async_server.py:853-862: the engine sleeps, its KV is gone
        self.double.asleep = True  # type: ignore[attr-defined]
        self.double._reset_local()

    async def wake_up(self) -> None:  # :832-846
        self.double.asleep = False  # type: ignore[attr-defined]
        _post(self.double, "/reset_prefix_cache", reset_external="true")

    async def abort_all_requests(self, reject_request: bool = False) -> None:  # :931-1000
        self.gate_closed = True
        _post(self.double, "/pause", mode="abort")

    async def resume_generation(self) -> None:  # :1017-1020
        _post(self.double, "/resume")
        self.gate_closed = False

    async def release_kv_cache(self) -> None:  # :875-883
        pass

    async def resume_kv_cache(self) -> None:  # :885-892
        _post(self.double, "/reset_prefix_cache", reset_external="true")

    def load(self, step: int | None, verl_resets: bool = True) -> None:
        """New weights in the engine, then verl's own reset (vllm_rollout.py:246-248) unless a test
        breaks it."""
        self.double.weights = step  # type: ignore[attr-defined]
        if verl_resets:
            _post(self.double, "/reset_prefix_cache", reset_external="true")


@dataclass
class ActorGroup:
    """The actor worker group, as far as a weight update goes."""

    events: list[str] = field(default_factory=list)
    verl_resets: bool = True

    def update_weights(self, replicas: list[Replica], global_steps: int | None, mode: str) -> None:
        self.events.append(f"{mode} update {global_steps}")
        for replica in replicas:
            if mode == "naive":  # engine_workers.py:770-823: wake weights, load, wake kv_cache
                replica.double.asleep = False  # type: ignore[attr-defined]
            replica.load(global_steps, self.verl_resets)


def manager_module(auto_await: Any) -> Any:
    """verl.checkpoint_engine's CheckpointEngineManager, replayed (base.py:380-562)."""

    class CheckpointEngineManager:
        def __init__(self, config: Any, actor_wg: ActorGroup, replicas: list[Replica]) -> None:  # :409-420
            self.config, self.backend = config, config.backend
            self.actor_wg, self.replicas = actor_wg, replicas

        @auto_await
        async def sleep_replicas(self) -> None:  # :466-469
            await asyncio.gather(*[r.sleep() for r in self.replicas])

        @auto_await
        async def wake_up_replicas(self) -> None:  # :471-474
            await asyncio.gather(*[r.wake_up() for r in self.replicas])

        @auto_await
        async def abort_replicas(self, reject_request: bool = False) -> None:  # :476-484
            await asyncio.gather(*[r.abort_all_requests(reject_request=reject_request) for r in self.replicas])

        @auto_await
        async def resume_generation_replicas(self) -> None:  # :486-489
            await asyncio.gather(*[r.resume_generation() for r in self.replicas])

        @auto_await
        async def release_kv_cache_replicas(self) -> None:  # :491-499
            await asyncio.gather(*[r.release_kv_cache() for r in self.replicas])

        @auto_await
        async def resume_kv_cache_replicas(self) -> None:  # :501-507
            await asyncio.gather(*[r.resume_kv_cache() for r in self.replicas])

        @auto_await
        async def update_weights(self, global_steps: int | None = None) -> dict:  # :509-562
            if self.backend == "naive":  # :518-520
                self.actor_wg.update_weights(self.replicas, global_steps, "naive")
                return {}
            await self.abort_replicas()  # :523
            await self.release_kv_cache_replicas()  # :533
            self.actor_wg.update_weights(self.replicas, global_steps, self.backend)  # :536-554
            await self.resume_kv_cache_replicas()  # :557
            await self.resume_generation_replicas()  # :560
            return {"sync/bytes": 1.0}

    module = types.ModuleType("verl.checkpoint_engine")
    module.CheckpointEngineManager = CheckpointEngineManager  # type: ignore[attr-defined]
    return module


def install(monkeypatch: Any, **extra: types.ModuleType) -> dict[str, types.ModuleType]:
    """Empty verl packages, verl.utils.ray_utils (the real auto_await), verl.checkpoint_engine (the
    replay above), and `extra` modules by name, in sys.modules for the test."""
    auto_await = verl_auto_await()
    modules: dict[str, types.ModuleType] = {}
    for name in ("verl", "verl.utils", "verl.trainer", "verl.trainer.ppo", "verl.trainer.ppo.v1",
                 "verl.experimental", "verl.experimental.fully_async_policy"):
        modules[name] = types.ModuleType(name)
    ray_utils = types.ModuleType("verl.utils.ray_utils")
    ray_utils.auto_await = auto_await  # type: ignore[attr-defined]
    modules["verl.utils.ray_utils"] = ray_utils
    modules["verl.checkpoint_engine"] = manager_module(auto_await)
    modules.update(extra)
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    return modules


def window(double: VllmDouble, replica: Replica | None = None) -> str:
    """What a replica is doing, as the tests name it."""
    if getattr(double, "asleep", False):
        return "asleep"
    if double.paused:
        return "paused"
    if replica is not None and replica.gate_closed:
        return "gate-closed"
    return "serving"
