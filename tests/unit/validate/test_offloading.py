"""kvctl config validate on KV offloading configs (kvctl/validate/offloading.py): OffloadingConnector's
specs and the keys each reads per release, SimpleCPUOffloadConnector's keys, inside a MultiConnector
too. Release boundaries are taken from the facts (kvctl/data/vllm_facts.json, read from vLLM's
released sources), and checked on both sides."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from packaging.version import Version

from kvctl.facts.capabilities import table
from kvctl.validate import validate_path
from kvctl.validate.kv_config import validate_kv_transfer_config
from kvctl.validate.model import Problem

EXTRA = "kv_transfer_config.kv_connector_extra_config"


def _offloading(extra: dict[str, Any], connector: str = "OffloadingConnector") -> dict[str, Any]:
    return {"kv_connector": connector, "kv_role": "kv_both", "kv_connector_extra_config": extra}


def _mine(cfg: dict[str, Any], version: str) -> list[Problem]:
    """The problems under kv_connector_extra_config (other checks, e.g. the reset warning, aside)."""
    return [p for p in validate_kv_transfer_config(cfg, version) if ".kv_connector_extra_config" in p.where]


def _at(problems: list[Problem], key: str) -> Problem:
    found = [p for p in problems if p.where.endswith(f"kv_connector_extra_config.{key}")]
    assert len(found) == 1, problems
    return found[0]


def _boundary(section: str, name: str, key: str) -> tuple[str, str | None]:
    spans = table().offload_releases(section, name, key)
    assert len(spans) == 1, spans
    return spans[0]


def _before(version: str) -> str:
    """The release just before `version` in the facts."""
    releases = table().facts["releases"]
    return releases[releases.index(version) - 1]


def test_cpu_spec_key_changes_from_num_cpu_blocks_to_cpu_bytes_to_use() -> None:
    old_since, old_until = _boundary("offload_specs", "CPUOffloadingSpec", "num_cpu_blocks")
    new_since, _ = _boundary("offload_specs", "CPUOffloadingSpec", "cpu_bytes_to_use")
    assert (old_since, old_until, new_since) == ("0.11.0", "0.14.0", "0.14.0")  # what vllm/v1/kv_offload/cpu.py says
    last_old = _before(new_since)
    # The last release that reads num_cpu_blocks: cpu_bytes_to_use is dropped and num_cpu_blocks is missing.
    problems = _mine(_offloading({"cpu_bytes_to_use": 10 << 30}), last_old)
    dropped = _at(problems, "cpu_bytes_to_use")
    assert dropped.dropped and f"vLLM {last_old} ignores 'cpu_bytes_to_use'" in dropped.message
    assert "write num_cpu_blocks" in dropped.fix
    missing = _at(problems, "num_cpu_blocks")
    assert missing.severity == "error" and not missing.dropped
    assert "'num_cpu_blocks must be specified in kv_connector_extra_config'" in missing.message
    assert missing.fix.startswith("add num_cpu_blocks: ")
    assert _mine(_offloading({"num_cpu_blocks": 10000}), last_old) == []
    # The first release that reads cpu_bytes_to_use: the other way round.
    problems = _mine(_offloading({"num_cpu_blocks": 10000}), new_since)
    assert _at(problems, "num_cpu_blocks").dropped and "write cpu_bytes_to_use" in _at(problems, "num_cpu_blocks").fix
    assert "cpu_bytes_to_use must be specified" in _at(problems, "cpu_bytes_to_use").message
    assert _mine(_offloading({"cpu_bytes_to_use": 10 << 30}), new_since) == []


def test_zero_counts_as_not_set_where_vllm_tests_falsiness() -> None:
    problem = _at(_mine(_offloading({"cpu_bytes_to_use": 0}), "0.32.0"), "cpu_bytes_to_use")
    assert "is 0, which counts as not set" in problem.message and problem.severity == "error"


def test_tiering_spec_unknown_before_its_first_release_and_accepted_from_it() -> None:
    since = table().offload_releases("offload_specs", "TieringOffloadingSpec")[0][0]
    assert since == "0.22.0" and "TieringOffloadingSpec" not in table().offload_specs("0.21.0")
    extra = {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 10 << 30}
    problem = _at(_mine(_offloading(extra), _before(since)), "spec_name")
    assert problem.severity == "error" and "'Unsupported spec type: TieringOffloadingSpec'" in problem.message
    assert f"vLLM {_before(since)} registers CPUOffloadingSpec" in problem.message
    assert f"upgrade vLLM to >= {since}" in problem.fix
    assert _mine(_offloading(extra), since) == []


def test_a_misspelled_spec_and_a_misspelled_key() -> None:
    problems = _mine(_offloading({"spec_name": "CPUOffloadSpec", "cpu_bytes_to_use": 1}), "0.32.0")
    assert "did you mean 'CPUOffloadingSpec'?" in _at(problems, "spec_name").fix
    problems = _mine(_offloading({"cpu_bytes_to_use": 1, "evicton_policy": "arc"}), "0.32.0")
    dropped = _at(problems, "evicton_policy")
    assert dropped.dropped and dropped.fix.startswith("did you mean 'eviction_policy'?")
    # An out-of-tree spec reads keys kvctl cannot see: nothing to say about them.
    custom = {"spec_name": "MySpec", "spec_module_path": "my.module", "anything": 1}
    assert _mine(_offloading(custom), "0.32.0") == []


def test_values_vllm_cannot_convert_fail_and_string_booleans_vllm_misreads_fail() -> None:
    problems = _mine(_offloading({"cpu_bytes_to_use": "10GB", "offload_prompt_only": "false"}), "0.32.0")
    bad = _at(problems, "cpu_bytes_to_use")
    assert bad.severity == "error" and "converts it with int()" in bad.message
    misread = _at(problems, "offload_prompt_only")  # bool("false") is True: the setting does not happen
    assert misread.severity == "error" and misread.dropped
    assert _mine(_offloading({"cpu_bytes_to_use": "10737418240"}), "0.32.0") == []  # int("1073...") works


def test_secondary_tiers_follow_the_release_tier_registry() -> None:
    tiers = table().offload_fact("0.22.0", "offload_specs", "TieringOffloadingSpec", "tiers")
    assert tiers is not None and tiers["value"] == ["example", "fs_python"]
    extra = {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 1, "secondary_tiers": [{"type": "fs_python"}]}
    assert _mine(_offloading(extra), "0.22.0") == []
    problem = _at(_mine(_offloading(extra), "0.32.0"), "secondary_tiers[0].type")
    assert "Unknown secondary tier type: 'fs_python'" in problem.message and "fs" in problem.fix
    extra["secondary_tiers"] = [{"size": 1}]
    assert "must include 'type'" in _at(_mine(_offloading(extra), "0.32.0"), "secondary_tiers[0].type").message


def test_simple_cpu_offload_connector_keys_and_choices() -> None:
    simple = "SimpleCPUOffloadConnector"
    since, _ = _boundary("offload_connectors", simple, "kv_offload_backend")
    cfg = _offloading({"kv_offload_backend": "dsk"}, simple)
    dropped = _at(_mine(cfg, _before(since)), "kv_offload_backend")
    assert dropped.dropped and f"upgrade vLLM to >= {since}" in dropped.fix
    bad = _at(_mine(cfg, since), "kv_offload_backend")
    assert bad.severity == "error" and "expected one of ('cpu', 'disk')" in bad.message
    assert bad.fix.startswith("did you mean 'disk'?")
    # No required key: the defaults suffice.
    assert _mine(_offloading({}, simple), "0.32.0") == []


def test_inside_a_multiconnector_child() -> None:
    child = _offloading({"cpu_bytes_to_use": 1 << 30})
    cfg = {"kv_connector": "MultiConnector", "kv_role": "kv_both",
           "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeStoreConnector",
                                                         "kv_role": "kv_both"}, child]}}
    problem = _at(_mine(cfg, "0.13.0"), "num_cpu_blocks")
    assert problem.where == f"{EXTRA}.connectors[1].kv_connector_extra_config.num_cpu_blocks"


def test_where_is_the_key_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "kv.json"
    path.write_text(json.dumps(_offloading({"spec_name": "CPUOffloadingSpec", "num_cpu_blocks": 100}), indent=2))
    report = validate_path(path, "0.32.0")
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if '"num_cpu_blocks"' in text)
    dropped = [p for p in report.problems if p.dropped]
    assert [p.where for p in dropped] == [f"{path}:{line} {EXTRA}.num_cpu_blocks"]
    report.allow_dropped()
    assert all(p.severity == "warning" for p in report.problems if p.dropped)


def test_releases_before_offloading_fall_back_to_the_connector_check() -> None:
    first = table().offload_releases("offload_specs", "CPUOffloadingSpec")[0][0]
    problems = validate_kv_transfer_config(_offloading({"num_cpu_blocks": 1}), _before(first))
    assert [p.where for p in problems] == ["kv_transfer_config.kv_connector"]
    assert "Unsupported connector type: OffloadingConnector" in problems[0].message
    assert Version(first) == Version("0.11.0")
