"""Issue 40 item 1, one severity rule (docs/validate.md "Severity"): a setting the file states that
vLLM refuses, drops, misreads or never passes on is an error; what vLLM accepts and acts on as
written (with a log line at most) is not."""

from __future__ import annotations

import json
from pathlib import Path

from kvctl.validate import ERROR, WARNING, validate_path


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def simple(tmp_path: Path, lazy: object) -> Path:
    config = {"kv_connector": "SimpleCPUOffloadConnector", "kv_role": "kv_both",
              "kv_connector_extra_config": {"cpu_bytes_to_use": 10737418240, "lazy_offload": lazy}}
    return write(tmp_path, "ktc.json", json.dumps(config, indent=1))


def test_a_bool_written_as_a_string_vllm_reads_the_other_way_is_an_error(tmp_path: Path) -> None:
    for written in ("false", "False", "0", "no", "off"):
        report = validate_path(simple(tmp_path, written), "0.26.0")  # bool(str): simple_cpu_offload_connector.py:77
        [problem] = [p for p in report.problems if p.where.endswith("lazy_offload")]
        assert problem.severity == ERROR and "True" in problem.message, written
        assert "simple_cpu_offload_connector.py:77" in problem.message


def test_a_bool_string_vllm_reads_as_written_is_not_an_error(tmp_path: Path) -> None:
    for written in ("true", "1", True, False):
        report = validate_path(simple(tmp_path, written), "0.26.0")
        assert report.ok, (written, [p.message for p in report.problems])


def test_mooncake_enable_offload_false_string_is_an_error(tmp_path: Path) -> None:
    config = {"metadata_server": "P2PHANDSHAKE", "master_server_address": "10.0.0.5:50051", "protocol": "tcp",
              "device_name": "", "global_segment_size": "4GB", "local_buffer_size": "1GB", "enable_offload": "false"}
    report = validate_path(write(tmp_path, "mooncake.json", json.dumps(config)), "0.23.0")
    [problem] = [p for p in report.problems if p.where.endswith("enable_offload")]
    assert problem.severity == ERROR and "bool()" in problem.message
    config["enable_offload"] = "true"
    report = validate_path(write(tmp_path, "mooncake.json", json.dumps(config)), "0.23.0")
    assert not [p for p in report.errors if p.where.endswith("enable_offload")]


def test_an_offloading_size_vllm_never_passes_on_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "run.sh", "vllm serve M --kv-offloading-size 64 --kv-offloading-backend lmcache\n")
    report = validate_path(path, "0.33.0")  # config/vllm.py: the lmcache branch sets no size
    [problem] = [p for p in report.problems if p.where.endswith("kv_offloading_size")]
    assert problem.severity == ERROR and problem.dropped and "does not pass" in problem.message


def test_vllm_use_v1_1_on_a_v1_only_release_is_not_an_error(tmp_path: Path) -> None:
    store = json.dumps({"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"})
    path = write(tmp_path, "run.sh", f"export MOONCAKE_CONFIG_PATH=/m.json\n"
                 f"VLLM_USE_V1=1 vllm serve m --kv-transfer-config '{store}'\n")
    report = validate_path(path, "0.32.0")
    assert report.ok, [p.message for p in report.errors]
    [note] = [p for p in report.problems if "VLLM_USE_V1" in p.where]
    assert note.severity == WARNING and "the only engine" in note.message
    # asking for the V0 engine there is a setting that does not happen
    report = validate_path(write(tmp_path, "run.sh", path.read_text().replace("VLLM_USE_V1=1", "VLLM_USE_V1=0")),
                           "0.32.0")
    assert [p.severity for p in report.problems if "VLLM_USE_V1" in p.where] == [ERROR]


def test_a_string_number_vllm_keeps_unconverted_stays_a_warning(tmp_path: Path) -> None:
    """0.9.0's plain dataclass keeps "20002" a str: whether that breaks depends on the code using it
    (an f-string address works), so it is a trap, not a lost setting (corpus:
    ascend-run-consumer-barebone.sh@0.9.0 starts)."""
    config = {"kv_connector": "PyNcclConnector", "kv_role": "kv_producer", "kv_port": "20002"}
    report = validate_path(write(tmp_path, "ktc.json", json.dumps(config)), "0.9.0")
    [problem] = [p for p in report.problems if p.where.endswith("kv_port")]
    assert problem.severity == WARNING and not problem.dropped


def test_every_warning_left_is_not_a_setting_vllm_loses(tmp_path: Path) -> None:
    """The warnings that stay: traps that are not a stated setting (a reset that clears nothing,
    PYTHONHASHSEED unset) and what kvctl cannot check."""
    path = write(tmp_path, "ktc.json", json.dumps({"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"}))
    report = validate_path(path, "0.22.0")
    assert report.ok and all("reset_cache()" in p.message for p in report.warnings)


def test_local_hostname_fix_names_what_the_release_reads(tmp_path: Path) -> None:
    """Issue 40 item 4: MOONCAKE_REQUESTER_LOCAL_HOSTNAME first exists in 0.22.0 (vllm/envs.py;
    rdma_utils.get_requester_local_hostname); 0.21.0's store worker registers get_ip() (VLLM_HOST_IP)."""
    config = {"metadata_server": "P2PHANDSHAKE", "master_server_address": "10.0.0.5:50051", "protocol": "tcp",
              "device_name": "", "global_segment_size": "4GB", "local_buffer_size": "1GB", "local_hostname": "h"}
    path = write(tmp_path, "mooncake.json", json.dumps(config))
    [old] = [p for p in validate_path(path, "0.21.0").problems if p.where.endswith("local_hostname")]
    assert "VLLM_HOST_IP" in old.fix and "export MOONCAKE_REQUESTER_LOCAL_HOSTNAME" not in old.fix
    [new] = [p for p in validate_path(path, "0.22.0").problems if p.where.endswith("local_hostname")]
    assert "export MOONCAKE_REQUESTER_LOCAL_HOSTNAME" in new.fix


def test_mooncake_config_path_no_connector_reads(tmp_path: Path) -> None:
    """Issue 40 item 4: on 0.11.0 no registered connector reads MOONCAKE_CONFIG_PATH (V0's left in
    0.10.1, the V1 store connector comes in 0.21.0); LMCache reads it only for a mooncakestore:// remote."""
    lmcache = json.dumps({"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"})

    def verdict(env: str) -> list[bool]:
        path = write(tmp_path, "run.sh", f"export MOONCAKE_CONFIG_PATH=/etc/mooncake.json\n{env}"
                     f"vllm serve m --kv-transfer-config '{lmcache}'\n")
        return [p.dropped for p in validate_path(path, "0.11.0").errors if "MOONCAKE_CONFIG_PATH" in p.message]

    assert verdict("") == [True]
    assert verdict("export LMCACHE_REMOTE_URL=mooncakestore://10.0.0.5:50051/\n") == []
    assert verdict("export LMCACHE_CONFIG_FILE=/etc/lmcache.yaml\n") == []  # its remote is not in the file
    assert verdict("export LMCACHE_REMOTE_URL=lm://10.0.0.5:65432\n") == [True]
