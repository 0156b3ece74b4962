"""KVCTL_MASTER / KVCTL_MASTER_RPC are the defaults of --master / --master-rpc in every command that
takes them, as KVCTL_URLS is of --url; probe, which never talks to the master, does not read them."""

from __future__ import annotations

import json

import pytest

from tests.doubles import DoubleFleet, MasterDouble, SharedStore, VllmDouble


def test_status_and_reset_read_kvctl_master(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    with DoubleFleet() as fleet:
        store = SharedStore([f"double-model@tp_rank:0@pcp0@dcp0@pp_rank:0@{i:032x}" for i in range(2)])  # its own
        url = fleet.add(VllmDouble("0.22.0", store=store))
        monkeypatch.setenv("KVCTL_MASTER", fleet.add_master(MasterDouble(store)))
        status = cli("status", "--url", url, "--json")
        reset = cli("reset", "--url", url, "--connector", "--json")
    assert status.exit_code == 0, status.stdout
    assert [m["key_count"] for m in json.loads(status.stdout)["masters"]] == [2]
    assert reset.exit_code == 0, reset.stdout
    data = json.loads(reset.stdout)
    assert data["master"]["keys_before"] == 2 and data["master"]["keys_after"] == 0


def test_a_bad_kvctl_master_is_named_where_it_is_read_and_ignored_by_probe(cli, monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path) -> None:
    monkeypatch.setenv("KVCTL_MASTER", "not-an-address")
    with DoubleFleet() as fleet:
        url = fleet.add(VllmDouble("0.32.0"))
        reset = cli("reset", "--url", url, "--dry-run")
        prompts = tmp_path / "p.txt"
        prompts.write_text("hello\n")
        probe = cli("probe", "--url", url, "--prompts", str(prompts))
    assert reset.exit_code == 2 and "KVCTL_MASTER: 'not-an-address' is not HOST:PORT" in reset.stderr
    assert "KVCTL_MASTER" not in probe.stderr + probe.stdout and probe.exit_code != 2
