"""Issue 40 item 3: a config counts only if it reaches vLLM. A script that hands its JSON to vLLM
through a flag vLLM's parser refuses (--kv-connector-config, --kv-connector-extra-config) fails
even when the JSON is fine: the command never starts, and the config would not be vLLM's."""

from __future__ import annotations

import json
from pathlib import Path

from kvctl.validate import validate_path

STORE = {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"}


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_config_passed_through_a_flag_vllm_refuses(tmp_path: Path) -> None:
    path = write(tmp_path, "run.sh", f"""export MOONCAKE_CONFIG_PATH=/etc/mooncake.json
VLLM_KV_TRANSFER_CONFIG='{json.dumps(STORE)}'
vllm serve m \\
  --kv-connector-config "$VLLM_KV_TRANSFER_CONFIG"
""")
    report = validate_path(path, "0.32.0")
    [error] = report.errors
    assert error.where.startswith(f"{path}:4 --kv-connector-config")
    assert "unrecognized arguments" in error.message and "never reaches vLLM" in error.message
    assert "--kv-transfer-config" in error.fix


def test_an_extra_config_flag_is_refused_too(tmp_path: Path) -> None:
    path = write(tmp_path, "run.sh", "vllm serve m --kv-connector-extra-config='{\"backend\": \"mooncake\"}'\n")
    report = validate_path(path, "0.32.0")
    assert [p.where.split()[1] for p in report.errors] == ["--kv-connector-extra-config"]
    assert "never reaches vLLM" in report.errors[0].message


def test_the_right_flag_still_passes(tmp_path: Path) -> None:
    path = write(tmp_path, "run.sh", f"""export MOONCAKE_CONFIG_PATH=/etc/mooncake.json
vllm serve m --kv-transfer-config '{json.dumps(STORE)}'
""")
    assert validate_path(path, "0.32.0").ok


def test_container_args_carry_the_config_through_a_refused_flag(tmp_path: Path) -> None:
    path = write(tmp_path, "deploy.yaml", f"""apiVersion: v1
kind: Pod
metadata: {{name: p}}
spec:
  containers:
  - name: vllm
    image: vllm/vllm-openai:v0.32.0
    env:
    - {{name: MOONCAKE_CONFIG_PATH, value: /etc/m.json}}
    args: ["--model", "m", "--kv-connector-config", '{json.dumps(STORE)}']
""")
    report = validate_path(path, "0.32.0")
    assert any("--kv-connector-config" in p.where and "never reaches vLLM" in p.message for p in report.errors), \
        [p.message for p in report.problems]


def test_a_config_exported_in_a_variable_vllm_never_reads(tmp_path: Path) -> None:
    path = write(tmp_path, "run.sh", f"""export MOONCAKE_CONFIG_PATH=/etc/mooncake.json
export VLLM_KV_TRANSFER_CONFIG='{json.dumps(STORE)}'
vllm serve m
""")
    report = validate_path(path, "0.32.0")
    assert [p.where.split()[-1] for p in report.errors] == ["env.VLLM_KV_TRANSFER_CONFIG"]
    assert report.errors[0].dropped and "does not read VLLM_KV_TRANSFER_CONFIG" in report.errors[0].message


def test_kv_transfer_config_fields_written_as_options(tmp_path: Path) -> None:
    """`--kv-connector X --kv-role kv_both` (seen in published launch docs): vLLM's parser has no such
    options (serve-flag facts, every release); each is said as a field that belongs in the JSON."""
    path = write(tmp_path, "run.sh", "python -m vllm.entrypoints.openai.api_server --model m \\\n"
                 "  --kv-connector OffloadingConnector --kv-role kv_both \\\n"
                 "  --kv-connector-extra-config '{\"cpu_bytes_to_use\": 8000000000}'\n")
    report = validate_path(path, "0.32.0")
    assert sorted(p.where.split()[1] for p in report.errors) == [
        "--kv-connector", "--kv-connector-extra-config", "--kv-role"]
    assert all("field of kv_transfer_config" in p.message and "--kv-transfer-config" in p.fix for p in report.errors)
