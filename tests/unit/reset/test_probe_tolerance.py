"""kvctl probe's tolerance, fitted to each replica (issue 25, finding 8): a correct cache hit in bf16 drifts
from a fresh computation by rounding (tools/gpu/bf16_prefix_logprobs.py, docs/reset.md), so a bf16 replica
gets 0.25 nat, a float32 one 1e-3, an unknown one the bf16 value; --tolerance wins. A flipped token is STALE
whatever the tolerance."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvctl.errors import EXIT_FAILED, EXIT_MATCH, EXIT_STALE
from kvctl.reset.tolerance import FP32_TOLERANCE, HALF_PRECISION_TOLERANCE, tolerance_for
from tests.doubles import DoubleFleet, VllmDouble
from tests.unit.reset.test_probe import LogprobsVllm, answer, write_prompts

TOKENS = ["a", "b", "c", "d"]
FRESH_LOGPROBS = [-0.5, -0.9, -1.2, -0.3]
# what bf16 rounding does to a correct hit: 0.02-0.08 nat per token (tools/gpu/bf16_prefix_logprobs.py)
BF16_DELTAS = [0.02, -0.05, 0.08, 0.03]
SERVED_LOGPROBS = [lp + d for lp, d in zip(FRESH_LOGPROBS, BF16_DELTAS)]


def replica(dtype: str, device: str | None = "cuda", served_tokens: list[str] = TOKENS, **kwargs: Any) -> LogprobsVllm:
    """TEST DOUBLE of a replica whose /server_info says `dtype` on `device`, whose answer as served
    differs from the fresh one by bf16-like deltas (and by the tokens given). The fresh answer's
    top_logprobs leave a clear margin (3 nat) at every token: no near-tie."""
    return LogprobsVllm(fresh=answer(TOKENS, FRESH_LOGPROBS), served=answer(served_tokens, SERVED_LOGPROBS),
                        dtype=dtype, device=device, **kwargs)


def probe_json(cli: Any, tmp_path: Path, *replicas: VllmDouble, args: tuple[str, ...] = ()) -> tuple[int, dict]:
    with DoubleFleet() as fleet:
        urls = [fleet.add(r) for r in replicas]
        result = cli("probe", *[a for u in urls for a in ("--url", u)], "--prompts",
                     str(write_prompts(tmp_path, "hello")), "--json", *args)
    return result.exit_code, json.loads(result.stdout)


# -- against a replica (a double speaking vLLM 0.32's /server_info and /v1/completions) ----------------
def test_a_bf16_gpu_replica_with_rounding_deltas_matches(cli: Any, tmp_path: Path) -> None:
    code, data = probe_json(cli, tmp_path, replica("torch.bfloat16"))
    (r,) = data["replicas"]
    assert code == EXIT_MATCH and r["verdict"] == "match", data
    assert r["tolerance"] == HALF_PRECISION_TOLERANCE and "bfloat16 on cuda" in r["tolerance_reason"]
    assert r["results"][0]["max_logprob_difference"] == pytest.approx(0.08)
    assert data["tolerance"] is None  # none given: each replica's own


def test_a_flipped_token_is_stale_whatever_the_tolerance(cli: Any, tmp_path: Path) -> None:
    served = ["a", "b", "x", "d"]
    code, data = probe_json(cli, tmp_path, replica("torch.bfloat16", served_tokens=served))
    (r,) = data["replicas"]
    assert code == EXIT_STALE and r["verdict"] == "STALE", data
    assert r["results"][0]["first_difference"] == {"index": 2, "plain": "x", "salted": "c"}
    code, data = probe_json(cli, tmp_path, replica("torch.bfloat16", served_tokens=served), args=("--tolerance", "1"))
    assert code == EXIT_STALE and data["replicas"][0]["results"][0]["reason"].startswith("token 2 differs")


def test_a_float32_cpu_replica_with_the_same_deltas_is_stale(cli: Any, tmp_path: Path) -> None:
    code, data = probe_json(cli, tmp_path, replica("torch.float32", "cpu"))
    (r,) = data["replicas"]
    assert code == EXIT_STALE and r["verdict"] == "STALE", data
    assert r["tolerance"] == FP32_TOLERANCE and "float32 on cpu" in r["tolerance_reason"]
    assert "(> 0.001)" in r["results"][0]["reason"]


def test_a_mixed_fleet_judges_each_replica_by_its_own_dtype(cli: Any, tmp_path: Path) -> None:
    code, data = probe_json(cli, tmp_path, replica("torch.bfloat16", name="gpu"), replica("torch.float32", "cpu"))
    gpu, cpu = data["replicas"]
    assert code == EXIT_STALE, data
    assert (gpu["verdict"], gpu["tolerance"]) == ("match", HALF_PRECISION_TOLERANCE)
    assert (cpu["verdict"], cpu["tolerance"]) == ("STALE", FP32_TOLERANCE)


def test_an_explicit_tolerance_wins(cli: Any, tmp_path: Path) -> None:
    code, data = probe_json(cli, tmp_path, replica("torch.bfloat16"), args=("--tolerance", "0.01"))
    (r,) = data["replicas"]
    assert code == EXIT_STALE and data["tolerance"] == 0.01, data
    assert r["tolerance"] == 0.01 and "given explicitly" in r["tolerance_reason"]
    assert "(> 0.01)" in r["results"][0]["reason"]
    code, data = probe_json(cli, tmp_path, replica("torch.float32", "cpu"), args=("--tolerance", "0.1"))
    assert code == EXIT_MATCH and data["replicas"][0]["tolerance"] == 0.1, data


@pytest.mark.parametrize(("make", "why"), [
    (lambda: replica("torch.float32", "cpu", dev_mode=False), "404"),  # no VLLM_SERVER_DEV_MODE=1
    (lambda: replica("torch.float32", "cpu", version="0.10.2"), "has no /server_info, first in 0.11.0"),
    (lambda: replica("auto"), "model_config.dtype 'auto'"),
], ids=["not-dev-mode", "before-server-info", "unresolved-dtype"])
def test_an_unknown_dtype_gets_the_half_precision_value(cli: Any, tmp_path: Path, make: Any, why: str) -> None:
    """Documented fallback: a replica that cannot say its dtype is judged as half precision (a float32 one
    would need only 1e-3, but a bf16 one called STALE for rounding is the worse mistake)."""
    code, data = probe_json(cli, tmp_path, make())
    (r,) = data["replicas"]
    assert code == EXIT_MATCH and r["tolerance"] == HALF_PRECISION_TOLERANCE, data
    assert r["tolerance_reason"].startswith("dtype unknown") and why in r["tolerance_reason"], r["tolerance_reason"]


def test_a_failing_server_info_falls_back_and_still_probes(cli: Any, tmp_path: Path) -> None:
    double = replica("torch.bfloat16")
    double.faults.status["/server_info"] = 500
    code, data = probe_json(cli, tmp_path, double)
    (r,) = data["replicas"]
    assert code == EXIT_MATCH and "dtype unknown (GET /server_info" in r["tolerance_reason"], data


def test_the_text_report_says_each_replicas_tolerance_and_why(cli: Any, tmp_path: Path) -> None:
    with DoubleFleet() as fleet:
        url = fleet.add(replica("torch.bfloat16", name="gpu-0"))
        result = cli("probe", "--url", url, "--prompts", str(write_prompts(tmp_path, "hello")))
    assert result.exit_code == EXIT_MATCH, result.stdout
    assert "tolerance 0.25 for" in result.stdout and "bfloat16 on cuda" in result.stdout, result.stdout
    assert "tolerance per replica" in result.stdout


def test_reset_verify_probe_prompts_on_bf16_is_verified_and_the_receipt_says_the_tolerance(cli: Any,
                                                                                        tmp_path: Path) -> None:
    with DoubleFleet() as fleet:
        url = fleet.add(replica("torch.bfloat16"))
        result = cli("reset", "--url", url, "--verify", "--probe-prompts", str(write_prompts(tmp_path, "hello")),
                     "--json")
    data = json.loads(result.stdout)
    probe = data["replicas"][0]["probe"]
    assert result.exit_code == 0 and data["ok"] is True, result.stdout
    assert probe["verdict"] == "match" and probe["tolerance"] == HALF_PRECISION_TOLERANCE
    assert "bfloat16" in probe["tolerance_reason"]


def test_reset_verify_probe_prompts_on_float32_with_bf16_deltas_fails(cli: Any, tmp_path: Path) -> None:
    with DoubleFleet() as fleet:
        url = fleet.add(replica("torch.float32", "cpu"))
        result = cli("reset", "--url", url, "--verify", "--probe-prompts", str(write_prompts(tmp_path, "hello")),
                     "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == EXIT_FAILED and "found STALE KV" in data["replicas"][0]["error"], result.stdout
    assert data["replicas"][0]["probe"]["tolerance"] == FP32_TOLERANCE


def test_the_python_api_fits_the_tolerance_too() -> None:
    import kvctl

    with DoubleFleet() as fleet:
        url = fleet.add(replica("torch.bfloat16"))
        fitted = kvctl.probe([url], prompts=["hello"], timeout=10)
        given = kvctl.probe([url], prompts=["hello"], timeout=10, tolerance=0.01)
    assert fitted.exit_code == EXIT_MATCH and fitted.tolerance is None
    assert fitted.replicas[0].tolerance == HALF_PRECISION_TOLERANCE
    assert given.exit_code == EXIT_STALE and given.replicas[0].tolerance == given.tolerance == 0.01


# -- tolerance_for, on /server_info payloads in vLLM 0.32's layout --------------------------------------
def info(dtype: object = "torch.bfloat16", device: object = "cuda", **env: object) -> dict:
    """What GET /server_info?config_format=json carries that matters here (vLLM 0.32.0 api_router.py:49-58)."""
    return {"vllm_config": {"model_config": {"dtype": dtype}, "device_config": {"device": device}},
            "vllm_env": {"VLLM_BATCH_INVARIANT": False, "VLLM_FLOAT32_MATMUL_PRECISION": "highest", **env}}


@pytest.mark.parametrize(("server_info", "tolerance", "said"), [
    (info("torch.float32", "cpu"), FP32_TOLERANCE, "float32 on cpu"),
    (info("torch.float32", "cuda"), FP32_TOLERANCE, "float32 on cuda"),
    (info("torch.bfloat16"), HALF_PRECISION_TOLERANCE, "bfloat16 on cuda"),
    (info("torch.float16", "xpu"), HALF_PRECISION_TOLERANCE, "float16 on xpu"),
    (info("bfloat16", None), HALF_PRECISION_TOLERANCE, "bfloat16:"),  # a name never resolved; TPU: no device
    (info("torch.float32", "cuda", VLLM_FLOAT32_MATMUL_PRECISION="high"), HALF_PRECISION_TOLERANCE,
     "VLLM_FLOAT32_MATMUL_PRECISION=high"),
    (info("torch.bfloat16", VLLM_BATCH_INVARIANT=True), HALF_PRECISION_TOLERANCE, "not a prefix-cache hit"),
    ({"vllm_config": {"model_config": {"dtype": "torch.float32"}}}, FP32_TOLERANCE, "float32:"),  # < 0.14: no env
])
def test_tolerance_for_reads_dtype_device_and_env(server_info: dict, tolerance: float, said: str) -> None:
    value, reason = tolerance_for(server_info)
    assert value == tolerance and said in reason, reason


@pytest.mark.parametrize(("server_info", "said"), [
    (None, "no model_config.dtype"),
    ({}, "no model_config.dtype"),
    ({"vllm_config": "model='m', dtype=torch.float32"}, "no model_config.dtype"),  # the text format
    ({"vllm_config": {"model_config": None}}, "no model_config.dtype"),
    (info(dtype=32), "model_config.dtype 32"),
    (info(dtype="torch.float8_e4m3fn"), "model_config.dtype 'torch.float8_e4m3fn'"),
    ([1, 2], "no model_config.dtype"),
])
def test_tolerance_for_odd_answers_falls_back_to_half_precision(server_info: object, said: str) -> None:
    value, reason = tolerance_for(server_info)
    assert value == HALF_PRECISION_TOLERANCE and reason.startswith("dtype unknown") and said in reason, reason


def test_the_measuring_tool_judges_its_numbers_by_kvctls_tolerances() -> None:
    """tools/gpu/bf16_prefix_logprobs.py (torch only, no kvctl import) says whether each dtype's drift stays
    within kvctl's tolerance: its copy of them must be kvctl's (read without importing torch)."""
    import ast

    from tests.lib import REPO

    tree = ast.parse((REPO / "tools" / "gpu" / "bf16_prefix_logprobs.py").read_text())
    (copy,) = [ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
               and any(isinstance(t, ast.Name) and t.id == "KVCTL_TOLERANCE" for t in node.targets)]
    assert copy == {"fp32": FP32_TOLERANCE, "bf16": HALF_PRECISION_TOLERANCE, "fp16": HALF_PRECISION_TOLERANCE}
