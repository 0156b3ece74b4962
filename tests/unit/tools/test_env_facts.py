"""tools/capabilities/env_facts.py on a synthetic tree and on vLLM's real released sources (the
cache `make capabilities` fills): the names vllm/envs.py defines, the VLLM_* names read outside
it, and validate_environ."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path


from tests.lib import REPO
from tests.lib.release_sources import vllm_tree
from tools.capabilities import env_facts
from tools.capabilities.merge import facts_at
from tools.capabilities.source import SourceTree

COMMITTED = json.loads((REPO / "kvctl/data/vllm_facts.json").read_text())


def _release(version: str) -> SourceTree:
    return vllm_tree(version)


FAKE = {
    "vllm/envs.py": """
        import os
        environment_variables: dict = {
            "VLLM_HOST_IP": lambda: os.getenv("VLLM_HOST_IP", ""),
            "VLLM_OLD_KEY": lambda: os.environ.get("VLLM_RENAMED_READ", "0"),
            "CUDA_HOME": lambda: os.environ.get("CUDA_HOME", None),
        }

        def validate_environ(hard_fail: bool) -> None:
            for env in os.environ:
                if env.startswith("VLLM_") and env not in environment_variables:
                    if hard_fail:
                        raise ValueError(f"Unknown vLLM environment variable detected: {env}")
    """,
    "vllm/engine/arg_utils.py": """
        from vllm import envs
        def add_cli_args(parser):
            parser.add_argument("--fail-on-environ-validation", default=False)
        def create_engine_config(self):
            envs.validate_environ(self.fail_on_environ_validation)
    """,
    "vllm/v1/engine/core.py": """
        import os
        if "VLLM_ONLY_HERE" in os.environ and os.environ["VLLM_ALSO_HERE"]:
            pass
        os.environ["VLLM_WRITTEN_NOT_READ"] = "1"
    """,
    "vllm/utils/other.py": """
        import os
        X = os.getenv("VLLM_OUTSIDE_THE_FETCHED_MEMBERS")
    """,
}


def _fake(tmp_path: Path, files: dict[str, str]) -> SourceTree:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    return SourceTree(tmp_path)


def test_synthetic_registry_reads_outside_it_and_validation(tmp_path: Path) -> None:
    names, validation = env_facts.extract(_fake(tmp_path, FAKE))
    assert {n for n, e in names.items() if "spans" in e} == {"VLLM_HOST_IP", "VLLM_OLD_KEY", "CUDA_HOME"}
    assert names["VLLM_HOST_IP"]["spans"] == {"file": "vllm/envs.py", "line": 4}
    # Read but not a key (a key that reads another name), read in a fetched file; a write is no
    # read, and a file outside the fetched members is not looked at (the cache does not hold it).
    assert {n for n, e in names.items() if "read_outside" in e} == \
        {"VLLM_RENAMED_READ", "VLLM_ONLY_HERE", "VLLM_ALSO_HERE"}
    check = validation["unknown_names"]
    assert check["call"]["values"] == {"value": "envs.validate_environ", "file": "vllm/engine/arg_utils.py",
                                       "line": 6}
    assert check["check"]["values"]["prefix"] == "VLLM_"
    assert check["check"]["values"]["registry"] == "environment_variables"
    assert check["check"]["values"]["message"] == "Unknown vLLM environment variable detected"
    assert check["hard_fail_flag"]["values"]["value"] == "--fail-on-environ-validation"


def test_synthetic_tree_without_validation_or_registry(tmp_path: Path) -> None:
    names, validation = env_facts.extract(_fake(tmp_path, {"vllm/envs.py": "X = 1\n"}))
    assert names == {} and validation == {}


def test_moe_dp_chunk_is_defined_up_to_0_19_and_gone_in_0_20() -> None:
    for version in ("0.13.0", "0.19.1"):
        assert "VLLM_ENABLE_MOE_DP_CHUNK" in env_facts.registered(_release(version))
    assert "VLLM_ENABLE_MOE_DP_CHUNK" not in env_facts.registered(_release("0.20.0"))
    assert "VLLM_ENABLE_MOE_DP_CHUNK" not in env_facts.registered(_release("0.12.0"))


def test_vllm_use_v1_is_gone_from_0_11_1_and_dev_mode_stays() -> None:
    assert "VLLM_USE_V1" in env_facts.registered(_release("0.11.0"))
    assert "VLLM_USE_V1" not in env_facts.registered(_release("0.11.1"))
    for version in ("0.9.0", "0.13.0", "0.32.0"):
        assert "VLLM_SERVER_DEV_MODE" in env_facts.registered(_release(version))


def test_validate_environ_from_0_17_and_on_the_platform_from_0_31() -> None:
    assert env_facts.validation(_release("0.16.0")) == {}
    at_17 = env_facts.validation(_release("0.17.0"))["unknown_names"]
    assert at_17["call"]["values"]["value"] == "envs.validate_environ"
    assert at_17["check"]["values"]["line"] == 1704  # vllm/envs.py:1704 at 0.17.0
    at_32 = env_facts.validation(_release("0.32.0"))["unknown_names"]
    assert at_32["call"]["values"] == {"value": "current_platform.validate_environ",
                                       "file": "vllm/engine/arg_utils.py", "line": 2221}
    assert "check" not in at_32  # Platform.validate_environ: vllm/platforms/, not in the cache
    assert at_32["hard_fail_flag"]["values"]["value"] == "--fail-on-environ-validation"


def test_committed_facts_hold_what_the_sources_say() -> None:
    for version in ("0.13.0", "0.20.0", "0.32.0"):
        names, validation = env_facts.extract(_release(version))
        committed = facts_at(COMMITTED, version)
        assert set(committed["env_vars"]) == set(names), version
        assert set(committed["env_validation"]) == set(validation), version
