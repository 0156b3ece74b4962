"""tools/capabilities/offload_args_facts.py (vLLM's --kv-offloading-size / --kv-offloading-backend
and the kv_transfer_config _post_init_kv_transfer_config builds) on a synthetic tree and on vLLM's
real released sources (the cache `make capabilities` fills)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.lib import REPO
from tests.lib.release_sources import vllm_tree
from tools.capabilities import offload_args_facts
from tools.capabilities.merge import facts_at, strip_locations
from tools.capabilities.source import SourceTree

COMMITTED = json.loads((REPO / "kvctl/data/vllm_facts.json").read_text())


def _release(version: str) -> SourceTree:
    return vllm_tree(version)


def _values(section: dict, *path: str) -> dict:
    node = section
    for key in path:
        node = node[key]
    return node["values"]


FAKE = {
    "vllm/config/cache.py": """
        from typing import Literal
        Backend = Literal["native", "other"]
        class CacheConfig:
            kv_offloading_size: float | None = None
            kv_offloading_backend: Backend | None = None
    """,
    "vllm/engine/arg_utils.py": """
        def add(parser):
            parser.add_argument("--kv-offloading-size")
            parser.add_argument("--kv-offloading-backend")
    """,
    "vllm/config/vllm.py": """
        import vllm.envs as envs
        class VllmConfig:
            def _post_init_kv_transfer_config(self):
                if (backend := self.cache_config.kv_offloading_backend) is None:
                    return
                if (size := self.cache_config.kv_offloading_size) is None:
                    raise ValueError("size needed")
                if kv_offloading_backend == "native":
                    if envs.USE_SIMPLE:
                        name = "Simple"
                    else:
                        name = "Native"
                    self.kv_transfer_config.kv_connector = name
                    per_rank = size * 2
                    self.kv_transfer_config.kv_connector_extra_config.update({"bytes": per_rank, "blocks": 0})
                elif kv_offloading_backend == "other":
                    self.kv_transfer_config.kv_connector = "Other"
                    self.kv_transfer_config.kv_connector_extra_config = {"x": True}
                self.kv_transfer_config.kv_role = "kv_both"
    """,
}


def test_synthetic_fields_gate_requires_and_branches(tmp_path: Path) -> None:
    for name, text in FAKE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    facts = offload_args_facts.extract(SourceTree(tmp_path))
    assert facts["kv_offloading_backend"]["types"] == {"type": "Backend | None", "default": "None"}
    assert _values(facts, "kv_offloading_backend", "choices")["value"] == ["native", "other"]
    assert _values(facts, "kv_offloading_size", "flag")["value"] == "--kv-offloading-size"
    post = facts["post_init"]
    assert _values(post, "gate")["value"] == "kv_offloading_backend"
    assert _values(post, "requires")["message"] == "size needed"
    assert _values(post, "kv_role")["value"] == "kv_both"
    native = _values(post, "params", "native")
    assert (native["connector"], native["env_connector"]) == ("Native", {"env": "USE_SIMPLE", "connector": "Simple"})
    assert (native["extra"], native["extra_mode"]) == ({"bytes": "size * 2", "blocks": "0"}, "update")
    other = _values(post, "params", "other")
    assert (other["connector"], other["extra"], other["extra_mode"]) == ("Other", {"x": "True"}, "replace")


def test_absent_before_0_11_1() -> None:
    assert offload_args_facts.extract(_release("0.11.0")) == {}
    assert "kv_offloading_size" in offload_args_facts.extract(_release("0.11.1"))


def test_0_13_gates_on_the_backend_and_writes_num_cpu_blocks_0() -> None:
    facts = offload_args_facts.extract(_release("0.13.0"))
    post = facts["post_init"]
    assert facts["kv_offloading_backend"]["types"]["default"] == "None"
    assert _values(facts, "kv_offloading_backend", "choices")["value"] == ["lmcache", "native"]
    assert _values(post, "gate") == {"value": "kv_offloading_backend", "file": "vllm/config/vllm.py", "line": 477}
    assert _values(post, "requires")["message"] == "You must set kv_offloading_size when kv_offloading_backend is set."
    native = _values(post, "params", "native")
    assert native["connector"] == "OffloadingConnector" and native["extra"]["num_cpu_blocks"] == "0"
    assert _values(post, "params", "lmcache")["extra_mode"] == "replace"


def test_0_14_gates_on_the_size_defaults_native_and_writes_cpu_bytes_to_use() -> None:
    facts = offload_args_facts.extract(_release("0.14.0"))
    post = facts["post_init"]
    assert facts["kv_offloading_backend"]["types"]["default"] == "'native'"
    assert _values(post, "gate")["value"] == "kv_offloading_size" and "requires" not in post
    native = _values(post, "params", "native")
    assert native["extra"] == {"cpu_bytes_to_use": "kv_offloading_size * (1 << 30)"}
    assert native["env_connector"] is None


def test_simple_cpu_offload_switch_from_0_19_and_lmcache_mp_from_0_23() -> None:
    native = _values(offload_args_facts.extract(_release("0.19.0"))["post_init"], "params", "native")
    assert native["env_connector"] == {"env": "VLLM_USE_SIMPLE_KV_OFFLOAD", "connector": "SimpleCPUOffloadConnector"}
    lmcache = _values(offload_args_facts.extract(_release("0.23.0"))["post_init"], "params", "lmcache")
    assert (lmcache["connector"], lmcache["extra_mode"]) == ("LMCacheMPConnector", None)


def test_committed_facts_hold_what_the_sources_say() -> None:
    for version in ("0.11.1", "0.13.0", "0.14.0", "0.23.0", "0.33.0"):
        fresh = strip_locations({"offload_args": offload_args_facts.extract(_release(version))})["offload_args"]
        committed = strip_locations(facts_at(COMMITTED, version))["offload_args"]
        assert committed == fresh, version


@pytest.mark.parametrize("version", ["0.11.1", "0.13.0", "0.22.0"])
def test_the_sizes_are_per_rank(version: str) -> None:
    """Issue 40 item 4: _post_init_kv_transfer_config divides the size by num_kv_ranks = TP x PP
    (vllm/config/vllm.py:488-491 in 0.13.0): the fact says so, and the committed facts carry it."""
    ranks = _values(offload_args_facts.extract(_release(version))["post_init"], "ranks")
    assert ranks["value"] == ("self.parallel_config.tensor_parallel_size * "
                              "self.parallel_config.pipeline_parallel_size")
    assert facts_at(COMMITTED, version)["offload_args"]["post_init"]["ranks"]["values"]["value"] == ranks["value"]
