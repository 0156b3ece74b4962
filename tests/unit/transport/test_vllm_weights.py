"""VllmClient's weight calls (collective_rpc, update_weight_version, weight_info, weight_checksums)
against the vLLM test double, and the checksum summary (kvctl/transport/vllm_weights.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from kvctl.transport.vllm_client import ServerError, VllmClient
from kvctl.transport.vllm_weights import split_rank, summarise_checksums
from tests.doubles import DoubleFleet, VllmDouble


@pytest.fixture
def doubles() -> Iterator[DoubleFleet]:
    with DoubleFleet() as fleet:
        yield fleet


def run(url: str, call: str, *args: Any, **kwargs: Any) -> Any:
    async def go() -> Any:
        async with VllmClient(url, timeout=2.0, retries=0) as client:
            return await getattr(client, call)(*args, **kwargs)

    return asyncio.run(go())


def test_weight_info_and_update_weight_version(doubles: DoubleFleet) -> None:
    double = VllmDouble("0.32.0+cpu")
    url = doubles.add(double)
    assert run(url, "weight_info") == "default"  # vLLM's engine core starts there
    outcome = run(url, "update_weight_version", "step-7")
    assert outcome.ok and outcome.body == {"success": True, "new_version": "step-7"}
    assert run(url, "weight_info") == "step-7"
    assert doubles_call(double, "/update_weight_version") == {"new_version": "step-7"}


def doubles_call(double: VllmDouble, path: str) -> Any:
    return next(c.body for c in double.calls if c.path == path)


def test_weight_routes_missing_answer_none(doubles: DoubleFleet) -> None:
    old = doubles.add(VllmDouble("0.26.0"))  # no /weight_info before 0.27.0
    no_checker = doubles.add(VllmDouble("0.31.0"))  # /weight_info, no /weight_checker before 0.32.0
    dev_off = doubles.add(VllmDouble("0.32.0", dev_mode=False))
    assert run(old, "weight_info") is None
    assert run(no_checker, "weight_info") == "default"
    assert run(no_checker, "weight_checksums") is None
    assert run(dev_off, "weight_info") is None and run(dev_off, "weight_checksums") is None


def test_weight_checksums_as_vllm_merges_them(doubles: DoubleFleet) -> None:
    double = VllmDouble("0.32.0", weights="seed-0", tensor_parallel=2)
    url = doubles.add(double)
    checksums = run(url, "weight_checksums")
    assert checksums == double.weight_checksums()
    assert {split_rank(k)[0]["tp"] for k in checksums} == {"0", "1"}
    assert doubles_call(double, "/weight_checker") == {"action": "checksum"}
    double.weights = "seed-1"
    assert run(url, "weight_checksums") != checksums


def test_a_failing_or_odd_answer_raises(doubles: DoubleFleet) -> None:
    double = VllmDouble("0.32.0")
    url = doubles.add(double)
    double.faults.status["/weight_info"] = 500
    with pytest.raises(ServerError, match="HTTP 500"):
        run(url, "weight_info")
    double.faults.status["/weight_checker"] = 500
    with pytest.raises(ServerError, match="HTTP 500"):
        run(url, "weight_checksums")


def test_collective_rpc_sends_method_kwargs_and_timeout_once(doubles: DoubleFleet) -> None:
    double = VllmDouble("0.32.0", tensor_parallel=2)
    seen: list[dict[str, Any]] = []
    double.rpc_methods["echo"] = lambda kwargs: seen.append(kwargs)
    url = doubles.add(double)
    outcome = run(url, "collective_rpc", "echo", {"weights_path": "/w"}, timeout=5.0)
    assert outcome.ok and outcome.body == {"results": [None, None]}
    assert seen == [{"weights_path": "/w"}] * 2
    assert doubles_call(double, "/collective_rpc") == {"method": "echo", "kwargs": {"weights_path": "/w"},
                                                       "timeout": 5.0}
    unknown = run(url, "collective_rpc", "no_such_method", {})
    assert unknown.status == 500 and unknown.attempts == 1  # never retried


def test_summary_collapses_copies_and_names_disagreement() -> None:
    one = VllmDouble("0.32.0", weights="w")
    two_dp = VllmDouble("0.32.0", weights="w", data_parallel=2)
    other = VllmDouble("0.32.0", weights="v")
    a, b, c = (summarise_checksums(d.weight_checksums()) for d in (one, two_dp, other))
    assert a.digest == b.digest != c.digest and len(a.digest) == 12
    assert (a.workers, b.workers) == (1, 2) and a.workers_agree and b.workers_agree
    two_dp.rank_weights["dp1:pp0:pcp0:tp0:"] = "stale"
    mixed = summarise_checksums(two_dp.weight_checksums())
    assert not mixed.workers_agree and mixed.digest != a.digest
    assert mixed.disagreeing == sorted(f"pp0:tp0:{n}" for n in ("lm_head.weight", "model.embed_tokens.weight",
                                                                 "model.layers.0.self_attn.qkv_proj.weight"))


def test_moe_experts_differ_across_dp_without_disagreeing() -> None:
    # vLLM shards a FusedMoE layer's experts across dp x pcp x tp: different bytes per dp rank by design
    checksums = {"dp0:pp0:pcp0:tp0:model.layers.0.mlp.experts.w13_weight": "a",
                 "dp1:pp0:pcp0:tp0:model.layers.0.mlp.experts.w13_weight": "b",
                 "dp0:pp0:pcp0:tp0:lm_head.weight": "c", "dp1:pp0:pcp0:tp0:lm_head.weight": "c"}
    assert summarise_checksums(checksums).workers_agree


def test_split_rank_keeps_the_name_whole() -> None:
    assert split_rank("dp0:pp1:pcp0:tp3:model.w") == ({"dp": "0", "pp": "1", "pcp": "0", "tp": "3"}, "model.w")
    assert split_rank("lm_head.weight") == ({}, "lm_head.weight")
    assert split_rank("tp0:odd:name") == ({"tp": "0"}, "odd:name")
