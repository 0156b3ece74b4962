"""`kvctl logs`: which log files a run's processes write, their last lines, and following them.

A run folder holds `logs/r0.log`, `logs/r1.log`, ... and `logs/mooncake_master.log` (embedded master),
appended to by the processes themselves; an earlier run under the same name keeps its own in
`previous/<start time>/logs/`. Reading is bounded: the last N lines are found by scanning backwards
in blocks, and text is handed on in pieces of at most MAX_PIECE bytes, so a multi-GB log or one
line without a newline never sits in memory whole.

Log text is decoded leniently and stripped of control characters (kvctl.serve.logtext: C0 but tab
and newline, DEL, C1, bidi controls): vLLM logs prompts when asked to (--enable-log-requests), so a
log can carry escape sequences that would drive the reader's terminal. A log path that is not a
regular file (a named pipe, a device) is refused without a blocking open.

Never prints: the CLI (kvctl/cli/logs.py) prints the pieces this yields.
"""

from __future__ import annotations

import codecs
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvctl.errors import UsageError
from kvctl.serve import runs
from kvctl.serve.logtext import not_regular, open_regular, printable
from kvctl.serve.procs import ProcessRef, is_ours
from kvctl.serve.runs import RunRecord

MASTER = "master"  # the name `kvctl logs RUN master` takes for the embedded mooncake_master
BLOCK = 64 * 1024
MAX_PIECE = 64 * 1024  # a longer line is handed on in pieces of this size
READ_PER_POLL = 1024 * 1024  # per log and poll while following: one busy log cannot starve the others


@dataclass
class LogStream:
    """One process's log."""

    name: str  # r0, r1, ... or master
    path: Path
    process: ProcessRef | None
    node: dict[str, str] | None = None  # a Ray run: the node the process runs on
    remote: bool = False  # on another machine: kvctl cannot read it from here

    def where(self) -> str:
        if self.node is None:
            return str(self.path)
        return f"{self.path} on node {self.node.get('ip', '?')} (host {self.node.get('host', '?').split('/')[0]})"


@dataclass
class Piece:
    """Text of one log: a whole line (ending in a newline) or part of one (`complete` False)."""

    name: str
    text: str
    complete: bool


# -- which logs ------------------------------------------------------------------------------------
def open_run(name: str, state_dir: str | Path | None = None, *, previous: bool = False,
             ray: str | None = None) -> tuple[RunRecord, Path | None]:
    """The run named `name` (with `previous`: the earlier run under that name, newest first), and the
    folder its files are in (None for a Ray run read from its cluster that was not started here)."""
    if ray is not None:
        from kvctl.serve import ray_fleet

        record = ray_fleet.load(ray, name, state_dir)
        folder = Path(record.dir) if record.dir else None
    else:
        record = runs.load(name, state_dir)
        folder = runs.runs_dir(state_dir) / name
    if not previous:
        return record, folder
    earlier = runs.previous_runs(folder) if folder is not None else []
    readable = [(p, r) for p in reversed(earlier) if (r := _read_or_none(p)) is not None]
    if not readable:
        raise UsageError(f"run {name} has no earlier run under its name (no {runs.PREVIOUS}/ folder with a run.json)",
                         f"leave out --previous for the current run's logs; earlier runs' files are in "
                         f"{(folder or Path(record.dir)) / runs.PREVIOUS}")
    folder, record = readable[0]
    return record, folder


def _read_or_none(folder: Path) -> RunRecord | None:
    try:
        return runs.read(folder)
    except UsageError:
        return None


def streams(record: RunRecord, folder: Path | None) -> list[LogStream]:
    """Every log the run has: its replicas in order, then its embedded master."""
    out = [_stream(r.name, r.log, r.process, r.node, record, folder) for r in record.replicas]
    m = record.master
    if m is not None and m.embedded:
        out.append(_stream(MASTER, m.log or "", m.process, m.node, record, folder, "mooncake_master"))
    return out


def select(record: RunRecord, folder: Path | None, name: str | None) -> list[LogStream]:
    """The logs `kvctl logs RUN [NAME]` shows: all of them, or the one named. UsageError names the others."""
    found = streams(record, folder)
    if name is None:
        if not found:
            raise UsageError(f"run {record.name} has no processes with logs yet (state: {record.state})",
                             f"kvctl runs shows its state; its folder is {folder or record.dir}")
        return found
    for stream in found:
        if stream.name == name:
            return [stream]
    names = ", ".join(s.name for s in found) or "none yet"
    extra = ""
    if name == MASTER and record.master is not None and not record.master.embedded:
        extra = (f"; its master ({record.master.rpc_address}) was not started by kvctl, so its log is wherever "
                 "that master was started")
    raise UsageError(f"run {record.name} has no process named '{name}'{extra}",
                     f"its processes: {names} (kvctl logs {record.name} NAME)")


def _stream(name: str, recorded: str, process: ProcessRef | None, node: dict[str, str] | None,
            record: RunRecord, folder: Path | None, file_stem: str | None = None) -> LogStream:
    if node is not None or record.ray is not None:  # a Ray run: the path is on the process's node
        path = Path(recorded) if recorded else Path("?")
        return LogStream(name, path, process, node, remote=not _on_this_machine(node, path))
    base = folder or Path(record.dir)
    path = Path(recorded) if recorded else base / "logs" / f"{file_stem or name}.log"
    try:
        # run.json holds absolute paths: an archived run (previous/<stamp>/) reads its logs where they moved
        path = base / path.relative_to(record.dir)
    except ValueError:
        pass
    return LogStream(name, path, process)


def _on_this_machine(node: dict[str, str] | None, path: Path) -> bool:
    """A Ray node on this machine (a one-machine cluster) wrote its log where kvctl can read it."""
    if node is None or not path.is_file():
        return False
    try:
        from kvctl.serve.ray_actors import host_id  # imports ray: only for a Ray run
    except Exception:  # noqa: BLE001 - no ray here: the node cannot be told apart, so it is not read
        return False
    return node.get("host") == host_id()


# -- reading --------------------------------------------------------------------------------------
def tail_offset(fh: Any, lines: int | None, end: int) -> int:
    """Where the last `lines` lines of the first `end` bytes begin (None: all, 0: none); a last line
    without a newline counts. Reads backwards in BLOCK-sized reads: memory does not grow with the file."""
    if lines is None:
        return 0
    if lines <= 0:
        return end
    pos, count, first = end, 0, True
    while pos > 0:
        size = min(BLOCK, pos)
        pos -= size
        fh.seek(pos)
        block = fh.read(size)
        idx = len(block) - 1 if first and block.endswith(b"\n") else len(block)  # the last line's own newline
        first = False
        while (i := block.rfind(b"\n", 0, idx)) >= 0:
            count += 1
            if count == lines:
                return pos + i + 1
            idx = i
    return 0


class _Splitter:
    """Bytes of one log -> Pieces: whole lines, a part of a longer line every MAX_PIECE bytes."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.pending = b""
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> list[Piece]:
        data, out, start = self.pending + data, [], 0
        while (i := data.find(b"\n", start)) >= 0:
            out.append(self._piece(data[start:i + 1], True))
            start = i + 1
        rest = data[start:]
        while len(rest) > MAX_PIECE:
            out.append(self._piece(rest[:MAX_PIECE], False))
            rest = rest[MAX_PIECE:]
        self.pending = rest
        return out

    def flush(self) -> list[Piece]:
        rest, self.pending = self.pending, b""
        text = printable(self.decoder.decode(rest, final=True))
        return [Piece(self.name, text, False)] if text else []

    def _piece(self, data: bytes, complete: bool) -> Piece:
        return Piece(self.name, printable(self.decoder.decode(data)), complete)


def read(stream: LogStream, lines: int | None = None) -> Iterator[Piece]:
    """The log as it is now (its last `lines` lines; None: all), in pieces. OSError when it cannot be read."""
    with open_regular(stream.path) as fh:  # a named pipe would wait for a writer: refused
        end = os.fstat(fh.fileno()).st_size  # what is there now: a growing log is not chased
        fh.seek(tail_offset(fh, lines, end))
        split, left = _Splitter(stream.name), end - fh.tell()
        while left > 0:
            data = fh.read(min(BLOCK, left))
            if not data:
                break
            left -= len(data)
            yield from split.feed(data)
        yield from split.flush()


# -- following ------------------------------------------------------------------------------------
class _Tracked:
    """One followed log: its open file (None until it exists) and what was read of it."""

    def __init__(self, stream: LogStream, lines: int | None) -> None:
        self.stream, self.lines = stream, lines
        self.fh: Any = None
        self.split = _Splitter(stream.name)

    def poll(self) -> list[Piece]:
        if self.fh is None and not self._open():
            return []
        out = self._read()
        if self._replaced():  # rotated or recreated: finish the old file (done above), then the new one
            out += self.split.flush()
            self.fh.close()
            self.fh, self.lines = None, None
            if self._open():
                out += self._read()
        return out

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None

    def _open(self) -> bool:
        try:
            self.fh = open_regular(self.stream.path)  # held open across polls, closed in close()
        except OSError:  # not there yet (waited for), or not a regular file (never read; the CLI says so)
            return False
        end = os.fstat(self.fh.fileno()).st_size
        self.fh.seek(tail_offset(self.fh, self.lines, end))
        return True

    def _read(self) -> list[Piece]:
        if os.fstat(self.fh.fileno()).st_size < self.fh.tell():  # truncated in place: from its start
            self.fh.seek(0)
        out: list[Piece] = []
        left = READ_PER_POLL
        while left > 0 and (data := self.fh.read(min(BLOCK, left))):
            left -= len(data)
            out += self.split.feed(data)
        return out

    def _replaced(self) -> bool:
        try:
            now = os.stat(self.stream.path)
        except OSError:
            return False  # moved away and not yet recreated: keep reading the moved file
        held = os.fstat(self.fh.fileno())
        return (now.st_ino, now.st_dev) != (held.st_ino, held.st_dev)


def refused(stream: LogStream) -> str | None:
    """Why a log path that exists cannot be followed (not a regular file), else None; stat only."""
    try:
        return not_regular(os.stat(stream.path).st_mode)
    except OSError:
        return None


def follow(first: list[LogStream], lines: int | None, refresh: Callable[[], tuple[bool, list[LogStream]]],
           poll_s: float = 0.25, check_s: float = 1.0) -> Iterator[Piece]:
    """The last `lines` lines of each log, then what the processes append, as it comes, until
    `refresh` says nothing that writes them lives; it also names logs that appeared since (a
    starting run's next replica), which are read from their start. A log that does not exist yet
    is waited for. Ends after a last read once nothing lives (Ctrl-C ends it sooner)."""
    tracked = {s.name: _Tracked(s, lines) for s in first}
    next_check = 0.0
    try:
        while True:
            got = [p for t in tracked.values() for p in t.poll()]
            yield from got
            if got:
                continue
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + check_s
                alive, current = refresh()
                for stream in current:
                    if stream.name not in tracked:
                        tracked[stream.name] = _Tracked(stream, None)
                if not alive:
                    break
            time.sleep(poll_s)
        # nothing writes any more: what came since the last read, and the last lines without a newline
        yield from (p for t in tracked.values() for p in t.poll())
        yield from (p for t in tracked.values() for p in t.split.flush())
    finally:
        for t in tracked.values():
            t.close()


def run_refresh(record: RunRecord, folder: Path | None, name: str | None,
                liveness: Callable[[RunRecord], Callable[[ProcessRef], bool]] | None = None,
                ) -> Callable[[], tuple[bool, list[LogStream]]]:
    """What follow() asks each second: does anything that writes the followed logs live (a followed
    process, or the kvctl process still starting the run), and which logs the run has now.
    `liveness`: how to ask (default: kvctl.serve.lifecycle.liveness; a Ray run's actors answer)."""
    if liveness is None:
        from kvctl.serve.lifecycle import liveness

    def refresh() -> tuple[bool, list[LogStream]]:
        nonlocal record
        if folder is not None and record.ray is None:
            record = _read_or_none(folder) or record  # a starting run records each replica as it starts
        chosen = streams(record, folder)
        if name is not None:
            chosen = [s for s in chosen if s.name == name]
        alive = liveness(record)
        writing = any(s.process is not None and alive(s.process) for s in chosen)
        starting = record.state == "starting" and record.supervisor is not None and is_ours(record.supervisor)
        return writing or starting, chosen

    return refresh
