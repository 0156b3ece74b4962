"""Launch lines with an option the vLLM release does not have (kvctl.validate.serve_flags), through the
real readers, at the release boundaries kvctl's facts give (section serve_flags of vllm_facts.json,
read from each release's parser by tools/capabilities/cli_facts.py)."""

from __future__ import annotations

from pathlib import Path

from kvctl.facts.capabilities import table
from kvctl.facts.serve_flags import first_in, removed_in, serve_options
from kvctl.validate import validate_path
from kvctl.validate.serve_flags import option_of, resolve

RELEASES = table().facts["releases"]
NEWEST = RELEASES[-1]
REMOVED = "--disable-log-requests"  # deprecated through 0.16.0 (engine/arg_utils.py:2087-2093), gone in 0.17.0
LAST_WITH = "0.16.0"
GONE = RELEASES[RELEASES.index(LAST_WITH) + 1]
ADDED = "--moe-backend"  # first in 0.17.0 (a KernelConfig field, engine/arg_utils.py)
CONFIG = "--kv-transfer-config '{\"kv_connector\": \"NixlConnector\", \"kv_role\": \"kv_both\"}'"


def _report(tmp_path: Path, text: str, version: str, name: str = "launch.sh"):
    path = tmp_path / name
    path.write_text(text)
    return validate_path(path, version)


def _flag_errors(report) -> list:
    return [p for p in report.errors if "argument parser refuses" in p.message]


def test_the_boundaries_come_from_the_facts() -> None:
    assert GONE == "0.17.0" and removed_in(REMOVED, GONE) == GONE and removed_in(REMOVED, LAST_WITH) is None
    assert serve_options(LAST_WITH)[REMOVED].deprecated and REMOVED not in serve_options(GONE)
    assert first_in(ADDED, LAST_WITH) == GONE and ADDED in serve_options(GONE)


def test_removed_flag_refused_from_the_release_that_dropped_it(tmp_path: Path) -> None:
    text = f"vllm serve Qwen/Qwen3-0.6B \\\n  --port 8100 \\\n  {REMOVED} \\\n  {CONFIG}\n"
    assert _flag_errors(_report(tmp_path, text, LAST_WITH)) == []
    for version in (GONE, NEWEST):
        [problem] = _flag_errors(_report(tmp_path, text, version))
        assert problem.where == f"{tmp_path / 'launch.sh'}:3 {REMOVED}"
        assert f"removed in vLLM {GONE}" in problem.message and "unrecognized arguments" in problem.message
        assert f"remove {REMOVED}" in problem.fix


def test_flag_of_a_later_release_and_underscore_and_equals_forms(tmp_path: Path) -> None:
    text = f"python -m vllm.entrypoints.openai.api_server --model m --moe_backend=auto {CONFIG}\n"
    [problem] = _flag_errors(_report(tmp_path, text, LAST_WITH))
    assert f"added in vLLM {GONE}" in problem.message and "upgrade vLLM" in problem.fix
    assert _flag_errors(_report(tmp_path, text, GONE)) == []


def test_misspelled_flag_did_you_mean(tmp_path: Path) -> None:
    text = f"vllm serve m --gpu-memory-utilisation 0.9 {CONFIG}\n"
    [problem] = _flag_errors(_report(tmp_path, text, NEWEST))
    assert "no vLLM release kvctl knows" in problem.message
    assert "did you mean --gpu-memory-utilization?" in problem.fix


def test_abbreviations_as_argparse_reads_them(tmp_path: Path) -> None:
    accepted = set(serve_options(NEWEST))
    assert resolve("--gpu-memory-util", accepted) == ("prefix", ["--gpu-memory-utilization"])
    assert resolve("--enable", accepted)[0] == "ambiguous"
    text = f"vllm serve m --gpu-memory-util 0.9 --enable {CONFIG}\n"
    [problem] = _flag_errors(_report(tmp_path, text, NEWEST))
    assert problem.where.endswith(":1 --enable") and "ambiguous option" in problem.message


def test_placeholders_dotted_and_short_options_are_not_judged(tmp_path: Path) -> None:
    assert [option_of(w) for w in ("--$FLAG", "--kv-transfer-config.kv_role", "-tp", "--", "8")] == [None] * 5
    text = ("EXTRA_ARGS='--not-a-vllm-flag'\n"
            f"vllm serve m $EXTRA_ARGS \"${{ARGS[@]}}\" --$NAME 1 -tp 2 --kv-transfer-config.kv_role kv_both "
            f"{CONFIG} -- --after-double-dash\n")
    assert _flag_errors(_report(tmp_path, text, NEWEST)) == []


def test_k8s_container_args(tmp_path: Path) -> None:
    manifest = """apiVersion: v1
kind: Pod
metadata: {name: vllm}
spec:
  containers:
  - name: vllm
    image: vllm/vllm-openai:v0.17.0
    command: ["vllm", "serve"]
    args:
    - Qwen/Qwen3-0.6B
    - --disable-log-requests
    - --kv-transfer-config
    - '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}'
"""
    report = _report(tmp_path, manifest, GONE, "pod.yaml")
    [problem] = _flag_errors(report)
    assert problem.where.endswith(f"pod.yaml:11 {REMOVED}")
    assert _flag_errors(_report(tmp_path, manifest, LAST_WITH, "pod.yaml")) == []


def test_a_command_kvctl_does_not_read_as_vllm_is_not_judged(tmp_path: Path) -> None:
    text = f"mooncake_master --rpc_port 50051 --eviction_high_watermark_ratio 0.9\nvllm serve m {CONFIG}\n"
    assert _flag_errors(_report(tmp_path, text, NEWEST)) == []
