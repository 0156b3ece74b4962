"""A run is named the same way by every command that targets one (issue 28): positionally, as docker
and kubectl name things (`kvctl stop rl`, `kvctl reset rl --connector`), or by --run NAME as scripts
do; kvctl serve names it --run NAME (--name kept); probe takes --ray like reset and status. Runs are
real records in tmp_path whose replicas are vLLM doubles; live ones are real `sleep` processes."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from kvctl.serve import procs, runs
from tests.doubles import DoubleFleet, VllmDouble
from tests.unit.cli.test_completion import complete
from tests.unit.serve.test_runs import GONE, Sleeper, alive, closed_port, serve, sleeper  # noqa: F401 - a fixture
from tests.unit.serve.test_serve import fake_python


@pytest.fixture(autouse=True)
def _no_ambient_targets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KVCTL_URLS", raising=False)
    monkeypatch.setenv("KVCTL_STATE_DIR", str(tmp_path / "elsewhere"))  # --state-dir is always given


def record(state: Path, name: str, urls: list[str], processes: list[procs.ProcessRef] | None = None,
           state_word: str = "running") -> runs.RunRecord:
    """A run as kvctl serve records it, its replicas at `urls`, no master."""
    refs = processes or [GONE] * len(urls)
    rec = runs.RunRecord(
        name=name, dir=str(runs.runs_dir(state) / name), state=state_word, created=time.time() - 30,
        template="mooncake-store", parameters={}, model="m", host="127.0.0.1", vllm={"version": "0.32.0"},
        master=None, replicas=[runs.ReplicaRecord(f"r{i}", url, int(url.rsplit(":", 1)[1]), refs[i])
                               for i, url in enumerate(urls)])
    rec.save()
    return rec


def weights_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "step-2"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"")
    return folder


# every command that targets one run, with what makes it harmless against the doubles
TARGETING = [["reset", "--dry-run"], ["status"], ["probe", "--max-tokens", "1"], ["weights", "show", "--no-checksums"]]


@pytest.mark.parametrize("command", TARGETING)
def test_a_run_named_positionally_is_the_run_named_by_the_option(cli, tmp_path: Path, command: list[str]) -> None:
    with DoubleFleet() as fleet:
        url = fleet.add(VllmDouble("0.32.0", connector=None))
        record(tmp_path, "rl", [url])
        record(tmp_path, "other", [fleet.add(VllmDouble("0.32.0", connector=None))])
        state = ["--state-dir", str(tmp_path), "--json"]
        by_position = cli(*command, "rl", *state)
        by_option = cli(*command, "--run", "rl", *state)
        both = cli(*command, "rl", "--run", "rl", *state)
    assert by_position.exit_code == by_option.exit_code == both.exit_code, by_position.stderr
    assert by_position.exit_code in (0, 1, 3), by_position.stderr  # it ran (a usage error is 2)
    for result in (by_position, by_option, both):
        names = [r["name"] for r in json.loads(result.stdout)["replicas"]] if "replicas" in result.stdout \
            else None
        assert names == ["r0"], result.stdout  # rl's replica, not other's


def test_weights_update_takes_the_run_positionally_beside_from(cli, tmp_path: Path) -> None:
    new = weights_dir(tmp_path)
    with DoubleFleet() as fleet:
        record(tmp_path, "rl", [fleet.add(VllmDouble("0.32.0", connector=None))])
        for args in (["rl", "--from", str(new)], ["--from", str(new), "rl"], ["--from", str(new), "--run", "rl"]):
            result = cli("weights", "update", *args, "--dry-run", "--json", "--state-dir", str(tmp_path))
            assert result.exit_code == 0, result.stderr
            assert [r["name"] for r in json.loads(result.stdout)["replicas"]] == ["r0"]


@pytest.mark.parametrize("command", [["reset"], ["status"], ["probe"], ["weights", "show"],
                                     ["weights", "update", "--from", "/x"], ["stop"]])
def test_two_different_runs_named_is_a_usage_error(cli, tmp_path: Path, command: list[str]) -> None:
    record(tmp_path, "a", ["http://127.0.0.1:1"])
    record(tmp_path, "b", ["http://127.0.0.1:2"])
    result = cli(*command, "a", "--run", "b", "--state-dir", str(tmp_path))
    assert result.exit_code == 2
    assert "two runs named, 'a' and --run 'b'" in result.stderr and "name one run, once" in result.stderr


def test_stop_by_name_and_several_names(cli, tmp_path: Path, sleeper: Sleeper) -> None:  # noqa: F811
    procs_of = {name: [sleeper(f"replica {name}")] for name in ("a", "b", "c")}
    for name, refs in procs_of.items():
        record(tmp_path, name, ["http://127.0.0.1:1"], refs)
    one = cli("stop", "a", "--state-dir", str(tmp_path))
    assert one.exit_code == 0 and "run a: replica a" in one.stdout, one.stderr
    assert not alive(procs_of["a"][0]) and alive(procs_of["b"][0])
    # an unknown name among several: looked up first, nothing is stopped
    typo = cli("stop", "b", "nope", "--state-dir", str(tmp_path))
    assert typo.exit_code == 2 and "no run named 'nope'" in typo.stderr and alive(procs_of["b"][0])
    several = cli("stop", "b", "c", "--json", "--state-dir", str(tmp_path))
    assert several.exit_code == 0 and set(json.loads(several.stdout)) == {"b", "c"}
    assert not alive(procs_of["b"][0]) and not alive(procs_of["c"][0])
    assert cli("stop", "--run", "a", "--state-dir", str(tmp_path)).exit_code == 0  # the option still works
    refused = cli("stop", "a", "--all", "--state-dir", str(tmp_path))
    assert refused.exit_code == 2 and "give run names or --all, not both" in refused.stderr
    twice = cli("stop", "a", "b", "--run", "a", "--state-dir", str(tmp_path))
    assert twice.exit_code == 2 and "runs named twice" in twice.stderr


@pytest.mark.parametrize("spelling", ["--run", "--name"])
def test_serve_names_the_run_with_run_and_keeps_name(cli, tmp_path: Path, spelling: str) -> None:
    (tmp_path / "model").mkdir()
    result = cli("serve", str(tmp_path / "model"), "--vllm-python", str(fake_python(tmp_path)), "--state-dir",
                 str(tmp_path), spelling, "rl", "--master", f"127.0.0.1:{closed_port()}")
    assert result.exit_code == 1 and "is unreachable" in result.stderr, result.stderr
    assert runs.load("rl", tmp_path).state == "failed"  # claimed under that name, then failed (no master)


def test_serve_run_and_name_must_agree(cli, tmp_path: Path) -> None:
    agreeing = serve(cli, tmp_path, "rl", "--run", "rl")  # serve() gives --name rl
    assert agreeing.exit_code == 1 and "is unreachable" in agreeing.stderr, agreeing.stderr
    differing = serve(cli, tmp_path, "a", "--run", "b")
    assert differing.exit_code == 2 and "two run names, --run 'b' and --name 'a'" in differing.stderr
    assert not (runs.runs_dir(tmp_path) / "a").exists() and not (runs.runs_dir(tmp_path) / "b").exists()
    serve_help = " ".join(cli("serve", "--help").stdout.split())
    assert "--run" in serve_help and "--name NAME: the same" in serve_help


def test_probe_takes_ray_like_reset_and_status(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run as its Ray cluster records it (the cluster's lookup is stood in for; the replica is real)."""
    from kvctl.serve import ray_fleet

    with DoubleFleet() as fleet:
        rec = record(tmp_path, "rl", [fleet.add(VllmDouble("0.32.0", connector=None))])
        asked: list[tuple[str, str]] = []

        def load(address: str, name: str, state_dir: object) -> runs.RunRecord:
            asked.append((address, name))
            return rec

        monkeypatch.setattr(ray_fleet, "load", load)
        result = cli("probe", "rl", "--ray", "10.0.0.1:6379", "--max-tokens", "1", "--json",
                     "--state-dir", str(tmp_path / "empty"))
    assert asked == [("10.0.0.1:6379", "rl")]
    assert result.exit_code in (0, 3) and json.loads(result.stdout)["replicas"][0]["name"] == "r0", result.stderr
    no_run = cli("probe", "--ray", "10.0.0.1:6379", "--state-dir", str(tmp_path))
    assert no_run.exit_code == 2 and "--ray needs --run NAME" in no_run.stderr


def test_run_positionals_complete_from_recorded_runs(tmp_path: Path) -> None:
    for name in ("rl-a", "rl-b", "svc"):
        record(tmp_path / "state", name, ["http://127.0.0.1:1"], state_word="stopped")
    for line, wanted in (("kvctl stop rl", ["rl-a", "rl-b"]), ("kvctl stop rl-a s", ["svc"]),
                         ("kvctl reset ", ["rl-a", "rl-b", "svc"]), ("kvctl status s", ["svc"]),
                         ("kvctl probe rl-", ["rl-a", "rl-b"]), ("kvctl weights update --from /w rl-b", ["rl-b"]),
                         ("kvctl weights show sv", ["svc"])):
        assert sorted(complete("bash", line, tmp_path)) == wanted, line
