"""Compat verdicts for each connector family across the version boundaries."""

from __future__ import annotations

import pytest

from kvctl.facts.compat import assess, matrix, matrix_markdown, salt_markdown
from kvctl.facts.versions import parse_version

STORE = {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"}
LMCACHE = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
P2P = {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer"}
MULTI = {"kv_connector": "MultiConnector", "kv_role": "kv_both",
         "kv_connector_extra_config": {"connectors": [P2P, STORE]}}
MULTI_STORE = {"kv_connector": "MultiConnector", "kv_role": "kv_both",
               "kv_connector_extra_config": {"connectors": [STORE]}}


@pytest.mark.parametrize(
    ("layout", "version", "verdict", "external"),
    [
        # 0.12 / 0.13: no HTTP connector reset before 0.13
        (None, "0.12.0", "no-hard-reset", "not-applicable"),
        (None, "0.13.0", "hard-reset", "not-applicable"),
        (P2P, "0.12.0", "no-hard-reset", "missing"),
        (P2P, "0.13.0", "no-hard-reset", "silent-no-op"),
        # 0.20 / 0.21: MooncakeStoreConnector appears, but its reset is a no-op
        (STORE, "0.20.0", "no-hard-reset", "unknown"),
        (STORE, "0.21.0", "hard-reset-with-master-clear", "silent-no-op"),
        # 0.22 / 0.23: the store connector clears the master from 0.23
        (STORE, "0.22.0", "hard-reset-with-master-clear", "silent-no-op"),
        (STORE, "0.23.0", "hard-reset", "works"),
        (STORE, "0.32.0+cpu", "hard-reset", "works"),
        (MULTI_STORE, "0.22.0", "hard-reset-with-master-clear", "silent-no-op"),
        (MULTI_STORE, "0.23.0", "hard-reset", "works"),
        # LMCache and P2P: never, on any version
        (LMCACHE, "0.13.0", "hard-reset-with-master-clear", "silent-no-op"),
        (LMCACHE, "0.33.0", "hard-reset-with-master-clear", "silent-no-op"),
        (P2P, "0.33.0", "no-hard-reset", "silent-no-op"),
        (MULTI, "0.23.0", "no-hard-reset", "silent-no-op"),
    ],
)
def test_verdicts(layout: dict | None, version: str, verdict: str, external: str) -> None:
    report = assess(parse_version(version), layout)
    assert report.verdict == verdict
    assert report.operation("external_store").status == external
    assert report.meets_hard_reset() is (verdict == "hard-reset")
    assert report.meets_hard_reset(with_master=True) is (verdict != "no-hard-reset")
    if verdict != "hard-reset":
        assert report.reasons and report.fixes


def test_fixes_name_the_upgrade() -> None:
    assert "upgrade vLLM to >= 0.23.0" in assess(parse_version("0.22.0"), STORE).fixes
    assert "upgrade vLLM to >= 0.23.0" in assess(parse_version("0.20.0"), STORE).fixes
    assert "upgrade vLLM to >= 0.23.0" in assess(parse_version("0.12.0"), STORE).fixes
    lm = assess(parse_version("0.33.0"), LMCACHE)
    assert not any("upgrade" in f for f in lm.fixes)
    assert any("--master" in f for f in lm.fixes)


@pytest.mark.parametrize(
    ("version", "mm", "encoder", "pause_detail"),
    [("0.13.0", "works", "missing", "wait_for_inflight_requests"), ("0.16.0", "works", "works", "mode=abort")],
)
def test_other_operations(version: str, mm: str, encoder: str, pause_detail: str) -> None:
    report = assess(parse_version(version), None)
    assert report.operation("mm_cache").status == mm
    assert report.operation("encoder_cache").status == encoder
    assert pause_detail in report.operation("pause").detail
    assert bool(report.caveats) is (encoder == "missing")


def test_matrix_matches_table() -> None:
    data = matrix()
    row = next(r for r in data["rows"] if r["id"] == "connector.MooncakeStoreConnector.reset")
    assert [v for v, ok in row["cells"].items() if ok] == [v for v in data["versions"] if parse_version(v) >= parse_version("0.23.0")]
    field = next(r for r in data["rows"] if r["id"] == "field.kv_ip")
    assert field["cells"]["0.28.0"] is True and field["cells"]["0.32.0"] is False
    md = matrix_markdown()
    assert md.splitlines()[0].startswith("| capability | 0.9.0 |")
    assert len(md.splitlines()) == 2 * len(data["rows"]) + 7 + 1 + len(salt_markdown())  # and the salt table
    assert "| MooncakeStoreConnector reset clears its store | 0.23.0 |" in md


# -- the shared-master hazard: the release's own calls that wipe every deployment -------------------
@pytest.mark.parametrize(("layout", "version", "calls"), [
    (STORE, "0.22.0", None),  # its reset clears nothing, so neither does a sleep or pause
    (STORE, "0.23.0", ["sleep", "pause with the default clear_cache=true", "connector reset"]),
    (MULTI_STORE, "0.32.0+cpu", ["sleep", "pause with the default clear_cache=true", "connector reset"]),
    (LMCACHE, "0.33.0", None),  # its reset clears nothing of the master
    (P2P, "0.33.0", None),
    (None, "0.33.0", None),
])
def test_shared_master_hazard(layout: dict | None, version: str, calls: list[str] | None) -> None:
    report = assess(parse_version(version), layout)
    if calls is None:
        assert report.shared_master is None
        return
    hazard = report.shared_master
    assert hazard is not None and hazard["since"] == "0.23.0" and hazard["connector"] == "MooncakeStoreConnector"
    assert [c.split(" (")[0] for c in hazard["calls"]] == calls
    assert "wipes EVERY deployment's keys" in hazard["message"] and "connector.py:203" in hazard["message"]
    assert hazard["isolation"].startswith("give each deployment its own Mooncake master")
    assert report.verdict == "hard-reset"  # a fact about sharing, not about the reset: the verdict stands


def test_compat_check_says_the_hazard(cli) -> None:
    out = cli("compat", "check", "--vllm-version", "0.24.0").stdout
    assert "shared master: vLLM 0.24.0 wipes EVERY deployment's keys" in out
    assert "isolation: give each deployment its own Mooncake master" in out and "only isolation" in out
    assert "shared master" not in cli("compat", "check", "--vllm-version", "0.22.0").stdout
    import json

    data = json.loads(cli("compat", "check", "--vllm-version", "0.32.0", "--json").stdout)
    assert data["shared_master"]["since"] == "0.23.0" and "--enable_multi_tenants=true" in data["shared_master"]["isolation"]
