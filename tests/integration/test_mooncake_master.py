"""kvctl.transport.master_admin against a real mooncake_master and a real store client (loopback only)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import psutil
import pytest

from kvctl.serve.master_process import MasterProcess
from kvctl.transport.master_admin import MasterAdmin, MasterError

from .helpers import StoreWriter, admin_call, require_mooncake, run, wait_for

pytestmark = pytest.mark.integration


def test_health(master: MasterProcess) -> None:
    health = admin_call(master.admin_address, "health")
    assert health["status"] == "ok"
    assert health["service_ready"] is True


def test_master_binds_loopback_only(master: MasterProcess) -> None:
    conns = psutil.Process(master.pid).net_connections(kind="inet")
    listening = {(c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN}
    assert listening == {("127.0.0.1", master.rpc_port), ("127.0.0.1", master.metrics_port)}


def test_metrics_and_keys_match_what_was_written(empty_master: MasterProcess,
                                                 writer: StoreWriter) -> None:
    address = empty_master.admin_address
    keys = writer.put(12, "metrics/")
    assert wait_for(lambda: admin_call(address, "metrics").key_count == 12, timeout=3)
    metrics = admin_call(address, "metrics")
    assert metrics.allocated_bytes >= 12 * 1024
    assert metrics.total_capacity_bytes >= metrics.allocated_bytes
    # The master counts a client as active from its periodic ping, not from its puts: on a
    # loaded machine the gauge can trail the keys by a few seconds.
    assert wait_for(lambda: (admin_call(address, "metrics").active_clients or 0) >= 1, timeout=20)
    assert sorted(admin_call(address, "all_keys")) == sorted(keys)
    assert admin_call(address, "key_count") == 12


def test_key_count_by_prefix(empty_master: MasterProcess, writer: StoreWriter) -> None:
    address = empty_master.admin_address
    writer.put(5, "deployA/")
    writer.put(3, "deployB/")
    assert admin_call(address, "key_count") == 8
    assert admin_call(address, "key_count", "deployA/") == 5
    assert admin_call(address, "key_count", "deployB/") == 3
    assert admin_call(address, "key_count", "deployC/") == 0


def test_forced_remove_all_clears_keys_of_a_live_client(empty_master: MasterProcess,
                                                        writer: StoreWriter) -> None:
    address = empty_master.admin_address
    keys = writer.put(20, "forced/")
    writer.get(keys[0])  # keys[0] now holds a read lease
    before = admin_call(address, "metrics").remove_all_requests_total
    assert admin_call(address, "remove_all", force=True) == 20
    assert writer.proc.poll() is None  # the writer is still alive: its keys did not vanish by close
    assert admin_call(address, "key_count") == 0
    metrics = admin_call(address, "metrics")
    assert metrics.key_count == 0
    assert metrics.remove_all_requests_total == before + 1


def test_non_forced_remove_all_leaves_leased_keys(empty_master: MasterProcess,
                                                  writer: StoreWriter) -> None:
    """Why kvctl always forces: a plain remove_all skips every key under a read lease."""
    address = empty_master.admin_address
    keys = writer.put(10, "lease/")
    writer.get(keys[0])
    writer.get(keys[1])
    assert admin_call(address, "remove_all", force=False) == 8
    assert sorted(admin_call(address, "all_keys")) == sorted(keys[:2])  # stale KV survives
    assert admin_call(address, "remove_all", force=True) == 2
    assert admin_call(address, "key_count") == 0


def test_remove_all_on_an_empty_master(empty_master: MasterProcess) -> None:
    assert admin_call(empty_master.admin_address, "remove_all") == 0


def test_admin_accepts_a_url_and_a_shared_pool(master: MasterProcess) -> None:
    from kvctl.transport.http import HttpPool

    async def go() -> dict:
        async with HttpPool() as pool:
            admin = MasterAdmin(master.admin_url + "/", pool=pool)
            await admin.aclose()  # does not close a pool it does not own
            return await admin.health()

    assert run(go())["status"] == "ok"


def _closed_loopback_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("method", ["health", "metrics", "all_keys", "remove_all"])
def test_unreachable_master_fails_fast_and_clearly(method: str) -> None:
    address = f"127.0.0.1:{_closed_loopback_port()}"
    began = time.monotonic()
    with pytest.raises(MasterError) as info:
        admin_call(address, method, timeout=2.0)
    assert time.monotonic() - began < 1.5
    text = str(info.value)
    assert f"http://{address}" in text
    assert "ConnectError" in text
    assert "fix:" in text and "--metrics_port" in text


def test_process_start_stop_leaves_no_process(tmp_path: Path) -> None:
    require_mooncake()
    log = tmp_path / "master.log"
    with MasterProcess(log_path=log) as proc:
        pid = proc.pid
        assert pid is not None and psutil.pid_exists(pid)
        assert proc.start_time == pytest.approx(psutil.Process(pid).create_time())
        assert proc.ready_seconds is not None and proc.ready_seconds < 10
        assert admin_call(proc.admin_address, "health")["status"] == "ok"
        assert proc.info()["rpc_port"] == proc.rpc_port
    assert proc.returncode == 0  # SIGTERM: clean exit
    assert not psutil.pid_exists(pid)
    assert proc.stop() == 0  # a second stop is harmless
    assert "Shutdown signal received" in log.read_text()


def test_process_that_exits_early_raises_with_its_log(tmp_path: Path) -> None:
    require_mooncake()
    proc = MasterProcess(log_path=tmp_path / "master.log", extra_args=["--no_such_flag=1"])
    with pytest.raises(MasterError) as info:
        proc.start(timeout=10)
    assert "exited with code" in str(info.value)
    assert "no_such_flag" in str(info.value)  # the tail of the master's own log
    assert not proc.running
    assert proc.pid is not None and not psutil.pid_exists(proc.pid)


def test_process_on_a_taken_port_raises(master: MasterProcess, tmp_path: Path) -> None:
    """Explicit ports are not re-chosen: a port in use is an error naming the log."""
    proc = MasterProcess(log_path=tmp_path / "master.log", rpc_port=master.rpc_port,
                         metrics_port=_closed_loopback_port())
    with pytest.raises(MasterError) as info:
        proc.start(timeout=10)
    assert "master.log" in str(info.value)
    assert not proc.running
    assert admin_call(master.admin_address, "health")["status"] == "ok"  # the first one is intact


def test_process_with_one_fixed_port_picks_the_other(tmp_path: Path) -> None:
    require_mooncake()
    metrics_port = _closed_loopback_port()
    with MasterProcess(log_path=tmp_path / "master.log", metrics_port=metrics_port) as proc:
        assert proc.metrics_port == metrics_port
        assert proc.rpc_port not in (None, metrics_port)
        assert admin_call(proc.admin_address, "health")["status"] == "ok"
