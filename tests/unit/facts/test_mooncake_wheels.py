"""Which Mooncake wheel fits which vLLM environment (kvctl.facts.mooncake_wheels): the CUDA major from
package metadata, checked against the resolutions pip made for every vLLM release
(benchmarks/coinstall.json), and the verdicts. The probe through a real interpreter is in
tests/unit/test_doctor.py and tests/unit/serve/test_mooncake_wheel.py."""

from __future__ import annotations

import json

import pytest
from packaging.version import Version

from kvctl.facts.mooncake_wheels import CUDA12, CUDA13, NON_CUDA, WHEELS, cuda_major_of, judge, wanted_mooncake
from tests.lib import REPO

PY = "/envs/gpu/bin/python"


@pytest.mark.parametrize(("dists", "major"), [
    ({"torch": "2.9.0+cu130"}, 13),                       # the PyTorch index says it in the local version
    ({"torch": "2.9.0+cu128", "nvidia-cuda-runtime": "13.0.96"}, 12),  # ... which wins over a runtime
    ({"torch": "2.8.0+cu118"}, 11),
    ({"torch": "2.13.0+cpu", "nvidia-cuda-runtime": "13.5.37"}, None),  # a CPU torch: no CUDA, whatever lies beside
    ({"torch": "2.9.0+rocm6.4"}, None),
    ({"torch": "2.11.0", "nvidia-cuda-runtime": "13.0.96"}, 13),        # PyPI's torch: no local version
    ({"torch": "2.10.0", "nvidia-cuda-runtime-cu12": "12.8.90"}, 12),
    # an in-place upgrade from vLLM 0.19 to 0.20 leaves the CUDA 12 runtime behind
    ({"torch": "2.11.0", "nvidia-cuda-runtime-cu12": "12.8.90", "nvidia-cuda-runtime": "13.0.96"}, 13),
    ({"torch": "2.11.0"}, None),
    ({}, None),
])
def test_cuda_major_of(dists: dict[str, str], major: int | None) -> None:
    assert cuda_major_of(dists) == major


def test_wanted_mooncake() -> None:
    assert wanted_mooncake(None) == NON_CUDA == "mooncake-transfer-engine-non-cuda"
    assert wanted_mooncake(12) == CUDA12 == "mooncake-transfer-engine"
    assert wanted_mooncake(13) == CUDA13 == "mooncake-transfer-engine-cuda13"
    with pytest.raises(ValueError, match="no wheel for CUDA 11"):
        wanted_mooncake(11)


def test_every_vllm_release_from_pypi_gets_the_wheel_of_its_cuda() -> None:
    """pip's resolution of each `vllm==X` alone: CUDA 12 up to 0.19.1, CUDA 13 from 0.20.0 (the split the
    docs state). Targets whose torch resolved to this machine's local `+cpu` build say nothing about CUDA."""
    data = json.loads((REPO / "benchmarks" / "coinstall.json").read_text())
    seen = {12: 0, 13: 0}
    for target in data["targets"]:
        name, _, version = target["target"].partition("==")
        versions = (target.get("alone") or {}).get("versions") or {}
        if name != "vllm" or not versions or "+" in versions.get("torch", "+"):
            continue
        major = 13 if Version(version) >= Version("0.20.0") else 12
        assert cuda_major_of(versions) == major, target["target"]
        assert wanted_mooncake(cuda_major_of(versions)) == (CUDA13 if major == 13 else CUDA12)
        seen[major] += 1
    assert seen[12] >= 10 and seen[13] >= 10, seen  # the file really holds both sides


def test_a_gpu_vllm_whose_cuda_is_unknown() -> None:
    no_torch = judge({CUDA13: "0.3.13"}, True, PY)
    assert no_torch.status == "warn" and "unknown (no torch)" in no_torch.detail
    assert "torch.version.cuda" in no_torch.fix
    non_cuda = judge({NON_CUDA: "0.3.13", "torch": "2.13.0+cpu"}, True, PY)
    assert non_cuda.status == "fail" and "host memory" in non_cuda.detail
    assert non_cuda.fix.startswith(f"{PY} -m pip uninstall -y {NON_CUDA} && {PY} -m pip install {CUDA13}")
    missing = judge({}, True, PY)
    assert missing.status == "fail" and missing.fix.startswith(f"{PY} -m pip install {CUDA13}")
    assert "vLLM >= 0.20" in missing.fix and CUDA12 in missing.fix


def test_a_cuda_mooncake_has_no_wheel_for() -> None:
    verdict = judge({CUDA12: "0.3.13", "torch": "2.7.0+cu118"}, True, PY)
    assert verdict.status == "fail" and "CUDA 11" in verdict.detail and "CUDA 12 and 13 only" in verdict.detail


def test_the_efa_builds_count_as_their_cuda() -> None:
    cuda13 = {"torch": "2.11.0", "nvidia-cuda-runtime": "13.0.96"}
    assert judge({**cuda13, "mooncake-transfer-engine-efa-cuda13": "0.3.13"}, True, PY).status == "ok"
    wrong = judge({**cuda13, "mooncake-transfer-engine-efa": "0.3.13"}, True, PY)
    assert wrong.status == "fail" and wrong.fix.endswith(f"install {CUDA13}")
    assert set(WHEELS.values()) == {None, 12, 13}


def test_no_vllm_found_keeps_the_cpu_guess() -> None:
    """kvctl doctor without a vLLM checks kvctl's own environment: the CPU wheel is fine, the CUDA ones named."""
    assert judge({NON_CUDA: "0.3.13"}, None, PY).status == "ok"
    missing = judge({}, None, PY)
    assert missing.status == "fail" and missing.fix.startswith(f"{PY} -m pip install {NON_CUDA}")
    assert CUDA13 in missing.fix
