"""The master phase counts each phase once, as cheaply as its number allows (issue 29), and the receipt
says "not counted" / "at least" where it gives no exact number: against the master HTTP TEST DOUBLE.

A whole-master clear takes its totals from the master_key_count gauge (no listing when the clear leaves
no key); the split per deployment before it is listed only on a master of at most EXACT_BEFORE_MAX keys.
Scoped clears need Mooncake's store client: tests/integration/test_reset_scale.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from kvctl.reset import master as master_phase
from kvctl.reset.execute import ResetOptions, hard_reset_fleet
from kvctl.targets import build_fleet
from tests.doubles import DoubleFleet, MasterDouble, SharedStore, VllmDouble


@pytest.fixture
def doubles() -> Iterator[DoubleFleet]:
    with DoubleFleet() as fleet:
        yield fleet


def _key(deployment: str, i: int) -> str:
    """A key shaped as vLLM's MooncakeStoreConnector writes it (kvctl counts a deployment's keys by that shape)."""
    return f"{deployment}@m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@{i:x}"


def _fleet(doubles: DoubleFleet, mine: int, others: int) -> tuple[list[str], str, MasterDouble]:
    store = SharedStore([_key("rl-a", i) for i in range(mine)] + [_key("svc-b", i) for i in range(others)])
    # 0.22's connector cannot clear the store: kvctl plans the forced remove_all (whole master)
    url = doubles.add(VllmDouble("0.22.0", store=store, cache_prefix="rl-a"))
    double = MasterDouble(store)
    return [url], doubles.add_master(double), double


def _whole_reset(urls: list[str], master: str, **options: object):
    fleet = build_fleet(urls, master=master, env={})
    return asyncio.run(hard_reset_fleet(fleet, ResetOptions(connector=True, whole_master=True, timeout=5.0,
                                                            **options)))  # type: ignore[arg-type]


def test_a_small_master_is_counted_exactly_with_one_listing(doubles: DoubleFleet) -> None:
    urls, master, double = _fleet(doubles, 30, 70)
    receipt = _whole_reset(urls, master)
    m = receipt.master
    assert receipt.exit_code == 0, receipt.summary
    assert (m.keys_before, m.others_before, m.total_before, m.removed_count) == (30, 70, 100, 100)
    assert (m.keys_after, m.others_after, m.keys_before_min) == (0, 0, None)
    # before: one listing for the split; after: the gauge at 0 is the count, no listing
    assert len(double.calls_to("/get_all_keys")) == 1
    assert not m.notes


def test_a_large_master_is_cleared_without_any_listing(doubles: DoubleFleet, monkeypatch: pytest.MonkeyPatch,
                                                       cli) -> None:
    monkeypatch.setattr(master_phase, "EXACT_BEFORE_MAX", 50)
    urls, master, double = _fleet(doubles, 30, 70)
    receipt = _whole_reset(urls, master)
    m = receipt.master
    assert receipt.exit_code == 0, receipt.summary
    # the split before was not counted (None, never a guess); the total is the gauge's exact 100
    assert (m.keys_before, m.others_before, m.total_before, m.removed_count) == (None, None, 100, 100)
    assert (m.keys_after, m.others_after, m.keys_before_min) == (0, 0, None)
    assert double.calls_to("/get_all_keys") == []
    assert any("held 100 keys before the clear" in n and "not counted" in n for n in m.notes), m.notes
    data = receipt.to_dict()["master"]
    assert (data["keys_before"], data["total_before"]) == (None, 100)

    SharedStore.add_many(double.store, [_key("rl-a", i) for i in range(30)] + [_key("svc-b", i) for i in range(70)])
    shown = cli("reset", "--url", urls[0], "--master", master, "--connector", "--whole-master")
    assert shown.exit_code == 0, shown.stdout
    assert "keys not counted -> 0" in shown.stdout and "other deployments' keys not counted -> 0" in shown.stdout
    listed = cli("reset", "--url", urls[0], "--master", master, "--connector", "--whole-master", "--json")
    assert json.loads(listed.stdout)["master"]["total_before"] == 0  # nothing left to clear: counted, 0


def test_keys_left_after_a_whole_clear_are_listed(doubles: DoubleFleet, monkeypatch: pytest.MonkeyPatch) -> None:
    """The gauge at 0 is the only shortcut: keys the clear left (leased ones, without force) are listed."""
    urls, master, double = _fleet(doubles, 3, 4)
    double.store.lease(_key("rl-a", 1))

    async def unforced(self, force: bool = True) -> int:  # a master that keeps leased keys
        return await original(self, False)
    from kvctl.transport.master_admin import MasterAdmin
    original = MasterAdmin.remove_all
    monkeypatch.setattr(MasterAdmin, "remove_all", unforced)
    receipt = _whole_reset(urls, master, clear_timeout=0.0)
    m = receipt.master
    assert (m.keys_after, m.others_after) == (1, 0) and receipt.exit_code != 0
    assert len(double.calls_to("/get_all_keys")) == 2  # before (split) and after (keys left)
