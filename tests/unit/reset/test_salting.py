"""kvctl.reset.salting (kvctl salt check, kvctl.check_salt_isolation) against the vLLM TEST DOUBLE.

The real stack's verdict (isolated on both tiers) is tests/e2e/test_salt_isolation.py. What a real
vLLM cannot be made to produce is produced here by the double: an external tier whose keys ignore
the salt (LEAKS, what LMCache's token-only keys do), a replica with prefix caching or the connector
off, or no per-request count (unproven, with the reason), and a single replica.
"""

from __future__ import annotations

import json

import pytest

import kvctl
from kvctl.errors import UsageError
from kvctl.reset.salting import SaltOptions, salts_of_versions
from tests.doubles import DoubleFleet, SharedStore, VllmDouble

SALTS = ["v7", "v8"]


def _fleet(n: int = 2, **kw: object) -> tuple[DoubleFleet, SharedStore]:
    store = SharedStore()
    kw.setdefault("cache_salt", True)
    return DoubleFleet(replicas=[VllmDouble(store=store, **kw) for _ in range(n)]), store  # type: ignore[arg-type]


def _tiers(report: kvctl.api.SaltReport) -> list[tuple[str, str]]:  # type: ignore[name-defined]
    return [(r.local.verdict, r.store.verdict) for r in report.replicas]


def test_a_salt_honoured_everywhere_is_isolated_on_both_tiers() -> None:
    fleet, store = _fleet()
    with fleet:
        report = kvctl.check_salt_isolation(urls=fleet.urls, salts=SALTS, settle=0)
    assert report.exit_code == 0, report.to_dict()
    assert _tiers(report) == [("isolated", "isolated")] * 2
    for r in report.replicas:
        assert r.local.cross.cached_tokens == 0 and r.local.control.cached_tokens > 0
        # the reader never saw the prompt: its same-salt hit came from the store, the other salt's nothing
        assert r.store.cross.cached_tokens == 0 and r.store.control.cached_tokens > 0
        assert r.store.control.external_hits == r.store.control.cached_tokens
        assert r.local.signal == r.store.signal == "cached_tokens"
    assert [r.store.primed_on for r in report.replicas] == [report.replicas[1].name, report.replicas[0].name]
    assert len(store) > 0  # the proof wrote its own fresh keys, and removed nothing


def test_a_store_whose_keys_ignore_the_salt_leaks() -> None:
    """The double's store_ignores_salt fault: the local cache honours the salt, the store does not."""
    fleet, _ = _fleet(store_ignores_salt=True)
    with fleet:
        report = kvctl.check_salt_isolation(urls=fleet.urls, salts=SALTS, settle=0)
    assert report.exit_code == 1
    assert _tiers(report) == [("isolated", "LEAKS")] * 2
    leak = report.replicas[0].store
    assert leak.cross.cached_tokens > 0 and leak.cross.external_hits == leak.cross.cached_tokens
    assert "'v8'" in leak.reason and "external store" in leak.reason and "kvctl reset --connector" in leak.hint
    assert "LEAKS" in report.summary


def test_a_cache_that_ignores_the_salt_everywhere_leaks_locally_too() -> None:
    fleet, _ = _fleet(cache_salt=False)
    with fleet:
        report = kvctl.check_salt_isolation(urls=fleet.urls, salts=SALTS, settle=0)
    assert _tiers(report) == [("LEAKS", "LEAKS")] * 2 and report.exit_code == 1


def test_a_tier_that_is_off_is_unproven_not_isolated() -> None:
    """No store behind the connector: the other salt finds nothing, but neither does the same salt."""
    fleet = DoubleFleet(replicas=[VllmDouble(store=None, cache_salt=True) for _ in range(2)])
    with fleet:
        report = kvctl.check_salt_isolation(urls=fleet.urls, salts=SALTS, settle=0)
    assert report.exit_code == 3
    assert _tiers(report) == [("isolated", "unproven")] * 2
    assert "0 cached tokens" in report.replicas[0].store.reason and report.replicas[0].store.hint


def test_no_connector_and_no_prefix_cache_hits_are_unproven_with_the_reason() -> None:
    fleet = DoubleFleet(replicas=[VllmDouble(connector=None, cache_salt=True) for _ in range(2)])
    with fleet:
        for d in fleet.replicas:  # a local cache that serves nothing (--enable-prefix-caching off)
            d.local_blocks = _Forgetful()
        report = kvctl.check_salt_isolation(urls=fleet.urls, salts=SALTS, settle=0)
    assert _tiers(report) == [("unproven", "unproven")] * 2 and report.exit_code == 3
    r = report.replicas[0]
    assert "--enable-prefix-caching" in r.local.hint and "no KV connector" in r.store.reason


def test_one_replica_leaves_the_store_unproven() -> None:
    fleet, _ = _fleet(1)
    with fleet:
        report = kvctl.check_salt_isolation(urls=fleet.urls, salts=SALTS, settle=0)
    assert _tiers(report) == [("isolated", "unproven")] and "one replica with a store" in report.replicas[0].store.reason


def test_without_per_request_counts_the_counters_decide_and_say_so() -> None:
    fleet, _ = _fleet(prompt_tokens_details=False, store_ignores_salt=True)
    with fleet:
        report = kvctl.check_salt_isolation(urls=fleet.urls, salts=SALTS, settle=0)
    r = report.replicas[0]
    assert (r.local.verdict, r.local.signal) == ("isolated", "metrics")
    assert r.store.verdict == "LEAKS" and "other traffic" in r.store.reason


def test_a_release_without_cache_salt_is_unproven() -> None:
    fleet = DoubleFleet(replicas=[VllmDouble("0.9.2", connector=None) for _ in range(2)])
    with fleet:
        report = kvctl.check_salt_isolation(urls=fleet.urls, salts=SALTS, settle=0)
    assert _tiers(report) == [("unproven", "unproven")] * 2
    assert "takes no cache_salt" in report.replicas[0].local.reason
    assert all(d.counters.requests == 0 for d in fleet.replicas)  # nothing was sent


def test_a_paused_replica_gets_no_request() -> None:
    fleet, _ = _fleet()
    with fleet:
        fleet.replicas[0].paused, fleet.replicas[0].pause_mode = True, "keep"
        report = kvctl.check_salt_isolation(urls=fleet.urls, salts=SALTS, settle=0, timeout=5)
        assert fleet.replicas[0].counters.requests == 0
    assert report.replicas[0].local.verdict == "unproven" and "paused" in report.replicas[0].local.reason


def test_options_and_versions() -> None:
    assert salts_of_versions(["7", "8"], "weight-version:{version}") == ("weight-version:7", "weight-version:8")
    assert SaltOptions().check().salts[0] != SaltOptions().check().salts[0]  # fresh random salts
    for bad in (("a", "a"), ("a", ""), ("a",), "ab", None.__class__):
        with pytest.raises(UsageError):
            SaltOptions(salts=bad).check()  # type: ignore[arg-type]
    with pytest.raises(UsageError):
        salts_of_versions(["7", "8"], "no placeholder")
    with pytest.raises(UsageError, match="salt=|salts=|weight-version|versions"):
        kvctl.check_salt_isolation(urls=["http://127.0.0.1:9"], salts=SALTS, versions=["1", "2"])


def test_the_cli_json_and_table(cli) -> None:  # noqa: ANN001
    fleet, _ = _fleet(store_ignores_salt=True)
    with fleet:
        args = [a for u in fleet.urls for a in ("--url", u)]
        result = cli("salt", "check", *args, "--weight-version", "7", "--weight-version", "8", "--settle", "0",
                     "--json")
        table = cli("salt", "check", *args, "--settle", "0")
    data = json.loads(result.stdout)
    assert result.exit_code == 1 and data["exit_code"] == 1 and data["salts"] == ["7", "8"]
    assert [(r["local"]["verdict"], r["store"]["verdict"]) for r in data["replicas"]] == [("isolated", "LEAKS")] * 2
    assert table.exit_code == 1 and "LEAKS" in table.stdout and "external store" in table.stdout
    bad = cli("salt", "check", *args, "--salt", "only-one")
    assert bad.exit_code == 2 and "two salts" in bad.stderr


class _Forgetful(set):  # type: ignore[type-arg]
    """A local block set that keeps nothing (the double's prefix caching off)."""

    def update(self, *_: object) -> None:
        pass


def test_the_store_ring_leaves_out_a_replica_without_a_connector() -> None:
    """Three replicas, the middle one without a connector: the other two read each other's store prompts."""
    store = SharedStore()
    doubles = [VllmDouble(store=store, cache_salt=True), VllmDouble(connector=None, cache_salt=True),
               VllmDouble(store=store, cache_salt=True)]
    with DoubleFleet(replicas=doubles) as fleet:
        report = kvctl.check_salt_isolation(urls=fleet.urls, salts=SALTS, settle=0)
    assert _tiers(report) == [("isolated", "isolated"), ("isolated", "unproven"), ("isolated", "isolated")]
    a, _, c = report.replicas
    assert (a.store.primed_on, c.store.primed_on) == (c.name, a.name)
