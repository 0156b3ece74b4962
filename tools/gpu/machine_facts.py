#!/usr/bin/env python3
"""The facts of this machine that kvctl's GPU paths depend on, as JSON (tools/gpu_check.sh part a).

Python, PyTorch and its CUDA (torch.version.cuda, every device's properties with its UUID), the
CUDA environment variables, the NVIDIA CUDA runtime distributions kvctl reads to choose a Mooncake
wheel (kvctl/facts/mooncake_wheels.py: cuda_major_of, wanted_mooncake, judge) and what kvctl would
choose from them, the C library (Mooncake's wheels are manylinux_2_28) and the system libraries
those wheels link. Runs without torch and without kvctl on the path (it says so); imports no vLLM
or mooncake.

    PYTHONPATH=. python tools/gpu/machine_facts.py [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

# What Mooncake's CUDA 13 wheel 0.3.14 needs from the system (readelf -d of its mooncake_master and
# _store extension: every other library is bundled in mooncake_transfer_engine_cuda13.libs/)
SYSTEM_LIBS = ("libibverbs.so.1", "libmlx5.so.1", "libnuma.so.1", "libcurl.so.4", "libcuda.so.1")
ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "LD_LIBRARY_PATH", "NVIDIA_VISIBLE_DEVICES")


def python_facts() -> dict[str, Any]:
    return {"version": platform.python_version(), "executable": sys.executable, "prefix": sys.prefix,
            "venv": sys.prefix != sys.base_prefix, "tag": f"cp{sys.version_info[0]}{sys.version_info[1]}",
            "libc": " ".join(platform.libc_ver()), "machine": platform.machine(), "os": _os_release()}


def _os_release() -> str:
    try:
        lines = Path("/etc/os-release").read_text().splitlines()
    except OSError:
        return platform.platform()
    fields = dict(line.split("=", 1) for line in lines if "=" in line)
    return fields.get("PRETTY_NAME", "").strip('"') or platform.platform()


def torch_facts() -> dict[str, Any]:
    try:
        import torch
    except ImportError as exc:
        return {"installed": False, "error": str(exc)}
    facts: dict[str, Any] = {"installed": True, "version": torch.__version__, "cuda": torch.version.cuda,
                             "cuda_available": torch.cuda.is_available()}
    if not facts["cuda_available"]:
        return facts
    facts["device_count"] = torch.cuda.device_count()
    facts["devices"] = [_device(torch, i) for i in range(facts["device_count"])]
    return facts


def _device(torch: Any, index: int) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(index)
    out = {"index": index, "name": props.name, "total_memory_gib": round(props.total_memory / 2**30, 1),
           "capability": f"{props.major}.{props.minor}", "multiprocessors": props.multi_processor_count}
    for name in ("uuid", "pci_bus_id", "pci_device_id", "pci_domain_id", "L2_cache_size"):
        if hasattr(props, name):  # newer torch only
            out[name] = str(getattr(props, name))
    return out


def distributions() -> dict[str, str]:
    """torch, the CUDA runtimes and Mooncake's wheels (kvctl's PROBED names), plus any other nvidia-cuda-*
    or cuda-toolkit distribution."""
    wanted = set(_probed())
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name in wanted or name.startswith(("nvidia-cuda-", "cuda-toolkit", "mooncake")):
            found[name] = dist.version
    return dict(sorted(found.items()))


def _probed() -> tuple[str, ...]:
    try:
        from kvctl.facts.mooncake_wheels import PROBED
    except ImportError:
        return ("torch", "nvidia-cuda-runtime", "nvidia-cuda-runtime-cu12")
    return PROBED


def kvctl_choice(dists: dict[str, str]) -> dict[str, Any]:
    """What kvctl/facts/mooncake_wheels.py makes of these versions (absent: says so)."""
    try:
        from kvctl.facts.mooncake_wheels import cuda_major_of, judge, wanted_mooncake
    except ImportError as exc:
        return {"available": False, "error": f"kvctl.facts.mooncake_wheels: {exc}"}
    major = cuda_major_of(dists)
    try:
        wanted = wanted_mooncake(major)
    except ValueError as exc:
        wanted = str(exc)
    verdict = judge(dists, gpu=True, python=sys.executable)
    return {"available": True, "cuda_major": major, "wanted": wanted,
            "judge_gpu_vllm": {"status": verdict.status, "detail": verdict.detail, "fix": verdict.fix}}


def libraries() -> dict[str, Any]:
    """Where the loader finds Mooncake's system libraries, and the libcudart files on sys.path (the
    CUDA wheels bundle no libcudart: torch's nvidia-cuda-runtime has to provide it)."""
    try:
        cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        cache = ""
    found = {lib: sorted({line.split("=>")[-1].strip() for line in cache.splitlines() if f"{lib} " in line})
             for lib in SYSTEM_LIBS}
    cudart = sorted({str(p) for entry in sys.path if os.path.isdir(entry)
                     for p in Path(entry).glob("nvidia/**/libcudart.so*")})
    return {"ldconfig": found, "libcudart_on_sys_path": cudart}


def collect() -> dict[str, Any]:
    dists = distributions()
    return {"part": "machine", "python": python_facts(), "torch": torch_facts(),
            "env": {name: os.environ.get(name) for name in ENV}, "distributions": dists,
            "kvctl_wheel_choice": kvctl_choice(dists), "libraries": libraries()}


def status_of(facts: dict[str, Any]) -> tuple[str, str]:
    torch = facts["torch"]
    if not torch.get("installed"):
        return "no-gpu", f"python {facts['python']['version']}; torch not installed"
    if not torch.get("cuda_available"):
        return "no-gpu", f"python {facts['python']['version']}; torch {torch['version']} sees no GPU"
    names = ", ".join(d["name"] for d in torch["devices"])
    choice = facts["kvctl_wheel_choice"]
    wanted = f"; kvctl would choose {choice['wanted']}" if choice.get("available") else ""
    return "ok", (f"python {facts['python']['version']}; torch {torch['version']} (CUDA {torch['cuda']}), "
                  f"{torch['device_count']} GPU(s): {names}{wanted}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--json", help="write the facts here (they are printed in any case)")
    args = parser.parse_args(argv)
    facts = collect()
    facts["status"], facts["summary"] = status_of(facts)
    print(json.dumps(facts, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(facts, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
