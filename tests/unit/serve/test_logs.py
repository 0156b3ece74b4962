"""kvctl logs, on run folders written as kvctl serve writes them (run.json with each process's log path,
logs/r0.log ... logs/mooncake_master.log, earlier runs in previous/). Following is tested against a
real process that appends to its log, through the real console script; no test signals a process it
did not start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import tracemalloc
from pathlib import Path

import pytest

from kvctl.serve import logs, procs, runs
from tests.unit.serve.test_runs import GONE, Sleeper, sleeper  # noqa: F401 - sleeper is a fixture

KVCTL = str(Path(sys.executable).parent / "kvctl")


@pytest.fixture(autouse=True)
def _no_ambient_state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KVCTL_STATE_DIR", str(tmp_path / "elsewhere"))  # --state-dir is always given


def make_run(state: Path, name: str, texts: dict[str, bytes | None], *, refs: dict[str, procs.ProcessRef] | None = None,
             embedded: bool = True, state_word: str = "stopped", created: float | None = None) -> runs.RunRecord:
    """A run folder as kvctl serve leaves it: run.json naming each log by its absolute path, and the
    logs. `texts`: process name (r0, r1, ..., master) -> its log's bytes (None: no file)."""
    folder = runs.runs_dir(state) / name
    refs = refs or {}
    (folder / "logs").mkdir(parents=True, exist_ok=True)
    paths = {n: folder / "logs" / ("mooncake_master.log" if n == "master" else f"{n}.log") for n in texts}
    for n, data in texts.items():
        if data is not None:
            paths[n].write_bytes(data)
    replicas = [runs.ReplicaRecord(n, f"http://127.0.0.1:{8000 + i}", 8000 + i, refs.get(n, GONE), str(paths[n]))
                for i, n in enumerate(n for n in texts if n != "master")]
    master = runs.MasterRecord(embedded, "127.0.0.1:50051", "127.0.0.1:9003",
                               refs.get("master", GONE) if embedded else None,
                               str(paths["master"]) if embedded and "master" in paths else None)
    record = runs.RunRecord(name=name, dir=str(folder), state=state_word, created=created or time.time(),
                            template="mooncake-store", parameters={}, model="/models/tiny", host="127.0.0.1",
                            vllm={"version": "0.32.0+cpu"}, master=master, replicas=replicas, cache_prefix=name)
    record.save()
    return record


def logs_cli(cli, state: Path, *args: str):  # noqa: ANN001, ANN201 - the cli fixture and its result
    return cli("logs", *args, "--state-dir", str(state))


# -- showing ----------------------------------------------------------------------------------------
def test_one_replica_prints_its_log_as_written(cli, tmp_path: Path) -> None:
    make_run(tmp_path, "rl", {"r0": b"a\nb\nc\n", "r1": b"other\n", "master": b"I master\n"})
    assert logs_cli(cli, tmp_path, "rl", "r0").stdout == "a\nb\nc\n"
    assert logs_cli(cli, tmp_path, "rl", "r0", "--tail", "2").stdout == "b\nc\n"
    assert logs_cli(cli, tmp_path, "rl", "master", "-n", "1").stdout == "I master\n"
    assert logs_cli(cli, tmp_path, "rl", "r1", "--tail", "0").stdout == ""


def test_without_a_replica_every_log_is_shown_prefixed_replicas_then_master(cli, tmp_path: Path) -> None:
    make_run(tmp_path, "rl", {"r0": b"zero 1\nzero 2\n", "r1": b"one 1\none 2", "master": b"m 1\nm 2\n"})
    result = logs_cli(cli, tmp_path, "rl")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == ["r0     | zero 1", "r0     | zero 2", "r1     | one 1", "r1     | one 2",
                                          "master | m 1", "master | m 2"]
    tail = logs_cli(cli, tmp_path, "rl", "--tail", "1", "--no-prefix")
    assert tail.stdout == "zero 2\none 2\nm 2\n"  # r1's last line had no newline: ended before the next log


def test_unknown_run_and_process_name_the_ones_there_are(cli, tmp_path: Path) -> None:
    make_run(tmp_path, "rl", {"r0": b"x\n", "r1": b"y\n", "master": b"z\n"})
    make_run(tmp_path, "ext", {"r0": b"x\n"}, embedded=False)
    run = logs_cli(cli, tmp_path, "nope")
    assert run.exit_code == 2 and "no run named 'nope'" in run.stderr and "ext, rl" in run.stderr
    replica = logs_cli(cli, tmp_path, "rl", "r7")
    assert replica.exit_code == 2 and "no process named 'r7'" in replica.stderr
    assert "r0, r1, master" in replica.stderr
    external = logs_cli(cli, tmp_path, "ext", "master")
    assert external.exit_code == 2 and "not started by kvctl" in external.stderr and "127.0.0.1:50051" in external.stderr
    negative = logs_cli(cli, tmp_path, "rl", "--tail", "-1")
    assert negative.exit_code == 2 and "--tail -1" in negative.stderr


def test_a_missing_log_is_named_and_fails_after_the_others(cli, tmp_path: Path) -> None:
    record = make_run(tmp_path, "rl", {"r0": b"here\n", "r1": None, "master": b"m\n"})
    result = logs_cli(cli, tmp_path, "rl")
    assert result.exit_code == 1
    assert result.stdout.splitlines() == ["r0     | here", "master | m"]
    assert f"r1: no log at {Path(record.dir) / 'logs' / 'r1.log'}" in result.stderr
    alone = logs_cli(cli, tmp_path, "rl", "r1")
    assert alone.exit_code == 1 and alone.stdout == "" and "no log at" in alone.stderr


def test_previous_reads_the_earlier_run_where_its_logs_moved(cli, tmp_path: Path) -> None:
    first = make_run(tmp_path, "rl", {"r0": b"first run\n"}, created=time.time() - 100)
    assert logs_cli(cli, tmp_path, "rl", "--previous").exit_code == 2  # no earlier run yet
    # a reused name: kvctl serve moves the earlier run's files into previous/<its start>/ (runs.archive)
    moved = runs.archive(Path(first.dir), runs.stamp(first.created))
    assert moved is not None
    make_run(tmp_path, "rl", {"r0": b"second run\n"})
    assert logs_cli(cli, tmp_path, "rl", "r0").stdout == "second run\n"
    earlier = logs_cli(cli, tmp_path, "rl", "r0", "-p")
    # its run.json still names rl/logs/r0.log (the new run's file): read where it moved to
    assert earlier.exit_code == 0 and earlier.stdout == "first run\n"


def test_binary_garbage_cannot_drive_the_terminal(cli, tmp_path: Path) -> None:
    garbage = b"ok \x1b[2J\x1b]0;owned\x07 \x00\xff\xfe end\rredrawn\nnext\tline\n"
    make_run(tmp_path, "rl", {"r0": garbage})
    out = logs_cli(cli, tmp_path, "rl", "r0").stdout
    assert not any(c in out for c in "\x1b\x07\x00")
    # a lone \r would let a line overwrite itself ("end" hidden behind "redrawn"): replaced too
    assert out == "ok \ufffd[2J\ufffd]0;owned\ufffd \ufffd\ufffd\ufffd end\ufffdredrawn\nnext\tline\n"


def test_c1_and_bidi_controls_cannot_drive_the_terminal(cli, tmp_path: Path) -> None:
    """Issue 39 (low): U+009B is CSI and U+009D OSC on terminals that take 8-bit controls, and the bidi
    overrides reorder what a reader sees (a 'Trojan Source' line); a CRLF line end stays a line end."""
    hostile = ["\x9b2J", "\x9d0;owned\x9c", "\x85", "\x80", "\x9f", "\u202a", "\u202b", "\u202c", "\u202d",
               "\u202e", "\u2066", "\u2067", "\u2068", "\u2069", "\u061c", "\u200e", "\u200f", "\x7f", "\x1b"]
    text = "a " + " ".join(hostile) + " z\r\nnext\n"
    make_run(tmp_path, "rl", {"r0": text.encode(), "master": "m \u202eevil\n".encode()})
    for args in (["rl", "r0"], ["rl"], ["rl", "--no-prefix"]):
        out = logs_cli(cli, tmp_path, *args).stdout
        assert not any(0x80 <= ord(c) <= 0x9f or c in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
                       "\u061c\u200e\u200f\x7f\x1b" for c in out), (args, out)
    want = "a \ufffd2J \ufffd0;owned\ufffd " + " ".join(["\ufffd"] * 17) + " z\r\nnext\n"
    assert "".join(p.text for p in logs.read(logs.select(runs.load("rl", tmp_path), None, "r0")[0])) == want
    assert logs_cli(cli, tmp_path, "rl", "r0").stdout == want.replace("\r\n", "\n")  # click's Result drops \r
    assert logs.printable("é ü 中文 ok\tend\r\n") == "é ü 中文 ok\tend\r\n"  # text stays text


def _kvctl_logs(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([KVCTL, "logs", *args, "--state-dir", str(tmp_path)], capture_output=True, text=True,
                          timeout=20)


def test_a_fifo_as_a_log_is_refused_not_waited_on(tmp_path: Path) -> None:
    """Issue 39 (low): a log path that is a named pipe (or a device) hung `kvctl logs` in open() for
    ever; it is named as not a regular file, the other logs are shown, exit 1 -- with -f too."""
    record = make_run(tmp_path, "rl", {"r0": None, "r1": b"fine\n", "master": b"m\n"})
    os.mkfifo(record.replicas[0].log)
    alone = _kvctl_logs(tmp_path, "rl", "r0")
    assert alone.returncode == 1 and alone.stdout == "" and "not a regular file" in alone.stderr
    every = _kvctl_logs(tmp_path, "rl")
    assert every.returncode == 1 and every.stdout == "r1     | fine\nmaster | m\n" and "r0: " in every.stderr
    followed = _kvctl_logs(tmp_path, "rl", "-f")  # its processes are gone: following ends by itself
    assert followed.returncode == 1 and "r1     | fine" in followed.stdout and "not a regular file" in followed.stderr
    assert "(not a regular file" in procs.tail(Path(record.replicas[0].log))  # serve's error excerpts


def test_the_log_excerpt_of_a_serve_error_is_printable_and_bounded(tmp_path: Path) -> None:
    log = tmp_path / "r0.log"
    log.write_bytes(b"x" * (4 * 1024 * 1024) + b"\nlast \x1b[31mred\xc2\x9b\xe2\x80\xae\n")
    tracemalloc.start()
    try:
        excerpt = procs.tail(log)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert excerpt.endswith("last \ufffd[31mred\ufffd\ufffd") and peak < 1024 * 1024, peak


def test_a_ray_run_names_where_each_log_is(cli, tmp_path: Path) -> None:
    record = make_run(tmp_path, "ray-rl", {"r0": None})
    record.ray = {"address": "10.0.0.1:6379", "namespace": "kvctl"}
    node = {"id": "abc", "ip": "10.0.0.7", "host": "worker-7/boot-id"}
    record.replicas[0].node, record.replicas[0].log = node, "/home/u/.local/state/kvctl/ray-runs/ray-rl/x/r0/r0.log"
    record.master = None
    record.save()
    result = logs_cli(cli, tmp_path, "ray-rl", "r0")
    assert result.exit_code == 1 and result.stdout == ""
    assert "/home/u/.local/state/kvctl/ray-runs/ray-rl/x/r0/r0.log on node 10.0.0.7 (host worker-7)" in result.stderr
    assert "kvctl cannot read it from this machine" in result.stderr


# -- bounded reading ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("data", "n", "want"), [
    (b"", 3, b""), (b"a\nb\nc\n", 2, b"b\nc\n"), (b"a\nb\nc", 2, b"b\nc"), (b"a\nb\n", 9, b"a\nb\n"),
    (b"\n\n\n", 2, b"\n\n"), (b"a\nb\n", 0, b""), (b"a\nb\n", None, b"a\nb\n"),
])
def test_tail_offset(tmp_path: Path, data: bytes, n: int | None, want: bytes) -> None:
    path = tmp_path / "log"
    path.write_bytes(data)
    with open(path, "rb") as fh:
        fh.seek(logs.tail_offset(fh, n, len(data)))
        assert fh.read() == want


def test_a_huge_log_tails_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "r0.log"
    line = b"INFO 12-02 05:12:28 [engine.py:123] " + b"x" * 90 + b"\n"
    with open(path, "wb") as fh:
        for _ in range(40):  # 40 x 1 MiB chunks: a ~40 MiB log
            fh.write(line * (1024 * 1024 // len(line)))
        fh.write(b"the end\n")
    stream = logs.LogStream("r0", path, None)
    tracemalloc.start()
    try:
        got = list(logs.read(stream, 3))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [p.text for p in got] == [line.decode(), line.decode(), "the end\n"]
    assert peak < 2 * 1024 * 1024, peak  # the whole log never in memory

    one_line = tmp_path / "one.log"  # 3 MiB without a newline: handed on in pieces, nothing lost
    one_line.write_bytes(b"y" * (3 * 1024 * 1024))
    pieces = list(logs.read(logs.LogStream("r0", one_line, None), 1))
    assert all(len(p.text) <= logs.MAX_PIECE and not p.complete for p in pieces)
    assert "".join(p.text for p in pieces) == "y" * (3 * 1024 * 1024)


# -- following ----------------------------------------------------------------------------------------
def test_follow_reads_a_rotated_and_a_truncated_log(tmp_path: Path) -> None:
    path = tmp_path / "r0.log"
    path.write_bytes(b"old 1\nold 2\n")
    steps = iter([
        lambda: path.open("ab").write(b"old 3\n"),
        lambda: (path.rename(tmp_path / "r0.log.1"), path.write_bytes(b"new 1\n")),  # rotated
        lambda: path.write_bytes(b"cut\n"),  # truncated in place and rewritten
    ])

    def refresh() -> tuple[bool, list[logs.LogStream]]:
        step = next(steps, None)
        if step is not None:
            step()
        return step is not None, []

    got = [p.text for p in logs.follow([logs.LogStream("r0", path, None)], 1, refresh, poll_s=0.01, check_s=0)]
    assert got == ["old 2\n", "old 3\n", "new 1\n", "cut\n"]


def _appender(log: Path, lines: int, every: float) -> subprocess.Popen[bytes]:
    """A process that appends to its log as a replica does (its own session, output to the file)."""
    code = textwrap.dedent(f"""
        import sys, time
        for i in range({lines}):
            print(f"line {{i}}", flush=True)
            time.sleep({every})
    """)
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _ref(proc: subprocess.Popen[bytes], name: str) -> procs.ProcessRef:
    start = procs.start_time_of(proc.pid)
    assert start is not None
    return procs.ProcessRef(proc.pid, start, name)


def test_follow_prints_what_a_live_process_appends_and_ends_when_it_exits(tmp_path: Path) -> None:
    record = make_run(tmp_path, "rl", {"r0": b"before\n", "master": b"m\n"}, state_word="running")
    proc = _appender(Path(record.replicas[0].log), lines=12, every=0.15)
    try:
        record.replicas[0].process = _ref(proc, "replica r0")
        record.save()
        follower = subprocess.run([KVCTL, "logs", "rl", "-f", "--state-dir", str(tmp_path)], capture_output=True,
                                  text=True, timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert follower.returncode == 0, follower.stderr
    lines = follower.stdout.splitlines()
    assert lines[0] == "r0     | before" and "master | m" in lines
    assert [ln for ln in lines if "line" in ln] == [f"r0     | line {i}" for i in range(12)]
    assert "its processes have exited; stopped following" in follower.stderr


def test_ctrl_c_ends_a_follow_with_exit_0(tmp_path: Path, sleeper: Sleeper) -> None:  # noqa: F811
    make_run(tmp_path, "rl", {"r0": b"one\ntwo\n"}, refs={"r0": sleeper("replica r0")}, state_word="running")
    follower = subprocess.Popen([KVCTL, "logs", "rl", "r0", "-f", "--tail", "1", "--state-dir", str(tmp_path)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert follower.stdout is not None and follower.stdout.readline() == "two\n"  # it is following now
        follower.send_signal(signal.SIGINT)
        _, err = follower.communicate(timeout=30)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert follower.returncode == 0, err
    assert "Traceback" not in err


def test_follow_of_a_starting_run_picks_up_replicas_as_they_start(tmp_path: Path) -> None:
    record = make_run(tmp_path, "rl", {"master": b"m\n"}, state_word="starting")
    live = {"alive": True}
    refresh = logs.run_refresh(record, Path(record.dir), None, liveness=lambda _: lambda _ref: live["alive"])
    pieces = logs.follow(logs.streams(record, Path(record.dir)), None, refresh, poll_s=0.01, check_s=0)
    assert next(pieces).text == "m\n"
    log = Path(record.dir) / "logs" / "r0.log"  # serve records r0 once it has spawned it
    log.write_bytes(b"r0 up\n")
    record.replicas.append(runs.ReplicaRecord("r0", "http://127.0.0.1:8000", 8000, GONE, str(log)))
    record.save()
    assert next(pieces) == logs.Piece("r0", "r0 up\n", True)
    live["alive"] = False
    assert list(pieces) == []


def test_logs_help_imports_nothing_heavy() -> None:
    code = ("import sys; sys.argv = ['kvctl', 'logs', '--help']\nfrom kvctl.cli.main import run\ntry:\n    run()\n"
            "except SystemExit:\n    pass\nprint(sorted({'psutil', 'httpx', 'ray', 'vllm', 'torch'} & set(sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "80"})
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stderr
    assert "kvctl logs" in proc.stdout


def test_logs_of_a_run_kvctl_serve_started(cli, tmp_path: Path) -> None:
    """The files and record a real `kvctl serve --detach` leaves (real mooncake_master, the vLLM double)."""
    from tests.integration.helpers import require_mooncake
    from tests.unit.serve.test_serve import serve_args

    require_mooncake()
    state = tmp_path / "state"
    started = cli(*serve_args(tmp_path, "lg", "--replicas", "2", "--detach"))
    assert started.exit_code == 0, started.stderr
    try:
        record = runs.load("lg", state)
        for r in record.replicas:  # the vLLM double writes nothing: a line where serve sent its output
            with open(r.log, "a") as out:
                out.write(f"INFO served by {r.name}\n")
        every = cli("logs", "lg", "--state-dir", str(state))
        assert every.exit_code == 0, every.stderr
        names = [line.split(" | ", 1)[0].strip() for line in every.stdout.splitlines()]
        assert set(names) == {"r0", "r1", "master"} and names.index("master") > max(names.index("r0"), names.index("r1"))
        assert "r1     | INFO served by r1" in every.stdout
        for name, path in [(r.name, r.log) for r in record.replicas] + [("master", record.master.log)]:
            one = cli("logs", "lg", name, "--state-dir", str(state))
            assert one.exit_code == 0 and one.stdout == Path(path).read_text(errors="replace")
    finally:
        assert cli("stop", "--run", "lg", "--state-dir", str(state)).exit_code == 0
    ended = subprocess.run([KVCTL, "logs", "lg", "-f", "--tail", "1", "--state-dir", str(state)],
                           capture_output=True, text=True, timeout=30)  # nothing lives: ends at once
    assert ended.returncode == 0 and "stopped following" in ended.stderr
    assert len(ended.stdout.splitlines()) == 3  # the last line of each
