"""Run records: what `kvctl serve` started, so status, reset and stop can find it later.

A run lives in its own folder (default `<user state dir>/kvctl/runs/NAME`; override with
KVCTL_STATE_DIR or --state-dir) holding run.json, the rendered config bundle and every log.
run.json is rewritten atomically after each change, so a crash mid-start still leaves a record
that `kvctl stop` can act on. When a name is reused, the earlier run's files move to
`NAME/previous/<its start time>/`; nothing is deleted except by `kvctl rm`.

Liveness is read from the processes themselves (pid AND start time), never from the recorded
state alone: a run recorded running whose processes are all gone is listed as `exited`.

A run started on a Ray cluster (`kvctl serve --ray`) has the same record, with `ray` set (the
cluster's address) and each process's node; its processes run on other machines, so whether they
live is what their Ray actors say (kvctl.serve.ray_fleet.liveness), and the record also lives in the
cluster's key-value store so any machine that reaches the cluster can find it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvctl.errors import UsageError
from kvctl.state import state_dir
from kvctl.serve.procs import ProcessRef, is_ours

RUN_FILE = "run.json"
PREVIOUS = "previous"  # NAME/previous/<start time>/: the files of earlier runs under the same name
LIVE_STATES = ("starting", "running")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass
class ReplicaRecord:
    name: str
    url: str
    port: int
    process: ProcessRef | None = None
    log: str = ""
    gpu: str | None = None
    cpus: str | None = None  # VLLM_CPU_OMP_THREADS_BIND of a CPU replica (cores, or nobind)
    node: dict[str, str] | None = None  # Ray run: the node it runs on (id, ip, host); its log is a path there
    actor: str | None = None  # Ray run: the named actor that supervises it (namespace kvctl)


@dataclass
class MasterRecord:
    embedded: bool
    rpc_address: str  # host:port for mooncake.json
    admin_address: str | None  # host:port of the admin/metrics HTTP port
    process: ProcessRef | None = None
    log: str | None = None
    node: dict[str, str] | None = None  # Ray run: as for ReplicaRecord
    actor: str | None = None


@dataclass
class RunRecord:
    name: str
    dir: str
    state: str  # starting | running | stopped | failed
    created: float
    template: str
    parameters: dict[str, Any]
    model: str
    host: str
    vllm: dict[str, Any]  # python, distribution, version
    master: MasterRecord | None
    replicas: list[ReplicaRecord] = field(default_factory=list)
    bundle: str = ""
    connector: list[str] = field(default_factory=list)
    cache_prefix: str | None = None
    kvctl_version: str = ""
    error: str | None = None
    # The kvctl process starting the run, or serving it in the foreground: it writes run.json until it
    # exits, so the folder is not reused or removed while it lives. Never signalled (not in processes()).
    supervisor: ProcessRef | None = None
    # A run on a Ray cluster: {"address": its GCS address, "namespace": "kvctl"}; None for a local run.
    ray: dict[str, str] | None = None
    # Who started its processes: None, kvctl; else the framework that did and recorded its servers so
    # kvctl finds them ("verl": kvctl.integrations.verl). kvctl never signals such a run's processes:
    # stop refuses it, rm only removes its record once it has ended (kvctl.serve.lifecycle).
    owner: str | None = None

    @property
    def external(self) -> bool:
        """Recorded by a framework that started the servers itself (`owner`), not started by kvctl."""
        return self.owner is not None

    @property
    def path(self) -> Path:
        return Path(self.dir)

    def processes(self) -> list[ProcessRef]:
        """Everything this run started, in stop order: replicas first, then the master. None for an
        external run (`owner`): kvctl started nothing of it, so it has nothing to signal."""
        if self.external:
            return []
        refs = [r.process for r in self.replicas if r.process is not None]
        if self.master is not None and self.master.embedded and self.master.process is not None:
            refs.append(self.master.process)
        return refs

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord:
        master = data.get("master")
        return cls(
            **{k: v for k, v in data.items() if k not in ("master", "replicas", "supervisor")},
            supervisor=_ref(data.get("supervisor")),
            master=None if master is None else MasterRecord(
                **{**master, "process": _ref(master.get("process"))}),
            replicas=[ReplicaRecord(**{**r, "process": _ref(r.get("process"))}) for r in data.get("replicas", [])],
        )

    def save(self) -> None:
        """Write run.json atomically (temp file + rename in the same folder)."""
        tmp = self._write_temp()
        try:
            os.replace(tmp, self.path / RUN_FILE)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def create(self) -> None:
        """Write run.json only if there is none: FileExistsError when another start claimed the name first."""
        tmp = self._write_temp()
        try:
            os.link(tmp, self.path / RUN_FILE)  # a complete file or none: link fails if the name exists
        finally:
            tmp.unlink(missing_ok=True)

    def _write_temp(self) -> Path:
        """The record as a complete temp file in the run folder (removed again if writing fails)."""
        # 0700: the run's logs, configs and private dirs are its owner's (logs hold vLLM's command line)
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".run.", suffix=".json", dir=self.path)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(self.to_dict(), fh, indent=2)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return Path(tmp)


def _ref(data: dict[str, Any] | None) -> ProcessRef | None:
    return None if not data else ProcessRef(int(data["pid"]), float(data["start_time"]), str(data["name"]))


def runs_dir(override: str | Path | None = None) -> Path:
    return state_dir(override) / "runs"


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):  # fullmatch: `$` would let a trailing newline through
        raise UsageError(f"run name '{name}' is not usable",
                         "use letters, digits, '.', '_' or '-' (at most 64), starting with a letter or digit")
    return name


def new_name() -> str:
    return time.strftime("run-%Y%m%d-%H%M%S")


def load(name: str, override: str | Path | None = None) -> RunRecord:
    check_name(name)
    record = read(runs_dir(override) / name)
    if record is None:
        known = ", ".join(r.name for r in list_runs(override)) or "none"
        raise UsageError(f"no run named '{name}' in {runs_dir(override)}", f"known runs: {known} (kvctl runs)")
    return record


def read(folder: Path) -> RunRecord | None:
    """The record in a run folder; None when it has none."""
    path = folder / RUN_FILE
    if not path.is_file():
        return None
    try:
        return RunRecord.from_dict(json.loads(path.read_text("utf-8")))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise UsageError(f"{path}: not a kvctl run record ({exc})",
                         f"kvctl rm --force {folder.name} removes that folder") from None


def list_runs(override: str | Path | None = None) -> list[RunRecord]:
    """The readable run records, by name."""
    base = runs_dir(override)
    out = []
    for path in sorted(base.glob(f"*/{RUN_FILE}")) if base.is_dir() else ():
        try:
            record = read(path.parent)
        except UsageError:
            continue
        if record is not None:
            out.append(record)
    return out


def resolve(name: str | None, override: str | Path | None = None) -> RunRecord:
    """The named run, or the only live one when no name is given."""
    if name:
        return load(name, override)
    live = [r for r in list_runs(override) if r.state in LIVE_STATES]
    if len(live) == 1:
        return live[0]
    if not live:
        raise UsageError("no running kvctl run found", "start one with kvctl serve, or pass --run NAME")
    raise UsageError("several runs are live: " + ", ".join(r.name for r in live), "pass --run NAME")


# -- liveness and the listing (kvctl runs) -------------------------------------------------------
def live_processes(record: RunRecord, alive: Callable[[ProcessRef], bool] = is_ours) -> list[ProcessRef]:
    """What of the run still lives: the processes it started (by `alive`: pid AND start time here; a
    Ray run's are asked of its actors) and its supervisor, a kvctl process on this machine. Non-empty
    means live: its folder is neither reused nor removed."""
    live = [ref for ref in record.processes() if alive(ref)]
    if record.supervisor is not None and _supervisor_here(record) and is_ours(record.supervisor):
        live.append(record.supervisor)
    return live


def _supervisor_here(record: RunRecord) -> bool:
    """Whether the supervisor's pid means anything here: always for kvctl's runs (as before); an
    external run's writer (a verl trainer) only on its own host (a shared state dir is read elsewhere)."""
    return not record.external or record.host == socket.gethostname()


def describe(refs: list[ProcessRef]) -> str:
    return ", ".join(f"{ref.name} (pid {ref.pid})" for ref in refs)


@dataclass
class RunSummary:
    """One line of `kvctl runs`."""

    name: str
    state: str  # as recorded, except "exited" (recorded starting/running, nothing alive) and "unreadable"
    dir: str
    recorded_state: str | None = None
    created: float | None = None
    age_s: float | None = None
    model: str | None = None
    template: str | None = None
    cache_prefix: str | None = None
    master: dict[str, Any] | None = None  # embedded, rpc_address, admin_address, alive
    replicas: list[dict[str, Any]] = field(default_factory=list)  # name, url, alive
    live: list[dict[str, Any]] = field(default_factory=list)  # name, pid: what still runs, supervisor included
    previous: list[str] = field(default_factory=list)  # folders of earlier runs under this name
    error: str | None = None
    ray: str | None = None  # a Ray run: the cluster's address
    checked: bool = True  # False: a Ray run listed without asking its cluster (state as recorded)
    owner: str | None = None  # an external run: who started it (RunRecord.owner)

    @property
    def replicas_live(self) -> int:
        return sum(1 for r in self.replicas if r["alive"])  # 0 when not checked (alive None)

    @property
    def age(self) -> str:
        return "?" if self.age_s is None else human_age(self.age_s)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "age": self.age, "replicas_live": self.replicas_live}


@dataclass
class Removed:
    """A run kvctl rm removed."""

    name: str
    dir: str
    state: str  # as listed just before: stopped, failed, exited, unreadable (or running with force)
    stopped: list[tuple[str, str]] = field(default_factory=list)  # with force: what was stopped first

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dir": self.dir, "state": self.state,
                "stopped": [{"process": n, "result": r} for n, r in self.stopped]}


def summarize(record: RunRecord, folder: Path | None, now: float | None = None,
              alive: Callable[[ProcessRef], bool] | None = None) -> RunSummary:
    """The run as `kvctl runs` shows it; its name is its folder's (what --run and rm take), or the
    record's for a Ray run read from its cluster (folder None). A Ray run is checked only when `alive`
    is given (kvctl.serve.ray_fleet.liveness asks the cluster); else its recorded state stands and `checked`
    is False."""
    checked = record.ray is None or alive is not None
    if record.external:  # only its writer's process tells, and only on its host
        checked, alive = _supervisor_here(record), None
    live = live_processes(record, alive or is_ours) if checked else []
    state = record.state
    if state in LIVE_STATES and not live and checked:
        state = "exited"  # crashed, killed outside kvctl, or the machine restarted: nothing to stop
    m = record.master
    return RunSummary(
        name=folder.name if folder else record.name, state=state, dir=str(folder) if folder else record.dir,
        recorded_state=record.state, created=record.created,
        age_s=max(0.0, (time.time() if now is None else now) - record.created), model=record.model,
        template=record.template, cache_prefix=record.cache_prefix,
        master=None if m is None else {"embedded": m.embedded, "rpc_address": m.rpc_address,
                                       "admin_address": m.admin_address,
                                       "alive": m.process in live if m.process is not None and checked else None},
        replicas=[{"name": r.name, "url": r.url,
                   "alive": (r.process is not None and r.process in live) if checked else None}
                  for r in record.replicas],
        live=[{"name": ref.name, "pid": ref.pid} for ref in live],
        previous=[str(p) for p in previous_runs(folder)] if folder else [], error=record.error,
        ray=record.ray["address"] if record.ray else None, checked=checked, owner=record.owner,
    )


def summaries(override: str | Path | None = None, now: float | None = None) -> list[RunSummary]:
    """Every run folder in the state dir, newest first; a folder whose run.json is unreadable too."""
    base = runs_dir(override)
    out = []
    for path in base.glob(f"*/{RUN_FILE}") if base.is_dir() else ():
        try:
            record = read(path.parent)
        except UsageError as exc:
            out.append(RunSummary(path.parent.name, "unreadable", str(path.parent), error=exc.message))
            continue
        if record is not None:
            out.append(summarize(record, path.parent, now))
    return sorted(out, key=lambda s: (-(s.created or 0.0), s.name))


def human_age(seconds: float) -> str:
    """45 -> '45s', 200 -> '3m', 7300 -> '2h', 5 days -> '5d' (whole units, rounded down)."""
    whole = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if whole >= size:
            return f"{whole // size}{unit}"
    return f"{whole}s"


# -- the run folder: reuse and removal ------------------------------------------------------------
@contextmanager
def locked(base: Path) -> Iterator[None]:
    """One claim or removal of a run folder at a time in a state dir (flock on the runs folder)."""
    import fcntl

    base.mkdir(parents=True, exist_ok=True)
    fd = os.open(base, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def run_folder(base: Path, name: str) -> Path:
    """base/NAME, refused when it is a link or not a folder: kvctl moves and removes only inside runs/."""
    path = base / check_name(name)
    if path.is_symlink() or (path.exists() and (not path.is_dir() or path.resolve().parent != base.resolve())):
        raise UsageError(f"{path} is not a run folder (a link or a file)",
                         f"kvctl reuses and removes only folders inside {base}; move that entry away yourself")
    return path


def archive(folder: Path, stamp: str) -> Path | None:
    """Move everything in a run folder except earlier archives into previous/<stamp>/ (renames on one
    filesystem: nothing is copied or lost). None when there was nothing to move."""
    if not folder.is_dir():
        return None
    entries = sorted((p for p in folder.iterdir() if p.name != PREVIOUS), key=lambda p: p.name == RUN_FILE)
    if not entries:
        return None
    target, n = folder / PREVIOUS / stamp, 1
    while target.exists():  # two runs started in the same second, or an interrupted earlier move
        n += 1
        target = folder / PREVIOUS / f"{stamp}-{n}"
    target.mkdir(parents=True)
    for entry in entries:  # run.json last: an interrupted move still leaves the record to finish it
        entry.rename(target / entry.name)
    return target


def previous_runs(folder: Path) -> list[Path]:
    base = folder / PREVIOUS
    return sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []


def remove_folder(path: Path) -> None:
    """Delete a run folder (links inside it are removed, never followed)."""
    shutil.rmtree(path)


def stamp(created: float | None) -> str:
    """The archive name of a run: its start time, like new_name()."""
    return time.strftime("%Y%m%d-%H%M%S", time.localtime(created))
