"""The live rollout servers of a verl job, recorded as a run kvctl did not start: rebuilt after every
update (verl adds and removes replicas), found by `kvctl status --run` and targets.build_fleet(run=),
written to the Ray cluster's key-value store under Ray, and never signalled by kvctl stop or rm."""

from __future__ import annotations

import asyncio
import json
import os
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvctl import targets
from kvctl.errors import UsageError
from kvctl.integrations.verl import KvctlVerlHook, install
from kvctl.integrations.verl.managers import attach
from kvctl.integrations.verl.servers import run_name
from kvctl.serve import lifecycle, procs, runs
from tests.doubles import DoubleFleet, VllmDouble
from tests.unit.integrations.fake_api import FakeApi


class Manager:
    """What the record reads of a verl CheckpointEngineManager: its replicas (base.py:420)."""

    def __init__(self, doubles: list[VllmDouble], first: int = 0) -> None:
        self.replicas = [types.SimpleNamespace(server_address=d.url.removeprefix("http://"), replica_rank=first + i,
                                               config=types.SimpleNamespace(data_parallel_size=1))
                         for i, d in enumerate(doubles)]


@pytest.fixture
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[KvctlVerlHook, list[VllmDouble], Path]]:
    with DoubleFleet() as fleet:
        doubles = [VllmDouble("0.24.0", name=f"d{i}") for i in range(3)]
        for double in doubles:
            fleet.add(double)
        FakeApi(doubles).install(monkeypatch)
        hook = install(KvctlVerlHook("127.0.0.1:9003", master_rpc="127.0.0.1:50051", state_dir=str(tmp_path)))
        hook.describe_job({"trainer": {"experiment_name": "gsm8k grpo/7"},
                           "actor_rollout_ref": {"model": {"path": "Qwen/Qwen2.5-0.5B"}}}, "sync")
        yield hook, doubles, tmp_path


def update(hook: KvctlVerlHook, manager: Manager, step: int) -> None:
    from kvctl.integrations.verl.servers import replica_views

    asyncio.run(hook.after_update("", replica_views(manager, ""), step))


def test_the_record_is_rebuilt_every_step_and_resolves(job: tuple[KvctlVerlHook, list[VllmDouble], Path]) -> None:
    hook, doubles, state = job
    assert run_name("gsm8k grpo/7") == "verl-gsm8k-grpo-7"
    manager = Manager(doubles[:2])
    attach(manager, hook, "")
    record = runs.load("verl-gsm8k-grpo-7", state)
    assert record.external and record.owner == "verl" and record.processes() == []
    assert [r.url for r in record.replicas] == [d.url for d in doubles[:2]]
    assert record.model == "Qwen/Qwen2.5-0.5B" and record.parameters["trainer"] == "sync"

    manager.replicas.append(Manager(doubles[2:], first=2).replicas[0])  # verl scaled up
    update(hook, manager, 5)
    record = runs.load("verl-gsm8k-grpo-7", state)
    assert [r.name for r in record.replicas] == ["rollout-0", "rollout-1", "rollout-2"]
    assert record.parameters["step"] == 5 and record.state == "running"
    fleet = targets.build_fleet(run="verl-gsm8k-grpo-7", state_dir=str(state), env={})
    assert [r.url for r in fleet.replicas] == [d.url for d in doubles]
    assert fleet.masters == ("127.0.0.1:9003",) and fleet.master_rpcs == ("127.0.0.1:50051",)

    del manager.replicas[0]  # and down
    update(hook, manager, 6)
    assert [r.url for r in runs.load("verl-gsm8k-grpo-7", state).replicas] == [d.url for d in doubles[1:]]
    hook.finish("stopped")
    assert runs.load("verl-gsm8k-grpo-7", state).state == "stopped"


def test_the_cli_finds_it_and_never_stops_it(job: tuple[KvctlVerlHook, list[VllmDouble], Path], cli: Any) -> None:
    hook, doubles, state = job
    hook.run = "verl-job"
    attach(Manager(doubles[:2]), hook, "")
    status = cli("status", "--run", "verl-job", "--state-dir", str(state), "--json")
    shown = json.loads(status.stdout)
    assert [r["url"] for r in shown["replicas"]] == [d.url for d in doubles[:2]], status.stdout + status.stderr
    listed = cli("runs", "--state-dir", str(state), "--json")
    assert any(r["name"] == "verl-job" and r["owner"] == "verl" and r["state"] == "running"
               for r in json.loads(listed.stdout)["runs"]), listed.stdout

    stop = cli("stop", "verl-job", "--state-dir", str(state))
    assert stop.exit_code == 2 and "started by verl, not by kvctl" in stop.stderr
    assert cli("stop", "--all", "--state-dir", str(state)).exit_code == 0  # nothing of kvctl's: untouched
    removed = cli("rm", "--force", "verl-job", "--state-dir", str(state))
    assert removed.exit_code == 2 and "live verl job" in removed.stderr
    assert runs.load("verl-job", state).state == "running"  # nothing was stopped or marked stopped
    with pytest.raises(UsageError, match="kvctl stops only what it started"):
        lifecycle.stop_run(runs.load("verl-job", state))

    record = runs.load("verl-job", state)  # the job has ended (its writer is gone): rm takes the record
    record.supervisor = procs.ProcessRef(os.getpid(), 1.0, "verl trainer")
    record.state = "stopped"
    record.save()
    assert cli("rm", "verl-job", "--state-dir", str(state)).exit_code == 0
    assert not (state / "runs" / "verl-job").exists()


def test_a_live_kvctl_run_of_that_name_is_never_overwritten(job: tuple[KvctlVerlHook, list[VllmDouble], Path],
                                                            caplog: pytest.LogCaptureFixture) -> None:
    hook, doubles, state = job
    hook.run = "taken"
    me = os.getpid()
    theirs = runs.RunRecord("taken", str(state / "runs" / "taken"), "running", 1.0, "t", {}, "m", "h", {}, None,
                            supervisor=procs.ProcessRef(me, procs.start_time_of(me) or 0.0, "kvctl serve"))
    theirs.save()
    attach(Manager(doubles[:1]), hook, "")
    assert runs.load("taken", state).owner is None and "KVCTL_VERL_RUN" in caplog.text


def test_under_ray_the_record_goes_to_the_cluster_too(job: tuple[KvctlVerlHook, list[VllmDouble], Path],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Never ray_fleet.connect() (it would re-init the job's Ray): the trainer's own connection."""
    from kvctl.serve import ray_fleet

    hook, doubles, _ = job
    put: list[runs.RunRecord] = []
    fake_ray = types.SimpleNamespace(is_initialized=lambda: True, get_runtime_context=lambda: types.SimpleNamespace(
        gcs_address="10.0.0.1:6379"))
    monkeypatch.setitem(__import__("sys").modules, "ray", fake_ray)
    monkeypatch.setattr(ray_fleet, "kv_put", put.append)
    monkeypatch.setattr(ray_fleet, "connect", lambda *a: pytest.fail("connect() inside the trainer"))
    manager = Manager(doubles[:2])
    attach(manager, hook, "")
    update(hook, manager, 1)
    assert len(put) == 2 and put[-1].ray == {"address": "10.0.0.1:6379", "namespace": "kvctl"}
    assert put[-1].owner == "verl" and put[-1].parameters["step"] == 1
    with pytest.raises(UsageError, match="started by verl"):
        ray_fleet.stop_processes(put[-1])
