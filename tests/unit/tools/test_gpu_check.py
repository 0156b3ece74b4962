"""tools/gpu_check.sh and its parts (tools/gpu/), on this machine that has no GPU.

The script runs for real: without nvidia-smi and CUDA every part says no-gpu, the run still exits 0 with
its summary and JSON. The GPU paths of the discovery check run against TEST DOUBLES, since no real GPU is
here: nvidia-smi (tests/doubles/nvidia_smi.py) and a TORCH DOUBLE (a `torch` package written below,
that enumerates the double's GPUs under CUDA_VISIBLE_DEVICES the way CUDA does and shows a process that
makes a CUDA context to nvidia-smi's --query-compute-apps). The Mooncake put/get check runs against a
real mooncake_master and the real (non-CUDA) store client (marked integration); its crash and hang
reports against a CHILD DOUBLE that dies in an op, as the CUDA client would reading GPU memory.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.doubles import nvidia_smi
from tests.lib import REPO

SCRIPT = REPO / "tools" / "gpu_check.sh"
GPU_DIR = REPO / "tools" / "gpu"
UUIDS = ["GPU-8932f937-d72c-4106-c12f-20bd9faed9f6", "GPU-2b9a4f5c-61e0-7d3a-9b42-5e8c1d0f7a13"]
TWO_H200 = {"gpus": [{"index": i, "uuid": u, "name": "NVIDIA H200", "memory_used": 1, "memory_total": 143771,
                      "mig": "Disabled"} for i, u in enumerate(UUIDS)]}

# TORCH DOUBLE: torch's device enumeration over the nvidia-smi double's machine file. CUDA_VISIBLE_DEVICES
# as CUDA reads it (indices, UUIDs or a unique prefix, "" = none, stop at the first invalid entry);
# "torch_order": "reversed" stands in for CUDA's fastest-first order disagreeing with nvidia-smi's.
TORCH_DOUBLE = r'''
import json, os, sys
from types import SimpleNamespace
__version__ = "2.11.0+cu130"
version = SimpleNamespace(cuda="13.0")
_MACHINE = os.environ["TORCH_DOUBLE_MACHINE"]

def _gpus():
    machine = json.load(open(_MACHINE))
    gpus = list(machine["gpus"])
    if machine.get("torch_order") == "reversed":
        gpus.reverse()
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return gpus
    seen = []
    for entry in (e.strip() for e in value.split(",")):  # an index counts in torch's own order
        found = [gpus[int(entry)]] if entry.isdigit() and int(entry) < len(gpus) else \
            [g for g in gpus if g["uuid"].startswith(entry) and len(entry) > 4]
        if len(found) != 1:
            break
        seen.append(found[0])
    return seen

class cuda:
    is_available = staticmethod(lambda: bool(_gpus()))
    device_count = staticmethod(lambda: len(_gpus()))
    get_device_name = staticmethod(lambda i=0: _gpus()[i]["name"])

    @staticmethod
    def get_device_properties(i):
        g = _gpus()[i]
        return SimpleNamespace(name=g["name"], uuid=g["uuid"][4:], total_memory=g["memory_total"] * 2**20,
                               major=9, minor=0, multi_processor_count=132, pci_bus_id=int(g["index"]))

def zeros(*shape, device="cpu"):
    if device == "cuda":  # a CUDA context: nvidia-smi lists this process from now on
        machine = json.load(open(_MACHINE))
        gpu = _gpus()[0]
        machine.setdefault("apps", []).append({"gpu_uuid": gpu["uuid"], "pid": os.getpid(), "used_memory": 500})
        json.dump(machine, open(_MACHINE, "w"))
    return [0] * shape[0]
'''


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"gpu_check_{name}", GPU_DIR / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def path_without_nvidia_smi() -> str:
    dirs = [d for d in os.environ["PATH"].split(os.pathsep) if d and not (Path(d) / "nvidia-smi").exists()]
    return os.pathsep.join(dirs)


def gpu_doubles(tmp_path: Path, machine: dict) -> dict[str, str]:
    """An environment with the nvidia-smi double first on PATH and the torch double importable."""
    smi = nvidia_smi.install(tmp_path / "smi", machine)
    site = tmp_path / "torch-double"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text(TORCH_DOUBLE)
    return {**os.environ, "PATH": f"{smi}{os.pathsep}{path_without_nvidia_smi()}",
            "PYTHONPATH": f"{REPO}{os.pathsep}{site}", "TORCH_DOUBLE_MACHINE": str(smi / "machine.json")}


def run_script(tmp_path: Path, *args: str, env: dict[str, str] | None = None,
               timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], dict]:
    out = tmp_path / "out"
    env = dict(env or {**os.environ, "PATH": path_without_nvidia_smi()})
    env.pop("OUT", None)
    done = subprocess.run(["bash", str(SCRIPT), "--out", str(out), "--python", sys.executable, *args],
                          capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)
    report = json.loads((out / "gpu-check.json").read_text()) if (out / "gpu-check.json").exists() else {}
    return done, report


# -- the script on this machine -------------------------------------------------------------------
def test_without_a_gpu_every_part_says_no_gpu_and_the_run_exits_0(tmp_path: Path) -> None:
    done, report = run_script(tmp_path, "--quick")
    assert done.returncode == 0, done.stdout + done.stderr
    parts = {p["part"]: p for p in report["parts"]}
    assert list(parts) == ["machine", "discovery", "bf16", "mooncake"]
    assert {name: p["status"] for name, p in parts.items()} == dict.fromkeys(parts, "no-gpu")
    assert "nvidia-smi not on PATH" in parts["machine"]["summary"]
    assert "torch is not installed" in parts["mooncake"]["summary"]
    smi = next(c for c in parts["machine"]["commands"] if c["command"] == "nvidia-smi -L")
    assert smi["rc"] == 127 and "not found on PATH" in smi["output"]
    assert parts["machine"]["python"]["tag"] == f"cp{sys.version_info[0]}{sys.version_info[1]}"
    assert parts["discovery"]["checks"][0] == {"name": "import kvctl.serve.gpus", "ok": True,
                                               "detail": "non-stdlib modules loaded: none"}
    # one section per part and the summary, on the console and in the text log
    for title in ("a. machine facts", "b. kvctl GPU discovery", "c. bf16 prefix logprobs", "d. Mooncake on the GPU"):
        assert f"=== {title}" in done.stdout
        assert any(line.startswith(f"  {title}") and "no-gpu" in line for line in done.stdout.splitlines())
    assert "SUMMARY " in done.stdout
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "gpu-check-logs.tar.gz", "gpu-check.json", "gpu-check.txt"]  # 3 files: what the lent machine sends back


@pytest.mark.parametrize(("args", "said"), [
    (["--wheels", "/no/such/folder"], "--wheels /no/such/folder: no such folder"),
    (["--budget", "soon"], "--budget 'soon' is not a number of seconds"),
    (["--frobnicate"], "unknown argument '--frobnicate'"),
    (["--out"], "--out needs a value"),
])
def test_bad_arguments_are_refused_before_anything_runs(tmp_path: Path, args: list[str], said: str) -> None:
    done = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=30,
                          cwd=tmp_path)
    assert done.returncode == 2 and said in done.stderr
    assert not (tmp_path / "gpu-check-out").exists()


def test_a_part_that_leaves_no_result_is_recorded_from_its_exit_code(tmp_path: Path) -> None:
    report = [sys.executable, str(GPU_DIR / "report.py")]
    for part, rc in (("bf16", 124), ("mooncake", 1)):
        subprocess.run([*report, "finish", "--work", str(tmp_path), "--part", part, "--title", part, "--rc", str(rc),
                        "--seconds", "3"], check=True, capture_output=True)
    assert json.loads((tmp_path / "bf16.final.json").read_text())["status"] == "timeout"
    assert json.loads((tmp_path / "mooncake.final.json").read_text())["status"] == "failed"


# -- part b against the doubles -----------------------------------------------------------------------
def discovery(env: dict[str, str], tmp_path: Path) -> dict:
    done = subprocess.run([sys.executable, str(GPU_DIR / "discovery_check.py"), "--json", str(tmp_path / "d.json")],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads((tmp_path / "d.json").read_text())


@pytest.mark.parametrize("count", [1, 2])  # the lent machine has one GPU
def test_discovery_agrees_with_torch_when_kvctl_is_right(tmp_path: Path, count: int) -> None:
    result = discovery(gpu_doubles(tmp_path, {"gpus": TWO_H200["gpus"][:count]}), tmp_path)
    checks = {c["name"]: c for c in result["checks"]}
    assert result["status"] == "ok", json.dumps(result["checks"], indent=1)
    assert result["summary"] == f"{count} GPU(s); kvctl and torch agree"
    assert set(checks) == {"import kvctl.serve.gpus", "CUDA_VISIBLE_DEVICES unset", 'CUDA_VISIBLE_DEVICES="0"',
                           f"CUDA_VISIBLE_DEVICES=GPU 0's UUID {UUIDS[0]}",
                           f"CUDA_VISIBLE_DEVICES=a UUID prefix {UUIDS[0][:12]}", 'CUDA_VISIBLE_DEVICES="" (no GPU)',
                           "allocate(1, 1)", "compute apps", "allocate with GPU 0 busy",
                           *(["allocate around GPU 0"] if count > 1 else [])}
    assert checks["CUDA_VISIBLE_DEVICES unset"]["torch"]["count"] == count
    assert checks["allocate(1, 1)"]["value"] == "0"
    assert "computes on it" in checks["allocate with GPU 0 busy"]["detail"]
    if count > 1:
        assert checks["allocate around GPU 0"]["detail"] == "allocate(1, 1) gave ['1']"


def test_discovery_reports_when_torch_sees_another_order(tmp_path: Path) -> None:
    result = discovery(gpu_doubles(tmp_path, {**TWO_H200, "torch_order": "reversed"}), tmp_path)
    failed = [c["name"] for c in result["checks"] if c["ok"] is False]
    assert result["status"] == "failed"
    assert "CUDA_VISIBLE_DEVICES unset" in failed and 'CUDA_VISIBLE_DEVICES="0"' in failed
    assert "allocate(1, 1)" in failed  # the replica would get the other GPU
    assert result["summary"].startswith("2 GPU(s); differs: CUDA_VISIBLE_DEVICES unset")


# -- part d: crash and hang reports (child double), real put/get (integration) ---------------------------
CHILD_DOUBLE = r'''
import json, os, signal, sys, time
args = sys.argv[1:]
progress = open(args[args.index("--progress") + 1], "a", buffering=1)
progress.write(json.dumps({"event": "op", "op": "setup", "ok": True, "rc": 0, "seconds": 0.01}) + "\n")
progress.write(json.dumps({"event": "start", "op": "get_into"}) + "\n")
if os.environ.get("CHILD_DOUBLE") == "hang":
    time.sleep(60)
os.kill(os.getpid(), signal.SIGSEGV)
'''


@pytest.mark.parametrize(("mode", "status", "summary"), [
    ("crash", "crashed", "killed by SIGSEGV (in get_into)"),
    ("hang", "timeout", "no answer within 3 s (in get_into)"),
])
def test_a_variant_that_dies_in_an_op_is_reported_with_the_op(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 mode: str, status: str, summary: str) -> None:
    putget = load("mooncake_cuda_putget")
    double = tmp_path / "child_double.py"
    double.write_text(CHILD_DOUBLE)
    monkeypatch.setattr(putget, "__file__", str(double))
    monkeypatch.setenv("CHILD_DOUBLE", mode)
    args = putget.argparse.Namespace(master="127.0.0.1:1", quick=True, variant_timeout=3.0)
    result = putget.run_variant("cuda-tcp", args, tmp_path)
    assert (result["status"], result["summary"]) == (status, summary)
    assert result["MC_STORE_MEMCPY"] == "0" and [op["op"] for op in result["ops"]] == ["setup"]
    assert putget.part_status([result], ["cuda"]) == "failed"


@pytest.fixture
def master_exe() -> str:
    from kvctl.serve.master_process import find_master_executable
    from kvctl.transport.master_admin import MasterError

    try:
        return find_master_executable()
    except MasterError as exc:
        pytest.skip(f"real Mooncake needed: {exc}")


@pytest.mark.integration
def test_put_get_against_a_real_master(tmp_path: Path, master_exe: str) -> None:
    from kvctl.serve.master_process import MasterProcess

    with MasterProcess(log_path=tmp_path / "master.log", executable=master_exe) as master:
        done = subprocess.run([sys.executable, str(GPU_DIR / "mooncake_cuda_putget.py"), "--master",
                               master.rpc_address, "--metrics-url", master.admin_url, "--device", "cpu", "--quick",
                               "--json", str(tmp_path / "r.json")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["status"] == "ok", done.stdout
    statuses = {v["variant"]: v["status"] for v in report["variants"]}
    assert statuses == {"cpu": "ok", "cpu-tcp": "ok", "cpu-torch": "skipped"}  # kvctl's .venv has no torch
    for variant in report["variants"][:2]:
        ops = {op["op"]: op for op in variant["ops"]}
        assert variant["status"] == "ok" and ops["get_into"]["rc"] == 4 * 2**20 and ops["get_into"]["gb_per_s"] > 0
        assert ops["get_into bytes"]["match"] and ops["batch_get_into bytes"]["match"] and ops["get bytes"]["match"]
        assert "mooncake-transfer-engine" in variant["info"]["mooncake"]


@pytest.mark.integration
def test_the_script_runs_the_cpu_baseline_and_stops_its_master(tmp_path: Path, master_exe: str) -> None:
    done, report = run_script(tmp_path, timeout=120)  # no --quick: the CPU variants run against a real master
    assert done.returncode == 0, done.stdout + done.stderr
    mooncake = next(p for p in report["parts"] if p["part"] == "mooncake")
    assert mooncake["status"] == "no-gpu" and mooncake["summary"].startswith("no GPU (torch is not installed")
    assert {v["variant"]: v["status"] for v in mooncake["variants"]} == {
        "cpu": "ok", "cpu-tcp": "ok", "cpu-torch": "skipped", "cuda": "no-gpu", "cuda-tcp": "no-gpu"}
    stopped = [line for line in done.stdout.splitlines() if line.startswith("mooncake_master (pid ")]
    assert len(stopped) == 1
    pid = int(stopped[0].split("pid ")[1].split(")")[0])
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
