"""vLLM's weight answers, parsed: /weight_info's version and /weight_checker's per-worker checksums.

vLLM 0.32's /weight_checker {"action": "checksum"} (vllm/entrypoints/rl/online/api_router.py:229-260)
merges every worker's `compute_weight_checksums()` into one flat object. Each worker prefixes its keys
with its ranks, `dp{dp}:pp{pp}:pcp{pcp}:tp{tp}:` (vllm/v1/worker/gpu_worker.py:367-378 of the 0.32.0
wheel), before the parameter name, and each value is the sha256 of that parameter's bytes
(vllm/model_executor/model_loader/weight_checksum.py). Tensor- and pipeline-parallel workers hold
different shards; data- and context-parallel (dp, pcp) workers hold copies, so their checksums of one
shard must agree, except a MoE layer's experts, which vLLM shards across dp x pcp x tp
(FusedMoEParallelConfig.make, vllm/model_executor/layers/fused_moe/config.py:1189-1199 of the wheel).
A replica's digest is one short hash over its shards, comparable between replicas of the same
parallel layout.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

DIGEST_CHARS = 12
# The rank fields that hold copies of the same shard (data and prefill-context parallel).
_COPY_RANKS = ("dp", "pcp")
_RANK = re.compile(r"([a-z]+)(\d+)")
_EXPERTS = re.compile(r"(^|\.)experts\.")  # FusedMoE modules are named `experts` in vLLM's models


@dataclass(frozen=True)
class WeightChecksums:
    """One replica's /weight_checker checksums, summarised."""

    digest: str  # DIGEST_CHARS hex characters over every shard's checksum
    parameters: int  # checksummed tensors, over all workers
    workers: int  # distinct rank prefixes
    # Shards whose copies (dp/pcp workers) differ: the replica itself serves from two sets of weights.
    disagreeing: list[str] = field(default_factory=list)

    @property
    def workers_agree(self) -> bool:
        return not self.disagreeing


def split_rank(key: str) -> tuple[dict[str, str], str]:
    """'dp0:pp0:pcp0:tp1:model.w' -> ({'dp': '0', 'pp': '0', 'pcp': '0', 'tp': '1'}, 'model.w').

    Leading `<letters><digits>:` fields are ranks; the rest is the parameter name (which may hold
    colons of its own only after them). A key without rank fields is one worker's bare name."""
    ranks: dict[str, str] = {}
    rest = key
    while ":" in rest:
        head, tail = rest.split(":", 1)
        match = _RANK.fullmatch(head)
        if match is None:
            break
        ranks[match.group(1)] = match.group(2)
        rest = tail
    return ranks, rest


def summarise_checksums(checksums: dict[str, str]) -> WeightChecksums:
    """Collapse the copies (dp, pcp ranks) of each shard and hash what is left into one digest."""
    shards: dict[str, set[str]] = {}
    workers: set[str] = set()
    for key, value in checksums.items():
        ranks, name = split_rank(key)
        workers.add(":".join(f"{k}{v}" for k, v in ranks.items()))
        copies = () if _EXPERTS.search(name) else _COPY_RANKS
        shard = ":".join(f"{k}{v}" for k, v in ranks.items() if k not in copies)
        shards.setdefault(f"{shard}:{name}" if shard else name, set()).add(str(value))
    disagreeing = sorted(name for name, values in shards.items() if len(values) > 1)
    lines = "\n".join(f"{name}={','.join(sorted(values))}" for name, values in sorted(shards.items()))
    digest = hashlib.sha256(lines.encode()).hexdigest()[:DIGEST_CHARS]
    return WeightChecksums(digest, len(checksums), len(workers), disagreeing)


def parse_checksum_answer(body: Any) -> dict[str, str] | None:
    """{"checksums": {key: sha256}} -> the dict; None when the answer has another shape."""
    if not isinstance(body, dict) or not isinstance(body.get("checksums"), dict):
        return None
    checksums = body["checksums"]
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in checksums.items()):
        return None
    return checksums


__all__ = ["DIGEST_CHARS", "WeightChecksums", "parse_checksum_answer", "split_rank", "summarise_checksums"]
