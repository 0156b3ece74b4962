"""Every path that resumes (issue 39 finding 6): kvctl resumes only the replicas whose /pause IT sent (and
that answered, or may have landed), never one paused by its owner or kept paused by a failed step, and a
signal does not wait for a store client that never answers.

The scoped clear's store client starts before kvctl's pause (its start is most of a scoped clear); a
SIGINT/SIGTERM then used to resume every replica, one its owner had just paused included, and with a
master whose RPC port never answers the exit waited ~30 s for that client."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from kvctl.reset import resuming
from kvctl.reset.execute import ResetOptions, hard_reset_fleet
from kvctl.targets import build_fleet
from tests.doubles import DoubleFleet, MasterDouble, SharedStore, VllmDouble


@pytest.fixture
def doubles() -> Iterator[DoubleFleet]:
    with DoubleFleet() as fleet:
        yield fleet


@pytest.fixture
def silent_rpc() -> Iterator[tuple[str, list[socket.socket]]]:
    """A "master RPC port" that accepts connections and never answers; the list holds those it accepted."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    yield f"127.0.0.1:{server.getsockname()[1]}", held
    server.close()
    for conn in held:
        conn.close()


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM"])
def test_a_signal_before_kvctl_s_pause_resumes_nothing_and_does_not_wait_for_the_store_client(
        doubles: DoubleFleet, silent_rpc: tuple[str, list[socket.socket]], name: str) -> None:
    import psutil

    rpc, accepted = silent_rpc
    store = SharedStore()
    replicas = [VllmDouble("0.32.0", store=store, cache_prefix="rl") for _ in range(3)]
    urls = [doubles.add(r) for r in replicas]
    master = doubles.add_master(MasterDouble(store))
    targets = [w for u in urls for w in ("--url", u)]
    proc = subprocess.Popen([sys.executable, "-m", "kvctl", "reset", *targets, "--master", master,
                             "--master-rpc", rpc, "--connector", "--pause", "--timeout", "2", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(
                "kvctl.transport.store_client" in " ".join(c.cmdline()) for c in psutil.Process(proc.pid).children()):
            time.sleep(0.02)
        before = len(accepted)  # the plan's own look at the port came first
        while time.monotonic() < deadline and len(accepted) == before:
            time.sleep(0.02)
        assert len(accepted) > before, "the store client never reached the master's RPC port"
        replicas[2].paused = True  # its owner pauses it now (or a failed reload left it so)
        proc.send_signal(getattr(signal, name))
        sent = time.monotonic()
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + int(getattr(signal, name)), err
    assert took < 5, f"the exit waited {took:.1f}s for a store client that never answers"
    assert replicas[2].paused, "kvctl resumed a replica its owner paused"
    assert not any(r.calls_to("/pause") or r.calls_to("/resume") for r in replicas)
    receipt = json.loads(out)
    assert all("not paused by kvctl" in r["error"] for r in receipt["replicas"]), receipt["replicas"]


def test_a_pause_cut_short_by_a_signal_is_resumed_after_it_lands(doubles: DoubleFleet,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The low finding "an interrupted /pause can land after kvctl's resume": a /pause in flight when the
    signal comes is resumed, and watched, so a pause that lands late is undone; a replica kvctl never sent
    a pause stays as it is."""
    from kvctl.interrupt import interruptible

    monkeypatch.setattr(resuming, "LATE_PAUSE_WATCH_S", 1.5)
    store = SharedStore()
    slow = VllmDouble("0.32.0", store=store)
    slow.faults.delay["/pause"] = 0.6  # answers (and pauses) 0.6 s after the request
    fast = VllmDouble("0.32.0", store=store)
    urls = [doubles.add(fast), doubles.add(slow)]
    fleet = build_fleet(urls, env={})

    async def go():  # type: ignore[no-untyped-def]
        task = asyncio.ensure_future(interruptible(hard_reset_fleet(fleet, ResetOptions(pause=True, timeout=5.0))))
        while not slow.calls_to("/pause"):
            await asyncio.sleep(0.01)
        signal.raise_signal(signal.SIGINT)
        return await task

    receipt = asyncio.run(go())
    assert receipt.exit_code == 130
    assert not fast.paused and not slow.paused, "a pause that landed after kvctl's resume was left"
    assert fast.calls_to("/resume") and slow.calls_to("/resume")


def test_a_signal_keeps_a_replica_whose_step_failed_paused(doubles: DoubleFleet) -> None:
    """A replica whose step (a weight reload) failed may hold no weights, or other weights than the fleet's:
    kept paused at the end, a signal too; the replica whose step the signal cut short is resumed."""
    from kvctl.interrupt import interruptible
    from kvctl.reset.execute import WhilePaused, execute_plan
    from kvctl.reset.plan import plan_reset
    from kvctl.reset.receipt import OpResult

    store = SharedStore()
    broken, slow = VllmDouble("0.32.0", store=store), VllmDouble("0.32.0", store=store)
    fleet = build_fleet([doubles.add(broken), doubles.add(slow)], env={})
    started = asyncio.Event()

    async def reload(rp, client):  # type: ignore[no-untyped-def]
        if rp.url == fleet.replicas[0].url:
            return OpResult("while_paused", "failed", error="reload failed: no weights loaded")
        started.set()
        await asyncio.sleep(30)
        return OpResult("while_paused", "ok")

    async def go():  # type: ignore[no-untyped-def]
        plan = await plan_reset(fleet, ResetOptions(pause=True, timeout=5.0))
        step = WhilePaused(reload)
        task = asyncio.ensure_future(interruptible(execute_plan(plan, fleet, while_paused=step)))
        await started.wait()
        await asyncio.sleep(0.1)
        signal.raise_signal(signal.SIGTERM)
        return await task, step

    receipt, step = asyncio.run(go())
    assert receipt.exit_code == 143
    assert broken.paused and not broken.calls_to("/resume"), "a replica whose reload failed was resumed"
    assert not slow.paused and slow.calls_to("/resume")
    assert step.held == [receipt.replicas[0].name]
    assert "kept paused: its step failed" in (receipt.replicas[0].error or "")


def test_a_signal_mid_update_keeps_a_failed_reload_paused_and_its_receipt_says_so(doubles: DoubleFleet,
                                                                                    tmp_path) -> None:  # type: ignore[no-untyped-def]
    """kvctl weights update: one replica's reload fails (it may hold no weights), the other's hangs; SIGTERM.
    The failed one stays paused and its row says left_paused; the other is resumed."""
    folder = tmp_path / "c"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"step-2 weights")
    (folder / "config.json").write_text("{}")
    store = SharedStore()
    replicas = [VllmDouble("0.32.0", store=store, weight_answers=True, connector="MooncakeStoreConnector")
                for _ in range(2)]
    urls = [doubles.add(r) for r in replicas]
    master = doubles.add_master(MasterDouble(store))
    replicas[0].faults.status["/collective_rpc"] = 500
    replicas[1].faults.delay["/collective_rpc"] = 30
    targets = [w for u in urls for w in ("--url", u)]
    proc = subprocess.Popen([sys.executable, "-m", "kvctl", "weights", "update", *targets, "--master", master,
                             "--from", str(folder), "--version", "v2", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (replicas[1].calls_to("/collective_rpc") and replicas[0].calls_to("/collective_rpc")) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # replica 0's reload has answered its 500 by now
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert replicas[0].paused and not replicas[0].calls_to("/resume"), "a replica whose reload failed was resumed"
    assert not replicas[1].paused and replicas[1].calls_to("/resume")
    rows = json.loads(out)["replicas"]
    assert rows[0]["left_paused"] is True and rows[1]["left_paused"] is False, rows
