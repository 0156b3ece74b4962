"""The capability table: version parsing and the questions asked of it."""

from __future__ import annotations

import re

import pytest
from packaging.version import Version

from kvctl.errors import UsageError
from kvctl.facts.capabilities import table
from kvctl.facts.versions import parse_version, version_from_server_payload
from tests.lib import REPO

FACTS_TABLE = REPO / "tests" / "data" / "facts_capability_table.md"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0.32.0+cpu", "0.32.0+cpu"), ("0.23.1", "0.23.1"), ("0.24.0.dev12+g1234abc", "0.24.0.dev12+g1234abc"),
     ("v0.22.0", "0.22.0"), (" 0.13.0 ", "0.13.0")],
)
def test_versions_as_users_have_them(text: str, expected: str) -> None:
    assert str(parse_version(text)) == expected


@pytest.mark.parametrize("text", ["banana", "0.x", "", "latest", "0.23.0-cpu-build!"])
def test_unparsable_version_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError, match="is not a vLLM version"):
        parse_version(text)


def test_server_payload_version() -> None:
    assert version_from_server_payload({"version": "0.32.0+cpu"}) == Version("0.32.0+cpu")
    with pytest.raises(UsageError, match="unexpected /version answer"):
        version_from_server_payload({"ver": 1})


@pytest.mark.parametrize(
    ("version", "capability", "expected"),
    [
        ("0.12.0", "http.reset_prefix_cache.reset_external", False),
        ("0.13.0", "http.reset_prefix_cache.reset_external", True),
        ("0.15.9", "http.reset_encoder_cache", False),
        ("0.16.0", "http.reset_encoder_cache", True),
        ("0.25.3", "http.reset_prefix_cache.success_body", False),
        ("0.26.0", "http.reset_prefix_cache.success_body", True),
        ("0.15.1", "config.forbid_unknown_fields", False),
        ("0.16.0", "config.forbid_unknown_fields", True),
        ("0.15.0", "http.pause.legacy_params", True),
        ("0.31.0", "http.pause.legacy_params", True),  # still taken beside mode (vllm_facts.json)
        ("0.32.0", "http.pause.legacy_params", False),
        ("0.16.0", "http.pause.mode", True),
        ("0.32.0+cpu", "http.sleep.json_body", True),
        ("0.31.2", "http.sleep.json_body", False),
        # a dev build of 0.24.0 is credited with what 0.23.x has, not more
        ("0.24.0.dev12+g1234abc", "http.reset_prefix_cache.reset_external", True),
        ("v0.22.0", "http.pause.clear_cache_resets_connector", False),
        ("0.23.1", "http.pause.clear_cache_resets_connector", True),
        # issue 37, each from the release sources (vllm_facts.json)
        ("0.32.0+cpu", "engine.pause_rejects_new_requests", False),
        ("0.33.0", "engine.pause_rejects_new_requests", True),
        ("0.15.1", "http.pause.clear_cache_deprecated", False),
        ("0.33.0", "http.pause.clear_cache_deprecated", True),
        ("0.33.0", "http.pause.clear_cache", True),  # deprecated, still taken: kvctl sends false
        ("0.15.1", "http.init_weight_transfer_engine", False),
        ("0.16.0", "http.init_weight_transfer_engine", True),
        ("0.16.0", "http.update_weights", True),
        ("0.20.2", "http.start_weight_update", False),
        ("0.21.0", "http.start_weight_update", True),
        ("0.21.0", "http.finish_weight_update", True),
        ("0.11.0", "http.abort_requests", False),
        ("0.11.1", "http.abort_requests", True),
        ("0.25.1", "http.abort_requests.dev", False),
        ("0.26.0", "http.abort_requests.dev", True),
        ("0.33.0", "http.weight_checker.reset", True),
        ("0.32.0", "http.weight_checker.compare", True),
        ("0.31.0", "http.weight_checker.compare", False),
        ("0.22.1", "connector.mooncake_store.reset_needs_pause", False),
        ("0.23.0", "connector.mooncake_store.reset_needs_pause", True),
        ("0.33.0", "connector.mooncake_store.reset_rank0_only", True),
    ],
)
def test_has(version: str, capability: str, expected: bool) -> None:
    assert table().has(version, capability) is expected


def test_which_pause_modes_reject_new_requests() -> None:
    from kvctl.facts.pausing import pause_rejection_source, pause_rejects

    assert [m for m in ("abort", "wait", "keep") if pause_rejects("0.33.0", m)] == ["abort", "wait"]
    assert not any(pause_rejects(v, m) for v in ("0.16.0", "0.32.0+cpu") for m in ("abort", "wait", "keep"))
    assert pause_rejects("0.34.1", "wait")  # newer than the facts: the newest facts hold
    assert pause_rejection_source("0.33.0") == "vllm/v1/engine/core.py:1796"
    assert pause_rejection_source("0.32.0") is None


def test_connectors_by_version() -> None:
    t = table()
    assert "MooncakeStoreConnector" not in t.connectors_in("0.20.1")
    assert "MooncakeStoreConnector" in t.connectors_in("0.21.0")
    assert "MooncakeConnector" in t.connectors_in("0.13.0")
    assert t.connector_available("0.12.0", "MooncakeConnector") == "no"
    assert t.connector_available("0.30.0", "SomethingNew") == "unknown"
    assert t.connector_resets_store("0.22.0", "MooncakeStoreConnector") == "no"
    assert t.connector_resets_store("0.23.0", "MooncakeStoreConnector") == "yes"
    assert t.connector_resets_store("0.33.0", "LMCacheConnectorV1") == "no"
    assert t.connector_resets_store("0.33.0", "MooncakeConnector") == "no"


def test_fields_by_version() -> None:
    t = table()
    removed = {"kv_buffer_size", "kv_rank", "kv_parallel_size", "kv_ip"}
    assert removed <= set(t.fields_in("0.31.0"))
    assert not removed & set(t.fields_in("0.32.0+cpu"))
    assert {"kv_connector", "kv_role", "kv_connector_extra_config", "kv_load_failure_policy"} <= set(t.fields_in("0.33.0"))


def test_every_row_names_its_source_and_a_real_version() -> None:
    t = table()
    spans = [c.span for c in t.capabilities.values()] + [c.span for c in t.connectors.values()] \
        + [c.reset for c in t.connectors.values()] + [f.span for f in t.fields.values()]
    for span in spans:
        for bound in (span.since, span.until):
            if bound not in (None, "never"):
                Version(bound)
    for row in list(t.capabilities.values()) + list(t.connectors.values()) + list(t.fields.values()):
        assert row.source.strip(), row


def test_every_version_in_facts_table_is_in_the_data() -> None:
    """Each first-version of the field facts' capability table (FACTS.md section 2, copied into
    tests/data) appears in kvctl's data (capabilities.yaml or the facts generated from vLLM's sources)."""
    section = FACTS_TABLE.read_text()
    folder = REPO / "kvctl" / "data"
    data = (folder / "capabilities.yaml").read_text() + (folder / "vllm_facts.json").read_text()
    versions = set(re.findall(r"\| (0\.\d+\.\d+) \|", section))
    assert len(versions) >= 10, "the copied table lost its rows"
    for version in versions:
        assert f'"{version}"' in data, version
