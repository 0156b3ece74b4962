"""Issue 36 item 2: which releases take cache_salt, and whether each connector's keys carry it.

capabilities.yaml's `salt_tiers` says it per connector; vllm_facts.json's `salt_keys` (generated from
vLLM's release sources by tools/capabilities/connector_facts.py) says what each release's connector
code builds its keys from; the two must agree in every release that registers the connector.
"""

from __future__ import annotations

import json

import pytest
from packaging.version import Version

from kvctl.facts.capabilities import load_facts, table
from kvctl.facts.compat import assess, salt_markdown
from kvctl.facts.salting import assess_salt, salt_tiers


def test_every_connector_kvctl_knows_has_a_salt_fact() -> None:
    assert set(table().connectors) <= set(salt_tiers())


@pytest.mark.parametrize("name", sorted(salt_tiers()))
def test_the_salt_fact_agrees_with_what_vllms_sources_key_by(name: str) -> None:
    row = salt_tiers()[name]
    generated = load_facts()["connectors"][name].get("salt_keys", {}).get("values", [])
    registered = load_facts()["connectors"][name].get("v1", [])
    assert registered, f"{name} is registered in no release"
    if row.keys == "any":
        assert generated
        return
    # every interval the sources were read for says what the table says
    assert generated and {g["value"] for g in generated} == {row.keys}, (name, generated)


def test_the_generated_key_facts_tell_the_tiers_apart() -> None:
    """The extractor's own evidence on vLLM 0.32.0 (a test that could fail: P/D connectors must not
    look like caches, nor an LMCache event's block_hashes like a key)."""
    at = {name: next((g for g in entry.get("salt_keys", {}).get("values", []) if Version(g["since"]) <= Version("0.32.0")
                      and (g["until"] is None or Version("0.32.0") < Version(g["until"]))), None)
          for name, entry in load_facts()["connectors"].items()}
    assert at["MooncakeStoreConnector"]["value"] == "block_hashes"
    assert at["MooncakeStoreConnector"]["file"].endswith("mooncake/store/scheduler.py")
    assert at["SimpleCPUOffloadConnector"]["file"].startswith("vllm/v1/simple_kv_offload/")
    assert at["MooncakeConnector"]["value"] == at["LMCacheConnectorV1"]["value"] == "none"


def test_releases_that_take_cache_salt() -> None:
    t = table()
    assert t.capability("api.completions.cache_salt").span.since == "0.10.0"
    assert t.capability("api.chat_completions.cache_salt").span.since == "0.9.0"
    assert not assess_salt(Version("0.9.2"), ["MooncakeStoreConnector"]).takes_salt


@pytest.mark.parametrize(("leaves", "isolates", "words"), [
    (["MooncakeStoreConnector"], True, "salting isolates every tier"),
    (["OffloadingConnector"], True, "salting isolates every tier"),
    (["LMCacheConnectorV1"], False, "tier LMCacheConnectorV1 ignores the salt"),
    (["MooncakeConnector", "MooncakeStoreConnector"], True, "the P/D transfer is no cache"),
    (["LMCacheMPConnector"], False, "not known from vLLM's sources"),
    (["FlexKVConnectorV1"], False, "not known"),
])
def test_assess_salt(leaves: list[str], isolates: bool, words: str) -> None:
    a = assess_salt(Version("0.32.0"), leaves)
    assert a.isolates is isolates and words in a.verdict
    assert a.tiers[0].tier == "local prefix cache" and a.tiers[0].salt == "honours"
    if not isolates:
        assert any("kvctl reset --connector" in f for f in a.fixes)


def test_compat_report_and_matrix_carry_it() -> None:
    ktc = {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": [
        {"kv_connector": "MooncakeConnector"}, {"kv_connector": "LMCacheConnectorV1"}]}}
    report = assess(Version("0.32.0"), ktc)
    assert report.salt["isolates"] is False and "LMCacheConnectorV1 ignores the salt" in report.salt["verdict"]
    json.dumps(report.to_dict())
    table_md = "\n".join(salt_markdown())
    assert "| LMCacheConnectorV1 | ignores |" in table_md and "| MooncakeStoreConnector | honours |" in table_md


@pytest.mark.parametrize(("args", "code"), [
    (["--vllm-version", "0.32.0"], 0),
    (["--vllm-version", "0.32.0", "--template", "lmcache-mooncake"], 1),
    (["--vllm-version", "0.9.2"], 1),
])
def test_require_salt_isolation(cli, args: list[str], code: int) -> None:  # noqa: ANN001
    result = cli("compat", "check", *args, "--require", "salt-isolation", "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == code and data["requirement_met"] is (code == 0) and data["require"] == "salt-isolation"
    assert data["salt"]["isolates"] is (code == 0)
