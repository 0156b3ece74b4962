"""The per-replica lock (kvctl.reset.lock) is keyed by the endpoint, not by the URL's text (issue 39,
finding 8): two kvctl processes that name one server differently (localhost / 127.0.0.1, a default
port, a trailing slash, upper-case scheme or host) must not both hold it. Every per-replica lock
kvctl takes (reset, and weights update through the reset's executor) is this one."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvctl.reset.lock import Busy, reset_lock

HOLD = textwrap.dedent("""
    import sys, time
    from kvctl.reset.lock import reset_lock
    with reset_lock([sys.argv[1]], sys.argv[2]):
        print("held", flush=True)
        sys.stdin.readline()
""")


def held_by_another_process(url: str, state: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, url, str(state)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.parametrize(("held", "asked"), [
    ("http://localhost:8000", "http://127.0.0.1:8000"),
    ("http://127.0.0.1:8000", "http://localhost:8000/"),
    ("http://[::1]:8000", "http://127.0.0.1:8000"),
    ("http://LOCALHOST:8000", "HTTP://localhost:8000//"),
    ("http://127.0.0.1", "http://127.0.0.1:80"),
    ("https://127.0.0.1", "https://localhost:443"),
    ("http://0.0.0.0:8000", "http://127.0.0.1:8000"),
    ("http://127.0.0.1:8000", "https://127.0.0.1:8000"),  # one port is one server, whatever the scheme
])
def test_one_server_named_two_ways_is_one_lock(tmp_path: Path, held: str, asked: str) -> None:
    proc = held_by_another_process(held, tmp_path)
    try:
        with pytest.raises(Busy) as busy, reset_lock([asked], tmp_path):
            pass
        assert busy.value.url == asked
    finally:
        proc.communicate("\n", timeout=30)
    with reset_lock([asked], tmp_path):  # released with the process
        pass


def test_different_servers_are_different_locks(tmp_path: Path) -> None:
    proc = held_by_another_process("http://127.0.0.1:8000", tmp_path)
    try:
        for other in ("http://127.0.0.1:8001", "http://192.0.2.7:8000", "http://127.0.0.1:8000/r1"):
            with reset_lock([other], tmp_path):
                pass
    finally:
        proc.communicate("\n", timeout=30)


def test_endpoint_keys_are_canonical() -> None:
    from kvctl.reset.lock import endpoint_keys

    assert endpoint_keys("http://localhost:8000") == endpoint_keys("http://127.0.0.1:8000/")
    assert endpoint_keys("http://127.0.0.1") == endpoint_keys("http://127.0.0.1:80")
    assert endpoint_keys("http://localhost:8000") == ["local:8000"]
    assert endpoint_keys("http://192.0.2.7:8000") == ["192.0.2.7:8000"]
    assert endpoint_keys("http://[2001:db8::1]:8000/") == ["[2001:db8::1]:8000"]
    # a name that does not resolve is kept as its lower-cased text (the reset fails to reach it anyway)
    assert endpoint_keys("http://No-Such-Host.invalid:8000/") == ["no-such-host.invalid:8000"]


def test_two_weight_updates_naming_one_fleet_differently_do_not_both_run(tmp_path: Path, monkeypatch) -> None:
    """The audit's case: an update with localhost URLs runs (its reload is slow); a second one with
    127.0.0.1 URLs is refused with nothing sent, and the first finishes on its own."""
    import json
    import time

    import kvctl
    from tests.doubles import DoubleFleet, MasterDouble, SharedStore, VllmDouble

    monkeypatch.setenv("KVCTL_STATE_DIR", str(tmp_path / "state"))
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"new")
    store = SharedStore()
    with DoubleFleet() as fleet:
        replica = VllmDouble("0.32.0", store=store)
        url = fleet.add(replica)
        master = fleet.add_master(MasterDouble(store))
        replica.faults.delay["/collective_rpc"] = 3
        named = url.replace("127.0.0.1", "localhost")
        first = subprocess.Popen([sys.executable, "-m", "kvctl", "weights", "update", "--url", named, "--master",
                                  master, "--from", str(folder), "--version", "a", "--json"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while not replica.calls_to("/collective_rpc") and time.monotonic() < deadline:
                time.sleep(0.05)
            calls = len(replica.calls)
            second = kvctl.update_weights(folder, "b", urls=[url + "/"], master=master)
            assert second.exit_code == 1 and "being reset by another kvctl" in second.summary, second.summary
            assert not [c for c in replica.calls[calls:] if c.method == "POST"]  # nothing sent by the second
        finally:
            out, err = first.communicate(timeout=60)
        assert first.returncode == 0, err
        assert json.loads(out)["ok"] and replica.weight_version == "a" and not replica.paused


def test_a_nested_lock_keeps_the_outer_one_held(tmp_path: Path) -> None:
    """weights update holds its replicas' locks around the reset's executor, which takes them again:
    the inner one's end must not drop the outer one (closing the file would drop every POSIX lock)."""
    probe = textwrap.dedent("""
        import sys
        from kvctl.reset.lock import Busy, reset_lock
        try:
            with reset_lock([sys.argv[1]], sys.argv[2]):
                print("free")
        except Busy:
            print("busy")
    """)

    def seen_by_another_process() -> str:
        out = subprocess.run([sys.executable, "-c", probe, "http://localhost:8000", str(tmp_path)],
                             capture_output=True, text=True, timeout=30, check=True)
        return out.stdout.strip()

    with reset_lock(["http://127.0.0.1:8000"], tmp_path):
        with reset_lock(["http://127.0.0.1:8000", "http://127.0.0.1:8001"], tmp_path):
            assert seen_by_another_process() == "busy"
        assert seen_by_another_process() == "busy"
    assert seen_by_another_process() == "free"
