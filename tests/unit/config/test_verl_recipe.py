"""docs/verl.md's trainer hook, run as the page writes it, against HTTP TEST DOUBLES of vLLM and
the Mooncake master (tests/doubles) and against a real mooncake_master.

The hook (`kvctl_reset_hook.py` on the page) is taken from the page itself, so the page cannot
drift from what is tested: a reset that is verified passes; a replica that answers 500, or one
that answers success and keeps serving its cache, makes the hook retry, log each replica kvctl
could not confirm, and raise kvctl.ResetFailed. The page's verl wiring (`kvctl_verl.py`) runs
too, on stand-ins of verl's trainer registry and `PPOTrainerSync` (tests/unit/config/test_verl.py checks
those names in verl's source) and with verl's real `auto_await`, compiled from the installed
verl: an exception from the hook leaves verl's `on_step_end`, which stops the training step.
"""

from __future__ import annotations

import ast
import asyncio
import concurrent.futures
import functools
import inspect
import logging
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import kvctl
from tests.doubles import DoubleFleet, MasterDouble, SharedStore, VllmDouble
from tests.lib.verl_doc import named_block, require_verl

HOOK_LOGGER = "kvctl_reset_hook"


def _module(name: str, source: str, origin: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = origin
    exec(compile(source, origin, "exec"), module.__dict__)  # noqa: S102 - the page's own code
    return module


@pytest.fixture
def hook(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """docs/verl.md's kvctl_reset_hook.py, importable as the page's kvctl_verl.py imports it."""
    module = _module("kvctl_reset_hook", named_block("kvctl_reset_hook.py"), "docs/verl.md:kvctl_reset_hook.py")
    monkeypatch.setitem(sys.modules, "kvctl_reset_hook", module)
    return module


@pytest.fixture
def doubles() -> Iterator[DoubleFleet]:
    with DoubleFleet() as fleet:
        yield fleet


def _warm(replica: VllmDouble) -> None:
    """A rollout before the weight update: its blocks are cached locally and in the store."""
    prompt = " ".join(f"w{i}" for i in range(48))
    answer = httpx.post(f"{replica.url}/v1/completions",
                        json={"model": replica.model, "prompt": prompt, "max_tokens": 1}, timeout=10)
    assert answer.status_code == 200


def _fleet(doubles: DoubleFleet, version: str = "0.23.0", n: int = 2) -> tuple[list[VllmDouble], str, SharedStore]:
    store = SharedStore()
    replicas = [VllmDouble(version, store=store, name=f"rollout-{i}") for i in range(n)]
    for replica in replicas:
        doubles.add(replica)
    master = doubles.add_master(MasterDouble(store))
    for replica in replicas:
        _warm(replica)
    assert len(store) > 0
    return replicas, master, store


def _keep_cache_on_reset(replica: VllmDouble) -> None:
    """The replica answers /reset_prefix_cache with success and resets nothing (a broken tier, as
    in vLLM issue 57727): what verl's unchecked reset would take for done."""
    async def success_without_reset(request: Any, call: Any) -> Any:  # the double's handler signature
        from aiohttp import web

        return web.json_response({"success": True})

    replica._h_reset_prefix_cache = success_without_reset  # type: ignore[method-assign]


@pytest.mark.parametrize("version", ["0.22.0", "0.23.0", "0.32.0+cpu"])
def test_a_verified_reset_returns_the_receipt(hook: types.ModuleType, doubles: DoubleFleet, version: str,
                                              caplog: pytest.LogCaptureFixture) -> None:
    """0.22: the store connector's reset is a silent no-op and kvctl clears the master itself;
    0.23 and later: the connector clears the store; either way the canary proves it."""
    replicas, master, store = _fleet(doubles, version)
    old_weights = set(store.keys())
    caplog.set_level(logging.INFO, HOOK_LOGGER)
    receipt = asyncio.run(hook.reset_after_weight_update([r.url for r in replicas], master, step=7))
    assert receipt.ok and receipt.exit_code == 0, receipt.summary
    # no block of the old weights is left (the canary's check after the reset writes new ones)
    assert not old_weights & set(store.keys()) and receipt.master.keys_after == 0
    assert all(r.reset and r.canary.ok and r.canary.primed_cached_tokens > 0 for r in receipt.replicas)
    assert [rec.levelname for rec in caplog.records] == ["INFO"] and "step 7:" in caplog.text


def test_a_replica_answering_500_makes_the_hook_retry_then_raise(hook: types.ModuleType, doubles: DoubleFleet,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    replicas, master, _ = _fleet(doubles)
    replicas[1].faults.status["/reset_prefix_cache"] = 500
    caplog.set_level(logging.INFO, HOOK_LOGGER)
    with pytest.raises(kvctl.ResetFailed) as failed:
        asyncio.run(hook.reset_after_weight_update([r.url for r in replicas], master, step=3))
    receipt = failed.value.receipt
    bad = f"127.0.0.1:{replicas[1].port}"
    assert receipt.not_reset == [bad] and receipt.exit_code == 3  # partial: rollout-0 was reset
    # two attempts of the hook, each with kvctl's own retries (2) of the failing call
    assert len(replicas[1].calls_to("/reset_prefix_cache")) == 2 * 3
    errors = [rec.getMessage() for rec in caplog.records if rec.levelname == "ERROR"]
    assert [m.split(" failed")[0] for m in errors] == ["step 3, reset attempt 1 of 2", "step 3, reset attempt 2 of 2"]
    assert all(bad in m and "HTTP 500" in m for m in errors), errors


def test_a_replica_that_keeps_its_cache_is_caught_by_the_canary(hook: types.ModuleType, doubles: DoubleFleet,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    replicas, master, _ = _fleet(doubles, "0.32.0+cpu")
    _keep_cache_on_reset(replicas[0])
    caplog.set_level(logging.INFO, HOOK_LOGGER)
    with pytest.raises(kvctl.ResetFailed) as failed:
        asyncio.run(hook.reset_after_weight_update([r.url for r in replicas], master, step=11))
    stale = failed.value.receipt.replicas[0]
    assert stale.reset is False and stale.canary is not None and not stale.canary.ok
    assert all(op.result == "ok" for op in stale.ops if op.op == "prefix_cache")  # the server said success
    assert "step 11, reset attempt 2 of 2 failed" in caplog.text and stale.name in caplog.text


def test_a_failure_that_passes_is_retried_by_the_hook(hook: types.ModuleType, doubles: DoubleFleet,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """Three 500s exhaust kvctl's retries of one attempt; the hook's second attempt succeeds."""
    replicas, master, _ = _fleet(doubles)
    replicas[0].faults.fail_first["/reset_prefix_cache"] = 3
    caplog.set_level(logging.INFO, HOOK_LOGGER)
    receipt = asyncio.run(hook.reset_after_weight_update([r.url for r in replicas], master, step=5))
    assert receipt.ok, receipt.summary
    assert [rec.levelname for rec in caplog.records if rec.getMessage().startswith("step 5")] == ["ERROR", "INFO"]


def test_no_master_for_a_connector_that_cannot_clear_the_store_is_a_refusal(hook: types.ModuleType,
                                                                             doubles: DoubleFleet) -> None:
    """vLLM 0.22's store connector reports success and clears nothing; without KVCTL_MASTER kvctl
    refuses before sending anything (the page's list of causes), where verl would go on."""
    replicas, _, _ = _fleet(doubles, "0.22.0")
    with pytest.raises(kvctl.ResetFailed) as failed:
        asyncio.run(hook.reset_after_weight_update([r.url for r in replicas], None, step=1))
    assert "does not clear the store" in str(failed.value)
    assert not any(r.calls_to("/reset_prefix_cache") for r in replicas)


# -- the page's verl wiring, on stand-ins of verl's trainer ---------------------------------------
def _verl_auto_await() -> Any:
    """verl's own auto_await (verl/utils/ray_utils.py), compiled from the installed file (its module
    imports Ray)."""
    path = require_verl() / "utils" / "ray_utils.py"  # skips without verl, or fails under CI
    tree = ast.parse(path.read_text())
    (node,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "auto_await"]
    namespace = {"asyncio": asyncio, "concurrent": concurrent, "functools": functools, "inspect": inspect}
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102
    return namespace["auto_await"]


class _Replica:
    def __init__(self, url: str) -> None:
        self.server_address = url.removeprefix("http://")  # RolloutReplica.server_address: host:port


def _stand_ins(replicas: list[VllmDouble], monkeypatch: pytest.MonkeyPatch) -> tuple[dict, list[str]]:
    """verl.trainer.ppo.v1.trainer_base / trainer_sync and verl.utils.ray_utils, as far as the
    page's kvctl_verl.py uses them. The stand-in trainer's weight update ends like verl's: a reset
    of every replica whose answer is ignored (vllm_async_server.py:864-873)."""
    events: list[str] = []

    class PPOTrainerSync:  # stands for verl.trainer.ppo.v1.trainer_sync.PPOTrainerSync
        def __init__(self) -> None:
            self.global_steps = 0
            self.checkpoint_manager = types.SimpleNamespace(replicas=[_Replica(r.url) for r in replicas])

        def _update_weights(self) -> None:
            events.append(f"update_weights {self.global_steps}")
            for replica in replicas:  # verl: await engine.reset_prefix_cache(reset_connector=True)
                httpx.post(f"{replica.url}/reset_prefix_cache", params={"reset_external": "true"}, timeout=10)

        def on_init_end(self) -> None:
            self._update_weights()

        def on_step_end(self) -> None:
            self._update_weights()

    registry: dict[str, type] = {"sync": PPOTrainerSync}
    modules = {
        "verl": types.ModuleType("verl"), "verl.trainer": types.ModuleType("verl.trainer"),
        "verl.trainer.ppo": types.ModuleType("verl.trainer.ppo"),
        "verl.trainer.ppo.v1": types.ModuleType("verl.trainer.ppo.v1"),
        "verl.trainer.ppo.v1.trainer_base": types.ModuleType("verl.trainer.ppo.v1.trainer_base"),
        "verl.trainer.ppo.v1.trainer_sync": types.ModuleType("verl.trainer.ppo.v1.trainer_sync"),
        "verl.utils": types.ModuleType("verl.utils"), "verl.utils.ray_utils": types.ModuleType("verl.utils.ray_utils"),
    }
    modules["verl.trainer.ppo.v1.trainer_base"].TRAINER_REGISTRY = registry  # type: ignore[attr-defined]
    modules["verl.trainer.ppo.v1.trainer_sync"].PPOTrainerSync = PPOTrainerSync  # type: ignore[attr-defined]
    modules["verl.utils.ray_utils"].auto_await = _verl_auto_await()  # type: ignore[attr-defined]
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    return registry, events


def test_the_page_s_verl_wiring_resets_after_each_update_and_stops_the_step_on_failure(
        hook: types.ModuleType, doubles: DoubleFleet, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    replicas, master, store = _fleet(doubles, "0.32.0+cpu")
    registry, events = _stand_ins(replicas, monkeypatch)
    monkeypatch.setenv("KVCTL_MASTER", master)
    wiring = _module("kvctl_verl", named_block("kvctl_verl.py"), "docs/verl.md:kvctl_verl.py")
    trainer_cls = registry["sync"]
    assert trainer_cls is wiring.PPOTrainerSyncKvctl  # verl's get_trainer_cls("sync") now finds it
    trainer = trainer_cls()
    caplog.set_level(logging.INFO, HOOK_LOGGER)

    old_weights = set(store.keys())
    trainer.on_init_end()  # the checkpoint's weights, then kvctl's verified reset
    assert events == ["update_weights 0"] and not old_weights & set(store.keys()) and "step 0:" in caplog.text

    for replica in replicas:
        _warm(replica)  # a rollout with the new weights
    trainer.global_steps = 1
    _keep_cache_on_reset(replicas[1])  # verl's own reset of it now "succeeds" and clears nothing
    with pytest.raises(kvctl.ResetFailed):
        trainer.on_step_end()  # in verl, this ends the step: no rollout from a stale fleet
    assert events == ["update_weights 0", "update_weights 1"]
    assert "step 1, reset attempt 2 of 2 failed" in caplog.text


# -- a real mooncake_master: the keys a real store client wrote are gone ----------------------------
@pytest.mark.integration
def test_the_hook_clears_a_real_master(hook: types.ModuleType, doubles: DoubleFleet, tmp_path: Path) -> None:
    """Rollout doubles of vLLM 0.22 (whose connector reset clears nothing) on a real master that a
    real store client filled: the hook's reset clears the master itself and proves 0 keys left."""
    from kvctl.serve.master_process import MasterProcess
    from tests.integration.helpers import StoreWriter, admin_call, require_mooncake

    require_mooncake()
    master = MasterProcess(log_path=tmp_path / "master.log", default_kv_lease_ttl="60s")
    master.start()
    writer = None
    try:
        writer = StoreWriter(master.rpc_address)
        writer.put(30, "verl/")
        assert admin_call(master.admin_address, "key_count") == 30
        urls = [doubles.add(VllmDouble("0.22.0", name=f"rollout-{i}")) for i in range(2)]
        receipt = asyncio.run(hook.reset_after_weight_update(urls, master.admin_address, step=2))
        assert receipt.ok, receipt.summary
        assert receipt.master.removed_count == 30 and receipt.master.keys_after == 0
        assert admin_call(master.admin_address, "key_count") == 0
    finally:
        if writer is not None:
            writer.kill()
        master.stop()
