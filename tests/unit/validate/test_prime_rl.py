"""prime-rl's TOML read as prime-rl 559b447 turns it into vLLM's config
(packages/prime-rl-configs/src/prime_rl/configs/inference.py, the SLURM templates): TOML written
here for each rule, the two corpus files (prime-rl's docs and its GLM-5.2 P/D example), and TOML
that is not prime-rl's."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvctl.errors import UsageError
from kvctl.validate import validate_path
from kvctl.validate.readers import read
from kvctl.validate.readers.prime_rl import toml_lines
from tests.lib import REPO

CORPUS = REPO / "tests" / "corpus" / "files"
CPU = '[kv_cache_offload]\ntype = "native"\n[kv_cache_offload.cpu]\nnum_bytes = 64_000_000_000\n'


def write(tmp_path: Path, text: str, name: str = "inference.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def errors(path: Path) -> list:
    return [p for p in read(path).problems if p.severity == "error" and not p.dropped]


# -- the corpus files ---------------------------------------------------------------------------
def test_docs_cpu_disk_tiering_becomes_tiering_spec_with_fs_python_tier() -> None:
    path = CORPUS / "more-primerl-doc-native-cpu-disk-tiering.toml"
    found = read(path)
    assert found.format == "prime-rl-toml"
    (artifact,) = found.artifacts
    assert artifact.data == {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                             "kv_connector_extra_config": {
                                 "cpu_bytes_to_use": 128_000_000_000, "spec_name": "TieringOffloadingSpec",
                                 "secondary_tiers": [{"type": "fs_python", "root_dir": "/scratch/kv"}]}}
    assert artifact.origin == "prime-rl: [inference.kv_cache_offload] (line 2)"  # an RL config's table
    assert artifact.lines["kv_transfer_config.kv_connector_extra_config.cpu_bytes_to_use"] == 5
    assert artifact.lines["kv_transfer_config.kv_connector_extra_config.secondary_tiers[0].root_dir"] == 7
    assert validate_path(path, "0.22.0").ok
    (problem,) = validate_path(path, "0.26.0").errors  # the tier is called "fs" there
    assert problem.where.endswith(":6 kv_transfer_config.kv_connector_extra_config.secondary_tiers[0].type")
    assert "fs_python" in problem.message


def test_glm_pd_example_is_multiconnector_per_role_with_the_store_json() -> None:
    path = CORPUS / "more-primerl-glm-pd-llmd-mooncake-nixl.toml"
    prefill, decode, store = read(path).artifacts
    assert prefill.where == "prefill.kv_transfer_config" and decode.where == "decode.kv_transfer_config"
    assert prefill.data == decode.data == {
        "kv_connector": "MultiConnector", "kv_role": "kv_both", "kv_connector_extra_config": {"connectors": [
            {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_connector_extra_config": {"num_threads": 1}},
            {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both", "kv_connector_extra_config": {}}]}}
    assert prefill.env["VLLM_ENABLE_MOE_DP_CHUNK"] == "0" and "VLLM_ENABLE_MOE_DP_CHUNK" not in decode.env
    assert prefill.lines["env.VLLM_ENABLE_MOE_DP_CHUNK"] == 27
    for role in (prefill, decode):  # the SLURM template's exports, and use_deep_gemm = true
        assert role.env["PYTHONHASHSEED"] == "0" and role.env["MOONCAKE_CONFIG_PATH"].startswith("$OUTPUT_DIR/")
        assert role.env["VLLM_USE_DEEP_GEMM"] == "1" and role.env["VLLM_DEEP_GEMM_WARMUP"] == "skip"
        assert role.lines[role.where] == 20  # deployment.type = "disaggregated"
    assert store.kind == "mooncake" and store.readers == ("MooncakeStoreConnector",)
    assert store.data["mode"] == "standalone-store" and store.data["global_segment_size"] == 0
    assert store.data["device_name"].startswith("mlx5_0,") and store.data["enable_offload"] is False
    assert store.data["master_server_address"] == "$MC_HEAD:50051"  # filled by SLURM, not guessed
    assert store.lines["mooncake.device_name"] == 14
    assert any("MooncakeStoreConnector" in p.message for p in validate_path(path, "0.19.0").errors)


# -- prime-rl's rules ---------------------------------------------------------------------------
def test_native_cpu_only_is_offloading_connector(tmp_path: Path) -> None:
    (artifact,) = read(write(tmp_path, CPU)).artifacts
    assert artifact.data == {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                             "kv_connector_extra_config": {"cpu_bytes_to_use": 64_000_000_000}}
    assert artifact.where == "kv_transfer_config" and artifact.env == {}
    assert artifact.lines["kv_transfer_config.kv_connector"] == 2


def test_disaggregated_without_offload_is_nixl_alone(tmp_path: Path) -> None:
    path = write(tmp_path, '[deployment]\ntype = "disaggregated"\n[deployment.decode_env_vars]\nA = "1"\n')
    prefill, decode = read(path).artifacts
    assert prefill.data == {"kv_connector": "NixlConnector", "kv_role": "kv_both",
                            "kv_connector_extra_config": {"num_threads": 1}}
    assert decode.env == {"A": "1"} and prefill.env == {}


def test_env_order_env_vars_win_over_role_and_store(tmp_path: Path) -> None:
    text = CPU.replace('"native"', '"mooncake"') + ('[env_vars]\nPYTHONHASHSEED = "7"\n[deployment]\n'
                                                    'type = "disaggregated"\n[deployment.prefill_env_vars]\n'
                                                    'PYTHONHASHSEED = "5"\nB = "2"\n')
    prefill, decode, _ = read(write(tmp_path, text)).artifacts
    assert prefill.env["PYTHONHASHSEED"] == "7" and prefill.env["B"] == "2"  # inference.py:198 applies it last
    assert prefill.lines["env.PYTHONHASHSEED"] == 6


@pytest.mark.parametrize(("text", "words"), [
    ('[kv_cache_offload]\ncpu_bytes = 1000\n', "the flat table prime-rl read before c13409e2c"),
    ('[kv_cache_offload]\ntype = "lmcache"\n', "not one of 'native', 'mooncake'"),
    ('[kv_cache_offload]\ntype = "native"\n', "no cpu tier"),
    (CPU.replace("64_000_000_000", "0"), "above 0"),
    (CPU.replace('"native"\n', '"native"\ndevice_name = "mlx5_0"\n'), "device_name is not a key of a native"),
    (CPU + "[kv_cache_offload.disk]\nnum_bytes = 10\n", "num_bytes is not a key of the disk tier"),
    (CPU + '[vllm]\nenable_prefix_caching = false\n', "enable_prefix_caching is false"),
    ('[deployment]\ntype = "disagregated"\n', "'disagregated' is not one of single_node"),
    (CPU + '[deployment.prefill_env_vars]\nA = "1"\n', "prefill_env_vars is not a key of a single_node"),
    (CPU + '[env_vars]\nVLLM_X = 1\n', "not a string"),
    (CPU + '[env_vars]\nCUDA_VISIBLE_DEVICES = "0"\n', "set by prime-rl's launcher"),
])
def test_what_prime_rl_refuses_is_an_error(tmp_path: Path, text: str, words: str) -> None:
    path = write(tmp_path, text)
    found = errors(path)
    assert any(words in p.message and "refuses the config" in p.message for p in found), found
    assert not validate_path(path, "0.32.0").ok


def test_unknown_key_points_at_its_line(tmp_path: Path) -> None:
    unknown, missing = errors(write(tmp_path, CPU.replace("num_bytes", "num_byte")))
    assert unknown.where.endswith("inference.toml:4 kv_cache_offload.cpu.num_byte")
    assert "did you mean 'num_bytes'" in unknown.fix
    assert missing.where.endswith("inference.toml:3 kv_cache_offload.cpu") and "None" in missing.message


def test_vllm_kv_transfer_config_passes_through_or_is_replaced(tmp_path: Path) -> None:
    own = '[deployment]\ntype = "single_node"\n[vllm.kv_transfer_config]\nkv_connector = "NixlConnector"\n' \
          'kv_role = "kv_both"\n'
    (artifact,) = read(write(tmp_path, own)).artifacts
    assert artifact.data == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    assert artifact.lines["kv_transfer_config.kv_role"] == 5
    replaced = read(write(tmp_path, CPU + '[vllm]\nkv-transfer-config = \'{"kv_connector": "X"}\'\n'))
    (problem,) = replaced.problems
    assert problem.dropped and "replaced by the one prime-rl builds" in problem.message
    assert [a.data["kv_connector"] for a in replaced.artifacts] == ["OffloadingConnector"]


def test_vllm_offloading_size_is_read_with_the_config_it_edits(tmp_path: Path) -> None:
    found = read(write(tmp_path, CPU + "[vllm]\nkv_offloading_size = 64\n"))
    config, args = found.artifacts
    assert args.kind == "kv_offloading" and args.data["kv_offloading_size"] == 64
    assert args.data["kv_transfer_config"] == config.data and args.lines["vllm.kv_offloading_size"] == 6


def test_rl_config_reads_the_inference_table_and_both_env_tables(tmp_path: Path) -> None:
    text = ('[env_vars]\nA = "1"\n[deployment]\ntype = "multi_node"\n[trainer]\n[orchestrator]\n'
            '[inference.env_vars]\nB = "2"\n' + CPU.replace("[kv_cache_offload", "[inference.kv_cache_offload"))
    (artifact,) = read(write(tmp_path, text, "rl.toml")).artifacts  # top-level deployment: the RL job's
    assert artifact.env == {"A": "1", "B": "2"} and artifact.data["kv_connector"] == "OffloadingConnector"


def test_prime_rl_toml_without_kv_settings_says_so(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="builds no kv_transfer_config"):
        read(write(tmp_path, '[deployment]\ntype = "single_node"\n[vllm]\nmax_num_seqs = 8\n'))


# -- not prime-rl's -----------------------------------------------------------------------------
def test_other_toml_is_not_a_config_kvctl_reads(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not a config kvctl reads") as caught:
        read(write(tmp_path, '[tool.ruff]\nline-length = 120\n[server]\nport = 1\n', "pyproject.toml"))
    assert "YAML" not in caught.value.message


def test_invalid_toml_names_the_line(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"not valid TOML: .*line 2"):
        read(write(tmp_path, '[kv_cache_offload]\ntype = \n'))


def test_toml_lines_skip_multiline_strings_and_number_array_tables() -> None:
    text = 'a = """\nb = 1\n"""\n[[x.y]]\nc = 1\n[[x.y]]\n"d.e" = 2\n[t]\nq.r = 3\n'
    lines = toml_lines(text, "f.toml")
    assert "b" not in lines and lines["a"] == 1
    assert lines["x.y[0].c"] == 5 and lines['x.y[1]."d.e"'] == 7 and lines["t.q.r"] == 9
