"""Two spellings real configs use that kvctl read wrongly: Python's `dict(k=v)` (Ray Serve's docs
build engine_kwargs so) and a Helm chart's template YAML, whose `{{ ... }}` actions are not YAML."""

from __future__ import annotations

from pathlib import Path

from kvctl.validate import validate_path
from kvctl.validate.readers import read


def test_dict_calls_are_read_as_the_mapping_they_build(tmp_path: Path) -> None:
    path = tmp_path / "serve.py"
    path.write_text("from ray.serve.llm import LLMConfig\n"
                    "cfg = LLMConfig(\n"
                    "    engine_kwargs=dict(\n"
                    "        kv_transfer_config=dict(\n"
                    "            kv_connector='MooncakeStoreConnector',\n"
                    "            kv_role='kv_both',\n"
                    "            kv_connector_extra_config=dict(cache_prefx='rl'),\n"
                    "        ),\n"
                    "    ),\n"
                    ")\n")
    [artifact] = read(path).artifacts
    assert artifact.data == {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both",
                             "kv_connector_extra_config": {"cache_prefx": "rl"}}
    [typo] = validate_path(path, "0.32.0").dropped
    assert typo.where.startswith(f"{path}:7 ") and "did you mean 'cache_prefix'?" in typo.fix


def test_a_helm_template_is_read_with_its_actions_as_placeholders(tmp_path: Path) -> None:
    """Actions alone on a line (if/end, toYaml) are blanked; the others are values kvctl does not
    judge; line numbers stay the template's. Before, the YAML error sent it to the launch-line
    reader, which reported '--kv-transfer-config has no value'."""
    path = tmp_path / "deployment.yaml"
    path.write_text("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {{ .Release.Name }}-vllm\n"
                    "spec:\n  template:\n    spec:\n      containers:\n      - name: vllm\n"
                    "        image: \"{{ .Values.image }}\"\n"
                    "        {{- if .Values.env }}\n        env: {{ toYaml .Values.env | nindent 8 }}\n"
                    "        {{- end }}\n        args:\n        - {{ .Values.model }}\n"
                    "        - --kv-transfer-config\n"
                    "        - '{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"{{ .Values.role }}\",\"kv_rank\":1}'\n")
    [artifact] = read(path).artifacts
    assert artifact.data["kv_connector"] == "NixlConnector" and "container 'vllm'" in artifact.origin
    report = validate_path(path, "0.32.0")
    [removed] = report.errors
    assert removed.where.startswith(f"{path}:17 ") and "kv_rank" in removed.where
    assert not [p for p in report.problems if "kv_role" in p.where]  # filled in by the chart


def test_an_env_file_is_the_servers_environment_and_its_configs(tmp_path: Path) -> None:
    """docker --env-file / systemd EnvironmentFile: KEY=value lines. A value holding a config is
    checked with the file's environment; an unknown VLLM_ name is located at its line."""
    path = tmp_path / "vllm.env"
    path.write_text("# for the vllm unit\nPYTHONHASHSEED=0\nVLLM_SERVER_DEV_MODE=1\n"
                    "KV_TRANSFER_CONFIG='{\"kv_connector\":\"MooncakeStoreConnector\",\"kv_role\":\"kv_both\"}'\n"
                    "VLLM_ENABLE_MOE_DP_CHUNK=0\n")
    found = read(path)
    kv, env = found.artifacts
    assert kv.kind == "kv_transfer_config" and kv.env["PYTHONHASHSEED"] == "0" and env.kind == "env"
    report = validate_path(path, "0.32.0")
    [missing] = [p for p in report.errors if "MOONCAKE_CONFIG_PATH" in p.message and not p.dropped]
    [unread] = report.dropped
    assert unread.where == f"{path}:5 env.VLLM_ENABLE_MOE_DP_CHUNK"


def test_annotated_json_is_read_and_its_comments_judged_where_vllm_parses_it(tmp_path: Path) -> None:
    """`# ...` / `// ...` in a mooncake.json: refused where a connector json.loads the file (the V0
    pipe on 0.9.0 with VLLM_USE_V1=0, the store connector), moot where none reads it (dropped)."""
    path = tmp_path / "mooncake.json"
    path.write_text('{\n  "metadata_server": "P2PHANDSHAKE",  // or etcd://\n'
                    '  "master_server_address": "127.0.0.1:50051",\n  "protocol": "tcp"\n}\n')
    [artifact] = read(path).artifacts
    assert artifact.kind == "mooncake" and artifact.json_comments == 2
    [refused] = [p for p in validate_path(path, "0.32.0").errors if "comments are not JSON" in p.message]
    assert refused.where == f"{path}:2" and "MooncakeStoreConnector" in refused.message
    pipe = tmp_path / "pipe.json"  # a V0 pipe config: on 0.13 no connector reads it
    pipe.write_text('{"prefill_url": "h:13003", # the prefill node\n "decode_url": "h:13103", "metadata_server": "h:2379"}\n')
    moot = validate_path(pipe, "0.13.0")
    assert not [p for p in moot.problems if "comments" in p.message] and moot.dropped


def test_args_are_judged_by_vllms_parser_only_where_vllm_gets_them(tmp_path: Path) -> None:
    """KServe's predictor args go to KServe's own server (--model_name, --backend are its flags):
    not judged. A container of vLLM's image without a command runs vllm serve: its args are."""
    ktc = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
    kserve = tmp_path / "isvc.yaml"
    kserve.write_text("apiVersion: serving.kserve.io/v1beta1\nkind: InferenceService\nmetadata:\n  name: q\n"
                      "spec:\n  predictor:\n    model:\n      args:\n      - --model_name=q\n      - --backend=vllm\n"
                      f"      - --kv-transfer-config={ktc}\n")
    assert not [p for p in validate_path(kserve, "0.32.0").errors]
    pod = tmp_path / "pod.yaml"
    pod.write_text("apiVersion: v1\nkind: Pod\nmetadata:\n  name: v\nspec:\n  containers:\n  - name: vllm\n"
                   "    image: vllm/vllm-openai:v0.32.0\n    args: [\"--model\", \"m\", \"--disable-log-requests\",\n"
                   f"           \"--kv-transfer-config\", '{ktc}']\n")
    [removed] = validate_path(pod, "0.32.0").errors
    assert "--disable-log-requests" in removed.where


def test_a_compose_service_is_a_container_with_its_environment(tmp_path: Path) -> None:
    """docker-compose: `command` replaces vLLM's image CMD, so its flags are vllm serve's; the
    service's `environment` (mapping or list) is the server's env, located at its lines."""
    path = tmp_path / "compose.yaml"
    path.write_text("services:\n  prefill:\n    image: vllm/vllm-openai:v0.32.0\n    environment:\n"
                    "      PYTHONHASHSEED: \"0\"\n      VLLM_ENABLE_MOE_DP_CHUNK: \"0\"\n"
                    "    command: [\"--model\", \"m\", \"--disable-log-requests\", \"--kv-transfer-config\",\n"
                    "              '{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_both\"}']\n")
    [artifact] = read(path).artifacts
    assert artifact.env == {"PYTHONHASHSEED": "0", "VLLM_ENABLE_MOE_DP_CHUNK": "0"}
    assert "of service 'prefill'" in artifact.origin
    report = validate_path(path, "0.32.0")
    [flag] = [p for p in report.errors if not p.dropped]
    [unread] = report.dropped
    assert "--disable-log-requests" in flag.where and unread.where == f"{path}:6 env.VLLM_ENABLE_MOE_DP_CHUNK"
