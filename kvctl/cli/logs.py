"""`kvctl logs RUN [REPLICA]`: the logs of a run's processes, like `docker compose logs` / `kubectl logs`."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from kvctl.cli.completion import replica_names
from kvctl.cli.errors import EXIT_FAILED, handle_errors
from kvctl.cli.options import RayOpt, RunArg, StateDirOpt
from kvctl.errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Iterable

    from kvctl.serve.logs import LogStream, Piece


@handle_errors
def logs(
    run: RunArg,
    replica: Annotated[Optional[str], typer.Argument(
        metavar="REPLICA", autocompletion=replica_names, show_default=False,
        help="r0, r1, ... or master (the embedded Mooncake master). Default: every process of the run.")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing what is appended, until Ctrl-C or until the run's processes have exited.")] = False,
    tail: Annotated[Optional[int], typer.Option("--tail", "-n", metavar="N", show_default=False, help="Only the last N lines of each log (default: all; 0 with -f: only new lines).")] = None,
    previous: Annotated[bool, typer.Option("--previous", "-p", help="The logs of the earlier run under this name (the newest in RUN/previous/).")] = False,
    no_prefix: Annotated[bool, typer.Option("--no-prefix", help="Without REPLICA: leave out the 'r0 | ' prefix of each line.")] = False,
    ray: RayOpt = None,
    state_dir: StateDirOpt = None,
) -> None:
    """Print the logs of a run's processes (like docker compose logs / kubectl logs).

    With REPLICA: that process's log as written, without a prefix (pipe it to grep). Without: every process's log, replicas in order and then the master, one after another, each line prefixed with its name (with -f: lines as they arrive). -f ends by itself once none of the followed processes lives (exit 0; Ctrl-C also exits 0). Control characters (C0 but tab and newline, a lone carriage return, DEL, C1, bidi controls) and invalid UTF-8 are shown as U+FFFD, so a log cannot drive your terminal; a log path that is not a regular file (a named pipe) is named, not read. A run on Ray: its logs are files on its nodes; kvctl reads those on this machine and names where the others are. Exit 1 when a log cannot be read (after the readable ones), 2 for an unknown run or process.
    """
    from kvctl.cli import output
    from kvctl.serve import logs as core

    if tail is not None and tail < 0:
        raise UsageError(f"--tail {tail}: a negative number of lines", "give 0 or more lines, or leave --tail out for all")
    record, folder = core.open_run(run, state_dir, previous=previous, ray=ray)
    chosen = core.select(record, folder, replica)
    prefix = "" if replica is not None or no_prefix else "{name:<%d} | " % max(len(s.name) for s in chosen)
    printer = _Printer(prefix, several=len(chosen) > 1)
    readable = [s for s in chosen if not s.remote]
    unreadable = [s for s in chosen if s.remote]
    for s in unreadable:
        output.note(f"{s.name}: its log is {s.where()}; kvctl cannot read it from this machine: read it on that "
                    f"node (e.g. tail -f {s.path})")
    if follow:  # a named pipe is never opened for reading (it waits for a writer): said now, not followed
        for stream in [s for s in readable if core.refused(s)]:
            readable.remove(stream)
            unreadable.append(stream)
            output.note(f"{stream.name}: cannot read {stream.where()}: {core.refused(stream)}")
    try:
        if follow and readable:
            printer.write(core.follow(readable, tail, core.run_refresh(record, folder, replica)))
            output.note(f"run {record.name}: {'its processes have' if replica is None else replica + ' has'} "
                        "exited; stopped following")
            for stream in readable:
                if not stream.path.exists():
                    unreadable.append(stream)
                    output.note(f"{stream.name}: no log at {stream.where()} (removed, or the process never started)")
        else:
            for stream in readable:
                missing = printer.write_one(stream, tail)
                if missing:
                    unreadable.append(stream)
                    output.note(f"{stream.name}: {missing}")
    except KeyboardInterrupt:
        printer.end()
        return  # Ctrl-C is how -f is meant to end: exit 0, as docker logs -f does
    except BrokenPipeError:
        _quiet_stdout()  # `kvctl logs ... | head`: the reader has gone, and that is fine
        return
    printer.end()
    if unreadable:
        raise typer.Exit(EXIT_FAILED)


class _Printer:
    """Pieces -> stdout, each line with its prefix; partial pieces continue their line."""

    def __init__(self, prefix: str, several: bool) -> None:
        self.prefix, self.several = prefix, several  # several logs: a line never runs into another's
        self.open_line: str | None = None  # the stream whose line is unfinished on screen

    def write(self, pieces: Iterable[Piece]) -> None:
        from kvctl.cli import output

        for piece in pieces:
            if self.open_line is not None and self.open_line != piece.name and self.several:
                output.print_text("\n")  # another process's line: end the unfinished one
                self.open_line = None
            start = self.prefix.format(name=piece.name) if self.open_line is None and self.prefix else ""
            output.print_text(start + piece.text)
            self.open_line = None if piece.complete else piece.name
            _flush()

    def write_one(self, stream: LogStream, tail: int | None) -> str | None:
        """Print one log; what went wrong when it cannot be read."""
        from kvctl.serve import logs as core

        try:
            self.write(core.read(stream, tail))
        except FileNotFoundError:
            return f"no log at {stream.where()} (removed, or the process never started)"
        except OSError as exc:
            return f"cannot read {stream.where()}: {exc.strerror or exc}"
        if self.several:
            self.end()
        return None

    def end(self) -> None:
        from kvctl.cli import output

        # a last line without a newline: ended before the next prefix, or the prompt, follows it
        if self.open_line is not None and (self.several or output.console().is_terminal):
            output.print_text("\n")
            _flush()
        self.open_line = None


def _flush() -> None:
    from kvctl.cli import output

    output.console().file.flush()


def _quiet_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so Python's exit flush does not complain."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
