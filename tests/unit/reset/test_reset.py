"""kvctl reset against HTTP TEST DOUBLES of vLLM and of the Mooncake master (tests/doubles).

The doubles speak vLLM's real dev routes with each version's parameters and response shapes,
and simulate prefix caching with a shared store, so a silent no-op reset shows up as stale hits.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator

import pytest

import kvctl
from kvctl.reset.execute import hard_reset_fleet
from kvctl.reset.plan import ResetOptions, plan_reset
from kvctl.targets import Replica, build_fleet
from tests.doubles import DoubleFleet, Faults, MasterDouble, SharedStore, VllmDouble

RESET_PATHS = ("/reset_prefix_cache", "/reset_mm_cache", "/reset_encoder_cache", "/pause", "/resume")


@pytest.fixture
def doubles() -> Iterator[DoubleFleet]:
    with DoubleFleet() as fleet:
        yield fleet


def reset(urls: list[str], master: str | None = None, **options: object):
    fleet = build_fleet(urls, master=master, env={})
    options.setdefault("timeout", 2.0)
    return asyncio.run(hard_reset_fleet(fleet, ResetOptions(**options)))  # type: ignore[arg-type]


def posts(replica: VllmDouble) -> list[str]:
    return [c.path for c in replica.calls if c.method == "POST" and c.path in RESET_PATHS]


def warm(replica: VllmDouble, words: int = 40) -> str:
    """Send one long prompt so the replica caches it (locally and in its store)."""
    import httpx

    prompt = " ".join(f"w{i}" for i in range(words))
    httpx.post(f"{replica.url}/v1/completions", json={"model": replica.model, "prompt": prompt, "max_tokens": 1})
    return prompt


# -- the plan, per version --------------------------------------------------------------
@pytest.mark.parametrize(
    ("version", "connector", "external", "mm", "encoder", "master_clear"),
    [
        ("0.12.0", "LMCacheConnectorV1", None, True, False, True),
        ("0.13.0", "MooncakeConnector", True, True, False, False),
        ("0.16.0", "LMCacheConnectorV1", True, True, True, True),
        ("0.22.0", "MooncakeStoreConnector", True, True, True, True),
        ("0.23.0", "MooncakeStoreConnector", True, True, True, False),
        ("0.26.0", "MooncakeStoreConnector", True, True, True, False),
        ("0.32.0+cpu", "MooncakeStoreConnector", True, True, True, False),
        ("0.32.0+cpu", None, False, True, True, False),
    ],
)
def test_plan_per_version(doubles: DoubleFleet, version: str, connector: str | None, external: bool | None,
                          mm: bool, encoder: bool, master_clear: bool) -> None:
    url = doubles.add(VllmDouble(version, connector=connector))
    master = doubles.add_master(MasterDouble())
    fleet = build_fleet([url], master=master, env={})
    plan = asyncio.run(plan_reset(fleet, ResetOptions(connector=True)))
    assert plan.error is None
    ops = {o.op: o for o in plan.replicas[0].ops}
    assert ops["prefix_cache"].params.get("reset_external") is external
    assert (ops["mm_cache"].skip is None) is mm
    assert (ops["encoder_cache"].skip is None) is encoder
    if not encoder:
        assert ops["encoder_cache"].skip == f"not in vLLM {version} (first in 0.16.0)"
    assert plan.master_clear is master_clear


def test_plan_fails_before_sending_when_the_store_cannot_be_cleared(doubles: DoubleFleet, cli) -> None:
    old = VllmDouble("0.22.0")
    url = doubles.add(old)
    result = cli("reset", "--url", url, "--connector")
    assert result.exit_code == 1
    assert "MooncakeStoreConnector on vLLM 0.22.0 does not clear the store" in result.stderr
    assert "--master HOST:PORT" in result.stderr
    assert posts(old) == []


def test_dry_run_sends_nothing(doubles: DoubleFleet, cli) -> None:
    replica = VllmDouble("0.22.0")
    url, master = doubles.add(replica), doubles.add_master(MasterDouble(replica.store))
    result = cli("reset", "--url", url, "--master", master, "--connector", "--dry-run")
    assert result.exit_code == 0, result.stderr
    assert "remove_all?force=true" in result.stdout and "reset_external=True" in result.stdout
    assert posts(replica) == []


# -- execution --------------------------------------------------------------------------
def test_store_connector_023_clears_the_store_itself(doubles: DoubleFleet) -> None:
    store = SharedStore()
    a, b = VllmDouble("0.23.0", store=store), VllmDouble("0.23.0", store=store)
    urls = [doubles.add(a), doubles.add(b)]
    master = doubles.add_master(MasterDouble(store))
    warm(a)
    assert len(store) > 0
    receipt = reset(urls, master, connector=True, verify=True)
    assert receipt.exit_code == 0, receipt.summary
    assert receipt.master.clear is None and receipt.master.keys_after == 0
    for replica in (a, b):
        query = replica.calls_to("/reset_prefix_cache")[0].query
        assert query == {"reset_running_requests": "false", "reset_external": "true"}
    assert all(r.canary.ok and r.canary.signal == "cached_tokens" and r.canary.primed_cached_tokens > 0
               for r in receipt.replicas)


def test_silent_noop_on_022_is_covered_by_a_forced_master_clear(doubles: DoubleFleet) -> None:
    store = SharedStore()
    a, b = VllmDouble("0.22.0", store=store), VllmDouble("0.22.0", store=store)
    urls = [doubles.add(a), doubles.add(b)]
    master_double = MasterDouble(store)
    master = doubles.add_master(master_double)
    warm(a)
    before = len(store)
    receipt = reset(urls, master, connector=True, verify=True)
    assert receipt.exit_code == 0, receipt.summary
    assert receipt.master.clear.result == "ok" and receipt.master.removed_count >= before
    assert master_double.calls_to("/api/v1/remove_all")[0].query == {"force": "true"}
    assert a.counters.store_clears == 0  # vLLM 0.22 cleared nothing itself: kvctl's clear did


def test_a_scoped_clear_is_refused_where_vllm_does_not_read_cache_prefix(doubles: DoubleFleet) -> None:
    """MooncakeStoreConnector reads cache_prefix from 0.24.0: a 0.23 server's keys carry no prefix,
    so a clear scoped to it would find none of them and report success. Refused before anything is
    sent; --whole-master (not scoped) still goes."""
    store = SharedStore()
    old = VllmDouble("0.23.0", store=store, cache_prefix="team-a")
    urls = [doubles.add(old)]
    master = doubles.add_master(MasterDouble(store))
    receipt = reset(urls, master, connector=True)
    assert receipt.exit_code != 0 and "does not read cache_prefix (first read in vLLM 0.24.0)" in receipt.summary
    assert posts(old) == []
    whole = reset(urls, master, connector=True, whole_master=True)
    assert whole.exit_code == 0, whole.summary


@pytest.mark.parametrize("version, refused", [("0.34.0", True), ("0.33.0", False)])
def test_a_clear_scoped_to_auto_is_refused_where_vllm_resolves_it(doubles: DoubleFleet, version: str,
                                                                  refused: bool) -> None:
    """vLLM 0.34.0's store connector turns cache_prefix 'auto' into auto-<hash> (store/worker.py:218) and
    writes its keys there: a clear scoped to 'auto@' would find none and pass. Refused before anything is
    sent, naming where the resolved prefix is logged; before 0.34 'auto' is a prefix like any other."""
    store = SharedStore()
    replica = VllmDouble(version, store=store, cache_prefix="auto")
    urls = [doubles.add(replica)]
    master = doubles.add_master(MasterDouble(store))
    receipt = reset(urls, master, connector=True, dry_run=refused)
    if refused:
        assert receipt.exit_code == 1 and "resolve 'auto' to auto-<hash" in receipt.summary, receipt.summary
        assert "MooncakeStore resolved cache_prefix" in receipt.plan.hint
        assert posts(replica) == []
    else:
        assert receipt.plan.cache_prefix == "auto" and "auto-<hash" not in (receipt.plan.error or ""), receipt.summary


def test_an_inventory_connector_the_server_contradicts_is_an_error(doubles: DoubleFleet, tmp_path) -> None:
    """The inventory says MooncakeStoreConnector (clears from 0.23), the server runs LMCache: kvctl
    checks the inventory against /server_info and refuses to plan a reset for the wrong connector
    (it used to trust the inventory, plan no master clear, and leave the keys)."""
    store = SharedStore(["k1", "k2", "k3"])
    replica = VllmDouble("0.23.0", connector="LMCacheConnectorV1", store=store)
    url = doubles.add(replica)
    master = doubles.add_master(MasterDouble(store))
    inv = tmp_path / "inv.yaml"
    inv.write_text(f"master: {master}\nreplicas: [{{url: '{url}', connector: MooncakeStoreConnector}}]\n")
    receipt = kvctl.hard_reset(inventory=inv, verify=True)
    assert receipt.exit_code != 0 and not receipt.ok
    rr = receipt.replicas[0]
    assert rr.reset is False
    assert "inventory says connector MooncakeStoreConnector" in rr.error and "LMCacheConnectorV1" in rr.error


def test_metrics_fallback_when_no_prompt_tokens_details(doubles: DoubleFleet) -> None:
    store = SharedStore()
    replica = VllmDouble("0.32.0+cpu", store=store, prompt_tokens_details=False)
    url, master = doubles.add(replica), doubles.add_master(MasterDouble(store))
    receipt = reset([url], master, connector=True, verify=True)
    assert receipt.exit_code == 0, receipt.summary
    canary = receipt.replicas[0].canary
    assert canary.signal == "metrics" and canary.primed_cached_tokens > 0
    assert canary.local_hits == 0 and canary.external_hits == 0


def test_canary_is_longer_than_a_block(doubles: DoubleFleet) -> None:
    store = SharedStore()
    replica = VllmDouble("0.32.0+cpu", store=store, block_size=128, max_model_len=256)
    url, master = doubles.add(replica), doubles.add_master(MasterDouble(store))
    receipt = reset([url], master, connector=True, verify=True)
    assert receipt.exit_code == 0, receipt.summary
    assert 128 < receipt.replicas[0].canary.prompt_tokens < 256


# -- faults -----------------------------------------------------------------------------
def test_500_then_success_is_retried(doubles: DoubleFleet) -> None:
    replica = VllmDouble("0.26.0", connector=None, faults=Faults(fail_first={"/reset_prefix_cache": 2}))
    receipt = reset([doubles.add(replica)], retries=2)
    assert receipt.exit_code == 0
    op = next(o for o in receipt.replicas[0].ops if o.op == "prefix_cache")
    assert op.attempts == 3 and op.http_status == 200


def test_4xx_is_not_retried_and_404_means_dev_mode_off(doubles: DoubleFleet, cli) -> None:
    replica = VllmDouble("0.32.0+cpu", connector=None, dev_mode=False)
    result = cli("reset", "--url", doubles.add(replica), "--json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    op = data["replicas"][0]["ops"][0]
    assert op["http_status"] == 404 and op["attempts"] == 1
    assert "VLLM_SERVER_DEV_MODE=1" in op["error"]
    with_connector = cli("reset", "--url", replica.url, "--connector")
    assert with_connector.exit_code == 1 and "VLLM_SERVER_DEV_MODE=1" in with_connector.stderr


def test_success_false_is_a_failure(doubles: DoubleFleet) -> None:
    replica = VllmDouble("0.26.0", connector=None, faults=Faults(success_false={"/reset_prefix_cache"}))
    receipt = reset([doubles.add(replica)])
    assert receipt.exit_code == 1
    assert '{"success": false}' in receipt.replicas[0].error


def test_timeout_and_refused_make_a_partial_reset_naming_them(doubles: DoubleFleet, cli) -> None:
    good = VllmDouble("0.32.0+cpu", connector=None)
    slow = VllmDouble("0.32.0+cpu", connector=None, name="slow", faults=Faults(delay={"/reset_prefix_cache": 3}))
    gone = VllmDouble("0.32.0+cpu", connector=None, name="gone")
    urls = [doubles.add(good), doubles.add(slow), doubles.add(gone)]
    gone.faults.refuse = True
    result = cli("reset", *[a for u in urls for a in ("--url", u)], "--timeout", "0.5", "--retries", "1", "--json")
    assert result.exit_code == 3
    data = json.loads(result.stdout)
    assert sorted(data["not_reset"]) == sorted([f"127.0.0.1:{slow.port}", f"127.0.0.1:{gone.port}"])
    by_name = {r["name"]: r for r in data["replicas"]}
    slow_op = by_name[f"127.0.0.1:{slow.port}"]["ops"][0]
    assert slow_op["attempts"] == 2 and "timed out" in slow_op["error"]
    assert "cannot read its version" in by_name[f"127.0.0.1:{gone.port}"]["error"]
    assert by_name[f"127.0.0.1:{good.port}"]["reset"] is True


def test_one_slow_replica_does_not_hold_up_the_others(doubles: DoubleFleet) -> None:
    replicas = [VllmDouble("0.32.0+cpu", connector=None) for _ in range(15)]
    replicas[0].faults.delay = {"/reset_prefix_cache": 1.0}
    receipt = reset([doubles.add(r) for r in replicas], timeout=5.0)
    assert receipt.exit_code == 0
    slow_start = replicas[0].calls_to("/reset_prefix_cache")[0].t
    # every other replica's whole reset (prefix, mm, encoder) finished while the slow one was still waiting
    for r in replicas[1:]:
        assert r.calls_to("/reset_encoder_cache")[0].t < slow_start + 1.0


def test_pause_reset_resume_order_and_resume_on_failure(doubles: DoubleFleet) -> None:
    fine = VllmDouble("0.32.0+cpu", connector=None)
    broken = VllmDouble("0.32.0+cpu", connector=None, faults=Faults(status={"/reset_prefix_cache": 500}))
    receipt = reset([doubles.add(fine), doubles.add(broken)], pause=True, retries=0)
    assert receipt.exit_code == 3
    for replica in (fine, broken):
        assert posts(replica) == ["/pause", "/reset_prefix_cache", "/reset_mm_cache", "/reset_encoder_cache", "/resume"]
        assert replica.paused is False
    # clear_cache defaults to true: kvctl's pause must never clear (from 0.23 that would reset the
    # connector: a master-wide remove_all on a shared Mooncake master)
    assert fine.calls_to("/pause")[0].query == {"mode": "wait", "clear_cache": "false"}


@pytest.mark.parametrize("version", ["0.22.0", "0.23.0", "0.32.0+cpu"])
def test_pausing_never_clears_the_store(doubles: DoubleFleet, version: str) -> None:
    """A plain (local-only) reset with --pause leaves the external store alone in every release
    whose /pause clears caches by default."""
    store = SharedStore(["other@k1", "other@k2"])
    replica = VllmDouble(version, store=store)
    receipt = reset([doubles.add(replica)], pause=True)
    assert receipt.exit_code == 0 and len(store) == 2


def test_pause_params_for_015(doubles: DoubleFleet) -> None:
    replica = VllmDouble("0.15.0", connector=None)
    receipt = reset([doubles.add(replica)], pause=True)
    assert receipt.exit_code == 0, receipt.summary
    assert replica.calls_to("/pause")[0].query == {"wait_for_inflight_requests": "true", "clear_cache": "false"}


def test_256_replicas_at_once(doubles: DoubleFleet) -> None:
    store = SharedStore()
    replicas = [VllmDouble("0.23.0", store=store) for _ in range(256)]
    urls = [doubles.add(r) for r in replicas]
    master = doubles.add_master(MasterDouble(store))
    receipt = reset(urls, master, connector=True, concurrency=64, timeout=10.0)
    assert receipt.exit_code == 0, receipt.summary
    assert all(len(r.calls_to("/reset_prefix_cache")) == 1 for r in replicas)
    assert len(receipt.replicas) == 256 and all(r.reset for r in receipt.replicas)


# -- receipt and API ----------------------------------------------------------------------
def test_json_receipt_shape(doubles: DoubleFleet, cli) -> None:
    store = SharedStore()
    replica = VllmDouble("0.22.0", store=store)
    url, master = doubles.add(replica), doubles.add_master(MasterDouble(store))
    result = cli("reset", "--url", url, "--master", master, "--connector", "--verify", "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == 0 and data["ok"] is True and data["verify"] is True
    op = data["replicas"][0]["ops"][0]
    assert set(op) == {"op", "result", "http_status", "latency_s", "attempts", "error", "detail"}
    assert data["master"]["clear"]["result"] == "ok" and data["master"]["keys_after"] == 0
    assert data["replicas"][0]["canary"]["ok"] is True and data["total_s"] > 0


def test_table_output(doubles: DoubleFleet, cli) -> None:
    replica = VllmDouble("0.32.0+cpu", connector=None, name="a")
    url = doubles.add(replica)
    result = cli("reset", "--url", url)
    assert result.exit_code == 0
    assert "operations" in result.stdout and "1/1 replica(s) reset (local caches only" in result.stdout
    assert re.search(r"│ \d ok, \d+ ms +│", result.stdout), result.stdout  # 80 columns: one cell for them all
    wide = cli("reset", "--url", url, "-o", "wide").stdout  # a column per operation
    assert "prefix cache" in wide and "encoder cache" in wide and "operations" not in wide
    broken = VllmDouble("0.26.0", connector=None, faults=Faults(status={"/reset_prefix_cache": 500}))
    failed = cli("reset", "--url", doubles.add(broken), "--retries", "0")
    assert failed.exit_code == 1 and "prefix cache FAILED 500" in failed.stdout, failed.stdout


def test_python_api_raises_when_asked(doubles: DoubleFleet) -> None:
    replica = VllmDouble("0.26.0", connector=None, faults=Faults(status={"/reset_prefix_cache": 500}))
    url = doubles.add(replica)
    receipt = kvctl.hard_reset([url], connector=False, retries=0)
    assert receipt.ok is False and receipt.exit_code == 1
    with pytest.raises(kvctl.ResetFailed) as info:
        kvctl.hard_reset([url], connector=False, retries=0, raise_on_failure=True)
    assert info.value.receipt.not_reset == [f"127.0.0.1:{replica.port}"]


def test_async_api(doubles: DoubleFleet) -> None:
    url = doubles.add(VllmDouble("0.32.0+cpu", connector=None))
    receipt = asyncio.run(kvctl.hard_reset_async([url], connector=False))
    assert receipt.ok


def test_inventory_replica_names(doubles: DoubleFleet, tmp_path) -> None:
    url = doubles.add(VllmDouble("0.32.0+cpu", connector=None))
    assert Replica(url, "x").api_key() is None
    inv = tmp_path / "i.yaml"
    inv.write_text(f"replicas: [{{url: '{url}', name: trainer-0}}]\n")
    receipt = kvctl.hard_reset(inventory=inv, connector=False)
    assert receipt.replicas[0].name == "trainer-0" and receipt.ok


def test_a_failed_canary_prime_is_tried_once_more_with_a_new_prompt(doubles: DoubleFleet) -> None:
    store = SharedStore()
    replica = VllmDouble("0.32.0+cpu", store=store, faults=Faults(fail_first={"/v1/completions": 1}))
    url, master = doubles.add(replica), doubles.add_master(MasterDouble(store))
    receipt = reset([url], master, connector=True, verify=True, retries=0)
    assert receipt.exit_code == 0, receipt.summary
    prompts = [c.body["prompt"] for c in replica.calls_to("/v1/completions")]
    assert len(prompts) == 4 and prompts[0] != prompts[1]  # failed attempt, then a new canary
    assert prompts[1] == prompts[2] == prompts[3]  # primed twice, checked once: never re-sent after the reset


def test_a_failed_canary_check_is_inconclusive_not_retried(doubles: DoubleFleet) -> None:
    store = SharedStore()
    replica = VllmDouble("0.32.0+cpu", store=store)
    url, master = doubles.add(replica), doubles.add_master(MasterDouble(store))
    original = replica._h_completions
    sent = []

    async def fail_after_reset(request, call):  # noqa: ANN001 - the double's handler signature
        sent.append(call)
        if replica.calls_to("/reset_prefix_cache"):
            return replica._error(500, "engine failure", "InternalServerError")
        return await original(request, call)

    replica._h_completions = fail_after_reset
    receipt = reset([url], master, connector=True, verify=True, retries=2)
    assert receipt.exit_code == 1
    assert "inconclusive" in receipt.replicas[0].canary.error
    assert len(sent) == 3  # two primes, one check: the check is never retried


def test_proxy_variables_are_not_used(doubles: DoubleFleet, monkeypatch: pytest.MonkeyPatch) -> None:
    """Admin calls go straight to the replicas and the master, never through a proxy (docs/reset.md)."""
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # nothing listens there: a proxied call would fail
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    store = SharedStore(["double-model@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@01d"])  # its own (unprefixed)
    replica = VllmDouble("0.22.0", store=store)
    url = doubles.add(replica)
    master = doubles.add_master(MasterDouble(store))
    receipt = reset([url], master, connector=True, retries=0)
    assert receipt.exit_code == 0, receipt.summary
    assert receipt.master.removed_count == 1 and len(store) == 0


def test_pause_waits_longer_than_the_per_call_timeout(doubles: DoubleFleet) -> None:
    """/pause?mode=wait answers when in-flight requests are done: it gets PAUSE_TIMEOUT, not --timeout."""
    replica = VllmDouble("0.23.0", faults=Faults(delay={"/pause": 1.5}))
    receipt = reset([doubles.add(replica)], connector=True, timeout=0.5, retries=0, whole_master=True)
    assert receipt.exit_code == 0, receipt.summary
    pause = next(op for op in receipt.replicas[0].ops if op.op == "pause")
    assert pause.result == "ok" and pause.attempts == 1 and pause.latency_s >= 1.5
