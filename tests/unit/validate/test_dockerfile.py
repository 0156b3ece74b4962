"""Dockerfiles: the command the final image runs (ENTRYPOINT + CMD as Docker joins them) with the
environment its ENV lines set, read for the configs vLLM gets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvctl.errors import UsageError
from kvctl.validate import validate_path
from kvctl.validate.readers import read

STORE = {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"}


def dockerfile(tmp_path: Path, text: str, name: str = "Dockerfile") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_cmd_of_a_vllm_image_is_the_servers_arguments(tmp_path: Path) -> None:
    """FROM vllm/vllm-openai with only CMD: vLLM's own entrypoint (vllm serve) gets the CMD words."""
    args = json.dumps(["--model", "m", "--kv-transfer-config", json.dumps(STORE)])
    path = dockerfile(tmp_path, f"FROM vllm/vllm-openai:v0.32.0\nENV MOONCAKE_CONFIG_PATH=/m.json PYTHONHASHSEED=0\n"
                                f"CMD {args}\n")
    found = read(path)
    [artifact] = found.artifacts
    assert found.format == "dockerfile" and artifact.data == STORE
    assert artifact.env == {"MOONCAKE_CONFIG_PATH": "/m.json", "PYTHONHASHSEED": "0"}
    assert "vllm serve (line 3)" in artifact.origin
    assert validate_path(path, "0.32.0").ok


def test_entrypoint_and_cmd_join_and_the_last_stage_counts(tmp_path: Path) -> None:
    """A build stage's ENV is not the image's; the legacy `ENV K V` form is read; a bad key in the
    config is located at the CMD line."""
    bad = json.dumps({**STORE, "kv_conector": "x"})
    path = dockerfile(tmp_path, "FROM python:3.11 AS build\nENV VLLM_SERVER_DEV_MODE=1\n\n"
                                "FROM nvidia/cuda:12.8.0-runtime\nENV MOONCAKE_CONFIG_PATH /etc/mooncake.json\n"
                                'ENTRYPOINT ["vllm", "serve"]\n'
                                f'CMD ["m", \\\n     "--kv-transfer-config", {json.dumps(bad)}]\n')
    [artifact] = read(path).artifacts
    assert artifact.env == {"MOONCAKE_CONFIG_PATH": "/etc/mooncake.json"}
    report = validate_path(path, "0.32.0")
    [problem] = [p for p in report.errors if "kv_conector" in p.where]
    assert problem.where.startswith(f"{path}:7 ")


def test_shell_form_cmd_is_a_launch_line(tmp_path: Path) -> None:
    path = dockerfile(tmp_path, "FROM ubuntu:24.04\nENV PYTHONHASHSEED=0\n"
                                f"CMD vllm serve m --kv-transfer-config '{json.dumps(STORE)}'\n",
                      name="Containerfile")
    [artifact] = read(path).artifacts
    assert artifact.data == STORE and artifact.env.get("PYTHONHASHSEED") == "0"


def test_an_own_entrypoint_takes_the_cmd_and_run_lines_are_not_read(tmp_path: Path) -> None:
    """ENTRYPOINT after CMD in the same stage keeps that CMD (Docker resets only an inherited one):
    `python app.py --model m` runs, not vLLM; the RUN line only builds the image."""
    path = dockerfile(tmp_path, "FROM vllm/vllm-openai:v0.32.0\n"
                                f"RUN vllm serve m --kv-transfer-config '{json.dumps(STORE)}' --help\n"
                                'CMD ["--model", "m"]\nENTRYPOINT ["python", "app.py"]\n', name="app.Dockerfile")
    with pytest.raises(UsageError, match="no kv_transfer_config"):
        validate_path(path, "0.32.0")
    cmd_after = dockerfile(tmp_path, 'FROM ubuntu\nENTRYPOINT ["vllm", "serve"]\n'
                                     f'CMD ["m", "--kv-transfer-config", {json.dumps(json.dumps(STORE))}]\n')
    assert [a.data for a in read(cmd_after).artifacts] == [STORE]
