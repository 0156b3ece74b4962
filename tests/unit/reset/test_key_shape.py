"""A scoped clear's keys, whole (issue 39 finding 13): `rl` and `rl@eval` share a master; `rl`'s clear and
count match only keys of the shape vLLM's MooncakeStoreConnector writes under `rl` (store/data.py
PoolKey.build_prefix + build_key_string; store_namespace from 0.30.0), never `rl@eval@...`."""

from __future__ import annotations

import asyncio
import re

import pytest

from kvctl.facts.cache_prefix import key_pattern
from kvctl.transport.master_admin import KeyCount, KeyCounter, MasterAdmin
from tests.doubles import DoubleFleet, MasterDouble, SharedStore

RANKS = "@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@"
NS = "@store_tp:4@store_pp:1@store_format:attention_head_major@store_schema:ab12"
RL = [f"rl@Qwen3-8B{RANKS}{'a' * 64}", f"rl@Qwen3-8B{RANKS.replace('tp_rank:0', 'tp_rank:3')}{'0f' * 16}"]
RL_NS = [f"rl@Qwen3-8B{NS}{RANKS}{'b' * 64}"]
EVAL = [f"rl@eval@Qwen3-8B{RANKS}{'c' * 64}", f"rl@eval@Qwen3-8B{NS}{RANKS}{'d' * 64}"]
OTHER = [f"svc@Qwen3-8B{RANKS}{'e' * 64}", f"Qwen3-8B{RANKS}{'f' * 64}", "rl@key-0", "rl@"]


@pytest.mark.parametrize("version, namespaced", [("0.24.0", False), ("0.29.0", False), ("0.30.0", True),
                                                 ("0.32.0+cpu", True), ("0.34.0", True)])
def test_the_pattern_matches_exactly_the_deployment_s_keys_per_release(version: str, namespaced: bool) -> None:
    shape = re.compile(key_pattern("rl", [version]) or "")
    assert all(shape.search(k) for k in RL)
    assert all(bool(shape.search(k)) is namespaced for k in RL_NS)
    assert not any(shape.search(k) for k in EVAL + OTHER)
    nested = re.compile(key_pattern("rl@eval", [version]) or "")
    assert nested.search(EVAL[0]) and not any(nested.search(k) for k in RL + OTHER)


def test_the_counter_counts_the_shape_not_the_prefix() -> None:
    listing = "\n".join(RL + RL_NS + EVAL + OTHER).encode()
    for chunk_size in (7, 64, len(listing)):
        counter = KeyCounter("rl@", key_pattern("rl"))
        for i in range(0, len(listing), chunk_size):
            counter.feed(listing[i:i + chunk_size])
        assert counter.result() == KeyCount(len(RL + RL_NS + EVAL + OTHER), len(RL + RL_NS))
    crlf = KeyCounter("rl@", key_pattern("rl"))
    crlf.feed(("\r\n".join(RL + EVAL) + "\r\n\n").encode())
    assert crlf.result() == KeyCount(len(RL + EVAL), len(RL))


def test_the_master_s_listing_counts_rl_apart_from_rl_at_eval() -> None:
    store = SharedStore(RL + EVAL + OTHER)
    with DoubleFleet() as fleet:
        address = fleet.add_master(MasterDouble(store))

        async def counts() -> KeyCount:
            async with MasterAdmin(address) as admin:
                return await admin.key_counts("rl@", key_pattern("rl", ["0.24.0"]))
        assert asyncio.run(counts()) == KeyCount(len(RL + EVAL + OTHER), len(RL))
