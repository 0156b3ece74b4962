"""tools/capabilities/offload_facts.py on a synthetic tree and on vLLM's real released sources
(the cache `make capabilities` fills), and the source cache refetching releases cached before
the member list grew (fetch.py)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.lib import REPO
from tests.lib.release_sources import vllm_tree
from tools.capabilities import fetch, offload_facts
from tools.capabilities.__main__ import generate
from tools.capabilities.merge import facts_at
from tools.capabilities.source import SourceTree

COMMITTED = json.loads((REPO / "kvctl/data/vllm_facts.json").read_text())


def _release(version: str) -> SourceTree:
    return vllm_tree(version)


def _params(section: dict, name: str) -> dict[str, dict]:
    return {k: v["spans"] for k, v in section[name]["params"].items()}


# --- a synthetic tree: every pattern the extractor reads ----------------------------------------

FAKE = {
    "vllm/v1/kv_offload/factory.py": """
        class OffloadingSpecFactory:
            @classmethod
            def get_spec_cls(cls, extra_config):
                spec_name = extra_config.get("spec_name", "CPUOffloadingSpec")
                if spec_name not in cls._registry:
                    spec_module_path = extra_config.get("spec_module_path")
                    if spec_module_path is None:
                        raise ValueError(f"Unsupported spec type: {spec_name}")
        OffloadingSpecFactory.register_spec("CPUOffloadingSpec", "vllm.v1.kv_offload.cpu", "CPUOffloadingSpec")
    """,
    "vllm/v1/kv_offload/spec.py": """
        class OffloadingSpec:
            def __init__(self, vllm_config):
                self.extra_config = vllm_config.kv_transfer_config.kv_connector_extra_config
                self.block_size = int(self.extra_config.get("block_size", 16))
    """,
    "vllm/v1/kv_offload/cpu.py": """
        from vllm.v1.kv_offload.spec import OffloadingSpec
        POLICIES = ("lru", "arc")
        class CPUOffloadingSpec(OffloadingSpec):
            def __init__(self, vllm_config):
                super().__init__(vllm_config)
                num = self.extra_config.get("num_cpu_blocks")
                if not num:
                    raise Exception("num_cpu_blocks must be specified in kv_connector_extra_config")
                self.num: int = num
                policy = self.extra_config.get("eviction_policy", "lru")
                if policy not in POLICIES:
                    raise ValueError(f"Unknown eviction policy: {policy}")
                self.depth = self.extra_config["depth"]
                if "extra" in self.extra_config:
                    self.x = self.extra_config["extra"]
    """,
}


def test_synthetic_spec_keys_required_casts_choices_and_inherited(tmp_path: Path) -> None:
    for name, text in FAKE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    tree = SourceTree(tmp_path)
    assert offload_facts.spec_registrations(tree)["CPUOffloadingSpec"]["module"] == "vllm.v1.kv_offload.cpu"
    keys = offload_facts.spec_keys(tree, "vllm.v1.kv_offload.cpu", "CPUOffloadingSpec")
    assert keys["num_cpu_blocks"]["required"] and keys["num_cpu_blocks"]["when"] == "falsy"
    assert keys["num_cpu_blocks"]["message"] == "num_cpu_blocks must be specified in kv_connector_extra_config"
    assert keys["num_cpu_blocks"]["annotation"] == "int"
    assert keys["block_size"]["cast"] == "int" and keys["block_size"]["file"] == "vllm/v1/kv_offload/spec.py"
    assert keys["eviction_policy"]["choices"] == ["arc", "lru"]
    assert keys["depth"]["message"] == "KeyError: 'depth'"  # an unguarded subscript raises
    assert not keys["extra"].get("required")  # read only after `"extra" in extra_config`
    lookup = offload_facts.spec_lookup(tree)
    assert lookup is not None and lookup["default"] == "CPUOffloadingSpec"
    assert lookup["message"] == "Unsupported spec type: {spec_name}" and lookup["module_key"] == "spec_module_path"


# --- vLLM's released sources ----------------------------------------------------------------------

def test_0_13_requires_num_cpu_blocks_and_0_14_cpu_bytes_to_use() -> None:
    specs, _ = offload_facts.extract(_release("0.13.0"))
    old = _params(specs, "CPUOffloadingSpec")
    assert old["num_cpu_blocks"]["required"] and "cpu_bytes_to_use" not in old
    assert old["num_cpu_blocks"]["file"] == "vllm/v1/kv_offload/cpu.py"
    specs, _ = offload_facts.extract(_release("0.14.0"))
    new = _params(specs, "CPUOffloadingSpec")
    assert new["cpu_bytes_to_use"]["required"] and new["cpu_bytes_to_use"]["cast"] == "int"
    assert "num_cpu_blocks" not in new
    assert new["cpu_bytes_to_use"]["message"] == "cpu_bytes_to_use must be specified in kv_connector_extra_config"


def test_tiering_spec_is_registered_from_0_22_with_its_tiers() -> None:
    specs, _ = offload_facts.extract(_release("0.21.0"))
    assert sorted(specs) == ["CPUOffloadingSpec"]
    specs, _ = offload_facts.extract(_release("0.22.0"))
    assert specs["TieringOffloadingSpec"]["spans"]["module"] == "vllm.v1.kv_offload.tiering.spec"
    tiers = specs["TieringOffloadingSpec"]["tiers"]["values"]
    assert tiers["value"] == ["example", "fs_python"] and tiers["module_path"] is False
    # It inherits CPUOffloadingSpec's required key.
    assert _params(specs, "TieringOffloadingSpec")["cpu_bytes_to_use"]["required"]


def test_simple_cpu_offload_connector_keys_and_choices_0_32() -> None:
    _, connectors = offload_facts.extract(_release("0.32.0"))
    simple = _params(connectors, "SimpleCPUOffloadConnector")
    assert simple["kv_offload_backend"]["choices"] == ["cpu", "disk"]
    assert simple["cpu_bytes_to_use"]["required"] is False and simple["lazy_offload"]["cast"] == "bool"
    offloading = _params(connectors, "OffloadingConnector")
    assert {"spec_name", "spec_module_path", "block_size", "blocks_per_chunk"} <= set(offloading)
    assert offloading["spec_module_path"]["required"] is False  # only an unknown spec needs it


def test_committed_facts_hold_what_the_sources_say() -> None:
    for version in ("0.11.0", "0.13.0", "0.22.0", "0.33.0"):
        tree = _release(version)
        specs, connectors = offload_facts.extract(tree)
        committed = facts_at(COMMITTED, version)
        assert set(committed["offload_specs"]) == set(specs), version
        assert set(committed["offload_connectors"]) == set(connectors), version


# --- the source cache ---------------------------------------------------------------------------

def _mark(root: Path, version: str, patterns: list[str]) -> None:
    (root / version).mkdir(parents=True)
    (root / version / fetch.MARKER).write_text(json.dumps({"version": version, "patterns": patterns}))


def test_a_release_cached_before_the_member_list_grew_is_stale_not_release(tmp_path: Path) -> None:
    _mark(tmp_path, "0.13.0", [p for p in fetch.MEMBER_PATTERNS if "kv_offload" not in p])
    _mark(tmp_path, "0.14.0", list(fetch.MEMBER_PATTERNS))
    (tmp_path / "0.15.0").mkdir()  # interrupted: no marker
    assert fetch.cached_versions(tmp_path) == ["0.14.0"]
    assert fetch.stale_versions(tmp_path) == ["0.13.0"]
    assert not fetch._is_cached(tmp_path, "0.13.0") and not fetch._is_cached(tmp_path, "0.15.0")


def test_offline_generation_refuses_a_stale_cache(tmp_path: Path) -> None:
    _mark(tmp_path, "0.13.0", ["vllm/config.py"])
    with pytest.raises(SystemExit, match="0.13.0 predates members"):
        generate(offline=True, root=tmp_path, only=["0.13.0"])
