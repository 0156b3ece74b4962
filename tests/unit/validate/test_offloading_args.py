"""vLLM's native KV offloading settings (--kv-offloading-size / --kv-offloading-backend and their
keys) through the real readers and checks, at the release boundaries kvctl's facts give."""

from __future__ import annotations

from pathlib import Path

from packaging.version import Version

from kvctl.facts.capabilities import table
from kvctl.facts.offload_args import BACKEND, SIZE, backend_changes_after, offload_args, offload_args_since
from kvctl.validate import validate_path

FIRST = offload_args_since()  # 0.11.1 (vllm/config/cache.py:140)
RELEASES = table().facts["releases"]
BEFORE = RELEASES[RELEASES.index(FIRST) - 1]
# The first release that gates on the size (default backend "native"): 0.14.0 (vllm/config/vllm.py:502).
SIZE_GATED = next(r for r in RELEASES[RELEASES.index(FIRST):] if offload_args(r).gate == SIZE)
BACKEND_GATED = RELEASES[RELEASES.index(SIZE_GATED) - 1]  # 0.13.0: returns without a backend
NEWEST = RELEASES[-1]


def _report(tmp_path: Path, name: str, text: str, version: str):
    path = tmp_path / name
    path.write_text(text)
    return validate_path(path, version)


def _verdict(report) -> str:
    if any(not p.dropped for p in report.errors):
        return "error"
    return "dropped" if report.dropped else "ok"


LAUNCH = "vllm serve Qwen/Qwen3-0.6B \\\n  --kv-offloading-size 64 \\\n  --kv-offloading-backend native\n"


def test_the_boundaries_come_from_the_facts() -> None:
    assert (BEFORE, FIRST, BACKEND_GATED, SIZE_GATED) == ("0.11.0", "0.11.1", "0.13.0", "0.14.0")
    assert offload_args(BACKEND_GATED).gate == BACKEND and backend_changes_after(BACKEND_GATED, "native") == "0.14.0"


def test_launch_line_per_release(tmp_path: Path) -> None:
    verdicts = {v: _verdict(_report(tmp_path, "run.sh", LAUNCH, v))
                for v in (BEFORE, BACKEND_GATED, SIZE_GATED, NEWEST)}
    # before: argparse refuses the flags; 0.13: OffloadingConnector with num_cpu_blocks 0, which
    # CPUOffloadingSpec rejects; 0.14+: cpu_bytes_to_use = 64 GiB.
    assert verdicts == {BEFORE: "error", BACKEND_GATED: "error", SIZE_GATED: "ok", NEWEST: "ok"}


def test_absent_flags_are_located_at_their_lines(tmp_path: Path) -> None:
    report = _report(tmp_path, "run.sh", LAUNCH, BEFORE)
    assert [p.where for p in report.errors] == [f"{tmp_path}/run.sh:2 kv_offloading_size",
                                                f"{tmp_path}/run.sh:3 kv_offloading_backend"]
    assert all(f"in {FIRST}" in p.message and "--kv-offloading-" in p.message for p in report.errors)


def test_0_13_num_cpu_blocks_0_is_worded_for_the_flags(tmp_path: Path) -> None:
    report = _report(tmp_path, "run.sh", LAUNCH, BACKEND_GATED)
    (error,) = [p for p in report.errors if not p.dropped]
    assert error.where.startswith(f"{tmp_path}/run.sh:2 ") and error.where.endswith("num_cpu_blocks")
    assert error.message.startswith(f"vLLM {BACKEND_GATED} turns --kv-offloading-size and --kv-offloading-backend "
                                    "into kv_connector OffloadingConnector with ")
    assert "num_cpu_blocks 0" in error.message and "num_cpu_blocks must be specified" in error.message
    assert "upgrade vLLM to >= 0.14.0" in error.fix


def test_size_without_backend_is_dropped_while_the_backend_gates(tmp_path: Path) -> None:
    text = "vllm serve M --kv-offloading-size 64\n"
    report = _report(tmp_path, "run.sh", text, BACKEND_GATED)
    assert _verdict(report) == "dropped" and "add --kv-offloading-backend native" in report.dropped[0].fix
    assert _verdict(_report(tmp_path, "run.sh", text, SIZE_GATED)) == "ok"  # native by default


def test_backend_without_size(tmp_path: Path) -> None:
    text = "vllm serve M --kv-offloading-backend=native\n"
    error = _report(tmp_path, "run.sh", text, BACKEND_GATED).errors[0]
    assert not error.dropped and "You must set kv_offloading_size" in error.message
    assert _verdict(_report(tmp_path, "run.sh", text, SIZE_GATED)) == "dropped"  # returns early: nothing


def test_bad_values(tmp_path: Path) -> None:
    report = _report(tmp_path, "run.sh", "vllm serve M --kv-offloading-size lots --kv-offloading-backend nativ\n",
                     NEWEST)
    messages = " ".join(p.message for p in report.errors)
    assert "'lots' is not a number" in messages and "'nativ' is not a backend" in messages
    assert any("did you mean 'native'?" in p.fix for p in report.errors)


def test_ray_serve_yaml_engine_kwargs(tmp_path: Path) -> None:
    text = ("applications:\n  - args:\n      llm_configs:\n        - engine_kwargs:\n"
            "            kv_offloading_backend: native\n            kv_offloading_size: 8\n")
    assert _verdict(_report(tmp_path, "serve.yaml", text, SIZE_GATED)) == "ok"
    report = _report(tmp_path, "serve.yaml", text, BEFORE)
    prefix = "applications[0].args.llm_configs[0].engine_kwargs"
    assert {p.where for p in report.errors} == {f"{tmp_path}/serve.yaml:5 {prefix}.kv_offloading_backend",
                                                f"{tmp_path}/serve.yaml:6 {prefix}.kv_offloading_size"}


def test_vllm_config_yaml_dashed_keys(tmp_path: Path) -> None:
    report = _report(tmp_path, "config.yaml", "model: M\nkv-offloading-size: 16\n", BACKEND_GATED)
    assert _verdict(report) == "dropped" and report.dropped[0].where == f"{tmp_path}/config.yaml:2 kv_offloading_size"


def test_python_keywords_and_engine_kwargs(tmp_path: Path) -> None:
    text = "from vllm import LLM\nllm = LLM('M',\n          kv_offloading_size=8.0)\n"
    assert _verdict(_report(tmp_path, "run.py", text, SIZE_GATED)) == "ok"
    report = _report(tmp_path, "run.py", text, BEFORE)
    assert report.errors[0].where == f"{tmp_path}/run.py:3 kv_offloading_size"


def test_simple_cpu_offload_switch(tmp_path: Path) -> None:
    # vllm/envs.py: bool(int(VLLM_USE_SIMPLE_KV_OFFLOAD)) picks SimpleCPUOffloadConnector (0.19+).
    line = "vllm serve M --kv-offloading-size 8 --kv-transfer-config '{\"kv_connector\": \"OffloadingConnector\"}'\n"
    switched = _report(tmp_path, "run.sh", "VLLM_USE_SIMPLE_KV_OFFLOAD=1 " + line, NEWEST).dropped
    assert ["replaces kv_connector 'OffloadingConnector' with 'SimpleCPUOffloadConnector'" in p.message
            for p in switched] == [True]
    assert _report(tmp_path, "run.sh", "VLLM_USE_SIMPLE_KV_OFFLOAD=0 " + line, NEWEST).dropped == []


def test_user_kv_transfer_config_overwritten(tmp_path: Path) -> None:
    text = ("vllm serve M --kv-offloading-size 64 \\\n"
            "  --kv-transfer-config '{\"kv_connector\": \"OffloadingConnector\", \"kv_role\": \"kv_producer\",\n"
            "   \"kv_connector_extra_config\": {\"cpu_bytes_to_use\": 1000, \"block_size\": 64}}'\n")
    report = _report(tmp_path, "run.sh", text, NEWEST)
    dropped = {p.where.split(" ", 1)[1]: p.message for p in report.dropped}
    assert set(dropped) == {"kv_transfer_config.kv_role",
                            "kv_transfer_config.kv_connector_extra_config.cpu_bytes_to_use"}
    assert "replaces kv_role 'kv_producer' with 'kv_both'" in dropped["kv_transfer_config.kv_role"]
    assert "overwrites cpu_bytes_to_use with 68719476736.0" in \
        dropped["kv_transfer_config.kv_connector_extra_config.cpu_bytes_to_use"]
    # Located in the user's JSON, line by line.
    assert sorted(p.where.split(" ")[0] for p in report.dropped) == [f"{tmp_path}/run.sh:2", f"{tmp_path}/run.sh:3"]
    assert not [p for p in report.errors if not p.dropped]


def test_user_config_untouched_when_the_settings_do_nothing(tmp_path: Path) -> None:
    text = ("vllm serve M --kv-offloading-size 64 --kv-transfer-config "
            "'{\"kv_connector\": \"OffloadingConnector\", \"kv_role\": \"kv_both\", "
            "\"kv_connector_extra_config\": {\"num_cpu_blocks\": 1000}}'\n")
    report = _report(tmp_path, "run.sh", text, BACKEND_GATED)
    # 0.13 returns without a backend: the size is dropped, the user's config runs as written.
    assert [p.where.split(" ", 1)[1] for p in report.dropped] == ["kv_offloading_size"]
    assert Version(BACKEND_GATED) < Version(SIZE_GATED)


def test_kubernetes_args(tmp_path: Path) -> None:
    text = ("apiVersion: apps/v1\nkind: Deployment\nspec:\n  template:\n    spec:\n      containers:\n"
            "        - name: vllm\n          args: [\"--model\", \"M\", \"--kv-offloading-size\", \"64\", "
            "\"--kv-offloading-backend\", \"lmcachee\"]\n")
    report = _report(tmp_path, "deploy.yaml", text, NEWEST)
    assert [p.where for p in report.errors] == [f"{tmp_path}/deploy.yaml:8 kv_offloading_backend"]
    assert "--kv-offloading-size at args[2] of container 'vllm'" in report.found[0]


def test_the_sizes_vllm_writes_are_per_rank(tmp_path: Path) -> None:
    """Issue 40 item 4: with -tp 8 vLLM 0.13 writes 64 GiB / 8 per rank (vllm/config/vllm.py:488-505)."""
    ktc = '{"kv_connector":"OffloadingConnector","kv_role":"kv_both","kv_connector_extra_config":{"kv_bytes_per_rank":1}}'
    for flags, per_rank in (("-tp 8", 8 << 30), ("--tensor-parallel-size=4 -pp 2", 8 << 30), ("", 64 << 30)):
        text = f"vllm serve M {flags} --kv-offloading-size 64 --kv-offloading-backend native --kv-transfer-config '{ktc}'\n"
        report = _report(tmp_path, "run.sh", text, "0.13.0")
        [moved] = [p for p in report.problems if p.where.endswith("kv_bytes_per_rank") and "overwrites" in p.message]
        assert f"with {float(per_rank)!r}" in moved.message, (flags, moved.message)
