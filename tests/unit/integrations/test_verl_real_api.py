"""The integration on kvctl's real API (kvctl.api / kvctl.api.loop) against vLLM and Mooncake master
doubles: verl's sync trainer replayed (tests/lib/verl_stand_ins.py), its own reset broken so that
the old weights' KV survives in the store: mode "verify" sees it STALE, mode "reset" clears and proves."""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

import pytest

from kvctl.integrations.verl import KvctlVerlHook, install
from tests.doubles import DoubleFleet, MasterDouble, SharedStore, VllmDouble
from tests.lib import verl_stand_ins as verl

pytest.importorskip("kvctl.api.loop", reason="kvctl's training-loop API (take_evidence, check_evidence)")


@pytest.fixture
def fleet() -> Iterator[tuple[list[VllmDouble], str]]:
    store = SharedStore()
    with DoubleFleet() as doubles:
        replicas = [VllmDouble("0.24.0", store=store, name=f"rollout-{i}") for i in range(2)]
        for replica in replicas:
            doubles.add(replica)
        yield replicas, doubles.add_master(MasterDouble(store))


def run_sync(fleet: tuple[list[VllmDouble], str], monkeypatch: pytest.MonkeyPatch, hook: KvctlVerlHook) -> dict:
    """One step of v1 sync: generate, on_sample_end's sleep, on_step_end's naive update whose own
    reset is broken (trainer_sync.py:35-44)."""
    modules = verl.install(monkeypatch)
    doubles, _ = fleet
    replicas = [verl.Replica(d, i) for i, d in enumerate(doubles)]
    actor = verl.ActorGroup(verl_resets=False)
    manager = modules["verl.checkpoint_engine"].CheckpointEngineManager(types.SimpleNamespace(backend="naive"), actor,
                                                                        replicas)
    from kvctl.integrations.verl import adopt

    adopt(manager, install(hook), "")
    from tests.unit.integrations.test_verl_placement import generate

    generate(replicas)
    manager.sleep_replicas()
    for replica in replicas:  # vLLM 0.24's sleep clears the store (FACTS.md section 9); put the old KV back
        replica.double.asleep = False
        generate([replica])
        replica.double.asleep = True
    manager.update_weights(1)
    return hook.consume_metrics()


def test_verify_sees_the_old_weights_kv_that_verl_s_reset_left(fleet: Any, monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Any) -> None:
    metrics = run_sync(fleet, monkeypatch, KvctlVerlHook(fleet[1], mode="verify", state_dir=str(tmp_path)))
    assert metrics["kvctl/failed"] == 1.0 and metrics["kvctl/stale_replicas"] >= 1.0, metrics


def test_reset_clears_and_proves(fleet: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    metrics = run_sync(fleet, monkeypatch, KvctlVerlHook(fleet[1], policy="raise", state_dir=str(tmp_path)))
    assert metrics["kvctl/failed"] == 0.0 and metrics["kvctl/verified"] == 1.0, metrics
    assert metrics["kvctl/stale_replicas"] == 0.0 and metrics["kvctl/evidence"] == 1.0
