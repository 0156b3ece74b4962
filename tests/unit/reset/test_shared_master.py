"""The reset plan and the shared-master hazard (issue 37 item 2): kvctl's scoped clear keeps the other
deployments' keys, but where it can see that the fleet's own vLLM (0.23+, MooncakeStoreConnector) wipes
them on every sleep, default pause or connector reset, the plan says so instead of calling it safe.
Against HTTP test doubles of vLLM and of the master's admin port (nothing is cleared: --dry-run)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from kvctl.reset.plan import ResetOptions, plan_reset
from kvctl.targets import build_fleet
from tests.doubles import DoubleFleet, MasterDouble, SharedStore, VllmDouble

RPC = "127.0.0.1:50051"  # never reached: the plan only needs to know it


@pytest.fixture
def doubles() -> Iterator[DoubleFleet]:
    with DoubleFleet() as fleet:
        yield fleet


def plan(urls: list[str], master: str, **options: object):
    fleet = build_fleet(urls, master=master, master_rpc=RPC, env={})
    options = {"connector": True, "timeout": 2.0, **options}
    return asyncio.run(plan_reset(fleet, ResetOptions(**options)))  # type: ignore[arg-type]


@pytest.mark.parametrize("version", ["0.24.0", "0.32.0+cpu"])
def test_a_scoped_clear_is_not_called_safe_where_the_fleet_s_vllm_wipes_the_master(doubles: DoubleFleet,
                                                                                  version: str) -> None:
    store = SharedStore()
    urls = [doubles.add(VllmDouble(version, store=store, cache_prefix="team-a")) for _ in range(2)]
    master = doubles.add_master(MasterDouble(store))
    p = plan(urls, master)
    assert p.error is None and p.master_clear_scope == "scoped"
    assert p.shared_master is not None and p.shared_master in p.notes
    for words in ("kvctl's clear keeps other deployments' keys", "wipes EVERY deployment's keys",
                  "sleep (POST /sleep", "pause with the default clear_cache=true", "reset_connector=True",
                  "from vLLM 0.23.0", "verl does, every step", "its own Mooncake master"):
        assert words in p.shared_master, words
    # kvctl itself never sends the master-wide reset
    assert all(op.params.get("reset_external") is False for r in p.replicas for op in r.ops if op.op == "prefix_cache")


def test_the_dry_run_says_kept_by_this_clear_not_by_the_fleet(cli, doubles: DoubleFleet) -> None:
    store = SharedStore()
    url = doubles.add(VllmDouble("0.32.0+cpu", store=store, cache_prefix="team-a"))
    master = doubles.add_master(MasterDouble(store))
    out = cli("reset", "--url", url, "--master", master, "--master-rpc", RPC, "--connector", "--dry-run")
    text = " ".join(out.stdout.split())
    assert out.exit_code == 0, out.stdout + out.stderr
    assert "other deployments' keys are kept by this clear, NOT by this fleet's own vLLM" in text
    assert "note: shared master: kvctl's clear keeps other deployments' keys" in text
    data = json.loads(cli("reset", "--url", url, "--master", master, "--master-rpc", RPC, "--connector",
                          "--dry-run", "--json").stdout)
    assert "wipes EVERY deployment's keys" in data["plan"]["shared_master"]


def test_nothing_to_say_where_vllm_s_resets_do_not_reach_the_master_or_the_clear_is_whole(doubles: DoubleFleet) -> None:
    store = SharedStore()
    # 0.22: the connector reset clears nothing; kvctl's clear is the only one (and 0.22 ignores cache_prefix:
    # a scoped clear is refused, tests/unit/reset/test_reset.py); --whole-master: nothing is called safe
    old = [doubles.add(VllmDouble("0.22.0", store=store, cache_prefix="team-a"))]
    master = doubles.add_master(MasterDouble(store))
    assert plan(old, master, whole_master=True).shared_master is None
    new = [doubles.add(VllmDouble("0.32.0+cpu", store=store, cache_prefix="team-a"))]
    whole = plan(new, master, whole_master=True)
    assert whole.shared_master is None and whole.master_clear_scope is None  # vLLM clears it, whole
    unscoped = plan([doubles.add(VllmDouble("0.32.0+cpu", store=store))], master)
    assert unscoped.shared_master is None
    assert any("clears the WHOLE master" in n for n in unscoped.notes)  # said as it was
