"""`make demo` cannot lie: every answer is checked, a failed step names the replica, the server's
answer and the Mooncake transport error behind it (tools/demo.py, against a vLLM TEST DOUBLE that
answers 500 the way vLLM does on a failed KV load)."""

from __future__ import annotations

import importlib.util
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import httpx
import pytest

from tests.doubles import DoubleFleet, Faults, VllmDouble
from tests.lib import REPO

ROOT = REPO
TRANSPORT_LINE = ("E1130 23:36:55.276957  4404 transfer_task.cpp:1285] Failed to open segment for "
                  "endpoint='127.0.0.1:15014'\n")


@pytest.fixture(scope="module")
def demo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kvctl_demo", ROOT / "tools" / "demo.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def doubles() -> Iterator[DoubleFleet]:
    with DoubleFleet() as fleet:
        yield fleet


def test_a_500_names_the_step_the_replica_the_answer_and_the_transport(demo: ModuleType, doubles: DoubleFleet,
                                                                     tmp_path: Path) -> None:
    double = VllmDouble("0.32.0", faults=Faults(status={"/v1/completions": 500}, delay={"/v1/completions": 0.5}))
    url = doubles.add(double)
    log = tmp_path / "r1.log"
    log.write_text("E1130 an old transport error from before this request: TRANSFER_FAIL\n")
    # the replica logs the transport error while the request is in flight, as vLLM's worker does
    writer = threading.Timer(0.1, lambda: log.open("a").write(TRANSPORT_LINE))
    writer.start()
    with httpx.Client(timeout=10, trust_env=False) as client, pytest.raises(demo.DemoError) as failed:
        demo.send(client, demo.Replica("B", "r1", url, str(log)), double.model, "B, first time it sees the prompt")
    writer.join()
    message = str(failed.value)
    assert "B, first time it sees the prompt: replica B" in message and "HTTP 500" in message
    assert "Internal Server Error" in message  # the server's own answer
    assert "cause: Mooncake transport errors" in message and "segment unreachable x1" in message
    assert "old transport error" not in message  # only what this request caused
    assert str(log) in message


def test_numbers_that_contradict_each_other_are_a_failure(demo: ModuleType) -> None:
    row = demo.Row("B after a LOCAL-only reset", "B", 0, 0, 0)
    with pytest.raises(demo.DemoError, match="expected cached/local/external 128/0/128, got 0/0/0"):
        demo.expect(row, 128, 0, 128, "the stale block should still be in Mooncake")


def test_a_block_that_never_reaches_the_master_is_reported(demo: ModuleType, doubles: DoubleFleet,
                                                           tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.doubles import MasterDouble

    admin = doubles.add_master(MasterDouble())  # an empty store: A's put never lands
    log = tmp_path / "r0.log"
    log.write_text("")
    monkeypatch.setattr(demo, "KEY_WAIT_S", 0.5)
    began = time.monotonic()
    with httpx.Client(timeout=5, trust_env=False) as client, pytest.raises(demo.DemoError) as failed:
        demo.wait_for_key(client, admin, demo.Replica("A", "r0", "http://127.0.0.1:9", str(log)))
    assert time.monotonic() - began < 5
    assert "replica A's KV block did not reach the Mooncake master within 0.5 s" in str(failed.value)
