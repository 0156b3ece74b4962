"""KvctlVerlHook's policy: "warn" never raises (logged, counted), "raise" raises kvctl.ResetFailed
after bounded attempts within budget_s, "verify" checks without resetting, a data-parallel fleet is
refused, and every call leaves flat float metrics. And nothing of it imports verl, Ray or torch."""

from __future__ import annotations

import asyncio
import json
import logging
import pickle
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kvctl import api
from kvctl.errors import UsageError
from kvctl.integrations.verl import DataParallelRefused, KvctlVerlHook, ReplicaView
from tests.doubles import DoubleFleet, VllmDouble
from tests.lib import REPO
from tests.unit.integrations.fake_api import FakeApi


@pytest.fixture
def fleet(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeApi, list[ReplicaView]]]:
    with DoubleFleet() as doubles:
        replicas = [VllmDouble("0.24.0", name=f"d{i}") for i in range(2)]
        for replica in replicas:
            doubles.add(replica)
        yield FakeApi(replicas).install(monkeypatch), [ReplicaView(r.url, r.name) for r in replicas]


def cycle(hook: KvctlVerlHook, replicas: list[ReplicaView]) -> dict[str, float]:
    async def run() -> None:
        await hook.before_stop("", replicas)
        await hook.after_update("", replicas, step=3)
        await hook.after_resume("", replicas)

    asyncio.run(run())
    return hook.consume_metrics()


def test_warn_never_raises_and_counts(fleet: tuple[FakeApi, list[ReplicaView]],
                                      caplog: pytest.LogCaptureFixture) -> None:
    fake, replicas = fleet
    fake.fail = 5
    hook = KvctlVerlHook(attempts=2)
    caplog.set_level(logging.INFO, "kvctl.integrations.verl")
    metrics = cycle(hook, replicas)
    assert [c.op for c in fake.calls] == ["evidence", "reset", "reset"]  # two attempts, then on
    assert metrics["kvctl/ok"] == 0.0 and metrics["kvctl/failed"] == 1.0 and metrics["kvctl/attempts"] == 2.0
    assert metrics["kvctl/failures_total"] == 1.0
    assert "NOT proven clean after 2 attempt(s)" in caplog.text and "step 3" in caplog.text


def test_raise_raises_reset_failed_after_bounded_attempts(fleet: tuple[FakeApi, list[ReplicaView]]) -> None:
    fake, replicas = fleet
    fake.fail = 5
    hook = KvctlVerlHook(policy="raise", attempts=3)
    with pytest.raises(api.ResetFailed) as failed:
        cycle(hook, replicas)
    assert [c.op for c in fake.calls] == ["evidence", "reset", "reset", "reset"]
    assert failed.value.receipt.ok is False and hook.metrics()["kvctl/attempts"] == 3.0


def test_a_second_attempt_that_passes_is_ok(fleet: tuple[FakeApi, list[ReplicaView]]) -> None:
    fake, replicas = fleet
    fake.fail = 1
    metrics = cycle(KvctlVerlHook(policy="raise", attempts=2), replicas)
    assert metrics["kvctl/ok"] == 1.0 and metrics["kvctl/attempts"] == 2.0 and metrics["kvctl/failures_total"] == 0.0


def test_no_attempt_starts_after_the_budget(fleet: tuple[FakeApi, list[ReplicaView]],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    fake, replicas = fleet
    fake.fail = 5
    slow = fake.hard_reset_async

    async def slow_reset(*args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(0.3)
        return await slow(*args, **kwargs)

    monkeypatch.setattr(api, "hard_reset_async", slow_reset, raising=False)
    started = time.monotonic()
    with pytest.raises(api.ResetFailed):
        cycle(KvctlVerlHook(policy="raise", attempts=10, budget_s=0.2), replicas)
    assert [c.op for c in fake.calls].count("reset") == 1 and time.monotonic() - started < 3


def test_verify_checks_verl_s_reset_once_and_never_resets(fleet: tuple[FakeApi, list[ReplicaView]]) -> None:
    fake, replicas = fleet
    fake.stale = True  # verl's reset left the old weights' KV: the canary hits
    hook = KvctlVerlHook(mode="verify", master="127.0.0.1:9003", attempts=3)
    metrics = cycle(hook, replicas)
    assert [c.op for c in fake.calls] == ["evidence", "check"]  # a canary proves one reset: no retry
    assert fake.calls[1].evidence and fake.calls[1].master == "127.0.0.1:9003"
    assert metrics["kvctl/stale_replicas"] == 2.0 and metrics["kvctl/failed"] == 1.0
    with pytest.raises(api.ResetFailed):
        cycle(KvctlVerlHook(mode="verify", policy="raise"), replicas)


def test_verify_without_evidence_checks_nothing(fleet: tuple[FakeApi, list[ReplicaView]]) -> None:
    fake, replicas = fleet
    hook = KvctlVerlHook(mode="verify", policy="raise")
    asyncio.run(hook.after_update("", replicas, 0))
    assert fake.calls == [] and hook.metrics()["kvctl/checked"] == 0.0


def test_a_data_parallel_fleet_is_refused(fleet: tuple[FakeApi, list[ReplicaView]],
                                          caplog: pytest.LogCaptureFixture) -> None:
    fake, replicas = fleet
    wide = [ReplicaView(r.url, r.name, data_parallel_size=2) for r in replicas]
    metrics = cycle(KvctlVerlHook(), wide)
    assert fake.calls == [] and metrics["kvctl/refused"] == 1.0 and metrics["kvctl/ok"] == 0.0
    assert "data_parallel_size=2" in caplog.text and "fronts 2 engines" in caplog.text
    with pytest.raises(DataParallelRefused, match="data_parallel_size=2"):
        cycle(KvctlVerlHook(policy="raise"), wide)


def test_metrics_are_flat_floats_under_one_prefix(fleet: tuple[FakeApi, list[ReplicaView]]) -> None:
    _, replicas = fleet
    hook = KvctlVerlHook()
    metrics = cycle(hook, replicas)
    asyncio.run(hook.after_update("hybrid", replicas, 3))
    metrics.update(hook.consume_metrics())
    assert metrics and all(type(v) is float for v in metrics.values())
    assert all(k.startswith("kvctl/") and " " not in k for k in metrics)
    assert "kvctl/hybrid/ok" in metrics and json.loads(json.dumps(metrics)) == metrics
    assert hook.consume_metrics() == {}


def test_bad_settings_are_refused_and_the_hook_travels_bare() -> None:
    for bad in ({"policy": "ignore"}, {"mode": "clear"}, {"attempts": 0}, {"budget_s": -1}):
        with pytest.raises(UsageError):
            KvctlVerlHook(**bad)  # type: ignore[arg-type]
    hook = KvctlVerlHook.from_env({"KVCTL_MASTER": "10.0.0.1:9003", "KVCTL_VERL_POLICY": "raise",
                                   "KVCTL_VERL_ATTEMPTS": "4", "KVCTL_VERL_RUN": "verl-x"})
    assert (hook.master, hook.policy, hook.attempts, hook.run) == ("10.0.0.1:9003", "raise", 4, "verl-x")
    hook._metrics["kvctl/ok"] = 1.0
    copy = pickle.loads(pickle.dumps(hook))  # to verl's TaskRunner, with its class
    assert copy.master == "10.0.0.1:9003" and copy.metrics() == {} and copy.recorder is None


def test_importing_kvctl_and_the_integration_imports_no_verl_ray_or_torch() -> None:
    """verl's modules are loaded only when a trainer class is built, in verl's TaskRunner."""
    code = ("import sys, kvctl\n"
            "assert 'kvctl.integrations' not in sys.modules\n"
            "import kvctl.integrations.verl, kvctl.integrations.verl.trainers, kvctl.integrations.verl.managers\n"
            "import kvctl.integrations.verl.entry, kvctl.integrations.verl.servers\n"
            "print([m for m in ('verl', 'ray', 'torch') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_integration_is_a_leaf() -> None:
    """Nothing in kvctl imports it; it uses kvctl's API, the run records and the leaves only."""
    from tests.unit.test_layout import LEAVES, graph

    g = graph()
    assert not [n for n, deps in g.items() if not n.startswith("kvctl.integrations")
                and any(d.startswith("kvctl.integrations") for d in deps)]
    for name, deps in g.items():
        if name.startswith("kvctl.integrations"):
            outside = {d for d in deps if not d.startswith("kvctl.integrations") and d not in LEAVES}
            assert outside <= {"kvctl.api", "kvctl.api.loop", "kvctl.serve.runs", "kvctl.serve.procs", "kvctl.serve.ray_fleet"}, \
                (name, outside)
