"""Output as kubectl and docker users expect it (issue 28): every table fits 80 columns in an
80-column terminal, piped output is plain aligned columns (no box drawing, a header row unless
--no-headers), -o table|plain|wide|json, `kvctl runs -q` and `--state`, `kvctl status --watch`.

Tables are measured with realistic content: the vLLM and master TEST DOUBLES (tests/doubles) serve
the fleet commands, in a real pseudo-terminal of 80 columns (Rich sizes itself from the tty, as in a
user's shell) or through a pipe, as `kvctl ... | awk` reads it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kvctl.cli.output import plain_lines, table
from kvctl.serve import runs
from tests.doubles import DoubleFleet, MasterDouble, SharedStore, VllmDouble
from tests.unit.cli.test_tables import BOX, _env, run_in_tty

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"  # a model name as long as users' are


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """Two replicas with a shared store (hit rates of both kinds), a master, a checkpoint, run records."""
    store = SharedStore()
    with DoubleFleet() as doubles:
        replicas = [VllmDouble(store=store, model=MODEL, cache_prefix="rl-run", weight_answers=True)
                    for _ in range(2)]
        urls = [doubles.add(r) for r in replicas]
        master = doubles.add_master(MasterDouble(store))
        prompt = " ".join(f"w{i}" for i in range(80))
        for url in urls:
            for _ in range(2):
                httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 1})
        tmp = tmp_path_factory.mktemp("output")
        (tmp / "ckpt").mkdir()
        (tmp / "ckpt" / "model.safetensors").write_bytes(b"step-2")
        (tmp / "ckpt" / "config.json").write_text("{}")
        state = tmp / "state"
        for age, (name, recorded) in enumerate([("run-20261202-051233", "stopped"), ("grpo-qwen7b", "failed"),
                                                ("crashed", "running"), ("rl", "stopped")], start=1):
            record_run(state, name, recorded, age * 3600)
        yield {"targets": [a for u in urls for a in ("--url", u)], "master": master, "ckpt": str(tmp / "ckpt"),
               "state": str(state)}


def record_run(state: Path, name: str, recorded: str, age: float) -> None:
    """A run record as kvctl serve writes it (no process alive: 'running' lists as exited)."""
    folder = runs.runs_dir(state) / name
    folder.mkdir(parents=True)
    runs.RunRecord(
        name=name, dir=str(folder), state=recorded, created=time.time() - age, template="mooncake-store",
        parameters={}, model="/models/Qwen2.5-7B-Instruct", host="127.0.0.1", vllm={"version": "0.32.0+cpu"},
        master=runs.MasterRecord(True, "127.0.0.1:50051", "127.0.0.1:9003", None),
        replicas=[runs.ReplicaRecord(f"r{i}", f"http://127.0.0.1:{8000 + i}", 8000 + i, None) for i in range(2)],
        cache_prefix=name,
    ).save()


def commands(fleet: dict[str, object]) -> dict[str, list[str]]:
    t, m = fleet["targets"], fleet["master"]
    upd = ["weights", "update", *t, "--master", m, "--from", fleet["ckpt"], "--version", "step-2", "--whole-master"]
    return {
        "config list": ["config", "list"],
        "config show": ["config", "show", "mooncake-store"],
        "compat check": ["compat", "check", "--vllm-version", "0.32.0"],
        "compat matrix": ["compat", "matrix"],
        "status": ["status", *t, "--master", m],
        "reset plan": ["reset", *t, "--master", m, "--connector", "--whole-master", "--dry-run"],
        "reset receipt": ["reset", *t, "--master", m, "--connector", "--whole-master", "--verify"],
        "probe": ["probe", *t],
        "weights show": ["weights", "show", *t, "--master", m],
        "weights plan": [*upd, "--dry-run"],
        "weights receipt": upd,
        "runs": ["runs", "--state-dir", fleet["state"]],
    }


def piped(args: list[str], check: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([sys.executable, "-m", "kvctl", *args], capture_output=True, text=True,
                         env=_env(**env), timeout=60)
    assert not check or out.returncode == 0, (args, out.stdout, out.stderr)
    return out


# -- plain columns ----------------------------------------------------------------------------------
def test_plain_lines_are_aligned_columns_without_markup_or_box_drawing() -> None:
    t = table("replica", "state", "why", wrap=("why",))
    t.add_row("127.0.0.1:8000", "[green]ok[/]", "first line\nsecond line")
    t.add_row("r1", "", "[dim]x[/]")
    lines = plain_lines(t)
    assert lines == ["REPLICA          STATE   WHY",
                     "127.0.0.1:8000   ok      first line; second line",
                     "r1               -       x"]
    assert plain_lines(t, headers=False) == ["127.0.0.1:8000   ok   first line; second line",  # by the rows alone
                                             "r1               -    x"]


def test_every_table_fits_80_columns_in_an_80_column_terminal(fleet: dict[str, object]) -> None:
    for name, args in commands(fleet).items():
        out = run_in_tty(args, 80)
        assert BOX.search(out), (name, out)  # a terminal keeps Rich's tables
        wide = [line for line in out.splitlines() if len(line) > 80]
        assert not wide, (name, out)


def test_doctor_fits_80_columns_unless_one_path_is_wider_than_its_column() -> None:
    out = run_in_tty(["doctor", "--state-dir", "/tmp/kvctl-state"], 80, exit_codes=(0, 1))  # 1: no vLLM here
    assert "fix:" in out or "ready" in out
    for line in out.splitlines():  # names and paths never wrap: only a longer word may push a line out
        assert len(line) <= 80 or max(len(w) for w in line.split()) > 52, out


def test_serve_run_table_fits_80_columns_and_names_the_logs_folder() -> None:
    tmp_path = Path(tempfile.mkdtemp(prefix="kv", dir="/tmp"))  # a state dir as short as ~/.local/state/kvctl
    record_run(tmp_path, "run-20261202-051233", "running", 10)
    record = runs.resolve("run-20261202-051233", tmp_path)
    for r in record.replicas:
        r.log = str(Path(record.dir) / "logs" / f"{r.name}.log")
    script = ("import sys; from kvctl.serve import runs; from kvctl.cli.serve import _show_run\n"
              f"r = runs.resolve('run-20261202-051233', {str(tmp_path)!r})\n"
              f"for x in r.replicas: x.log = {str(Path(record.dir) / 'logs')!r} + '/' + x.name + '.log'\n"
              "_show_run(r, False)\n")
    try:
        out = run_in_tty(["-c", script], 80, module=False)
    finally:
        shutil.rmtree(tmp_path)
    assert max(len(line) for line in out.splitlines()) <= 80, out
    assert f"logs: {record.dir}/logs\n" in out and "kvctl logs run-20261202-051233 -f" in out and "r0.log" not in out


def test_piped_tables_are_plain_columns_with_a_header_row(fleet: dict[str, object]) -> None:
    for name, args in commands(fleet).items():
        out = piped(args).stdout
        assert not BOX.search(out), (name, out)
        headed = [line for line in out.splitlines() if re.match(r"^[A-Z][A-Z ]+[A-Z](   [A-Z]|$)", line)]
        assert headed, (name, out)
        bare = piped([*args, "--no-headers"]).stdout
        assert headed[0] not in bare.splitlines(), (name, bare)


def test_piped_rows_split_on_the_column_gap(fleet: dict[str, object]) -> None:
    out = piped(["runs", "--state-dir", fleet["state"], "-o", "wide", "--no-headers"]).stdout
    rows = [re.split(r" {3,}", line) for line in out.splitlines()]
    assert [r[0] for r in rows] == ["run-20261202-051233", "grpo-qwen7b", "crashed", "rl"]  # newest first
    assert {len(r) for r in rows} == {7}  # every row has every field
    assert rows[2][1:4] == ["exited", "3h", "2"] and rows[2][5] == "127.0.0.1:50051 (embedded)"
    assert "running" not in out  # recorded running, nothing alive: exited


def test_prose_is_never_wrapped_when_piped() -> None:
    out = piped(["config", "show", "mooncake-store"]).stdout
    assert "note: The store is cleared by vLLM's connector reset only from vLLM 0.23.0; on 0.21-0.22 `kvctl " \
           "reset --connector` clears the master directly." in out.splitlines()


def test_output_table_keeps_boxes_when_piped_and_wide_adds_columns(fleet: dict[str, object]) -> None:
    boxed = piped(["config", "list", "-o", "table"]).stdout
    assert BOX.search(boxed) and "connectors" not in boxed
    wide = piped(["config", "list", "-o", "wide"]).stdout
    assert wide.splitlines()[0].split() == ["TEMPLATE", "CONNECTORS", "VLLM", "DESCRIPTION"]
    matrix = piped(["compat", "matrix"]).stdout.splitlines()
    assert matrix[0].split() == ["CAPABILITY", "VLLM", "RELEASES"] and len(matrix[0]) < 200
    assert "0.12.0 to before 0.32.0" in piped(["compat", "matrix"]).stdout
    whole = piped(["compat", "matrix", "-o", "wide"]).stdout.splitlines()
    assert whole[0].split()[:3] == ["CAPABILITY", "0.8.5", "0.9.0"] or len(whole[0].split()) > 10


def test_output_json_is_the_json_flag_and_its_errors(fleet: dict[str, object]) -> None:
    for args in (["compat", "check", "--vllm-version", "0.32.0"], ["config", "list"], ["compat", "matrix"]):
        assert json.loads(piped([*args, "-o", "json"]).stdout) == json.loads(piped([*args, "--json"]).stdout)
    listed = [json.loads(piped(["runs", "--state-dir", fleet["state"], flag]).stdout) for flag in ("-ojson", "--json")]
    assert [[r["name"] for r in x["runs"]] for x in listed] == [["run-20261202-051233", "grpo-qwen7b",
                                                                 "crashed", "rl"]] * 2
    bad = piped(["runs", "--state-dir", fleet["state"], "--state", "bogus", "-o", "json"], check=False)
    assert bad.returncode == 2 and json.loads(bad.stdout)["error"]["message"] == "--state bogus: not a run state"
    wrong = piped(["runs", "-o", "yaml"], check=False)
    assert wrong.returncode == 2 and "yaml" in wrong.stderr


def test_a_closed_pipe_ends_quietly() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "kvctl", "compat", "matrix", "-o", "wide"], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.read(10)  # as `| head -c 10` does, then it goes away
    proc.stdout.close()
    assert proc.wait(timeout=60) in (0, 1)  # 0: everything fitted in the pipe before it closed
    assert proc.stderr.read().decode() == ""  # no internal error, no traceback


# -- kvctl runs -q, --state -------------------------------------------------------------------------
def test_runs_quiet_prints_names_newest_first(fleet: dict[str, object]) -> None:
    out = piped(["runs", "--state-dir", fleet["state"], "-q"]).stdout
    assert out == "run-20261202-051233\ngrpo-qwen7b\ncrashed\nrl\n"


def test_runs_state_filter_is_repeatable_and_checked(fleet: dict[str, object]) -> None:
    state = fleet["state"]
    assert piped(["runs", "--state-dir", state, "-q", "--state", "stopped"]).stdout == "run-20261202-051233\nrl\n"
    both = piped(["runs", "--state-dir", state, "-q", "--state", "exited", "--state", "FAILED"]).stdout
    assert both == "grpo-qwen7b\ncrashed\n"
    data = json.loads(piped(["runs", "--state-dir", state, "--state", "exited", "--json"]).stdout)
    assert [r["name"] for r in data["runs"]] == ["crashed"]
    none = piped(["runs", "--state-dir", state, "--state", "running"]).stdout
    assert none.startswith("no running runs in ")
    bad = piped(["runs", "--state-dir", state, "--state", "runing"], check=False)
    assert bad.returncode == 2 and "--state runing: not a run state" in bad.stderr and "running, starting" in bad.stderr
    both_ways = piped(["runs", "--state-dir", state, "-q", "--json"], check=False)
    assert both_ways.returncode == 2 and "give -q or --json" in both_ways.stderr


# -- kvctl status --watch ---------------------------------------------------------------------------
def test_status_watch_piped_prints_one_block_per_check(fleet: dict[str, object]) -> None:
    args = ["status", *fleet["targets"], "--master", fleet["master"], "--watch", "--interval", "0.1"]
    out = piped([*args, "--count", "3"]).stdout
    blocks = re.split(r"(?m)^kvctl status at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d.*, every 0.1 s\n", out)
    assert blocks[0] == "" and len(blocks) == 4, out
    for block in blocks[1:]:
        assert block.splitlines()[0].split()[:2] == ["REPLICA", "HEALTH"]
        assert "2/2 replica(s) healthy; master reachable" in block
    lines = piped([*args, "--count", "2", "--json"]).stdout.splitlines()
    assert len(lines) == 2
    one = json.loads(piped(["status", *fleet["targets"], "--master", fleet["master"], "--json"]).stdout)
    assert [set(json.loads(line)) for line in lines] == [set(one)] * 2  # status --json's shape, one a line


def test_status_watch_stops_on_ctrl_c_with_exit_0(fleet: dict[str, object]) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "kvctl", "status", *fleet["targets"], "--master",
                             fleet["master"], "-w", "--interval", "0.2"], env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("kvctl status at ")
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "2/2 replica(s) healthy" in out


def test_status_watch_redraws_a_terminal(fleet: dict[str, object]) -> None:
    args = ["status", *fleet["targets"], "--master", fleet["master"], "-w", "--interval", "0.1", "--count", "2"]
    raw = run_in_tty(args, 80, keep_ansi=True)
    assert raw.count("\x1b[2J") == 2 and raw.count("(Ctrl-C stops)") == 2  # cleared, then drawn from the top
    assert all(len(line) <= 80 for line in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", raw).splitlines())


@pytest.mark.parametrize("args, message", [
    (["--interval", "0"], "--interval must be a number of seconds > 0"),
    (["--count", "0"], "--count must be >= 1"),
])
def test_status_watch_refuses_bad_intervals(fleet: dict[str, object], args: list[str], message: str) -> None:
    bad = piped(["status", *fleet["targets"], "--watch", *args], check=False)
    assert bad.returncode == 2 and message in bad.stderr


def test_output_format_is_reset_between_in_process_commands(cli, fleet: dict[str, object]) -> None:
    assert "connectors" in cli("config", "list", "-o", "wide").stdout
    assert "connectors" not in cli("config", "list").stdout  # -o wide does not stick to the next command
    assert os.environ.get("COLUMNS") == "200"  # the cli fixture's: Rich tables, not plain
