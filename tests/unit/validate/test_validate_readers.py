"""kvctl.validate.readers: every input format people have, read into located configs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvctl.errors import UsageError
from kvctl.validate import load_kv_transfer_config, validate_path
from kvctl.validate.readers import read
from kvctl.validate.readers.shell import tokenize

STORE = {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"}


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def configs(path: Path) -> list[dict]:
    return [a.data for a in read(path).artifacts if a.kind == "kv_transfer_config"]


def line_of(path: Path, dotted: str) -> int:
    """The line read() located `dotted` at, in the only artifact that has it."""
    found = [a.lines[dotted] for a in read(path).artifacts if dotted in a.lines]
    assert len(found) == 1, found
    return found[0]


# -- shell launch lines ---------------------------------------------------------------------
def test_vllm_serve_line_with_continuations_and_multiline_json(tmp_path: Path) -> None:
    path = write(tmp_path, "launch.sh", """#!/bin/bash
# prefill
export MOONCAKE_CONFIG_PATH=/etc/mooncake.json
CUDA_VISIBLE_DEVICES=0 vllm serve Qwen/Qwen2.5-7B \\
    --port 8100 \\
    --kv-transfer-config '{"kv_connector": "MooncakeStoreConnector",
                           "kv_role": "kv_both",
                           "kv_buffer_size": "1e9"}' &
python3 -m vllm.entrypoints.openai.api_server --model m --kv-transfer-config='{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
""")
    found = read(path)
    assert found.format == "launch-line"
    assert [a.data["kv_connector"] for a in found.artifacts] == ["MooncakeStoreConnector", "NixlConnector"]
    first, second = found.artifacts
    assert first.lines["kv_transfer_config.kv_connector"] == 6
    assert first.lines["kv_transfer_config.kv_buffer_size"] == 8  # the key's own line in the JSON
    assert second.lines["kv_transfer_config.kv_role"] == 9
    assert "vllm serve" in first.origin and "python -m vllm.entrypoints.openai.api_server" in second.origin


def test_dotted_and_underscored_flags(tmp_path: Path) -> None:
    path = write(tmp_path, "run.sh", "vllm serve m --kv_transfer_config.kv_connector=LMCacheConnectorV1 "
                 "--kv-transfer-config.kv_role kv_both\n")
    assert configs(path) == [{"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}]


def test_kvctl_own_vllm_args_file_on_its_own(tmp_path: Path) -> None:
    args = f"--kv-transfer-config '{json.dumps(STORE)}'\n"
    path = write(tmp_path, "vllm-args.txt", args)
    assert configs(path) == [STORE]


def test_comments_end_at_the_line_and_do_not_swallow_the_next_command(tmp_path: Path) -> None:
    commands = tokenize("a --x 1 # comment here\nvllm serve m\n")
    assert [[t.text for t in c] for c in commands] == [["a", "--x", "1"], ["vllm", "serve", "m"]]


def test_shell_variables_are_said_not_guessed(tmp_path: Path) -> None:
    path = write(tmp_path, "run.sh", 'vllm serve m --kv-transfer-config "$KV_CONFIG"\n')
    report = validate_path(path, "0.32.0")
    assert report.ok and "$KV_CONFIG, which the script does not set" in report.problems[0].message
    assert report.problems[0].where.startswith(f"{path}:1")


def test_an_unclosed_quote_on_the_launch_line_is_an_error_at_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "run.sh", "echo hi\nvllm serve m --kv-transfer-config '{\"a\": 1}\n")
    (problem,) = read(path).problems
    assert problem.where == f"{path}:2" and problem.severity == "error"
    assert "a ' quote opened on line 2 is never closed" in problem.message
    assert "the --kv-transfer-config there is not checked" in problem.message


# -- verl / Hydra ---------------------------------------------------------------------------
def test_verl_hydra_overrides_whole_and_by_key(tmp_path: Path) -> None:
    path = write(tmp_path, "train.sh", """python3 -m verl.trainer.main_ppo \\
    data.train_batch_size=256 \\
    actor_rollout_ref.rollout.engine_kwargs.vllm.kv_transfer_config='{kv_connector:MooncakeStoreConnector,kv_role:kv_both}' \\
    +actor_rollout_ref.rollout.engine_kwargs.vllm.kv_transfer_config.kv_connector_extra_config.cache_prefix=team-a
""")
    artifact, verl = read(path).artifacts
    assert artifact.data == {**STORE, "kv_connector_extra_config": {"cache_prefix": "team-a"}}
    assert artifact.lines["kv_transfer_config.kv_role"] == 3
    assert artifact.lines["kv_transfer_config.kv_connector_extra_config.cache_prefix"] == 4
    assert artifact.origin.startswith("Hydra override") and artifact.framework == "verl"
    # and the rollout section the overrides build, for verl's own rules (kvctl.validate.verl)
    assert verl.kind == "verl" and [(o.prefix, o.line) for o in verl.data.overrides] == [("", 3), ("+", 4)]
    assert verl.lines["actor_rollout_ref.rollout.engine_kwargs.vllm"] == 3


def test_verl_yaml_with_a_json_string_block_locates_the_key_inside(tmp_path: Path) -> None:
    path = write(tmp_path, "verl.yaml", """actor_rollout_ref:
  rollout:
    engine_kwargs:
      vllm:
        kv_transfer_config: |
          {"kv_connector": "MooncakeStoreConnector",
           "kv_role": "kv_both",
           "kv_rank": 0}
""")
    assert read(path).format == "verl"
    assert line_of(path, "actor_rollout_ref.rollout.engine_kwargs.vllm.kv_transfer_config.kv_rank") == 8


# -- vLLM --config YAML, Kubernetes, docker-compose -----------------------------------------------
def test_vllm_config_yaml_with_dashed_keys(tmp_path: Path) -> None:
    path = write(tmp_path, "config.yaml", "model: m\nport: 8000\nkv-transfer-config:\n"
                 "  kv_connector: MooncakeStoreConnector\n  kv_role: kv_both\n")
    found = read(path)
    assert found.format == "vllm-config" and configs(path) == [STORE]
    assert line_of(path, "kv-transfer-config.kv_role") == 5


K8S = """apiVersion: v1
kind: ConfigMap
metadata: {name: mooncake}
data:
  mooncake.json: |
    {
      "metadata_server": "P2PHANDSHAKE",
      "master_server_address": "mooncake-master:50051",
      "protocol": "tcp",
      "global_segment_size": "4GB",
      "local_buffer_size": "512MB",
      "local_hostnme": "x"
    }
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: vllm}
spec:
  template:
    spec:
      containers:
        - name: prefill
          image: vllm/vllm-openai:v0.23.0
          args:
            - "--model"
            - "Qwen/Qwen3-8B"
            - "--kv-transfer-config"
            - '{"kv_connector":"MooncakeStoreConnector","kv_role":"kv_both"}'
        - name: decode
          command: ["/bin/sh", "-c"]
          args:
            - |
              vllm serve Qwen/Qwen3-8B \\
                --kv-transfer-config '{"kv_connector":"MooncakeStoreConnector","kv_role":"kv_bot"}'
"""


def test_kubernetes_manifest_args_script_and_configmap(tmp_path: Path) -> None:
    path = write(tmp_path, "deploy.yaml", K8S)
    found = read(path)
    assert found.format == "k8s"
    kinds = [(a.kind, a.lines.get(a.where)) for a in found.artifacts]
    assert kinds == [("mooncake", 6), ("kv_transfer_config", 28), ("kv_transfer_config", 34)]
    report = validate_path(path, "0.23.0")
    wheres = {p.where for p in report.problems}
    assert any(w.startswith(f"{path}:34 kv_transfer_config.kv_role") for w in wheres), wheres
    assert any(w.startswith(f"{path}:12 data.mooncake.json.local_hostnme") for w in wheres), wheres


def test_several_different_configs_are_refused_where_one_is_needed(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="2 different kv_transfer_configs"):
        load_kv_transfer_config(write(tmp_path, "deploy.yaml", K8S))


def test_lmcache_config_with_a_mooncake_backend(tmp_path: Path) -> None:
    path = write(tmp_path, "lmcache.yaml", "chunk_size: 256\nlocal_cpu: false\n"
                 "remote_url: mooncakestore://:50051/\nremote_serde: naive\n"
                 "extra_config:\n  master_server_address: localhost:50051\n  metadata_server: P2PHANDSHAKE\n"
                 "  protocol: tcp\n  local_buffer_size: 0\n")
    report = validate_path(path, "0.13.0")
    assert report.kind == "lmcache"
    wheres = [p.where for p in report.errors]
    assert f"{path}:3 lmcache.remote_url" in wheres
    assert f"{path}:9 lmcache.extra_config.local_buffer_size" in wheres


# -- what cannot be read -------------------------------------------------------------------
@pytest.mark.parametrize("text", ["just some words\n", "", "---\n"])
def test_text_without_configs_is_a_usage_error(tmp_path: Path, text: str) -> None:
    with pytest.raises(UsageError):
        validate_path(write(tmp_path, "notes.yaml", text), "0.32.0")


def test_json_error_object_on_stdout_for_exit_2(tmp_path: Path) -> None:
    path = write(tmp_path, "bad.json", "{nope")
    run = subprocess.run([sys.executable, "-m", "kvctl", "config", "validate", str(path),
                          "--vllm-version", "0.32.0", "--json"], capture_output=True, text=True)
    assert run.returncode == 2
    body = json.loads(run.stdout)
    assert body["ok"] is False and "not valid JSON" in body["error"]["message"]
    assert body["error"]["exit_code"] == 2


# -- Python -----------------------------------------------------------------------------------
def test_python_building_a_kv_transfer_config(tmp_path: Path) -> None:
    path = write(tmp_path, "run.py", """import os
from vllm import LLM
from vllm.config import KVTransferConfig
os.environ["VLLM_USE_V1"] = "0"
ktc = KVTransferConfig(
    kv_connector="MooncakeStoreConnector",
    kv_role=role,
)
llm = LLM(model="m", kv_transfer_config={"kv_connector": "NixlConnector", "kv_role": "kv_both"})
other = KVTransferConfig.from_cli('{"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}')
""")
    found = read(path)
    assert found.format == "python"
    first, *_ = found.artifacts
    assert [a.data["kv_connector"] for a in found.artifacts] == [
        "MooncakeStoreConnector", "NixlConnector", "LMCacheConnectorV1"]
    assert first.data["kv_role"] == "${role}"  # not a literal: a placeholder, not a guess
    assert first.lines["kv_transfer_config.kv_connector"] == 6
    assert first.env == {"VLLM_USE_V1": "0"}
    # the V0 store connector of 0.9.0 runs under VLLM_USE_V1=0, which the file sets
    report = validate_path(path, "0.9.0")
    assert not [p for p in report.errors if "V0 connector" in p.message]


def test_yaml_anchors_and_aliases_of_real_manifests_are_read(tmp_path: Path) -> None:
    """Shared env blocks (&env_common / *env_common) are common in CI and k8s YAML."""
    path = write(tmp_path, "ci.yaml", "common: &env_common {VLLM_USE_V1: '1'}\n"
                 "servers:\n  - envs: *env_common\n    args: ['--kv-transfer-config', "
                 "'{\"kv_connector\": \"NixlConnector\", \"kv_role\": \"kv_both\"}']\n")
    assert configs(path) == [{"kv_connector": "NixlConnector", "kv_role": "kv_both"}]


# -- hostile input --------------------------------------------------------------------------
def test_nesting_too_deep_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    report = validate_path(write(tmp_path, "run.sh", f"vllm serve m --kv-transfer-config '{deep}'\n"), "0.32.0")
    assert any("nested too deeply" in p.message for p in report.errors)
    inner = '{"a":' * 3000 + "1" + "}" * 3000
    report = validate_path(write(tmp_path, "c.yaml", f"kv_transfer_config: '{inner}'\n"), "0.32.0")
    assert any("nested too deeply" in p.message for p in report.errors)
    with pytest.raises(UsageError, match="not valid Python"):
        read(write(tmp_path, "x.py", "x = " + "(" * 300_000 + ")" * 300_000 + "\n"))


def test_huge_inputs_are_refused_before_reading(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="more than kvctl reads as a launch script"):
        read(write(tmp_path, "run.sh", "echo hi\n" * 200_000))
    with pytest.raises(UsageError, match="more than kvctl reads"):
        read(write(tmp_path, "c.yaml", "a: b\n" * 4_000_000))


# -- shell scripts read command by command (issue 27) -----------------------------------------
PREAMBLE = '''#!/usr/bin/env bash
set -euo pipefail
DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "${DIR}/env.sh"
MODEL=${MODEL:-"Qwen/Qwen3-8B"}
'''


def test_a_bash_source_preamble_does_not_stop_the_reader(tmp_path: Path) -> None:
    filler = "".join(f"echo step {i}\n" for i in range(20))
    path = write(tmp_path, "run.sh", PREAMBLE + filler + "vllm serve $MODEL \\\n"
                 f"  --kv-transfer-config '{json.dumps(STORE)}'\n")
    found = read(path)
    (artifact,) = found.artifacts
    assert artifact.data == STORE and artifact.lines["kv_transfer_config"] == 27
    assert artifact.origin == "vllm serve (line 27)"
    assert len(found.problems) <= 1 and not [p for p in found.problems if p.severity == "error"]


def test_an_unclosed_quote_on_one_line_is_said_there_and_later_configs_are_found(tmp_path: Path) -> None:
    path = write(tmp_path, "run.sh", "echo starting\necho it's time\n"
                 f"vllm serve m --kv-transfer-config '{json.dumps(STORE)}'\n")
    found = read(path)
    assert [a.lines["kv_transfer_config"] for a in found.artifacts] == [3]
    (note,) = found.problems
    assert note.where == f"{path}:2" and note.severity == "warning"
    assert "kvctl skipped line 2 and read the rest of the file" in note.message


def test_continuations_and_quotes_inside_command_substitutions(tmp_path: Path) -> None:
    path = write(tmp_path, "run.sh", 'HOST_IP="$(hostname -I \\\n  | awk \'{print $1}\')"\n'
                 'PORT=`python -c "print(8000 + ${RANK:-0})"`\n'
                 f"vllm serve m --port $PORT --kv-transfer-config '{json.dumps(STORE)}'\n")
    found = read(path)
    assert [a.lines["kv_transfer_config"] for a in found.artifacts] == [4] and not found.problems


def test_heredoc_bodies_and_configs_after_them(tmp_path: Path) -> None:
    path = write(tmp_path, "run.sh", "cat > /tmp/mooncake.json <<'EOF'\n"
                 '{"metadata_server": "P2PHANDSHAKE", "master_server_address": "m:50051",\n'
                 ' "protocol": "tcp"}\nEOF\n'
                 "cat <<-EOT\n\tit's a body, not a quote\n\tEOT\n"
                 f"MOONCAKE_CONFIG_PATH=/tmp/mooncake.json vllm serve m --kv-transfer-config '{json.dumps(STORE)}'\n")
    found = read(path)
    assert [(a.kind, a.lines[a.where]) for a in found.artifacts] == [("mooncake", 2), ("kv_transfer_config", 8)]
    assert found.artifacts[1].env["MOONCAKE_CONFIG_PATH"] == "/tmp/mooncake.json" and not found.problems


def test_arrays_case_if_and_functions(tmp_path: Path) -> None:
    path = write(tmp_path, "run.sh", """ARGS=(
  --port 8000   # the port
  --kv-transfer-config '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}'
)
case "$ROLE" in
  prefill) vllm serve m --kv-transfer-config '{"kv_connector": "NixlConnector", "kv_role": "kv_producer"}' ;;
esac
start() {
  if [ -n "$X" ]; then vllm serve m --kv-transfer-config '{"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}'; fi
}
vllm serve m "${ARGS[@]}"
""")
    found = read(path)
    assert [(a.data["kv_role"], a.lines["kv_transfer_config"], a.origin) for a in found.artifacts] == [
        ("kv_both", 3, "array ARGS (line 3)"), ("kv_producer", 6, "vllm serve (line 6)"),
        ("kv_consumer", 9, "vllm serve (line 9)")]
    assert not found.problems


def test_a_json_config_in_a_variable_nothing_uses_is_found(tmp_path: Path) -> None:
    path = write(tmp_path, "env.sh", """export KV_TRANSFER_CONFIG='{"kv_connector": "MooncakeStoreConnector",
  "kv_role": "kv_both"}'
KV_CFG="{\\"kv_connector\\":\\"NixlConnector\\",\\"kv_role\\":\\"kv_both\\"}"
setup() {
  local lm='{kv_connector: LMCacheConnectorV1, kv_role: kv_both}'
}
MC='{"master_server_address": "m:50051", "metadata_server": "P2PHANDSHAKE"}' python launch.py
""")
    found = read(path)
    assert [(a.kind, a.lines[a.where], a.origin) for a in found.artifacts] == [
        ("kv_transfer_config", 1, "variable KV_TRANSFER_CONFIG (line 1)"),
        ("kv_transfer_config", 3, "variable KV_CFG (line 3)"),
        ("kv_transfer_config", 5, "variable lm (line 5)"),
        ("mooncake", 7, "variable MC (line 7)")]
    assert found.artifacts[0].lines["kv_transfer_config.kv_role"] == 2
    assert found.artifacts[2].data == {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}


def test_a_variable_a_flag_uses_is_one_config_located_in_the_variable(tmp_path: Path) -> None:
    path = write(tmp_path, "run.sh", f"""KV_CONFIG='{json.dumps(STORE)}'
VLLM_USE_V1=1 vllm serve m --kv-transfer-config "$KV_CONFIG"
vllm serve m --kv-transfer-config '{json.dumps(STORE)}'
""")
    found = read(path)
    assert [(a.lines["kv_transfer_config"], a.origin) for a in found.artifacts] == [
        (1, "vllm serve (line 2), its value from KV_CONFIG (line 1)"), (3, "vllm serve (line 3)")]
    assert found.artifacts[0].env == {"VLLM_USE_V1": "1"}


def test_an_error_in_a_variable_is_reported_once_at_the_key(tmp_path: Path) -> None:
    path = write(tmp_path, "run.sh", 'KV=\'{"kv_connector": "MooncakeStoreConnector",\n "kv_role": "kv_bot"}\'\n'
                 'vllm serve m --kv-transfer-config "$KV"\n')
    report = validate_path(path, "0.32.0")
    assert [p.where for p in report.errors] == [f"{path}:2 kv_transfer_config.kv_role"]


def test_many_commands_kvctl_cannot_split_are_bounded(tmp_path: Path) -> None:
    """Each skip rescans to the end of the text: hostile input stops after MAX_SKIPPED notes."""
    from kvctl.validate.readers.shell_words import MAX_SKIPPED

    path = write(tmp_path, "run.sh", 'echo "unclosed $(\n' * 20_000)
    problems = read(path).problems
    assert len(problems) == MAX_SKIPPED and "kvctl stopped reading" in problems[-1].message


# -- Python: names followed, the API per release (issue 27) -----------------------------------
PY_VARIABLES = '''import json
from vllm import LLM
from vllm.config import KVTransferConfig

kv_config = {
    "kv_connector": "MultiConnector",
    "kv_role": "kv_both",
    "kv_connector_extra_config": {"connectors": [
        {"kv_connector": "NixlConnector", "kv_role": "kv_both"},
        {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"},
    ]},
}
spare = {"kv_connector": "NixlConnector", "kv_role": "kv_producer"}
prefill = LLM(model="m", kv_transfer_config=kv_config)
decode = dict(engine_kwargs={"kv_transfer_config": kv_config})
ktc = KVTransferConfig(**spare)
'''


def test_python_dicts_in_variables_are_followed_and_found_once(tmp_path: Path) -> None:
    path = write(tmp_path, "serve.py", PY_VARIABLES)
    found = read(path).artifacts
    assert [(a.lines["kv_transfer_config"], a.origin) for a in found] == [
        (5, "Python (line 14), its value from kv_config (line 5)"),
        (13, "Python (line 16), its value from spare (line 13)")]
    assert found[0].lines["kv_transfer_config.kv_connector_extra_config.connectors[1].kv_connector"] == 10


def test_python_dict_in_a_variable_nothing_passes_on(tmp_path: Path) -> None:
    path = write(tmp_path, "cfg.py", 'KV = {"kv_connector": "NixlConnector",\n      "kv_role": "kv_bot"}\n')
    (artifact,) = read(path).artifacts
    assert artifact.origin == "variable KV (line 1)"
    assert [p.where for p in validate_path(path, "0.32.0").errors] == [f"{path}:2 kv_transfer_config.kv_role"]


@pytest.mark.parametrize(("version", "gone"), [("0.8.5", False), ("0.8.5.post1", False), ("0.9.0", True),
                                               ("0.13.0", True), ("0.32.0", True)])
def test_kv_transfer_config_from_cli_is_gone_since_0_9_0(tmp_path: Path, version: str, gone: bool) -> None:
    """vllm/config.py:3288 of 0.8.5(.post1) has KVTransferConfig.from_cli; 0.9.0 and later do not."""
    path = write(tmp_path, "run.py", "import json\nfrom vllm.config import KVTransferConfig\n"
                 'TEXT = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"})\n'
                 "ktc = KVTransferConfig.from_cli(TEXT)\n")
    (artifact,) = read(path).artifacts
    assert artifact.calls == ("KVTransferConfig.from_cli",) and artifact.data["kv_connector"] == "NixlConnector"
    errors = [p for p in validate_path(path, version).errors if "from_cli" in p.message]
    assert bool(errors) is gone
    if gone:
        assert errors[0].where == f"{path}:4 KVTransferConfig.from_cli"
        assert "gone since vLLM 0.9.0" in errors[0].message and "AttributeError" in errors[0].message
        assert "KVTransferConfig(**json.loads(text))" in errors[0].fix


# -- Kubernetes: every origin names its container and the args item (issue 27) -------------------
LWS = """apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
metadata: {name: vllm}
spec:
  leaderWorkerTemplate:
    leaderTemplate:
      spec:
        initContainers:
          - name: setup
            image: busybox
            command: ["sh", "-c", "vllm serve m --kv-transfer-config '{\\"kv_connector\\":\\"NixlConnector\\",\\"kv_role\\":\\"kv_both\\"}'"]
        containers:
          - image: vllm/vllm-openai
            args: ["vllm serve m --kv-transfer-config '{\\"kv_connector\\":\\"NixlConnector\\",\\"kv_role\\":\\"kv_producer\\"}'"]
          - name: decode
            env:
              - name: KV_CFG
                value: '{"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}'
            command: ["vllm", "serve"]
            args: ["m", "--port", "8000", "--kv-transfer-config", "$(KV_CFG)"]
          - name: sidecar
            env:
              - {name: UNUSED_CFG, value: '{"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}'}
"""


def test_kubernetes_origins_name_the_container_and_the_item(tmp_path: Path) -> None:
    path = write(tmp_path, "lws.yaml", LWS)
    found = [(a.data["kv_role"], a.lines["kv_transfer_config"], a.origin) for a in read(path).artifacts]
    assert found == [
        ("kv_both", 11, "vllm serve (line 11) in command[2] of init container 'setup'"),
        ("kv_producer", 14, "vllm serve (line 14) in args[0] of unnamed container 1"),
        ("kv_consumer", 18, "--kv-transfer-config at args[3] of container 'decode' (line 18)"),
        ("kv_both", 23, "env UNUSED_CFG of container 'sidecar' (line 23)"),
    ]


def test_a_helm_rendered_argv_list_names_its_item(tmp_path: Path) -> None:
    path = write(tmp_path, "args.yaml", f"- --model\n- m\n- --kv-transfer-config\n- '{json.dumps(STORE)}'\n")
    (artifact,) = read(path).artifacts
    assert artifact.origin == "--kv-transfer-config at item [2] of the top-level list (line 4)"


def test_compose_environment_entries_holding_a_config(tmp_path: Path) -> None:
    path = write(tmp_path, "docker-compose.yaml", f"""services:
  prefill:
    image: vllm/vllm-openai
    environment:
      - 'KV_TRANSFER_CONFIG={json.dumps(STORE)}'
  decode:
    environment:
      KV_TRANSFER_CONFIG: '{json.dumps(STORE)}'
""")
    assert [(a.lines["kv_transfer_config"], a.origin) for a in read(path).artifacts] == [
        (5, "KV_TRANSFER_CONFIG in environment[0] of service 'prefill' (line 5)"),
        (8, "environment.KV_TRANSFER_CONFIG of service 'decode' (line 8)")]


def test_a_config_only_in_a_comment_is_said(tmp_path: Path) -> None:
    path = write(tmp_path, "serve.sh", "# usage: bash serve.sh \\\n"
                 "#   +engine_kwargs.kv_transfer_config.kv_connector=NixlConnector\nvllm serve m\n")
    report = validate_path(path, "0.32.0")
    (problem,) = report.problems
    assert report.ok and problem.where == f"{path}:2" and "in a comment" in problem.message


def test_a_templated_script_is_read_as_a_script(tmp_path: Path) -> None:
    path = write(tmp_path, "launch.sh.j2", f"vllm serve {{{{ model }}}} --kv-transfer-config '{json.dumps(STORE)}'\n")
    assert read(path).format == "launch-line" and configs(path) == [STORE]
