"""kvctl runs / rm, and reusing a run's name (kvctl serve --name, --replace), on real run folders in
tmp_path. Live runs are made of real short-lived processes these tests start (`sleep`), recorded by
pid and start time like kvctl serve records its replicas; no test signals a process it did not start."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvctl.errors import UsageError
from kvctl.serve import lifecycle, procs, runs
from tests.unit.serve.test_serve import fake_python

Sleeper = Callable[[str], procs.ProcessRef]


@pytest.fixture
def sleeper() -> Iterator[Sleeper]:
    """Start `sleep 60` processes (each in its own session, like kvctl's); kill the ones still running."""
    started: list[subprocess.Popen[bytes]] = []

    def start(name: str) -> procs.ProcessRef:
        proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
        started.append(proc)
        start_time = procs.start_time_of(proc.pid)
        assert start_time is not None
        return procs.ProcessRef(proc.pid, start_time, name)

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.fixture(autouse=True)
def _no_ambient_targets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KVCTL_URLS", raising=False)
    monkeypatch.setenv("KVCTL_STATE_DIR", str(tmp_path / "elsewhere"))  # --state-dir is always given


GONE = procs.ProcessRef(2**22 + 17, 1.0, "gone")  # above any pid_max: never a live process


def make_run(state: Path, name: str, state_word: str, processes: list[procs.ProcessRef], *, age: float = 60.0,
             replicas: int = 2, embedded: bool = True, log: str = "old log\n") -> runs.RunRecord:
    """A run folder like kvctl serve leaves: run.json, logs/, config/. `processes`: replicas, then the master."""
    folder = runs.runs_dir(state) / name
    refs = processes + [GONE] * (replicas + 1 - len(processes))
    record = runs.RunRecord(
        name=name, dir=str(folder), state=state_word, created=time.time() - age, template="mooncake-store",
        parameters={}, model="/models/tiny", host="127.0.0.1", vllm={"version": "0.32.0+cpu"},
        master=runs.MasterRecord(embedded, "127.0.0.1:50051", "127.0.0.1:9003", refs[replicas] if embedded else None),
        replicas=[runs.ReplicaRecord(f"r{i}", f"http://127.0.0.1:{8000 + i}", 8000 + i, refs[i]) for i in range(replicas)],
        cache_prefix=name,
    )
    record.save()
    (folder / "logs").mkdir()
    (folder / "logs" / "r0.log").write_text(log)
    (folder / "config").mkdir()
    (folder / "config" / "mooncake.json").write_text("{}")
    return record


def alive(ref: procs.ProcessRef) -> bool:
    return procs.is_ours(ref)


def row(stdout: str, name: str) -> list[str]:
    """The cells of a table row, by its first cell."""
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip("│ ").split("│")]
        if cells and cells[0] == name:
            return cells
    raise AssertionError(f"no row {name!r} in:\n{stdout}")


def first_cells(stdout: str) -> list[str]:
    return [line.strip("│ ").split("│")[0].strip() for line in stdout.splitlines() if line.startswith("│")]


def new_record(state: Path, name: str) -> runs.RunRecord:
    return runs.RunRecord(name=name, dir=str(runs.runs_dir(state) / name), state="starting", created=time.time(),
                          template="mooncake-store", parameters={}, model="/models/tiny", host="127.0.0.1",
                          vllm={}, master=None)


# -- kvctl runs ---------------------------------------------------------------------------------
def test_runs_lists_every_run_with_its_corrected_state(cli, tmp_path: Path, sleeper: Sleeper) -> None:
    make_run(tmp_path, "rl", "running", [sleeper("replica r0"), sleeper("replica r1"), sleeper("mooncake_master")],
             age=200)
    make_run(tmp_path, "half", "running", [sleeper("replica r0"), GONE, sleeper("mooncake_master")], age=30)
    make_run(tmp_path, "crashed", "running", [], age=7300)  # recorded running; nothing it started is alive
    make_run(tmp_path, "old", "stopped", [], age=5 * 86400 + 60, replicas=1)
    make_run(tmp_path, "bad", "failed", [], age=3 * 3600, embedded=False)

    result = cli("runs", "--state-dir", str(tmp_path), "-o", "wide")  # with master and cache_prefix
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert f"runs in {tmp_path / 'runs'}" in out
    assert row(out, "rl")[1:6] == ["running", "3m", "2/2 live", "/models/tiny", "127.0.0.1:50051 (embedded)"]
    assert row(out, "rl")[6] == "rl"  # cache_prefix
    assert row(out, "half")[1] == "running" and row(out, "half")[2].endswith("s") and row(out, "half")[3] == "1/2 live"
    assert row(out, "crashed")[1:4] == ["exited", "2h", "2"]
    assert row(out, "old")[1:4] == ["stopped", "5d", "1"]
    assert row(out, "bad")[1:6] == ["failed", "3h", "2", "/models/tiny", "127.0.0.1:50051"]  # external: no marker
    narrow = cli("runs", "--state-dir", str(tmp_path)).stdout  # 80 columns: no master, no cache_prefix
    assert row(narrow, "rl")[1:] == ["running", "3m", "2/2 live", "/models/tiny"]
    assert first_cells(out) == ["half", "rl", "crashed", "bad", "old"]  # newest first
    assert "exited: recorded as running, but none of its processes is alive" in out


def test_runs_json(cli, tmp_path: Path, sleeper: Sleeper) -> None:
    master = sleeper("mooncake_master")
    make_run(tmp_path, "rl", "running", [sleeper("replica r0"), GONE, master], age=200)
    make_run(tmp_path, "crashed", "starting", [], age=100)
    result = cli("runs", "--state-dir", str(tmp_path), "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["runs_dir"] == str(tmp_path / "runs")
    crashed, rl = data["runs"]  # newest first
    assert rl["name"] == "rl" and rl["state"] == "running" and rl["recorded_state"] == "running"
    assert rl["age"] == "3m" and 199 < rl["age_s"] < 260
    assert rl["replicas_live"] == 1 and [r["alive"] for r in rl["replicas"]] == [True, False]
    assert rl["replicas"][0]["url"] == "http://127.0.0.1:8000"
    assert rl["master"] == {"embedded": True, "rpc_address": "127.0.0.1:50051", "admin_address": "127.0.0.1:9003",
                            "alive": True}
    assert {"name": "mooncake_master", "pid": master.pid} in rl["live"]
    assert rl["dir"] == str(tmp_path / "runs" / "rl") and rl["cache_prefix"] == "rl" and rl["model"] == "/models/tiny"
    assert crashed["state"] == "exited" and crashed["recorded_state"] == "starting" and crashed["live"] == []


def test_no_runs_says_where_it_looked(cli, tmp_path: Path) -> None:
    result = cli("runs", "--state-dir", str(tmp_path))
    assert result.exit_code == 0 and f"no runs in {tmp_path / 'runs'}" in result.stdout
    data = json.loads(cli("runs", "--state-dir", str(tmp_path), "--json").stdout)
    assert data == {"runs_dir": str(tmp_path / "runs"), "runs": []}


def test_an_unreadable_run_is_listed_and_removed_only_with_force(cli, tmp_path: Path) -> None:
    folder = runs.runs_dir(tmp_path) / "junk"
    folder.mkdir(parents=True)
    (folder / runs.RUN_FILE).write_text("{not json")
    out = cli("runs", "--state-dir", str(tmp_path)).stdout
    assert row(out, "junk")[1] == "unreadable" and "kvctl rm --force NAME" in out
    refused = cli("rm", "junk", "--state-dir", str(tmp_path))
    assert refused.exit_code == 2 and "cannot tell whether it still runs" in refused.stderr and folder.exists()
    assert cli("rm", "junk", "--force", "--state-dir", str(tmp_path)).exit_code == 0 and not folder.exists()


@pytest.mark.parametrize(("seconds", "text"), [(0, "0s"), (59.9, "59s"), (60, "1m"), (200, "3m"), (3599, "59m"),
                                                (7300, "2h"), (86399, "23h"), (5 * 86400 + 7000, "5d"), (-3, "0s")])
def test_human_age(seconds: float, text: str) -> None:
    assert runs.human_age(seconds) == text


# -- reusing a name: the claim step of kvctl serve --------------------------------------------------
def test_a_stopped_runs_name_is_reused_and_its_files_kept(tmp_path: Path) -> None:
    old = make_run(tmp_path, "rl", "stopped", [], log="the old run's log\n")
    new = new_record(tmp_path, "rl")
    previous = lifecycle.claim_run(new)
    assert previous == runs.runs_dir(tmp_path) / "rl" / "previous" / runs.stamp(old.created)
    assert (previous / "logs" / "r0.log").read_text() == "the old run's log\n"
    assert (previous / "config" / "mooncake.json").is_file()
    assert runs.RunRecord.from_dict(json.loads((previous / runs.RUN_FILE).read_text())) == old
    folder = Path(new.dir)
    assert sorted(p.name for p in folder.iterdir()) == ["previous", "run.json"]  # a fresh folder otherwise
    fresh = runs.load("rl", tmp_path)
    assert fresh.state == "starting" and fresh.created == new.created and fresh.replicas == []
    assert fresh.supervisor is not None and fresh.supervisor.pid == os.getpid()
    # the next reuse keeps both earlier runs
    lifecycle.stop_run(fresh)  # as a start that ends does: this process no longer supervises it
    again = lifecycle.claim_run(new_record(tmp_path, "rl"))
    assert again is not None and sorted(p.parent for p in (again, previous)) == [folder / "previous"] * 2
    assert (previous / "logs" / "r0.log").exists() and (again / runs.RUN_FILE).exists()
    assert [s.previous for s in runs.summaries(tmp_path)] == [[str(previous), str(again)]]


def test_an_exited_runs_name_is_reused(tmp_path: Path) -> None:
    make_run(tmp_path, "rl", "running", [])  # recorded running, every process gone
    assert lifecycle.claim_run(new_record(tmp_path, "rl")) is not None
    assert runs.load("rl", tmp_path).state == "starting"


def test_a_live_runs_name_is_refused_and_nothing_moves(tmp_path: Path, sleeper: Sleeper) -> None:
    replica = sleeper("replica r0")
    make_run(tmp_path, "rl", "running", [replica], replicas=1)
    before = sorted(p.name for p in (runs.runs_dir(tmp_path) / "rl").iterdir())
    with pytest.raises(UsageError) as err:
        lifecycle.claim_run(new_record(tmp_path, "rl"))
    assert f"run 'rl' is still running: replica r0 (pid {replica.pid})" in err.value.message
    assert "kvctl stop rl" in (err.value.hint or "") and "--replace" in (err.value.hint or "")
    assert sorted(p.name for p in (runs.runs_dir(tmp_path) / "rl").iterdir()) == before
    assert alive(replica) and runs.load("rl", tmp_path).state == "running"


def test_replace_stops_only_the_live_runs_processes_then_reuses_the_name(tmp_path: Path, sleeper: Sleeper) -> None:
    mine = [sleeper("replica r0"), sleeper("replica r1"), sleeper("mooncake_master")]
    bystander = sleeper("not part of the run")
    make_run(tmp_path, "rl", "running", mine)
    events: list[tuple[str, dict]] = []
    previous = lifecycle.claim_run(new_record(tmp_path, "rl"), replace=True, grace=5,
                                   on_event=lambda e, **i: events.append((e, i)))
    assert not any(alive(p) for p in mine) and alive(bystander)
    assert previous is not None and (previous / "logs" / "r0.log").exists()
    assert runs.RunRecord.from_dict(json.loads((previous / runs.RUN_FILE).read_text())).state == "stopped"
    assert [e for e, _ in events] == ["replacing", "stopped", "stopped", "stopped", "archived"]
    assert runs.load("rl", tmp_path).state == "starting"


def test_replace_refuses_a_run_that_is_still_starting(tmp_path: Path, sleeper: Sleeper) -> None:
    record = make_run(tmp_path, "rl", "starting", [sleeper("mooncake_master")], replicas=0)
    record.supervisor = sleeper("kvctl serve")  # stands for the kvctl serve that is starting it
    record.save()
    with pytest.raises(UsageError, match="still being started by kvctl serve"):
        lifecycle.claim_run(new_record(tmp_path, "rl"), replace=True)
    assert all(alive(p) for p in record.processes())


def test_a_run_whose_supervisor_lives_is_live(cli, tmp_path: Path, sleeper: Sleeper) -> None:
    """A foreground kvctl serve keeps writing run.json until it exits: its run is neither reused nor removed."""
    record = make_run(tmp_path, "fg", "stopped", [])
    record.supervisor = sleeper("kvctl serve")
    record.save()
    assert row(cli("runs", "--state-dir", str(tmp_path)).stdout, "fg")[1] == "stopped"
    with pytest.raises(UsageError, match="kvctl serve"):
        lifecycle.claim_run(new_record(tmp_path, "fg"))
    refused = cli("rm", "fg", "--state-dir", str(tmp_path))
    assert refused.exit_code == 2 and f"kvctl serve (pid {record.supervisor.pid})" in refused.stderr


def test_two_starts_cannot_claim_one_name(tmp_path: Path) -> None:
    first = new_record(tmp_path, "rl")
    first.create()
    with pytest.raises(FileExistsError):
        new_record(tmp_path, "rl").create()
    assert runs.load("rl", tmp_path).created == first.created
    assert [p.name for p in Path(first.dir).iterdir()] == ["run.json"]  # no temp file left


def test_a_linked_run_folder_is_never_reused_or_removed(cli, tmp_path: Path) -> None:
    elsewhere = tmp_path / "precious"
    make_run(elsewhere, "rl", "stopped", [])
    target = runs.runs_dir(elsewhere) / "rl"
    runs.runs_dir(tmp_path).mkdir(parents=True)
    (runs.runs_dir(tmp_path) / "rl").symlink_to(target)
    with pytest.raises(UsageError, match="not a run folder"):
        lifecycle.claim_run(new_record(tmp_path, "rl"))
    result = cli("rm", "rl", "--force", "--state-dir", str(tmp_path))
    assert result.exit_code == 2 and "not a run folder" in result.stderr
    assert sorted(p.name for p in target.iterdir()) == ["config", "logs", "run.json"]


def test_an_unreadable_record_is_not_reused(tmp_path: Path) -> None:
    folder = runs.runs_dir(tmp_path) / "rl"
    folder.mkdir(parents=True)
    (folder / runs.RUN_FILE).write_text("[]")
    with pytest.raises(UsageError, match="not a kvctl run record") as err:
        lifecycle.claim_run(new_record(tmp_path, "rl"))
    assert "kvctl rm --force rl" in (err.value.hint or "")


# -- reusing a name through kvctl serve (no master or vLLM needed: these starts fail on purpose) --------
def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(cli, tmp_path: Path, name: str, *extra: str):  # noqa: ANN001, ANN201 - the cli fixture
    """kvctl serve against a master that is not there: it fails right after claiming the run folder."""
    (tmp_path / "model").mkdir(exist_ok=True)
    return cli("serve", str(tmp_path / "model"), "--vllm-python", str(fake_python(tmp_path)), "--state-dir",
               str(tmp_path), "--name", name, "--master", f"127.0.0.1:{closed_port()}", *extra)


def test_a_failed_restart_keeps_the_earlier_logs(cli, tmp_path: Path) -> None:
    old = make_run(tmp_path, "rl", "stopped", [], log="keep me\n")
    result = serve(cli, tmp_path, "rl")
    assert result.exit_code == 1 and "is unreachable" in result.stderr
    previous = runs.runs_dir(tmp_path) / "rl" / "previous" / runs.stamp(old.created)
    assert f"reusing the name rl: the earlier run's files are kept in {previous}" in result.stderr
    assert (previous / "logs" / "r0.log").read_text() == "keep me\n"
    failed = runs.load("rl", tmp_path)
    assert failed.state == "failed" and "unreachable" in (failed.error or "") and failed.supervisor is None
    assert row(cli("runs", "--state-dir", str(tmp_path)).stdout, "rl")[1] == "failed"


def test_serve_refuses_a_live_name_and_replace_takes_it(cli, tmp_path: Path, sleeper: Sleeper) -> None:
    mine = [sleeper("replica r0"), sleeper("mooncake_master")]
    make_run(tmp_path, "rl", "running", mine, replicas=1)
    refused = serve(cli, tmp_path, "rl")
    assert refused.exit_code == 2, refused.stderr
    assert "run 'rl' is still running: replica r0" in refused.stderr
    assert "kvctl stop rl" in refused.stderr and "--replace" in refused.stderr
    assert all(alive(p) for p in mine) and not (runs.runs_dir(tmp_path) / "rl" / "previous").exists()

    replaced = serve(cli, tmp_path, "rl", "--replace")
    assert "run rl is running: stopping it (--replace)" in replaced.stderr
    assert not any(alive(p) for p in mine)
    assert replaced.exit_code == 1 and "is unreachable" in replaced.stderr  # the new start itself fails here
    [previous] = runs.previous_runs(runs.runs_dir(tmp_path) / "rl")
    assert (previous / "logs" / "r0.log").exists()

    no_name = cli("serve", str(tmp_path / "model"), "--replace", "--state-dir", str(tmp_path))
    assert no_name.exit_code == 2 and "--replace needs --run NAME" in no_name.stderr


# -- kvctl rm ---------------------------------------------------------------------------------------
def test_rm_removes_stopped_failed_and_exited_runs(cli, tmp_path: Path) -> None:
    for name, word in (("a", "stopped"), ("b", "failed"), ("c", "running")):
        make_run(tmp_path, name, word, [])
    lifecycle.claim_run(new_record(tmp_path, "a"))  # a has an earlier run kept under its name
    lifecycle.stop_run(runs.load("a", tmp_path))
    result = cli("rm", "a", "b", "--state-dir", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    assert f"removed run a (stopped): {tmp_path / 'runs' / 'a'}" in result.stdout
    assert f"removed run b (failed): {tmp_path / 'runs' / 'b'}" in result.stdout
    assert sorted(p.name for p in runs.runs_dir(tmp_path).iterdir()) == ["c"]
    data = json.loads(cli("rm", "c", "--state-dir", str(tmp_path), "--json").stdout)
    assert data == {"removed": [{"name": "c", "dir": str(tmp_path / "runs" / "c"), "state": "exited", "stopped": []}]}
    assert list(runs.runs_dir(tmp_path).iterdir()) == []


def test_rm_refuses_a_running_run_and_removes_nothing(cli, tmp_path: Path, sleeper: Sleeper) -> None:
    replica = sleeper("replica r0")
    make_run(tmp_path, "live", "running", [replica], replicas=1)
    make_run(tmp_path, "done", "stopped", [])
    result = cli("rm", "done", "live", "--state-dir", str(tmp_path))
    assert result.exit_code == 2
    assert f"run 'live' is still running: replica r0 (pid {replica.pid})" in result.stderr
    assert "kvctl stop live first, or kvctl rm --force done live" in result.stderr
    assert alive(replica) and sorted(p.name for p in runs.runs_dir(tmp_path).iterdir()) == ["done", "live"]


def test_rm_force_stops_only_the_runs_processes_then_removes(cli, tmp_path: Path, sleeper: Sleeper) -> None:
    mine = [sleeper("replica r0"), sleeper("mooncake_master")]
    bystander = sleeper("not part of the run")
    make_run(tmp_path, "live", "running", mine, replicas=1)
    result = cli("rm", "live", "--force", "--grace", "5", "--state-dir", str(tmp_path), "--json")
    assert result.exit_code == 0, result.stderr
    [removed] = json.loads(result.stdout)["removed"]
    assert removed["state"] == "running"
    assert removed["stopped"] == [{"process": "replica r0", "result": "stopped"},
                                  {"process": "mooncake_master", "result": "stopped"}]
    assert not any(alive(p) for p in mine) and alive(bystander)
    assert not (runs.runs_dir(tmp_path) / "live").exists()


def test_rm_of_an_unknown_name_lists_the_known_runs(cli, tmp_path: Path) -> None:
    make_run(tmp_path, "a", "stopped", [])
    result = cli("rm", "a", "nope", "--state-dir", str(tmp_path))
    assert result.exit_code == 2
    assert f"no run named nope in {tmp_path / 'runs'}" in result.stderr and "known runs: a" in result.stderr
    assert (runs.runs_dir(tmp_path) / "a").is_dir()  # all or nothing
    assert cli("rm", "../x", "--state-dir", str(tmp_path)).exit_code == 2
    assert cli("rm", "a", "--state-dir", str(tmp_path / "empty")).exit_code == 2


# -- kvctl status with nothing to look at ------------------------------------------------------------
def test_status_with_no_target_shows_the_runs(cli, tmp_path: Path) -> None:
    make_run(tmp_path, "old", "stopped", [], age=400)
    make_run(tmp_path, "newer", "failed", [], age=100)
    result = cli("status", "--state-dir", str(tmp_path))
    assert result.exit_code == 2  # nothing was checked: not a healthy 0
    assert row(result.stdout, "old")[1] == "stopped" and row(result.stdout, "newer")[1] == "failed"
    assert f"no live kvctl run in {tmp_path / 'runs'}" in result.stderr
    assert "kvctl status --run newer" in result.stderr
    quiet = cli("status", "--state-dir", str(tmp_path), "--json")
    # --json: stdout stays JSON: the error object, no table of runs
    assert quiet.exit_code == 2 and json.loads(quiet.stdout)["error"]["fix"].startswith("kvctl status --run newer")


@pytest.mark.parametrize("args", [["runs", "--help"], ["rm", "--help"]])
def test_help_imports_nothing_heavy(args: list[str]) -> None:
    code = ("import sys; sys.argv = ['kvctl'] + %r\nfrom kvctl.cli.main import run\ntry:\n    run()\n"
            "except SystemExit:\n    pass\nprint(sorted({'psutil', 'httpx', 'asyncio'} & set(sys.modules)))") % args
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stderr
    assert re.search(r"kvctl (runs|rm)", proc.stdout)
