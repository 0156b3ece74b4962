"""production-stack Helm values read as chart 0.1.12 (a6c01db) renders them: the rules of
helm/templates/deployment-vllm-multi.yaml and ray-cluster.yaml, with values written here, and the
two corpus files taken from the project's tutorials."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvctl.errors import UsageError
from kvctl.validate import validate_path
from kvctl.validate.readers import read
from kvctl.validate.readers.helm_values import _go_int
from tests.lib import REPO

CORPUS = REPO / "tests" / "corpus" / "files"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "values.yaml"
    path.write_text(text)
    return path


def model(lmcache: str = "", vllm: str = "", extra: str = "", top: str = "") -> str:
    """A values file with one modelSpec; the blocks are indented under it."""
    def block(name: str, body: str) -> str:
        return f"    {name}:\n" + "".join(f"      {line}\n" for line in body.strip().splitlines()) if body else ""
    return (f"{top}servingEngineSpec:\n  modelSpec:\n  - name: m\n    modelURL: facebook/opt-125m\n"
            f"{block('vllmConfig', vllm)}{block('lmcacheConfig', lmcache)}{extra}")


def problems(path: Path, kind: str) -> list:
    """The reader's own problems (what the chart renders, drops or refuses) of one kind."""
    return [p for p in read(path).problems if (p.dropped if kind == "dropped" else p.severity == kind and
                                               not p.dropped)]


# -- the corpus files ---------------------------------------------------------------------------
def test_cpu_offloading_tutorial_renders_lmcache_v1_with_the_cpu_buffer_env() -> None:
    path = CORPUS / "dep-prodstack-values-05-cpu-offloading.yaml"
    found = read(path)
    assert found.format == "helm-values"
    (artifact,) = found.artifacts
    assert artifact.data == {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
    assert artifact.lines["kv_transfer_config"] == 19  # lmcacheConfig.enabled
    assert "modelSpec 'mistral' lmcacheConfig (line 18)" in artifact.origin
    assert artifact.env["LMCACHE_LOCAL_CPU"] == "True" and artifact.env["LMCACHE_MAX_LOCAL_CPU_SIZE"] == "20"
    assert artifact.env["PYTHONHASHSEED"] == "123" and "VLLM_USE_V1" not in artifact.env
    assert validate_path(path, "0.13.0").ok and validate_path(path, "0.32.0").ok


def test_disaggregated_prefill_tutorial_renders_producer_and_consumer() -> None:
    path = CORPUS / "dep-prodstack-values-16-disagg-prefill.yaml"
    prefill, decode = read(path).artifacts
    assert prefill.data == {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_producer",
                            "kv_connector_extra_config": {"discard_partial_chunks": False,
                                                          "lmcache_rpc_port": "sender"}}
    assert decode.data["kv_role"] == "kv_consumer"
    assert decode.data["kv_connector_extra_config"]["lmcache_rpc_port"] == "receiver"
    assert prefill.lines["kv_transfer_config.kv_role"] == 23
    assert prefill.lines["kv_transfer_config.kv_connector_extra_config.lmcache_rpc_port"] == 25
    # cpuOffloadingBufferSize: 0 leaves the PD env's LMCACHE_LOCAL_CPU=False in place
    assert prefill.env["LMCACHE_LOCAL_CPU"] == "False" and prefill.env["LMCACHE_NIXL_ROLE"] == "sender"
    assert decode.env["CUDA_VISIBLE_DEVICES"] == "1" and decode.env["LMCACHE_NIXL_RECEIVER_HOST"] == "0.0.0.0"
    assert all(validate_path(path, v).ok for v in ("0.9.0", "0.13.0", "0.32.0"))


# -- which config the chart renders -------------------------------------------------------------
def test_kv_role_and_the_v0_engine(tmp_path: Path) -> None:
    path = write(tmp_path, model("enabled: true\nkvRole: kv_producer", 'v0: "1"'))
    (artifact,) = read(path).artifacts
    assert artifact.data == {"kv_connector": "LMCacheConnector", "kv_role": "kv_producer"}
    assert artifact.env["VLLM_USE_V1"] == "0"
    assert validate_path(path, "0.9.0").ok
    assert not validate_path(path, "0.13.0").ok  # V0 connectors are gone there


def test_enable_pd_without_nixl_role_renders_json_vllm_refuses(tmp_path: Path) -> None:
    path = write(tmp_path, model("enabled: true\nenablePD: true"))
    (error,) = problems(path, kind="error")
    assert error.where.endswith(":7 servingEngineSpec.modelSpec[0].lmcacheConfig.enablePD")
    assert "nixlRole" in error.fix


def test_enable_pd_false_still_renders_the_pd_config(tmp_path: Path) -> None:
    path = write(tmp_path, model("enabled: true\nenablePD: false\nnixlRole: sender"))
    (artifact,) = read(path).artifacts
    assert "kv_connector_extra_config" in artifact.data and "LMCACHE_NIXL_ROLE" not in artifact.env
    (dropped,) = problems(path, kind="dropped")  # 'false' does not happen: an error (issue 40 rule)
    assert "tests only that the key exists" in dropped.message and dropped.severity == "error"


def test_ray_template_keeps_the_old_v1_rule_and_ignores_kv_role(tmp_path: Path) -> None:
    ray = "    raySpec:\n      enabled: true\n"
    old = read(write(tmp_path, model("enabled: true", "maxModelLen: 4096", ray))).artifacts[0]
    assert old.data == {"kv_connector": "LMCacheConnector", "kv_role": "kv_both"}
    assert old.env["VLLM_USE_V1"] == "0"
    path = write(tmp_path, model("enabled: true\nkvRole: kv_consumer", 'v1: "1"', ray))
    assert read(path).artifacts[0].data == {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
    (dropped,) = problems(path, kind="dropped")
    assert dropped.where.endswith("lmcacheConfig.kvRole")


def test_disabled_models_and_engines_render_nothing(tmp_path: Path) -> None:
    off = write(tmp_path, model("enabled: true", extra="    enabled: false\n"))
    with pytest.raises(UsageError, match="renders vLLM without KV transfer"):
        read(off)
    engine = write(tmp_path, model("enabled: true").replace("servingEngineSpec:\n",
                                                               "servingEngineSpec:\n  enableEngine: false\n"))
    found = read(engine)
    assert not found.artifacts and "renders no vLLM deployment" in found.problems[0].message


# -- what the chart drops -----------------------------------------------------------------------
def test_lmcache_settings_without_enabled_are_dropped(tmp_path: Path) -> None:
    path = write(tmp_path, model('cpuOffloadingBufferSize: "20"'))
    (dropped,) = read(path).problems
    assert dropped.dropped and "without enabled: true" in dropped.message
    with pytest.raises(UsageError):  # `enabled: false` says it on purpose: nothing to check
        read(write(tmp_path, model('enabled: false\ncpuOffloadingBufferSize: "20"')))


def test_keys_the_chart_never_reads_are_dropped(tmp_path: Path) -> None:
    path = write(tmp_path, model('enabled: true\nremoteUrl: "lm://cache:80"\ncpuOffloadBufferSize: "20"'))
    remote, typo = problems(path, kind="dropped")
    assert remote.where.endswith("lmcacheConfig.remoteUrl") and "cacheserverSpec.enabled" in remote.fix
    assert "did you mean 'cpuOffloadingBufferSize'?" in typo.fix


@pytest.mark.parametrize(("size", "dropped"), [('"20"', False), ("20", False), ("0", False), ('"0"', False),
                                              ("0.5", True), ('"1.5"', True), ('"20GB"', True)])
def test_cpu_buffer_the_chart_reads_as_zero(tmp_path: Path, size: str, dropped: bool) -> None:
    path = write(tmp_path, model(f"enabled: true\ncpuOffloadingBufferSize: {size}"))
    assert bool(problems(path, kind="dropped")) is dropped
    env = read(path).artifacts[0].env
    assert ("LMCACHE_MAX_LOCAL_CPU_SIZE" in env) is (size in ('"20"', "20"))


def test_disk_buffer_needs_a_local_disk_the_chart_does_not_set(tmp_path: Path) -> None:
    path = write(tmp_path, model('enabled: true\ndiskOffloadingBufferSize: "50"'))
    (dropped,) = problems(path, kind="dropped")
    assert "LMCACHE_LOCAL_DISK" in dropped.message
    disk = "    env:\n    - name: LMCACHE_LOCAL_DISK\n      value: file:///data/lmcache/\n"
    path = write(tmp_path, model('enabled: true\ndiskOffloadingBufferSize: "50"', extra=disk))
    assert not problems(path, kind="dropped")
    assert read(path).artifacts[0].env["LMCACHE_MAX_LOCAL_DISK_SIZE"] == "50"


def test_v1_key_of_old_charts_is_not_read(tmp_path: Path) -> None:
    path = write(tmp_path, model("enabled: true", 'v1: "0"'))
    assert read(path).artifacts[0].data["kv_connector"] == "LMCacheConnectorV1"
    (dropped,) = problems(path, kind="dropped")
    assert 'v0: "1"' in dropped.fix


# -- vllmConfig.extraArgs -----------------------------------------------------------------------
EXTRA = 'extraArgs:\n- "--kv-transfer-config"\n- \'{"kv_connector":"MooncakeConnector","kv_role":"kv_producer"}\''


def test_extra_args_config_is_read_as_an_argv(tmp_path: Path) -> None:
    path = write(tmp_path, model(vllm=EXTRA))
    (artifact,) = read(path).artifacts
    assert artifact.data == {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer"}
    assert artifact.lines["kv_transfer_config.kv_connector"] == 8  # the JSON item's line
    assert "vllmConfig.extraArgs[0] (line 7)" in artifact.origin


def test_extra_args_config_loses_to_the_charts_own_flag(tmp_path: Path) -> None:
    path = write(tmp_path, model("enabled: true", EXTRA))
    (artifact,) = read(path).artifacts
    assert artifact.data["kv_connector"] == "LMCacheConnectorV1"
    (dropped,) = problems(path, kind="dropped")
    assert "vLLM keeps the last one" in dropped.message


# -- values.schema.json ---------------------------------------------------------------------------
def test_types_helm_install_refuses(tmp_path: Path) -> None:
    path = write(tmp_path, model('enabled: "true"', "v0: 1\nextraArgs:\n- --max-num-seqs\n- 32"))
    wheres = sorted(p.where.rpartition(" ")[2] for p in problems(path, kind="error"))
    assert wheres == ["servingEngineSpec.modelSpec[0].lmcacheConfig.enabled",
                      "servingEngineSpec.modelSpec[0].vllmConfig.extraArgs[1]",
                      "servingEngineSpec.modelSpec[0].vllmConfig.v0"]


def test_cache_server_url_keeps_the_release_name_as_a_placeholder(tmp_path: Path) -> None:
    top = "cacheserverSpec:\n  enabled: true\n  servicePort: 81\n"
    env = read(write(tmp_path, model("enabled: true", top=top))).artifacts[0].env
    assert env["LMCACHE_REMOTE_URL"] == "lm://{{ .Release.Name }}-cache-server-service:81"


@pytest.mark.parametrize(("value", "expected"), [("20", 20), ("20.0", 20), ("0.5", 0), (0.9, 0), (2.5, 2),
                                                 ("0x10", 16), ("010", 8), (True, 1), ("20GB", 0), (None, 0)])
def test_sprig_int(value: object, expected: int) -> None:
    assert _go_int(value) == expected


def test_env_the_chart_sets_is_not_blamed_on_the_values_file(tmp_path: Path) -> None:
    """The chart exports VLLM_RPC_TIMEOUT, which vLLM 0.32 no longer reads: a warning naming the chart
    (the file cannot change it); a removed name stated in modelSpec.env is the file's: dropped."""
    path = write(tmp_path, model(lmcache="enabled: true\ncpuOffloadingBufferSize: \"20\"",
                                 extra="    env:\n    - name: VLLM_ENABLE_MOE_DP_CHUNK\n      value: \"0\"\n"))
    mine = [p for p in validate_path(path, "0.32.0").problems if "VLLM_ENABLE_MOE_DP_CHUNK" in p.where]
    assert [p.dropped for p in mine] == [True]
    plain = write(tmp_path, model(lmcache="enabled: true\ncpuOffloadingBufferSize: \"20\""))
    [chart] = [p for p in validate_path(plain, "0.32.0").problems if "VLLM_RPC_TIMEOUT" in p.where]
    assert chart.severity == "warning" and not chart.dropped and "production-stack chart" in chart.message
