"""The servers' environment per vLLM release (kvctl.facts.env_vars, validate/env.py
check_env_names) and the shell assignments bash never exports (readers/shell_env.py): both are
settings vLLM silently drops. Release boundaries come from the committed facts (vllm/envs.py of
each release); the scripts are written here and read by the real shell reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvctl.facts import env_vars
from kvctl.validate import validate_path
from kvctl.validate.kv_config import validate_kv_transfer_config

NIXL = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
LAUNCH = "vllm serve m --kv-transfer-config '{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_both\"}'"


def _env_problems(env: dict[str, str], version: str, cfg: dict = NIXL) -> dict[str, object]:
    return {p.where: p for p in validate_kv_transfer_config(cfg, version, env=env) if p.where.startswith("env.")}


# --- facts at the release boundaries -----------------------------------------------------------

def test_facts_moe_dp_chunk_0_13_to_0_19_and_validation_from_0_17() -> None:
    assert env_vars.reads("0.19.1", "VLLM_ENABLE_MOE_DP_CHUNK") and env_vars.reads("0.13.0", "VLLM_ENABLE_MOE_DP_CHUNK")
    assert not env_vars.reads("0.20.0", "VLLM_ENABLE_MOE_DP_CHUNK")
    assert env_vars.history("VLLM_ENABLE_MOE_DP_CHUNK") == [("0.13.0", "0.20.0")]
    assert env_vars.defined("0.13.0", "VLLM_ENABLE_MOE_DP_CHUNK").startswith("vllm/envs.py:")
    assert env_vars.validation("0.16.0") is None
    assert env_vars.validation("0.17.0").call == "envs.validate_environ"
    at_32 = env_vars.validation("0.32.0+cpu")
    assert at_32.call == "current_platform.validate_environ" and at_32.flag == "--fail-on-environ-validation"


def test_server_names_one_list() -> None:
    for name in ("LMCACHE_CONFIG_FILE", "LMCACHE_CHUNK_SIZE", "MOONCAKE_CONFIG_PATH", "MC_TCP_BIND_ADDRESS",
                 "PYTHONHASHSEED", "VLLM_SERVER_DEV_MODE", "VLLM_NOT_A_NAME", "S3_ENDPOINT_URL"):
        assert env_vars.server_reads(name), name
    for name in ("MODEL", "PORT", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "MAX_JOBS", "NIXL_ROLE"):
        assert not env_vars.server_reads(name), name


# --- check_env_names ---------------------------------------------------------------------------

def test_removed_name_is_dropped_from_the_release_that_removed_it() -> None:
    env = {"VLLM_ENABLE_MOE_DP_CHUNK": "0"}
    assert _env_problems(env, "0.19.1") == {}
    dropped = _env_problems(env, "0.20.0")["env.VLLM_ENABLE_MOE_DP_CHUNK"]
    assert dropped.dropped and dropped.severity == "error"
    assert "vLLM 0.20.0 does not read VLLM_ENABLE_MOE_DP_CHUNK (read in 0.13.0 to before 0.20.0)" in dropped.message
    assert "Unknown vLLM environment variable detected: VLLM_ENABLE_MOE_DP_CHUNK" in dropped.message
    assert "--fail-on-environ-validation" in dropped.message and dropped.fix == "remove VLLM_ENABLE_MOE_DP_CHUNK"


def test_name_not_yet_added_says_upgrade_and_old_release_says_no_check() -> None:
    dropped = _env_problems({"VLLM_ENABLE_MOE_DP_CHUNK": "0"}, "0.12.0")["env.VLLM_ENABLE_MOE_DP_CHUNK"]
    assert "upgrade vLLM to >= 0.13.0" in dropped.fix
    assert "says nothing" in dropped.message  # no validate_environ before 0.17.0


def test_misspelled_name_gets_the_release_name_with_its_value() -> None:
    for version in ("0.13.0", "0.32.0"):
        dropped = _env_problems({"VLLM_SERVER_DEV_MDOE": "1"}, version)["env.VLLM_SERVER_DEV_MDOE"]
        assert dropped.dropped and "no release kvctl knows defines it" in dropped.message
        assert "set VLLM_SERVER_DEV_MODE=1" in dropped.fix


def test_known_names_plugin_names_and_other_namespaces_are_not_judged() -> None:
    env = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_HOST_IP": "10.0.0.1", "VLLM_ASCEND_ENABLE_FLASHCOMM1": "1",
           "NIXL_ROLE": "SENDER", "UCX_TLS": "tcp"}
    for version in ("0.9.0", "0.20.0", "0.32.0"):
        assert _env_problems(env, version) == {}, version


def test_vllm_use_v1_dropped_from_0_11_1() -> None:
    assert _env_problems({"VLLM_USE_V1": "0"}, "0.11.0") == {}
    assert "env.VLLM_USE_V1" in _env_problems({"VLLM_USE_V1": "0"}, "0.11.1")


def test_connector_from_outside_code_is_not_judged() -> None:
    cfg = {"kv_connector": "MyConnector", "kv_role": "kv_both", "kv_connector_module_path": "my_pkg.conn"}
    assert _env_problems({"VLLM_MY_KNOB": "1"}, "0.32.0", cfg) == {}


# --- scripts: exported, prefixed, unexported ---------------------------------------------------

def _script(tmp_path: Path, text: str, version: str = "0.20.0") -> list:
    path = tmp_path / "run.sh"
    path.write_text(text)
    return validate_path(path, version).problems


def _unexported(problems: list) -> dict[str, object]:
    return {p.where.split(" ", 1)[1]: p for p in problems if "not exported" in p.message}


def test_unexported_assignments_are_dropped_at_their_line(tmp_path: Path) -> None:
    problems = _script(tmp_path, f"LMCACHE_CONFIG_FILE=/etc/lm.yaml\nPYTHONHASHSEED=0\nMOONCAKE_CONFIG_PATH=/m.json\n"
                                 f"MODEL=x\n{LAUNCH}\n")
    found = _unexported(problems)
    assert set(found) == {"LMCACHE_CONFIG_FILE", "PYTHONHASHSEED", "MOONCAKE_CONFIG_PATH"}
    lm = found["LMCACHE_CONFIG_FILE"]
    assert lm.where.endswith("run.sh:1 LMCACHE_CONFIG_FILE") and lm.dropped and lm.severity == "error"
    assert "vllm serve on line 5 does not see it" in lm.message and "export LMCACHE_CONFIG_FILE" in lm.fix


@pytest.mark.parametrize("text", [
    "LMCACHE_CONFIG_FILE=/etc/lm.yaml\nexport LMCACHE_CONFIG_FILE\n{launch}\n",  # export on a later line
    "export LMCACHE_CONFIG_FILE=/etc/lm.yaml\n{launch}\n",
    "declare -x LMCACHE_CONFIG_FILE=/etc/lm.yaml\n{launch}\n",
    "set -a\nLMCACHE_CONFIG_FILE=/etc/lm.yaml\nset +a\n{launch}\n",  # allexport
    "LMCACHE_CONFIG_FILE=/etc/lm.yaml\nLMCACHE_CONFIG_FILE=/etc/lm.yaml {launch}\n",  # the command's prefix
    "LMCACHE_CONFIG_FILE=/etc/lm.yaml\nenv LMCACHE_CONFIG_FILE=/etc/lm.yaml {launch}\n",
    "VLLM_HOST_IP=10.0.0.1\n{launch} --host $VLLM_HOST_IP\n",  # a script variable the script uses
    "{launch}\nLMCACHE_CONFIG_FILE=/etc/lm.yaml\n",  # no launch after it
    "VLLM_CACHE_ROOT=/c:$VLLM_CACHE_ROOT\n{launch}\n",  # extends a name the environment exports
    "LMCACHE_CONFIG_FILE=/etc/lm.yaml\nunset LMCACHE_CONFIG_FILE\n{launch}\n",
    "CUDA_VISIBLE_DEVICES=0\nNIXL_ROLE=SENDER\n{launch}\n",  # a launcher exports it / no facts
])
def test_exported_prefixed_or_used_assignments_are_not_reported(tmp_path: Path, text: str) -> None:
    assert _unexported(_script(tmp_path, text.format(launch=LAUNCH))) == {}


def test_export_on_a_later_line_puts_the_name_in_the_checked_environment(tmp_path: Path) -> None:
    problems = _script(tmp_path, f"VLLM_ENABLE_MOE_DP_CHUNK=1\nexport VLLM_ENABLE_MOE_DP_CHUNK\n{LAUNCH}\n")
    dropped = [p for p in problems if "does not read VLLM_ENABLE_MOE_DP_CHUNK" in p.message]
    assert len(dropped) == 1 and dropped[0].where.endswith("run.sh:1 env.VLLM_ENABLE_MOE_DP_CHUNK")
    assert not _unexported(problems)


def test_prefix_name_is_located_at_its_line(tmp_path: Path) -> None:
    problems = _script(tmp_path, f"VLLM_SERVER_DEV_MDOE=1 \\\n  {LAUNCH}\n", "0.32.0")
    dropped = [p for p in problems if "VLLM_SERVER_DEV_MDOE" in p.message]
    assert len(dropped) == 1 and dropped[0].where.endswith("run.sh:1 env.VLLM_SERVER_DEV_MDOE")


def test_allow_dropped_turns_them_into_warnings(tmp_path: Path) -> None:
    path = tmp_path / "run.sh"
    path.write_text(f"PYTHONHASHSEED=0\n{LAUNCH}\n")
    report = validate_path(path, "0.20.0", allow_dropped=True)
    assert report.ok and any("not exported" in p.message and p.severity == "warning" for p in report.problems)
