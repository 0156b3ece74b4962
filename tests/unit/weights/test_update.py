"""`kvctl weights update` and kvctl.update_weights against the vLLM and master TEST DOUBLES (issue 26).

The doubles reload weights as vLLM 0.32 does (collective_rpc reload_weights from a folder), keep the
old weights' KV in their prefix cache and the shared store (the bug), and with weight_answers=True
answer from the weights that computed each prompt's KV, so `kvctl probe` sees stale KV as STALE.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

import kvctl
from kvctl.errors import EXIT_FAILED, EXIT_OK, EXIT_PARTIAL, EXIT_USAGE, UsageError
from tests.doubles import Call, DoubleFleet, MasterDouble, SharedStore, VllmDouble

PROMPT = " ".join(f"word{i}" for i in range(40))  # two full blocks of 16 tokens: cached, then hit


@pytest.fixture
def doubles() -> Iterator[DoubleFleet]:
    with DoubleFleet() as fleet:
        yield fleet


def checkpoint(folder: Path, content: bytes = b"step-1 weights") -> Path:
    """A folder as a trainer writes it: safetensors (the double reads their bytes) and a config."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.safetensors").write_bytes(content)
    (folder / "config.json").write_text("{}")
    return folder


def fleet_of(doubles: DoubleFleet, *versions: str, **kwargs: Any) -> tuple[list[VllmDouble], list[str], str, SharedStore]:
    store = SharedStore()
    # MooncakeStoreConnector from 0.21.0: older replicas run without a connector
    replicas = [VllmDouble(v, store=store, weight_answers=True,
                           connector="MooncakeStoreConnector" if Version(v) >= Version("0.21") else None, **kwargs)
                for v in versions]
    urls = [doubles.add(r) for r in replicas]
    return replicas, urls, doubles.add_master(MasterDouble(store)), store


def update(cli: Any, urls: list[str], master: str, *args: str) -> tuple[int, dict]:
    targets = [w for u in urls for w in ("--url", u)] + ["--master", master]
    result = cli("weights", "update", *targets, *args, "--json")
    return result.exit_code, json.loads(result.stdout)


def prompts_file(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.txt"
    path.write_text(PROMPT + "\n")
    return path


def between(replica: VllmDouble, first: str, last: str) -> list[Call]:
    """The calls a replica received after its first `first` and before its last `last`."""
    paths = replica.call_paths()
    start, end = paths.index(first), len(paths) - 1 - paths[::-1].index(last)
    return replica.calls[start + 1:end]


# -- the happy path ------------------------------------------------------------------------------
def test_an_in_place_reload_leaves_stale_kv_and_the_update_leaves_none(cli, doubles, tmp_path: Path) -> None:
    """The bug first, through the double's own reload (what an RL loop does by hand): a prompt cached
    with the old weights is served from that KV after the reload (probe: STALE). Then kvctl weights
    update on two replicas sharing one store: both on the new weights and version, equal checksums that
    changed, caches cleared, the content probe matches, and no completion is served inside the pause."""
    replicas, urls, master, store = fleet_of(doubles, "0.32.0+cpu", "0.32.0+cpu")
    new = checkpoint(tmp_path / "step-1")
    prompts = str(prompts_file(tmp_path))
    assert cli("probe", "--url", urls[0], "--prompts", prompts).exit_code == EXIT_OK  # caches PROMPT: old weights
    assert len(store) > 0
    body = json.dumps({"method": "reload_weights", "kwargs": {"weights_path": str(new)}}).encode()
    request = urllib.request.Request(f"{urls[0]}/collective_rpc", body, {"Content-Type": "application/json"})
    assert json.loads(urllib.request.urlopen(request, timeout=10).read()) == {"results": [None]}
    stale = cli("probe", "--url", urls[0], "--prompts", prompts, "--json")
    assert stale.exit_code == EXIT_FAILED and json.loads(stale.stdout)["replicas"][0]["verdict"] == "STALE"

    code, receipt = update(cli, urls, master, "--from", str(new), "--version", "v2", "--verify",
                           "--probe-prompts", prompts)
    assert code == EXIT_OK and receipt["ok"] is True, receipt["summary"]
    assert receipt["version"] == "v2" and receipt["weights_path"] == str(new.resolve())
    rows = receipt["replicas"]
    assert [(r["version_before"], r["version_after"]) for r in rows] == [("default", "v2")] * 2
    assert rows[0]["checksum_after"] == rows[1]["checksum_after"] and receipt["checksums_match"] is True
    assert rows[1]["checksum_before"] != rows[1]["checksum_after"]  # replica 2 ran the old weights
    assert all(r["reload"]["result"] == "ok" and r["reset"] is True and r["probe"]["verdict"] == "match"
               for r in rows)
    assert all(r.weight_version == "v2" and r.weights == replicas[0].weights and not r.paused for r in replicas)
    assert set(receipt["phases"]) >= {"pause", "reload", "version", "reset", "verify", "resume"}
    assert 0 < receipt["paused_seconds"] <= receipt["total_s"]
    assert receipt["reset"]["master"]["verified"] is True
    for r in replicas:
        paths = [c.path for c in between(r, "/pause", "/resume")]
        assert paths == ["/collective_rpc", "/update_weight_version", "/weight_info", "/reset_prefix_cache",
                         "/reset_mm_cache", "/reset_encoder_cache"], paths  # nothing served between reload and clear
        (reload,) = [c for c in r.calls if c.path == "/collective_rpc" and c.t > r.calls_to("/pause")[-1].t]
        assert reload.body == {"method": "reload_weights", "kwargs": {"weights_path": str(new.resolve())},
                               "timeout": 600.0}


def test_the_human_output_names_versions_checksums_and_the_paused_window(cli, doubles, tmp_path: Path) -> None:
    replicas, urls, master, _ = fleet_of(doubles, "0.32.0", "0.32.0")
    targets = [w for u in urls for w in ("--url", u)]
    result = cli("weights", "update", *targets, "--master", master, "--from", str(checkpoint(tmp_path / "c")),
                 "--version", "step-7")
    assert result.exit_code == EXIT_OK, result.stdout + result.stderr
    assert "default -> step-7" in result.stdout and "paused " in result.stdout
    assert f"{replicas[0].name or urls[0].split('//')[1]}" in result.stdout
    assert "2/2 replica(s) reloaded as version step-7, hard-reset" in result.stdout


def test_dry_run_plans_and_changes_nothing(cli, doubles, tmp_path: Path) -> None:
    replicas, urls, master, store = fleet_of(doubles, "0.32.0", "0.28.0")
    store.add("double-model@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@0a1")  # its own key (an unprefixed fleet)
    code, receipt = update(cli, urls, master, "--from", str(checkpoint(tmp_path / "c")), "--version", "v3",
                           "--dry-run")
    assert code == EXIT_OK and receipt["dry_run"] is True and "nothing was sent" in receipt["summary"]
    plans = receipt["plan"]["replicas"]
    assert [p["reports_checksums"] for p in plans] == [True, False] and all(p["sets_version"] for p in plans)
    for r in replicas:
        assert not {"/pause", "/collective_rpc", "/update_weight_version", "/reset_prefix_cache"} & set(r.call_paths())
        assert r.weight_version == "default" and r.weights == "double-model"
    assert len(store) == 1


# -- refusals: nothing paused ----------------------------------------------------------------------
@pytest.mark.parametrize(("make", "message"), [
    (lambda tmp: tmp / "missing", "does not exist on this machine"),
    (lambda tmp: (tmp / "empty").mkdir() or tmp / "empty", "no *.safetensors file in it"),
    (lambda tmp: (tmp / "f.safetensors").write_bytes(b"x") and tmp / "f.safetensors", "is not a folder"),
])
def test_a_from_path_that_is_not_a_checkpoint_folder_is_a_usage_error(cli, doubles, tmp_path: Path, make: Any,
                                                                      message: str) -> None:
    replicas, urls, master, _ = fleet_of(doubles, "0.32.0")
    result = cli("weights", "update", "--url", urls[0], "--master", master, "--from", str(make(tmp_path)))
    assert result.exit_code == EXIT_USAGE and message in result.stderr, result.stderr
    assert "--remote-path" in result.stderr or "safetensors" in result.stderr
    assert replicas[0].calls == []  # refused before any replica was asked anything


def test_a_remote_path_is_not_looked_for_here_but_must_be_absolute(cli, doubles, tmp_path: Path) -> None:
    replicas, urls, master, _ = fleet_of(doubles, "0.32.0")
    relative = cli("weights", "update", "--url", urls[0], "--master", master, "--from", "ckpt", "--remote-path")
    assert relative.exit_code == EXIT_USAGE and "absolute path" in relative.stderr
    folder = checkpoint(tmp_path / "on-the-servers")
    code, receipt = update(cli, urls, master, "--from", str(folder), "--remote-path")
    assert code == EXIT_OK, receipt["summary"]


@pytest.mark.parametrize(("old", "args", "needed"), [
    ("0.13.0", [], "first in 0.16.0"),
    ("0.20.0", ["--version", "v2"], "first in 0.27.0"),
])
def test_a_replica_without_a_needed_route_refuses_the_whole_update_before_any_pause(
        cli, doubles, tmp_path: Path, old: str, args: list[str], needed: str) -> None:
    replicas, urls, master, _ = fleet_of(doubles, "0.32.0", old)
    code, receipt = update(cli, urls, master, "--from", str(checkpoint(tmp_path / "c")), *args)
    assert code == EXIT_FAILED and receipt["ok"] is False
    assert "refused, nothing was paused or sent" in receipt["summary"] and needed in receipt["summary"]
    assert f"vLLM {old}" in receipt["summary"] and receipt["plan"]["hint"]
    for r in replicas:
        assert not {"/pause", "/collective_rpc", "/update_weight_version"} & set(r.call_paths())


def test_a_release_with_the_reload_but_no_version_routes_updates_without_a_label(cli, doubles, tmp_path) -> None:
    replicas, urls, master, _ = fleet_of(doubles, "0.20.0", "0.20.0")
    code, receipt = update(cli, urls, master, "--from", str(checkpoint(tmp_path / "c")))
    assert code == EXIT_OK, receipt["summary"]
    rows = receipt["replicas"]
    assert all(r["set_version"]["result"] == "skipped" and r["version_after"] is None for r in rows)
    assert all(r["checksum_after"] is None and "0.32.0" in r["checksum_note"] for r in rows)
    assert receipt["checksums_match"] is None and any("no replica reports weight checksums" in n
                                                      for n in receipt["notes"])


def test_an_unreachable_replica_refuses_the_update(cli, doubles, tmp_path: Path) -> None:
    replicas, urls, master, _ = fleet_of(doubles, "0.32.0")
    code, receipt = update(cli, urls + ["http://127.0.0.1:9"], master, "--from", str(checkpoint(tmp_path / "c")),
                           "--retries", "0", "--timeout", "2")
    assert code == EXIT_FAILED and "cannot update every replica" in receipt["summary"]
    assert "/pause" not in replicas[0].call_paths()


# -- a replica whose reload fails ------------------------------------------------------------------
def test_a_failed_reload_keeps_that_replica_paused_and_names_how_to_finish_or_undo(cli, doubles, tmp_path) -> None:
    replicas, urls, master, _ = fleet_of(doubles, "0.32.0", "0.32.0", "0.32.0")
    replicas[1].faults.status["/collective_rpc"] = 500
    folder = checkpoint(tmp_path / "c")
    code, receipt = update(cli, urls, master, "--from", str(folder), "--version", "v2")
    assert code == EXIT_PARTIAL and receipt["ok"] is False, receipt["summary"]
    good, bad, other = receipt["replicas"]
    assert bad["reload"]["result"] == "failed" and "HTTP 500" in bad["reload"]["error"]
    assert bad["left_paused"] is True and replicas[1].paused and "kept paused" in bad["state"]
    assert bad["set_version"]["result"] == "not run" and replicas[1].weight_version == "default"
    steps = " | ".join(bad["next_steps"])
    assert f"kvctl weights update --from {folder.resolve()} --version v2 --url {urls[1]}" in steps
    assert f"curl -X POST {urls[1]}/resume" in steps and "or undo, the whole fleet" in steps
    assert f"NOT updated: {bad['name']}" in receipt["summary"] and "kept paused" in receipt["summary"]
    for row, replica in ((good, replicas[0]), (other, replicas[2])):
        assert row["updated"] is True and row["version_after"] == "v2" and not replica.paused
    # the next step it names works: the replica is found paused, updated, and left paused for the curl
    replicas[1].faults.status.clear()
    code, again = update(cli, urls[1:2], master, "--from", str(folder), "--version", "v2")
    assert code == EXIT_OK and replicas[1].weight_version == "v2" and replicas[1].paused


def test_resume_failed_resumes_it_anyway_and_says_what_it_serves(cli, doubles, tmp_path: Path) -> None:
    replicas, urls, master, _ = fleet_of(doubles, "0.32.0", "0.32.0")
    replicas[0].faults.status["/collective_rpc"] = 500
    code, receipt = update(cli, urls, master, "--from", str(checkpoint(tmp_path / "c")), "--resume-failed")
    assert code == EXIT_PARTIAL and not replicas[0].paused and not replicas[1].paused
    assert "may serve other weights" in receipt["replicas"][0]["state"]


def test_a_reload_that_loads_other_weights_fails_on_the_checksums(cli, doubles, tmp_path: Path) -> None:
    """A replica answers its reload but holds other weights after it (a stale mirror of the folder, say):
    only the checksums show it; it is named, the update fails, the others stay updated."""
    replicas, urls, master, _ = fleet_of(doubles, "0.32.0", "0.32.0", "0.32.0")
    odd = replicas[2]
    odd.rpc_methods["reload_weights"] = lambda kwargs: setattr(odd, "weights", "a stale mirror")
    code, receipt = update(cli, urls, master, "--from", str(checkpoint(tmp_path / "c")))
    assert code == EXIT_FAILED and receipt["checksums_match"] is False
    rows = receipt["replicas"]
    assert [r["updated"] for r in rows] == [True, True, False]
    assert "differ from the other replicas'" in rows[2]["error"] and "reload it again" in rows[2]["next_steps"][0]


def test_a_reset_that_fails_after_the_reload_names_the_reset_to_run(cli, doubles, tmp_path: Path) -> None:
    replicas, urls, master, _ = fleet_of(doubles, "0.32.0", "0.32.0")
    replicas[1].faults.status["/reset_prefix_cache"] = 500
    code, receipt = update(cli, urls, master, "--from", str(checkpoint(tmp_path / "c")), "--retries", "0")
    assert code == EXIT_PARTIAL
    row = receipt["replicas"][1]
    assert row["reload"]["result"] == "ok" and row["reset"] is False and not replicas[1].paused
    assert "NOT confirmed clear" in row["state"] and "kvctl reset --connector" in row["next_steps"][0]


# -- Python ---------------------------------------------------------------------------------------
def test_the_python_api_returns_the_receipt_the_cli_prints(doubles, tmp_path: Path) -> None:
    replicas, urls, master, _ = fleet_of(doubles, "0.32.0", "0.32.0")
    receipt = kvctl.update_weights(checkpoint(tmp_path / "c"), "v9", urls=urls, master=master)
    assert receipt.ok and [r.version_after for r in receipt.replicas] == ["v9", "v9"]
    data = receipt.to_dict()
    assert {"ok", "summary", "version", "replicas", "paused_seconds", "phases", "reset"} <= set(data)
    assert {"name", "url", "version_before", "version_after", "checksum_before", "checksum_after", "reload",
            "ops", "reset"} <= set(data["replicas"][0])
    assert set(data["replicas"][0]["reload"]) == {"result", "seconds", "error"}
    json.dumps(data)  # plain data all the way down


def test_the_async_twin_runs_inside_a_loop_and_failures_raise_when_asked(doubles, tmp_path: Path) -> None:
    import asyncio

    replicas, urls, master, _ = fleet_of(doubles, "0.32.0")
    folder = checkpoint(tmp_path / "c")

    async def trainer_step() -> Any:
        with pytest.raises(UsageError, match="await kvctl.update_weights_async"):
            kvctl.update_weights(folder, urls=urls, master=master)
        return await kvctl.update_weights_async(folder, "v1", urls=urls, master=master)

    assert asyncio.run(trainer_step()).ok
    replicas[0].faults.status["/collective_rpc"] = 500
    with pytest.raises(kvctl.WeightsUpdateFailed, match="reload failed") as failed:
        kvctl.update_weights(folder, urls=urls, master=master, raise_on_failure=True)
    assert failed.value.receipt.replicas[0].left_paused


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"version": ""}, "non-empty label"),
    ({"version": "v\n2"}, "without control characters"),
    ({"reload_timeout": 0}, "reload_timeout must be"),
    ({"probe_prompts": ["p"]}, "they need verify"),
    ({"timeout": "5"}, "timeout must be a number"),
])
def test_bad_api_input_is_a_usage_error(tmp_path: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        kvctl.update_weights(checkpoint(tmp_path / "c"), urls=["http://127.0.0.1:9"], **kwargs)


# -- a signal mid-update ----------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "slow", "state"), [
    ("SIGINT", "/collective_rpc", "its reload was in flight when the signal came"),
    ("SIGTERM", "/reset_prefix_cache", "reloaded before the signal, but its caches were not confirmed clear"),
])
def test_a_signal_mid_update_resumes_every_replica_and_says_each_ones_state(doubles, tmp_path: Path, name: str,
                                                                              slow: str, state: str) -> None:
    """SIGINT/SIGTERM while one replica's reload (or its cache clear) hangs: kvctl resumes every replica
    it paused, exits 128 + the signal, and the receipt says per replica whether its reload had run."""
    import signal
    import subprocess
    import sys
    import time

    replicas, urls, master, _ = fleet_of(doubles, "0.32.0", "0.32.0")
    replicas[1].faults.delay[slow] = 30
    targets = [w for u in urls for w in ("--url", u)]
    proc = subprocess.Popen([sys.executable, "-m", "kvctl", "weights", "update", *targets, "--master", master,
                             "--from", str(checkpoint(tmp_path / "c")), "--version", "v2", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not replicas[1].calls_to(slow) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert replicas[1].paused, "the update never paused the replica"
        proc.send_signal(getattr(signal, name))
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + int(getattr(signal, name)), err
    receipt = json.loads(out)
    assert not any(r.paused for r in replicas) and all(r.calls_to("/resume") for r in replicas)
    assert receipt["ok"] is False and receipt["interrupted"] == name
    assert f"interrupted by {name}" in receipt["summary"]
    fast, hung = receipt["replicas"]
    assert hung["state"].startswith(state) and "resumed" in hung["state"], hung["state"]
    assert fast["reload"]["result"] == "ok" and not fast["updated"] and not hung["updated"]
    assert all("finish the update of the whole fleet: kvctl weights update" in r["next_steps"][0]
               for r in (fast, hung))


def test_the_python_api_imports_no_cli_or_heavy_package(tmp_path: Path) -> None:
    """A trainer's `kvctl.update_weights()` pays for neither the CLI (typer, rich, pydantic) nor vLLM."""
    import subprocess
    import sys

    code = (f"import sys, kvctl; kvctl.update_weights({str(checkpoint(tmp_path / 'c'))!r}, urls=['http://127.0.0.1:9'], "
            "retries=0, timeout=1); print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'typer', 'rich', 'pydantic', 'vllm', 'torch', 'mooncake', 'ray', 'aiohttp'}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_a_failed_pause_reloads_nothing_and_resumes_everyone(cli, doubles, tmp_path: Path) -> None:
    replicas, urls, master, _ = fleet_of(doubles, "0.32.0", "0.32.0")
    replicas[1].faults.status["/pause"] = 500
    code, receipt = update(cli, urls, master, "--from", str(checkpoint(tmp_path / "c")), "--retries", "0")
    assert code == EXIT_FAILED and not any(r.paused for r in replicas)
    assert not any(r.calls_to("/collective_rpc") for r in replicas)
    assert all(r["reload"]["result"] == "not run" and "not reloaded" in r["state"] for r in receipt["replicas"])


def test_a_request_that_arrives_mid_update_is_answered_with_the_new_weights_from_scratch(
        cli, doubles, tmp_path: Path) -> None:
    """A prompt cached with the old weights, sent again while the fleet is paused for its reload: it
    waits, and is answered after the cache clear, computed fresh with the new weights (0 cached tokens)."""
    import threading
    import time

    replicas, urls, master, _ = fleet_of(doubles, "0.32.0")
    replica = replicas[0]
    replica.faults.delay["/collective_rpc"] = 0.5

    def complete() -> dict:
        body = json.dumps({"model": replica.model, "prompt": PROMPT, "max_tokens": 3, "logprobs": 1}).encode()
        request = urllib.request.Request(f"{urls[0]}/v1/completions", body, {"Content-Type": "application/json"})
        return json.loads(urllib.request.urlopen(request, timeout=30).read())

    old = complete()  # cached with the old weights
    answers: list[dict] = []

    def mid_update() -> None:
        deadline = time.monotonic() + 20
        while not replica.paused and time.monotonic() < deadline:
            time.sleep(0.01)
        answers.append(complete())

    thread = threading.Thread(target=mid_update)
    thread.start()
    code, receipt = update(cli, urls, master, "--from", str(checkpoint(tmp_path / "c")))
    thread.join(30)
    assert code == EXIT_OK, receipt["summary"]
    (served,) = answers
    assert served["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert served["choices"][0]["text"] != old["choices"][0]["text"]
    assert served["choices"][0]["text"] == complete()["choices"][0]["text"]  # the new weights' own answer
