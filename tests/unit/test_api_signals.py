"""A signal during a blocking Python API call (issue 39 finding 9): SIGTERM (or SIGINT) while
`kvctl.update_weights()` or `kvctl.hard_reset(pause=True)` runs used to leave every replica paused
(the CLI handled it, the API did not). Now the call resumes what it paused, restores the handlers it
found, and then the signal does what it would have done: the default SIGTERM ends the process, SIGINT
raises KeyboardInterrupt (carrying the receipt as `.receipt`), a trainer's own handler is called."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.doubles import DoubleFleet, MasterDouble, SharedStore, VllmDouble

SCRIPT = r"""
import json, signal, sys
import kvctl
mode, how, urls, master, folder = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4], sys.argv[5]
called = []
if how == "handler":
    def mine(signum, frame):
        called.append(signum)
    signal.signal(signal.SIGTERM, mine)
before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
print("START", flush=True)
try:
    if mode == "weights":
        receipt = kvctl.update_weights(folder, "v2", urls=urls, master=master, timeout=60)
    else:
        receipt = kvctl.hard_reset(urls=urls, master=master, pause=True, timeout=60)
    out = {"returned": receipt.to_dict().get("summary") or receipt.summary}
except KeyboardInterrupt as exc:
    out = {"keyboard_interrupt": getattr(getattr(exc, "receipt", None), "summary", None)}
out["handlers_restored"] = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
out["called"] = called
print(json.dumps(out), flush=True)
"""


def _checkpoint(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.safetensors").write_bytes(b"step-2 weights")
    (folder / "config.json").write_text("{}")
    return folder


@pytest.fixture
def doubles() -> Iterator[DoubleFleet]:
    with DoubleFleet() as fleet:
        yield fleet


@pytest.mark.parametrize(("mode", "how", "slow"), [
    ("weights", "default", "/collective_rpc"),   # SIGTERM, default action: the process ends, the fleet resumed
    ("reset", "default", "/reset_prefix_cache"),
    ("reset", "sigint", "/reset_prefix_cache"),  # SIGINT: KeyboardInterrupt with the receipt
    ("weights", "handler", "/reset_prefix_cache"),  # the trainer's own SIGTERM handler is called, once, after
])
def test_a_signal_during_a_blocking_api_call_resumes_the_fleet(doubles: DoubleFleet, tmp_path: Path, mode: str,
                                                                how: str, slow: str) -> None:
    store = SharedStore()
    replicas = [VllmDouble("0.32.0", store=store, weight_answers=True, connector="MooncakeStoreConnector")
                for _ in range(2)]
    urls = [doubles.add(r) for r in replicas]
    master = doubles.add_master(MasterDouble(store))
    replicas[1].faults.delay[slow] = 30
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, mode, how, json.dumps(urls), master,
                             str(_checkpoint(tmp_path / "c"))], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 60
        while not replicas[1].calls_to(slow) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(r.paused for r in replicas), "the call never paused the fleet"
        proc.send_signal(signal.SIGINT if how == "sigint" else signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not any(r.paused for r in replicas), f"replicas left paused; stderr: {err[-2000:]}"
    assert all(r.calls_to("/resume") for r in replicas)
    if how == "default":
        assert proc.returncode == -signal.SIGTERM, (proc.returncode, err[-2000:])
        return
    assert proc.returncode == 0, err[-2000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["handlers_restored"] is True
    if how == "sigint":
        assert "interrupted by SIGINT" in (result["keyboard_interrupt"] or ""), result
    else:
        assert result["called"] == [int(signal.SIGTERM)] and "interrupted by SIGTERM" in result["returned"], result
