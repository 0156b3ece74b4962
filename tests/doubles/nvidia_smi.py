"""TEST DOUBLE of NVIDIA's `nvidia-smi` (run by path), for kvctl.serve.gpus on machines without GPUs.

`install(folder, machine)` writes `folder/nvidia-smi`, an executable that answers from `machine` (a
dict, kept as folder/machine.json: change it with install() again); put `folder` first on PATH.
It answers only what kvctl asks, in nvidia-smi's output formats:
- `-L`: `GPU 0: NAME (UUID: GPU-...)`, and under a MIG-enabled GPU one line per MIG instance,
  `  MIG 1g.10gb     Device  0: (UUID: MIG-...)`;
- `--query-gpu=F,...` and `--query-compute-apps=F,...` with `--format=csv,noheader[,nounits]`:
  one row per GPU / compute process, fields joined by ", " (nvidia-smi's csv), "[N/A]" where a
  GPU has no such value; an unknown field is refused as nvidia-smi does (exit 2).
machine = {"gpus": [{"index", "uuid", "name", "memory_used", "memory_total", "mig" ("Enabled",
"Disabled" or "[N/A]"), "instances": [{"profile", "uuid"}]}], "apps": [{"gpu_uuid", "pid",
"used_memory"}], "fail": {"code", "output"} (every call prints output and exits with code), "delay": seconds
(every call takes that long first: a slow driver, or a wide window for two kvctl serve at once)}.
Stdlib only: it stands in for NVIDIA's tool and knows nothing of kvctl.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# The message of a real nvidia-smi whose driver is not loaded (exit code 9, NVML_ERROR_DRIVER_NOT_LOADED).
DRIVER_NOT_LOADED = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure "
                     "that the latest NVIDIA driver is installed and running.")
_GPU_FIELDS = {"index": "index", "uuid": "uuid", "gpu_uuid": "uuid", "name": "name", "gpu_name": "name",
               "memory.used": "memory_used", "memory.total": "memory_total", "mig.mode.current": "mig"}
_APP_FIELDS = {"gpu_uuid": "gpu_uuid", "pid": "pid", "used_memory": "used_memory", "used_gpu_memory": "used_memory"}
_MIB = ("memory_used", "memory_total", "used_memory")


def install(folder: Path, machine: dict) -> Path:
    """Write folder/nvidia-smi answering from `machine`; returns the folder (for PATH)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "machine.json").write_text(json.dumps(machine))
    script = folder / "nvidia-smi"
    script.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
                      "from nvidia_smi import main\n"
                      f"sys.exit(main(sys.argv[1:], {str(folder / 'machine.json')!r}))\n")
    script.chmod(0o755)
    return folder


def main(argv: list[str], machine_file: str) -> int:
    machine = json.loads(Path(machine_file).read_text())
    if machine.get("delay"):
        import time

        time.sleep(float(machine["delay"]))
    if machine.get("fail"):
        print(machine["fail"]["output"])
        return int(machine["fail"]["code"])
    if argv == ["-L"]:
        print(_list(machine))
        return 0
    queries = [a for a in argv if a.startswith("--query-")]
    formats = [a.split("=", 1)[1].split(",") for a in argv if a.startswith("--format=")]
    if len(queries) != 1 or not formats or "csv" not in formats[0]:
        print("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.")
        return 2
    kind, _, fields = queries[0].removeprefix("--query-").partition("=")
    if kind not in ("gpu", "compute-apps"):
        print("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.")
        return 2
    rows, names = (machine.get("gpus", []), _GPU_FIELDS) if kind == "gpu" else (machine.get("apps", []), _APP_FIELDS)
    for name in fields.split(","):
        if name not in names:
            print(f'Field "{name}" is not a valid field to query.')
            return 2
    if "noheader" not in formats[0]:
        print(", ".join(fields.split(",")))
    for row in rows:
        print(", ".join(_value(row, names[f], "nounits" in formats[0]) for f in fields.split(",")))
    return 0


def _list(machine: dict) -> str:
    lines = []
    for gpu in machine.get("gpus", []):
        lines.append(f"GPU {gpu['index']}: {gpu['name']} (UUID: {gpu['uuid']})")
        if gpu.get("mig") == "Enabled":
            lines += [f"  MIG {m['profile']:<12}Device {n:>2}: (UUID: {m['uuid']})"
                      for n, m in enumerate(gpu.get("instances", []))]
    return "\n".join(lines)


def _value(row: dict, key: str, nounits: bool) -> str:
    value = row.get(key, "[N/A]")
    if key in _MIB and isinstance(value, int) and not nounits:
        return f"{value} MiB"
    return str(value)
