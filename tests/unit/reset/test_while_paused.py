"""kvctl.reset.execute's step while paused (WhilePaused, what kvctl weights runs its reload as): it runs on
every live replica after the pause and before the cache ops; a replica whose step failed stays paused
unless resume_failed; the plain reset is unchanged. Against the vLLM TEST DOUBLE."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from kvctl.reset.execute import WhilePaused, execute_plan
from kvctl.reset.plan import ReplicaPlan, ResetOptions, plan_reset
from kvctl.reset.receipt import OpResult, Receipt
from kvctl.targets import build_fleet
from kvctl.transport.vllm_client import VllmClient
from tests.doubles import DoubleFleet, MasterDouble, SharedStore, VllmDouble


@pytest.fixture
def doubles() -> Iterator[DoubleFleet]:
    with DoubleFleet() as fleet:
        yield fleet


def run(urls: list[str], master: str, step: WhilePaused) -> Receipt:
    fleet = build_fleet(urls, master=master, env={})

    async def go() -> Receipt:
        plan = await plan_reset(fleet, ResetOptions(connector=True, pause=True, timeout=2.0))
        assert plan.error is None, plan.error
        return await execute_plan(plan, fleet, while_paused=step)

    return asyncio.run(go())


def two(doubles: DoubleFleet) -> tuple[list[VllmDouble], list[str], str]:
    store = SharedStore()
    replicas = [VllmDouble("0.32.0", store=store), VllmDouble("0.32.0", store=store)]
    return replicas, [doubles.add(r) for r in replicas], doubles.add_master(MasterDouble(store))


def test_the_step_runs_paused_before_the_cache_ops_and_the_window_is_timed(doubles: DoubleFleet) -> None:
    replicas, urls, master = two(doubles)
    seen: dict[str, tuple[bool, list[str]]] = {}
    by_url = {u: r for u, r in zip(urls, replicas)}

    async def step(rp: ReplicaPlan, client: VllmClient) -> OpResult:
        replica = by_url[rp.url]
        seen[rp.name] = (replica.paused, replica.call_paths())
        return OpResult("reload", "ok")

    hook = WhilePaused(step)
    receipt = run(urls, master, hook)
    assert receipt.ok, receipt.summary
    for paused, paths in seen.values():
        assert paused and "/pause" in paths and "/reset_prefix_cache" not in paths
    assert [o.op for o in receipt.replicas[0].ops] == ["pause", "reload", "prefix_cache", "mm_cache", "encoder_cache",
                                                       "resume"]
    assert set(hook.phases) == {"pause", "step", "reset", "resume"} and hook.failed == []
    assert hook.paused_s is not None and hook.paused_s >= sum(hook.phases.values()) - 1e-3


@pytest.mark.parametrize("resume_failed", [False, True])
def test_a_failed_step_keeps_its_replica_paused_unless_told_otherwise(doubles: DoubleFleet, resume_failed: bool) -> None:
    replicas, urls, master = two(doubles)

    async def step(rp: ReplicaPlan, client: VllmClient) -> OpResult:
        if rp.url == urls[0]:
            raise RuntimeError("the reload blew up")  # an exception is this replica's failure, not the fleet's
        return OpResult("reload", "ok")

    hook = WhilePaused(step, resume_failed=resume_failed)
    receipt = run(urls, master, hook)
    failed, fine = receipt.replicas
    assert hook.failed == [failed.name] and not failed.reset and fine.reset
    assert "RuntimeError: the reload blew up" in (failed.error or "")
    assert replicas[0].paused is (not resume_failed) and not replicas[1].paused
    if not resume_failed:
        assert f"curl -X POST {urls[0]}/resume" in (failed.error or "") and "kept paused" in (failed.error or "")
        assert not any(o.op == "resume" for o in failed.ops)
    assert failed.ops[-1].op != "reload" and any(o.op == "prefix_cache" for o in failed.ops)  # its caches cleared
