"""Real-stack tests beyond the basic story: a weight update, a reset under load, faults, and
vLLM's own KVTransferConfig judging kvctl's renders. They run after test_stale_kv.py (file order)
and the fault test, which kills processes of the shared stack, comes last.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from kvctl.serve import procs, runs
from kvctl.serve.vllm_launch import find_vllm, replica_command, replica_env

from .conftest import HTTP_TIMEOUT, PROMPT, Stack, kvctl, master_keys, probe, receipt, reset_local, start_stack, \
    stop_stack, wait_for_keys

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]


# -- 1. weight update ---------------------------------------------------------------------
def test_weight_update_stale_kv_then_fresh(stack: Stack, models: Path, vllm_python: str, tmp_path: Path) -> None:
    """Old-weight KV in Mooncake changes a new-weight server's output until kvctl resets the store."""
    kvctl("reset", "--run", stack.name, "--connector", state=stack.state)
    a = stack.urls[0]
    old = probe(a, stack.model, max_tokens=4)  # the old-weight server computes the prompt ...
    wait_for_keys(stack.admin, prefix=f"{stack.name}@")  # ... and its KV block reaches Mooncake (asynchronously)
    # The weight update: same path, same tokenizer and shape, new random weights (seed 1). The file
    # is replaced, never overwritten in place: the running old-weight server may keep it mapped.
    staged = stack.model / "model.safetensors.new"
    shutil.copy2(models / "tiny-llama-1" / "model.safetensors", staged)
    os.replace(staged, stack.model / "model.safetensors")
    # The same deployment after the update: same master, same cache_prefix (kvctl serve would give
    # the new run its own, which is what keeps unrelated runs apart)
    new = start_stack("weights", stack.state, stack.model, vllm_python, "--master", stack.rpc,
                      "--master-admin", stack.admin, "--set", f"cache_prefix={stack.name}")
    try:
        c = new.urls[0]
        stale = probe(c, stack.model, max_tokens=4)
        assert stale.external == 128  # the new-weight server's first request used the old-weight block
        # kvctl probe sees it by content: the prompt as served vs computed fresh with a cache_salt
        prompts = tmp_path / "prompts.txt"
        prompts.write_text(PROMPT + "\n")
        seen = kvctl("probe", "--run", new.name, "--prompts", str(prompts), "--json", state=stack.state, check=False)
        (found,) = receipt(seen)["replicas"]
        assert seen.returncode == 1 and found["verdict"] == "STALE", seen.stdout
        assert found["results"][0]["plain_cached"] >= 128 and found["results"][0]["salted_cached"] == 0
        done = kvctl("reset", "--run", new.name, "--connector", "--verify", "--probe-prompts", str(prompts),
                     "--json", state=stack.state)
        assert receipt(done)["ok"] is True
        assert [r["probe"]["verdict"] for r in receipt(done)["replicas"]] == ["match"]
        reset_local(c)
        kvctl("reset", "--run", new.name, "--connector", state=stack.state)  # drop the canary's blocks
        fresh = probe(c, stack.model, max_tokens=4)
        assert (fresh.cached, fresh.external) == (0, 0)  # computed from scratch on the new weights
        assert not _close(stale.logprobs, fresh.logprobs)  # the stale block had changed the output
        assert not _close(old.logprobs, fresh.logprobs)  # and the weights did change
    finally:
        stop_stack(new)


def _close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=1e-4, abs_tol=1e-4) for x, y in zip(a, b))


# -- 2. under load -----------------------------------------------------------------------
def test_reset_under_load_fails_no_request(stack: Stack) -> None:
    """Two clients, one per replica, send the same few prompts without pause, so replicas load each
    other's blocks through Mooncake while `kvctl reset --connector --pause --verify` runs: no request
    may fail (kvctl serve's CPU binding keeps cross-replica transfers reliable, docs/evidence.md)."""
    stop = threading.Event()
    results: list[tuple[float, float, int]] = []  # (start, end, status)

    def load(url: str) -> None:
        with httpx.Client(timeout=HTTP_TIMEOUT, trust_env=False) as client:
            i = 0
            while not stop.is_set() and i < 3000:  # bounded
                i += 1
                started = time.monotonic()
                try:
                    status = client.post(f"{url}/v1/completions", json={
                        "model": str(stack.model), "prompt": f"shared {i % 3} {PROMPT}", "max_tokens": 2,
                        "temperature": 0}).status_code
                except httpx.HTTPError:
                    status = -1
                results.append((started, time.monotonic(), status))

    threads = [threading.Thread(target=load, args=(url,)) for url in stack.urls]
    for t in threads:
        t.start()
    time.sleep(5)
    began = time.monotonic()
    proc = kvctl("reset", "--run", stack.name, "--connector", "--pause", "--verify", "--json",
                 state=stack.state, check=False)
    ended = time.monotonic()
    time.sleep(5)
    stop.set()
    for t in threads:
        t.join(timeout=300)
    data = receipt(proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert data["master"]["keys_after"] == 0  # counted while generation was paused
    assert all(r["canary"]["cached_tokens"] == 0 for r in data["replicas"])
    failed = [r for r in results if r[2] != 200]
    assert failed == [], f"{len(failed)} of {len(results)} requests failed during the reset"
    assert any(r[1] < began for r in results) and any(r[0] > ended for r in results)


# -- 3. vLLM's own KVTransferConfig --------------------------------------------------------
JUDGE = """
import json, sys
from vllm.config import KVTransferConfig
ok = {}
for name, cfg in json.loads(sys.stdin.read()).items():
    try:
        KVTransferConfig(**cfg)
        ok[name] = "accepted"
    except Exception as exc:
        ok[name] = f"rejected: {type(exc).__name__}: {str(exc)[:200]}"
print(json.dumps(ok))
"""


def test_every_render_is_accepted_by_vllms_kvtransferconfig(vllm_python: str, state: Path) -> None:
    install = find_vllm(vllm_python)
    configs = {}
    for name in ("mooncake-store", "mooncake-store-standalone", "mooncake-pd", "mooncake-pd-store",
                 "lmcache-mooncake"):
        out = kvctl("config", "render", name, "--set", "role=producer" if "pd" in name else "hash_seed=0",
                    "--format", "json", "--vllm-version", str(install.version), state=state)
        configs[name] = json.loads(out.stdout)
    configs["unknown-field"] = {**configs["mooncake-store"], "kv_bogus_field": 1}
    judged = json.loads(subprocess.run([vllm_python, "-c", JUDGE], input=json.dumps(configs), text=True,
                                       capture_output=True, timeout=300, check=True).stdout)
    assert {k: v for k, v in judged.items() if k != "unknown-field"} == {k: "accepted" for k in configs
                                                                         if k != "unknown-field"}
    assert judged["unknown-field"].startswith("rejected")  # extra=forbid from 0.16 (FACTS §2)


def test_kvctl_config_render_fits_the_installed_vllm(vllm_python: str, state: Path) -> None:
    install = find_vllm(vllm_python)
    assert install.cpu and str(install.version) == "0.32.0"


# -- 4. faults ----------------------------------------------------------------------------
def test_replica_without_dev_mode_gets_the_dev_mode_message(stack: Stack, vllm_python: str,
                                                            tmp_path: Path) -> None:
    install = find_vllm(vllm_python)
    port = _free_port()
    bundle_env = {"MOONCAKE_CONFIG_PATH": str(Path(stack.record.bundle) / "mooncake.json"), "PYTHONHASHSEED": "0"}
    env = replica_env(install, dict(__import__("os").environ), bundle_env, tmp_path / "nodev", "127.0.0.1", None)
    env.pop("VLLM_SERVER_DEV_MODE")
    cmd = replica_command(install, str(stack.model), "127.0.0.1", port,
                          {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"},
                          ["--max-model-len", "256", "--dtype", "float32", "--max-num-seqs", "4", "--enforce-eager"])
    _, ref = procs.spawn(cmd, env, tmp_path / "nodev.log", "replica nodev")
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_health(url, ref, tmp_path / "nodev.log")
        proc = kvctl("reset", "--url", url, state=stack.state, check=False)
        assert proc.returncode == 1
        assert "dev mode is off" in proc.stdout and "VLLM_SERVER_DEV_MODE=1" in proc.stdout
        with_connector = kvctl("reset", "--url", url, "--connector", state=stack.state, check=False)
        assert with_connector.returncode == 1 and "VLLM_SERVER_DEV_MODE=1" in with_connector.stderr
    finally:
        procs.stop(ref)
    assert not procs.is_ours(ref)


def test_zz_replica_then_master_killed(stack: Stack) -> None:
    """Last: kills processes of the shared stack. A replica killed during the reset gives exit 3
    naming it; with the master dead too, the reset fails clearly and in bounded time."""
    victim = stack.record.replicas[1]
    proc = subprocess.Popen([sys.executable, "-m", "kvctl", "reset", "--run", stack.name, "--connector", "--verify",
                             "--json", "--timeout", "5", "--retries", "1", "--state-dir", str(stack.state)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_until_talking_to(proc.pid, victim.port)  # the reset has reached the victim: kill it now
    procs.stop(victim.process, grace=0)
    out, err = proc.communicate(timeout=600)
    data = json.loads(out)
    # exit 3 naming the victim; or exit 1 when the dead replica's Mooncake segment also made the
    # survivor's connector reset fail ({"success": false}, seen): never success for either
    assert proc.returncode in (1, 3), out + err
    assert victim.name in data["not_reset"] and victim.name in data["summary"]
    by_name = {r["name"]: r for r in data["replicas"]}
    assert by_name[victim.name]["reset"] is False
    for r in data["replicas"]:
        assert r["reset"] or r["error"], r  # every replica not reset says why
    assert (proc.returncode == 3) == (len(data["not_reset"]) == 1)
    master = stack.record.master
    procs.stop(master.process, grace=0)
    began = time.monotonic()
    dead = kvctl("reset", "--run", stack.name, "--connector", "--verify", "--json", "--timeout", "5",
                 "--retries", "1", state=stack.state, check=False)
    assert time.monotonic() - began < 600
    assert dead.returncode in (1, 3)
    data = receipt(dead)
    assert data["master"]["error"] and "Mooncake master" in data["master"]["error"]
    assert not data["ok"]


def _wait_until_talking_to(pid: int, port: int, timeout: float = 60.0) -> None:
    """Until process `pid` has a TCP connection to `port` (a reset takes < 1 s now: a fixed sleep
    could kill the victim after the reset was already over)."""
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if any(c.raddr and c.raddr.port == port for c in _connections(psutil.Process(pid))):
                return
        except psutil.NoSuchProcess:
            break
        time.sleep(0.002)
    raise AssertionError(f"the reset (pid {pid}) never connected to port {port}")


def _connections(proc: "psutil.Process") -> list:  # noqa: F821 - psutil < 6 calls it connections()
    return (getattr(proc, "net_connections", None) or proc.connections)(kind="tcp")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_health(url: str, ref: procs.ProcessRef, log: Path, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not procs.is_ours(ref):
            raise AssertionError(f"replica exited:\n{procs.tail(log)}")
        try:
            if httpx.get(f"{url}/health", timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError(f"{url} not healthy:\n{procs.tail(log)}")


__all__ = ["runs", "signal", "master_keys"]
