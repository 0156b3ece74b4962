"""A run's life after `kvctl serve`: stop it, reuse its name, remove its folder.

`stop_run()` stops only processes the run started (pid and start time). `claim_run()` gives a
new run its folder, keeping an earlier run's files under NAME/previous/, and `remove_runs()`
deletes folders; neither touches a run with anything alive (kvctl.serve.runs.live_processes). A run on a
Ray cluster (`kvctl serve --ray`) is stopped and checked through its actors (kvctl.serve.ray_fleet, which
imports Ray only for such a run). Nothing here prints: progress goes to an `on_event` callback.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from kvctl.errors import KvctlError, UsageError
from kvctl.serve import procs, runs
from kvctl.serve.runs import Removed, RunRecord

Event = Callable[..., None]
SETTLE_TIMEOUT = 15.0  # for a foreground kvctl serve to notice its processes are gone and exit


def stop_run(record: RunRecord, grace: float = 10.0, on_event: Event | None = None) -> list[tuple[str, str]]:
    """Stop every process the run started (replicas, then the master). Safe to call twice; logs stay."""
    refuse_external(record)
    emit = on_event or (lambda *a, **k: None)
    results = []
    if record.ray is not None:  # each actor stops its process, then the actors are killed
        from kvctl.serve import ray_fleet

        results = ray_fleet.stop_processes(record, grace, emit)
    for ref in record.processes() if record.ray is None else []:
        result = procs.stop(ref, grace)
        results.append((ref.name, result))
        emit("stopped", name=ref.name, result=result)
    if record.state in runs.LIVE_STATES:
        record.state = "stopped"
    if record.supervisor is not None and record.supervisor.pid == os.getpid():
        record.supervisor = None  # we were supervising it: done
    _save(record)
    return results


def refuse_external(record: RunRecord) -> None:
    """kvctl stops only what it started: an external run (verl's servers, recorded by
    kvctl.integrations.verl) is never signalled, whatever asked (stop, rm --force, serve --replace)."""
    if record.external:
        raise UsageError(f"run '{record.name}' was started by {record.owner}, not by kvctl: kvctl stops only what "
                         "it started, and signals none of its processes",
                         f"stop the {record.owner} job itself; kvctl rm {record.name} removes the record once the "
                         "job has ended")


def liveness(record: RunRecord) -> Callable[[procs.ProcessRef], bool]:
    """How to tell whether a process of the run lives: pid and start time here; a Ray run's actors answer
    (an external run has no process of kvctl's: only its writer, checked here by runs.live_processes)."""
    if record.ray is None or record.external:
        return procs.is_ours
    from kvctl.serve import ray_fleet

    return ray_fleet.liveness(record)


def _save(record: RunRecord) -> None:
    if record.ray is None:
        record.save()
        return
    from kvctl.serve import ray_fleet

    ray_fleet.save(record)  # the local folder (if this machine has it) and the cluster's copy


def stop_and_settle(record: RunRecord, grace: float = 10.0, on_event: Event | None = None,
                    timeout: float = SETTLE_TIMEOUT) -> list[tuple[str, str]]:
    """stop_run, then wait for the run's supervisor (a foreground kvctl serve) to exit: it sees its
    processes gone and writes run.json a last time, so the folder is quiet before it is reused or
    removed. What it recorded meanwhile (a replica started after we read the record) is stopped too."""
    results = stop_run(record, grace, on_event)
    supervisor = record.supervisor
    if supervisor is None or supervisor.pid == os.getpid() or not procs.is_ours(supervisor):
        return results
    deadline = time.monotonic() + timeout
    while procs.is_ours(supervisor) and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        fresh = runs.read(record.path)
    except UsageError:
        return results
    done = set(record.processes())
    if fresh is None or fresh.created != record.created:
        return results
    if fresh.ray is not None:  # its processes are the actors' to stop, wherever they run
        if set(fresh.processes()) - done:
            from kvctl.serve import ray_fleet

            results += ray_fleet.stop_processes(fresh, grace, on_event)
        return results
    for ref in fresh.processes():
        if ref not in done:
            result = procs.stop(ref, grace)
            results.append((ref.name, result))
            if on_event is not None:
                on_event("stopped", name=ref.name, result=result)
    return results


def run_alive(record: RunRecord) -> list[str]:
    """Names of the run's processes that are gone (empty: all alive)."""
    alive = liveness(record)
    return [ref.name for ref in record.processes() if not alive(ref)]


def claim_run(record: RunRecord, *, replace: bool = False, grace: float = 10.0,
              on_event: Event | None = None) -> Path | None:
    """Make record.dir the new run's folder and write its run.json (state starting, this process as its
    supervisor) before anything starts. A name never used gets a new folder. A run of that name with
    nothing alive (stopped, failed, exited) is kept: its files move to NAME/previous/<its start time>/,
    which this returns. A live run is refused; with `replace` it is stopped first (only the processes
    it started)."""
    emit = on_event or (lambda *a, **k: None)
    folder = runs.run_folder(record.path.parent, record.name)
    old = runs.read(folder)
    live = runs.live_processes(old, liveness(old)) if old is not None else []
    if live and not replace:
        raise UsageError(f"run '{record.name}' is still running: {runs.describe(live)}",
                         f"stop it first (kvctl stop {record.name}), pass --replace to stop it and start "
                         "again under that name (its logs are kept), or pick another --run NAME")
    if live:
        assert old is not None
        if old.state == "starting" and old.supervisor in live:
            raise UsageError(f"run '{record.name}' is still being started by kvctl serve (pid {old.supervisor.pid})",
                             "wait until it is up and try again, or interrupt that kvctl serve (Ctrl-C)")
        emit("replacing", run=old)
        stop_and_settle(old, grace, emit)
    with runs.locked(folder.parent):  # another start or kvctl rm may act on this name meanwhile
        old = runs.read(folder)
        live = runs.live_processes(old, liveness(old)) if old is not None else []
        if live:
            raise KvctlError(f"run '{record.name}' still has live processes: {runs.describe(live)}",
                             f"kvctl stop {record.name}, then try again")
        previous = runs.archive(folder, runs.stamp(old.created if old is not None else None))
        record.supervisor = _this_process()
        try:
            record.create()
        except FileExistsError:
            raise UsageError(f"another kvctl serve claimed the name '{record.name}' just now",
                             "pick another --run NAME") from None
    if previous is not None:
        emit("archived", name=record.name, previous=previous)
    return previous


def remove_runs(names: list[str], state_dir: str | Path | None = None, *, force: bool = False,
                grace: float = 10.0, on_event: Event | None = None) -> list[Removed]:
    """Delete the folders of runs that have nothing alive (logs, config, earlier runs under the name).
    All or nothing: an unknown name or a live run (unless `force`, which stops it first) removes none."""
    names = list(dict.fromkeys(names))
    base = runs.runs_dir(state_dir)
    folders = {name: runs.run_folder(base, name) for name in names}
    unknown = [n for n, f in folders.items() if not (f / runs.RUN_FILE).is_file()]
    if unknown:
        known = ", ".join(r.name for r in runs.summaries(state_dir)) or "none"
        raise UsageError(f"no run named {', '.join(unknown)} in {base}", f"known runs: {known} (kvctl runs)")
    found = {name: _summary_or_none(f) for name, f in folders.items()}
    refused = [n for n, s in found.items() if s is None or s.live]
    external = [n for n in refused if found[n] is not None and found[n].owner is not None]  # type: ignore[union-attr]
    if external:  # even with force: kvctl never stops them, and its writer would write the record again
        raise UsageError("; ".join(f"run '{n}' is recorded by a live {found[n].owner} job "  # type: ignore[union-attr]
                                   "(kvctl did not start it and stops none of its processes)" for n in external),
                         f"stop that job itself, then kvctl rm {' '.join(external)}")
    if refused and not force:
        stoppable = [n for n in refused if found[n] is not None]
        stops = f"kvctl stop {' '.join(stoppable)}" if stoppable else ""
        raise UsageError("; ".join(_refusal(n, found[n]) for n in refused),
                         (f"{stops} first, or " if stops else "") + f"kvctl rm --force {' '.join(names)}"
                         + (" (stops, then removes)" if stops else ""))
    removed = []
    for name, summary in found.items():
        stopped = stop_and_settle(runs.load(name, state_dir), grace, on_event) if summary and summary.live else []
        removed.append(Removed(name, str(folders[name]), summary.state if summary else "unreadable", stopped))
    with runs.locked(base):
        records = {item.name: _record_or_none(folders[item.name]) for item in removed}
        for item in removed:  # a kvctl serve may have reused the name since we looked
            record = records[item.name]
            live = runs.live_processes(record, liveness(record)) if record is not None else []
            if live:
                raise KvctlError(f"run '{item.name}' is running again: {runs.describe(live)}",
                                 f"kvctl stop {item.name}, then kvctl rm {item.name}")
        for item in removed:
            runs.remove_folder(folders[item.name])
    for record in records.values():  # a Ray run's record in its cluster goes too
        if record is not None and record.ray is not None:
            from kvctl.serve import ray_fleet

            ray_fleet.forget(record)
    return removed


def _summary_or_none(folder: Path) -> runs.RunSummary | None:
    record = _record_or_none(folder)
    return None if record is None else runs.summarize(record, folder, alive=liveness(record))


def _record_or_none(folder: Path) -> RunRecord | None:
    try:
        return runs.read(folder)
    except UsageError:  # unreadable: which processes it started cannot be known
        return None


def _refusal(name: str, summary: runs.RunSummary | None) -> str:
    if summary is None:
        return f"{name}: its run.json is unreadable, so kvctl cannot tell whether it still runs"
    return f"run '{name}' is still running: " + ", ".join(f"{p['name']} (pid {p['pid']})" for p in summary.live)


def _this_process() -> procs.ProcessRef:
    pid = os.getpid()
    return procs.ProcessRef(pid, procs.start_time_of(pid) or time.time(), "kvctl serve")
