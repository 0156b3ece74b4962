"""kvctl reset and the weights it clears for (issue 26): receipts record each replica's weight version
(and, with --verify, its checksum digest); --verify fails replicas that share one cache namespace but
serve different weights, unless allow_mixed_weights. Against the vLLM and master TEST DOUBLES."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

import kvctl
from kvctl.errors import EXIT_FAILED, EXIT_OK, UsageError
from tests.doubles import DoubleFleet, MasterDouble, SharedStore, VllmDouble
from tests.unit.reset.test_reset import reset, warm


@pytest.fixture
def doubles() -> Iterator[DoubleFleet]:
    with DoubleFleet() as fleet:
        yield fleet


def pair(doubles: DoubleFleet, **kwargs: object) -> tuple[VllmDouble, VllmDouble, list[str], str]:
    store = SharedStore()
    a, b = VllmDouble(store=store, **kwargs), VllmDouble(store=store, **kwargs)  # type: ignore[arg-type]
    urls = [doubles.add(a), doubles.add(b)]
    return a, b, urls, doubles.add_master(MasterDouble(store))


def test_receipts_record_the_weights_they_cleared_for(doubles: DoubleFleet) -> None:
    a, b, urls, master = pair(doubles, weights="seed-0")
    a.weight_version = b.weight_version = "step-3"
    plain = reset(urls, master, connector=True)
    assert plain.ok and [r.weight_version for r in plain.replicas] == ["step-3", "step-3"]
    assert plain.replicas[0].weight_digest is None  # no hashing of every weight unless verifying
    assert not any(c.path == "/weight_checker" for c in a.calls)

    verified = reset(urls, master, connector=True, verify=True)
    assert verified.ok, verified.summary
    digests = {r.weight_digest for r in verified.replicas}
    assert len(digests) == 1 and None not in digests
    data = verified.to_dict()["replicas"][0]
    assert data["weight_version"] == "step-3" and data["weight_digest"] == digests.pop()
    assert data["weight_note"] is None


def test_verify_fails_on_mixed_weight_versions_after_resetting(doubles: DoubleFleet) -> None:
    a, b, urls, master = pair(doubles)
    b.weight_version = "v2"
    warm(a)
    receipt = reset(urls, master, connector=True, verify=True)
    assert receipt.exit_code == EXIT_FAILED and receipt.not_reset == [r.name for r in receipt.replicas]
    for r in receipt.replicas:
        assert r.error is not None and r.error.startswith("verification failed: replicas sharing")
        assert "default" in r.error and "v2" in r.error and "--allow-mixed-weights" in r.error
        assert all(o.result != "failed" for o in r.ops) and r.canary is not None and r.canary.ok  # it did reset
    assert receipt.master is not None and receipt.master.keys_after == 0

    allowed = reset(urls, master, connector=True, verify=True, allow_mixed_weights=True)
    assert allowed.exit_code == EXIT_OK, allowed.summary
    assert "mixed weights:" in " ".join(allowed.plan.notes)
    unverified = reset(urls, master, connector=True)  # no verify: a note, not a failure
    assert unverified.ok and any(n.startswith("mixed weights:") for n in unverified.plan.notes)


def test_same_label_different_weights_fails_verify_by_checksum(doubles: DoubleFleet) -> None:
    a, b, urls, master = pair(doubles)
    b.weights = "seed-1"  # reloaded, never relabelled: both still say "default"
    receipt = reset(urls, master, connector=True, verify=True)
    assert receipt.exit_code == EXIT_FAILED
    assert all("different weight checksums" in (r.error or "") for r in receipt.replicas)


def test_replicas_that_share_no_namespace_may_differ(doubles: DoubleFleet) -> None:
    """Other cache_prefixes, or no connector at all: their KV never meets, so no flag."""
    store = SharedStore()

    def scoped(prefix: str) -> VllmDouble:
        return VllmDouble(store=store, kv_transfer_config={
            "kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"cache_prefix": prefix}})

    a, b, lone = scoped("run-a"), scoped("run-b"), VllmDouble(connector=None)
    b.weight_version = lone.weight_version = "v2"
    urls = [doubles.add(a), doubles.add(b), doubles.add(lone)]
    master = doubles.add_master(MasterDouble(store))
    receipt = reset(urls, master, connector=True, whole_master=True, verify=True)
    assert receipt.plan.weights_mixed == [], receipt.plan.weights_mixed
    assert receipt.ok, receipt.summary
    a.kv_transfer_config["kv_connector_extra_config"]["cache_prefix"] = "run-b"  # now a and b share one
    mixed = reset(urls, master, connector=True, whole_master=True, verify=True)
    assert [m.replicas for m in mixed.plan.weights_mixed] == [[r.name for r in mixed.replicas[:2]]]
    assert "cache_prefix 'run-b'" in mixed.plan.weights_mixed[0].problem
    assert mixed.replicas[2].reset and not mixed.replicas[0].reset


def test_versions_without_the_routes_are_recorded_as_unknown(doubles: DoubleFleet) -> None:
    store = SharedStore()
    old, new = VllmDouble("0.26.0", store=store), VllmDouble("0.31.0", store=store)
    new.weight_version = "v9"
    urls = [doubles.add(old), doubles.add(new)]
    master = doubles.add_master(MasterDouble(store))
    receipt = reset(urls, master, connector=True, verify=True)
    assert receipt.ok, receipt.summary  # one version known only: nothing to compare it with
    first, second = receipt.replicas
    assert first.weight_version is None
    assert first.weight_note == "vLLM 0.26.0 has no /weight_info (first in 0.27.0); vLLM 0.26.0 has no " \
        "/weight_checker (first in 0.32.0)"
    assert second.weight_version == "v9" and second.weight_digest is None
    assert second.weight_note == "vLLM 0.31.0 has no /weight_checker (first in 0.32.0)"


def test_allow_mixed_weights_needs_verify(cli, doubles: DoubleFleet) -> None:
    _, _, urls, master = pair(doubles)
    with pytest.raises(UsageError, match="it needs verify"):
        kvctl.hard_reset(urls=urls, master=master, allow_mixed_weights=True)
    result = cli("reset", "--url", urls[0], "--allow-mixed-weights")
    assert result.exit_code == 2 and "--allow-mixed-weights" in result.stderr


def test_cli_verify_exit_and_json(cli, doubles: DoubleFleet) -> None:
    a, b, urls, master = pair(doubles)
    b.weight_version = "v2"
    args = ["reset", "--url", urls[0], "--url", urls[1], "--master", master, "--connector", "--verify",
            "--timeout", "2"]
    failed = cli(*args, "--json")
    data = json.loads(failed.stdout)
    assert failed.exit_code == EXIT_FAILED and data["ok"] is False
    assert [r["weight_version"] for r in data["replicas"]] == ["default", "v2"]
    assert data["plan"]["weights_mixed"][0]["replicas"] == [r["name"] for r in data["replicas"]]
    table = cli(*args)
    assert table.exit_code == EXIT_FAILED and "verification failed: replicas sharing" in table.stdout
    assert "weights" in table.stdout and "v2" in table.stdout
    assert cli(*args, "--allow-mixed-weights").exit_code == EXIT_OK
    dry = cli("reset", "--url", urls[0], "--url", urls[1], "--master", master, "--dry-run")
    assert dry.exit_code == EXIT_OK and "mixed weights:" in dry.stdout
