"""Counting a REAL mooncake_master's keys at a modest scale (20,000, issue 29): the streamed count equals
the listing's, and a reset's receipt is exact where it gives a number and says "not counted" / "at
least" where it does not (the limit that decides it, EXACT_BEFORE_MAX, is lowered here to 10,000 so
20,000 keys are "large"; benchmarks/scale.py measures the real thing at 1,000,000 and 5,000,000).

The keys are written with put_batch by benchmarks/store_filler.py (a real store client, 32-byte
values, keys shaped like vLLM's MooncakeStoreConnector's), alive for the module.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from benchmarks.common import Helper
from kvctl.reset import master as master_phase
from kvctl.serve.master_process import MasterProcess
from kvctl.transport.master_admin import KeyCount
from tests.doubles import DoubleFleet, VllmDouble

from .helpers import admin_call

pytestmark = pytest.mark.integration

MINE, OTHERS = 1000, 19000


@pytest.fixture(scope="module")
def filler(master: MasterProcess) -> Iterator[Helper]:
    with Helper("store_filler.py", "--master", master.rpc_address, "--segment-mb", "256") as helper:
        yield helper


@pytest.fixture
def filled(empty_master: MasterProcess, filler: Helper) -> MasterProcess:
    filler.command(f"fillp svc-b {OTHERS}")
    filler.command(f"fillp rl-a {MINE}")
    assert admin_call(empty_master.admin_address, "metrics").key_count == MINE + OTHERS
    return empty_master


def _inventory(tmp_path, master: MasterProcess, url: str) -> str:
    inv = tmp_path / "fleet.yaml"
    inv.write_text(f"master: {master.admin_address}\nmaster_rpc: {master.rpc_address}\ncache_prefix: rl-a\n"
                   f"replicas:\n  - url: {url}\n")
    return str(inv)


def test_the_streamed_count_equals_the_listing(filled: MasterProcess) -> None:
    keys = admin_call(filled.admin_address, "all_keys")
    exact = KeyCount(len(keys), sum(1 for k in keys if k.startswith("rl-a@")))
    assert exact == KeyCount(MINE + OTHERS, MINE)
    assert admin_call(filled.admin_address, "key_counts", "rl-a@") == exact
    assert admin_call(filled.admin_address, "key_count") == MINE + OTHERS
    assert admin_call(filled.admin_address, "key_count", "svc-b@") == OTHERS


def test_a_scoped_reset_under_the_limit_counts_exactly(filled: MasterProcess, tmp_path, cli) -> None:
    with DoubleFleet() as fleet:
        url = fleet.add(VllmDouble("0.32.0", cache_prefix="rl-a"))
        result = cli("reset", "--inventory", _inventory(tmp_path, filled, url), "--connector", "--json")
    m = json.loads(result.stdout)["master"]
    assert result.exit_code == 0, result.stdout
    assert (m["keys_before"], m["others_before"], m["total_before"]) == (MINE, OTHERS, MINE + OTHERS)
    assert (m["removed_count"], m["keys_after"], m["others_after"], m["keys_before_min"]) == (MINE, 0, OTHERS, None)


def test_a_scoped_reset_over_the_limit_says_at_least(filled: MasterProcess, tmp_path, cli,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(master_phase, "EXACT_BEFORE_MAX", 10_000)
    with DoubleFleet() as fleet:
        url = fleet.add(VllmDouble("0.32.0", cache_prefix="rl-a"))
        result = cli("reset", "--inventory", _inventory(tmp_path, filled, url), "--connector", "--json")
    data = json.loads(result.stdout)
    m = data["master"]
    assert result.exit_code == 0, result.stdout
    # no number that is not exact: the split before is None; what is known is the total and a floor
    assert (m["keys_before"], m["others_before"], m["total_before"]) == (None, None, MINE + OTHERS)
    assert (m["removed_count"], m["keys_before_min"], m["keys_after"], m["others_after"]) == (MINE, MINE, 0, OTHERS)
    assert any(f"at least {MINE} of this deployment's" in n for n in m["notes"]), m["notes"]
    assert admin_call(filled.admin_address, "key_count", "svc-b@") == OTHERS


def test_the_printed_receipt_says_at_least_and_not_counted(filled: MasterProcess, tmp_path, cli,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(master_phase, "EXACT_BEFORE_MAX", 10_000)
    with DoubleFleet() as fleet:
        url = fleet.add(VllmDouble("0.32.0", cache_prefix="rl-a"))
        result = cli("reset", "--inventory", _inventory(tmp_path, filled, url), "--connector")
    out = " ".join(result.stdout.split())
    assert result.exit_code == 0, result.stdout
    assert f"keys at least {MINE} -> 0" in out and f"other deployments' keys not counted -> {OTHERS}" in out, out


def test_a_whole_master_clear_over_the_limit_lists_nothing(filled: MasterProcess, tmp_path, cli,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from kvctl.transport.master_admin import MasterAdmin

    monkeypatch.setattr(master_phase, "EXACT_BEFORE_MAX", 10_000)
    listed: list[str] = []
    original = MasterAdmin.key_counts

    async def counting(self, prefix=None):  # type: ignore[no-untyped-def]
        listed.append(prefix)
        return await original(self, prefix)
    monkeypatch.setattr(MasterAdmin, "key_counts", counting)
    with DoubleFleet() as fleet:
        url = fleet.add(VllmDouble("0.22.0", cache_prefix="rl-a"))  # its connector cannot clear: kvctl does
        result = cli("reset", "--inventory", _inventory(tmp_path, filled, url), "--connector", "--whole-master",
                     "--verify", "--json")
    m = json.loads(result.stdout)["master"]
    assert result.exit_code == 0, result.stdout
    assert (m["keys_before"], m["others_before"], m["total_before"]) == (None, None, MINE + OTHERS)
    assert (m["removed_count"], m["keys_after"], m["others_after"], m["verified"]) == (MINE + OTHERS, 0, 0, True)
    assert listed == []  # the gauge before and after: no listing at all
    assert admin_call(filled.admin_address, "metrics").key_count == 0
