"""kvctl serve reads --master as every command does (the admin port, or `embedded`) and --master-rpc as
the RPC port vLLM connects to; the old spellings (--master RPC, --master etcd://..., --master-admin)
keep working with a note. A REAL mooncake_master tells its two ports apart."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kvctl.errors import UsageError
from kvctl.serve import runs
from kvctl.serve.master_flags import master_from_env, master_from_flags
from kvctl.serve.master_process import MasterProcess

pytestmark = pytest.mark.integration


def test_the_new_spelling_is_taken_as_given(master: MasterProcess) -> None:
    flags = master_from_flags(master.admin_address, master.rpc_address)
    assert (flags.master, flags.admin, flags.notes) == (master.rpc_address, master.admin_address, [])
    alone = master_from_flags(None, master.rpc_address)
    assert (alone.master, alone.admin, alone.notes) == (master.rpc_address, None, [])
    assert master_from_flags(None, None).master == master_from_flags("embedded", None).master == "embedded"


def test_the_old_rpc_spelling_still_works_with_a_note(master: MasterProcess) -> None:
    flags = master_from_flags(master.rpc_address, None, master.admin_address)
    assert (flags.master, flags.admin) == (master.rpc_address, master.admin_address)
    assert any(f"say --master-rpc {master.rpc_address} --master {master.admin_address}" in n for n in flags.notes)
    assert any(n.startswith("--master-admin is deprecated") for n in flags.notes)
    etcd = master_from_flags("etcd://127.0.0.1:2379", None)
    assert etcd.master == "etcd://127.0.0.1:2379" and "say --master-rpc etcd://127.0.0.1:2379" in etcd.notes[0]


@pytest.mark.parametrize(("given", "message"), [
    (("admin", None), "is the master's admin/metrics port (mooncake_master --metrics_port, default 9003); "
                      "vLLM connects to the master's RPC port"),
    ((None, "admin"), "--master-rpc {admin} is the master's admin port, not its RPC port"),
    (("rpc", "rpc"), "--master {rpc} answers no HTTP: it is the master's RPC port, not its admin port"),
    (("embedded", "rpc"), "--master embedded starts a master here"),
    (("etcd", "rpc"), "--master etcd://127.0.0.1:2379 is an RPC address, and --master-rpc gives one too"),
])
def test_a_port_given_for_the_other_is_refused(master: MasterProcess, given: tuple, message: str) -> None:
    words = {"admin": master.admin_address, "rpc": master.rpc_address, "etcd": "etcd://127.0.0.1:2379", "embedded": "embedded",
             None: None}
    with pytest.raises(UsageError) as caught:
        master_from_flags(words[given[0]], words[given[1]])
    assert message.format(admin=master.admin_address, rpc=master.rpc_address) in caught.value.message


def test_an_admin_port_a_live_run_records_gives_its_rpc_port(master: MasterProcess, tmp_path: Path) -> None:
    runs.RunRecord(name="rl", dir=str(runs.runs_dir(tmp_path) / "rl"), state="running", created=time.time(),
                   template="mooncake-store", parameters={}, model="m", host="127.0.0.1", vllm={},
                   master=runs.MasterRecord(False, master.rpc_address, master.admin_address)).save()
    flags = master_from_flags(master.admin_address, None, state_dir=str(tmp_path))
    assert (flags.master, flags.admin) == (master.rpc_address, master.admin_address)
    assert flags.notes == [f"--master-rpc {master.rpc_address}: from run rl's record (its master)"]


def test_serve_reads_the_env_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVCTL_MASTER", "127.0.0.1:9003")
    monkeypatch.delenv("KVCTL_MASTER_RPC", raising=False)
    assert master_from_env() == (None, None)  # set for kvctl reset: serve still starts its own
    monkeypatch.setenv("KVCTL_MASTER_RPC", "127.0.0.1:50051")
    assert master_from_env() == ("127.0.0.1:9003", "127.0.0.1:50051")


def test_the_cli_prints_the_deprecation_note_and_names_the_new_flags(master: MasterProcess, tmp_path: Path,
                                                                     cli) -> None:
    old = cli("serve", str(tmp_path), "--master", master.rpc_address, "--vllm-python", str(tmp_path / "none"),
              "--state-dir", str(tmp_path))
    assert f"say --master-rpc {master.rpc_address}" in old.stderr.replace("\n", " ")
    wrong = cli("serve", str(tmp_path), "--master-rpc", master.admin_address, "--state-dir", str(tmp_path))
    assert wrong.exit_code == 2 and "is the master's admin port, not its RPC port" in wrong.stderr
    assert "--master-admin" not in cli("serve", "--help").stdout  # the old name works, and is not offered


def _silent_port(trickle: bool) -> tuple[object, int]:
    """A port that accepts connections and answers no HTTP in time: silent, or an HTTP head followed by
    one byte a second (each read arrives before a per-read timeout)."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    kept: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            kept.append(conn)
            if trickle:
                threading.Thread(target=_trickle, args=(conn,), daemon=True).start()

    def _trickle(conn: socket.socket) -> None:
        try:
            conn.recv(4096)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
            for _ in range(120):
                conn.sendall(b"#")
                time.sleep(1)
        except OSError:
            return

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


@pytest.mark.parametrize("trickle", [False, True])
def test_a_port_that_hangs_is_not_taken_as_an_admin_port(trickle: bool) -> None:
    """Issue 39: an admin address that accepted and never answered was recorded as the master's admin port
    (and one that answered a byte a second held serve for 100 s)."""
    server, port = _silent_port(trickle)
    try:
        began = time.monotonic()
        with pytest.raises(UsageError) as caught:
            master_from_flags(f"127.0.0.1:{port}", "etcd://127.0.0.1:2379")
        assert time.monotonic() - began < 10
        assert "not a Mooncake master's admin port" in caught.value.message and caught.value.hint
    finally:
        server.close()


def test_an_etcd_port_given_as_the_admin_port_is_refused(tmp_path: Path) -> None:
    """etcd's client port answers GET /metrics with its own Prometheus text: an HTTP server, not a master."""
    from tests.integration.ha import EtcdServer, require_etcd

    require_etcd()
    with EtcdServer(tmp_path / "etcd") as etcd:
        with pytest.raises(UsageError) as caught:
            master_from_flags(etcd.endpoint, etcd.master_server_address)
    assert f"--master {etcd.endpoint}" in caught.value.message
    assert "not a Mooncake master's admin port" in caught.value.message
