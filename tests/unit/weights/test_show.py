"""kvctl weights show against the vLLM and master TEST DOUBLES: each replica's weight version and
checksum digest, where it cannot know them and why, and the flag on a cache namespace whose replicas
serve different weights (issue 26, deliverable 2)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from kvctl.errors import EXIT_FAILED, EXIT_OK
from kvctl.targets import build_fleet
from kvctl.weights.show import WeightsReport, show_weights
from tests.doubles import DoubleFleet, MasterDouble, SharedStore, VllmDouble


@pytest.fixture
def doubles() -> Iterator[DoubleFleet]:
    with DoubleFleet() as fleet:
        yield fleet


def show(urls: list[str], master: str | None = None, **kwargs: Any) -> WeightsReport:
    fleet = build_fleet(urls, master=master, env={})
    return asyncio.run(show_weights(fleet, timeout=2.0, **kwargs))


def scoped(store: SharedStore, prefix: str | None, **kwargs: Any) -> VllmDouble:
    extra = {"cache_prefix": prefix} if prefix else {}
    return VllmDouble(store=store, kv_transfer_config={"kv_connector": "MooncakeStoreConnector",
                                                       "kv_role": "kv_both", "kv_connector_extra_config": extra},
                      **kwargs)


def test_versions_digests_and_a_uniform_fleet(doubles: DoubleFleet) -> None:
    store = SharedStore()
    a, b = scoped(store, "rl", weights="seed-0"), scoped(store, "rl", weights="seed-0", data_parallel=2)
    a.weight_version = b.weight_version = "step-4"
    urls = [doubles.add(a), doubles.add(b)]
    report = show(urls, doubles.add_master(MasterDouble(store)))
    assert report.ok and report.mixed == []
    first, second = report.replicas
    assert (first.weight_version, second.weight_version) == ("step-4", "step-4")
    assert first.digest == second.digest and first.digest is not None  # dp copies collapse: same digest
    assert (first.workers, second.workers) == (1, 2)
    assert first.namespace == "rl" and first.connector == ["MooncakeStoreConnector"]
    assert first.connector_source == "server_info" and first.weight_note is None
    assert report.summary == "2/2 replica(s) read; weight version(s): step-4"


def test_mixed_versions_in_one_namespace_are_flagged(doubles: DoubleFleet) -> None:
    store = SharedStore()
    a, b = scoped(store, "rl"), scoped(store, "rl")
    b.weight_version = "v2"
    report = show([doubles.add(a), doubles.add(b)])  # no master named: the servers' own prefixes say it
    assert report.exit_code == EXIT_FAILED and len(report.mixed) == 1
    assert "cache_prefix 'rl'" in report.mixed[0].problem and "v2" in report.mixed[0].problem
    assert report.mixed[0].replicas == [r.name for r in report.replicas]
    assert "MIXED WEIGHTS" in report.summary


def test_same_label_other_weights_is_flagged_by_checksum(doubles: DoubleFleet) -> None:
    store = SharedStore()
    a, b = scoped(store, None, weights="seed-0"), scoped(store, None, weights="seed-1")
    report = show([doubles.add(a), doubles.add(b)])
    assert not report.ok and "different weight checksums" in report.mixed[0].problem
    assert "the master's unprefixed keys" in report.mixed[0].problem
    hashed = sum(c.path == "/weight_checker" for c in a.calls)
    assert not show([a.url, b.url], checksums=False).mixed  # versions alone cannot see it
    assert sum(c.path == "/weight_checker" for c in a.calls) == hashed == 1


def test_other_namespaces_and_connectorless_replicas_may_differ(doubles: DoubleFleet) -> None:
    store = SharedStore()
    a, b, lone = scoped(store, "run-a"), scoped(store, "run-b"), VllmDouble(connector=None)
    b.weight_version, lone.weight_version = "v2", "v3"
    report = show([doubles.add(a), doubles.add(b), doubles.add(lone)], doubles.add_master(MasterDouble(store)))
    assert report.ok, report.summary
    assert [r.namespace for r in report.replicas] == ["run-a", "run-b", None]


def test_a_replica_whose_workers_disagree_is_flagged_alone(doubles: DoubleFleet) -> None:
    double = VllmDouble(connector=None, data_parallel=2)
    double.rank_weights["dp1:pp0:pcp0:tp0:"] = "stale"
    report = show([doubles.add(double)])
    assert not report.ok and "workers hold different weights" in report.mixed[0].problem
    assert len(report.replicas[0].disagreeing) == 3


def test_unknown_where_vllm_cannot_say_and_why(doubles: DoubleFleet) -> None:
    store = SharedStore()
    old, no_checker = VllmDouble("0.26.0", store=store), VllmDouble("0.31.0", store=store)
    off = VllmDouble("0.32.0", store=store, dev_mode=False)
    gone = VllmDouble()
    urls = [doubles.add(d) for d in (old, no_checker, off, gone)]
    gone.faults.refuse = True
    report = show(urls, doubles.add_master(MasterDouble(store)))
    r_old, r_31, r_off, r_gone = report.replicas
    assert r_old.weight_version is None and r_old.weight_note is not None
    assert r_old.weight_note.startswith("vLLM 0.26.0 has no /weight_info (first in 0.27.0)")
    assert r_31.weight_version == "default" and r_31.digest is None
    assert r_31.weight_note == "vLLM 0.31.0 has no /weight_checker (first in 0.32.0)"
    assert r_off.weight_version is None and "dev mode off" in (r_off.weight_note or "")
    assert r_off.connector_source is not None and r_off.connector_source.startswith("unknown (/server_info")
    assert r_gone.error is not None and r_gone.error.startswith("cannot read its version")
    assert report.exit_code == EXIT_FAILED and report.mixed == []  # unreadable, not mixed
    assert "1 without a known version" not in report.summary and "2 without a known version" in report.summary


def test_json_shape(doubles: DoubleFleet) -> None:
    report = show([doubles.add(VllmDouble())])
    data = json.loads(json.dumps(report.to_dict()))
    assert set(data) == {"replicas", "mixed", "master", "cache_prefix", "checksums", "elapsed_s", "ok", "exit_code",
                         "summary"}
    assert data["exit_code"] == EXIT_OK and data["mixed"] == []
    assert set(data["replicas"][0]) == {"name", "url", "vllm_version", "weight_version", "digest", "workers",
                                        "disagreeing", "weight_note", "connector", "connector_source",
                                        "cache_prefix", "namespace", "error"}


# -- the CLI ----------------------------------------------------------------------------------------
def test_cli_table_json_and_exit(cli, doubles: DoubleFleet) -> None:
    store = SharedStore()
    a, b = scoped(store, "rl"), scoped(store, "rl")
    old = VllmDouble("0.26.0", connector=None)
    urls = [doubles.add(a), doubles.add(b), doubles.add(old)]
    args = ["weights", "show", "--url", urls[0], "--url", urls[1], "--url", urls[2], "--timeout", "2"]
    ok = cli(*args)
    assert ok.exit_code == EXIT_OK, ok.stdout + ok.stderr
    assert "cache_prefix 'rl'" in ok.stdout and "default" in ok.stdout
    assert "unknown (vLLM 0.26.0 has no /weight_info" in ok.stdout
    digest = show([urls[0]]).replicas[0].digest
    assert digest and ok.stdout.count(digest) == 2  # a and b: the same weights

    b.weight_version = "v2"
    mixed = cli(*args)
    assert mixed.exit_code == EXIT_FAILED and "mixed weights:" in mixed.stdout and "fix:" in mixed.stdout
    data = json.loads(cli(*args, "--json").stdout)
    assert data["exit_code"] == EXIT_FAILED
    assert data["mixed"][0]["replicas"] == [r["name"] for r in data["replicas"][:2]]
    quick = json.loads(cli(*args, "--json", "--no-checksums").stdout)
    assert quick["checksums"] is False and all(r["digest"] is None for r in quick["replicas"])


def test_cli_bad_usage(cli) -> None:
    zero = cli("weights", "show", "--url", "http://127.0.0.1:9", "--timeout", "0")
    assert zero.exit_code == 2 and "--timeout must be" in zero.stderr
    bad = cli("weights", "show", "--url", "ftp://x")
    assert bad.exit_code == 2 and "is not an http(s) URL" in bad.stderr
