"""Run records: what `kvctl serve` started, so status, reset and stop can find it later.

A run lives in its own folder (default `<user state dir>/kvctl/runs/NAME`; override with
KVCTL_STATE_DIR or --state-dir) holding run.json, the rendered config bundle and every log.
run.json is rewritten atomically after each change, so a crash mid-start still leaves a record
that `kvctl stop` can act on.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvctl.errors import UsageError
from kvctl.procs import ProcessRef

STATE_DIR_ENV = "KVCTL_STATE_DIR"
RUN_FILE = "run.json"
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


@dataclass
class MasterRecord:
    embedded: bool
    rpc_address: str  # host:port for mooncake.json
    admin_address: str | None  # host:port of the admin/metrics HTTP port
    process: ProcessRef | None = None
    log: str | None = None


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

    @property
    def path(self) -> Path:
        return Path(self.dir)

    def processes(self) -> list[ProcessRef]:
        """Everything this run started, in stop order: replicas first, then the master."""
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
            **{k: v for k, v in data.items() if k not in ("master", "replicas")},
            master=None if master is None else MasterRecord(
                **{**master, "process": _ref(master.get("process"))}),
            replicas=[ReplicaRecord(**{**r, "process": _ref(r.get("process"))}) for r in data.get("replicas", [])],
        )

    def save(self) -> None:
        """Write run.json atomically (temp file + rename in the same folder)."""
        self.path.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".run.", suffix=".json", dir=self.path)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(self.to_dict(), fh, indent=2)
            os.replace(tmp, self.path / RUN_FILE)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _ref(data: dict[str, Any] | None) -> ProcessRef | None:
    return None if not data else ProcessRef(int(data["pid"]), float(data["start_time"]), str(data["name"]))


def state_dir(override: str | Path | None = None) -> Path:
    # absolute: run records hold paths, and replicas run in folders of their own
    if override:
        return Path(override).expanduser().resolve()
    if os.environ.get(STATE_DIR_ENV):
        return Path(os.environ[STATE_DIR_ENV]).expanduser().resolve()
    from platformdirs import user_state_dir

    return Path(user_state_dir("kvctl"))


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
    path = runs_dir(override) / name / RUN_FILE
    if not path.is_file():
        known = ", ".join(r.name for r in list_runs(override)) or "none"
        raise UsageError(f"no run named '{name}' in {runs_dir(override)}", f"known runs: {known} (kvctl status)")
    try:
        return RunRecord.from_dict(json.loads(path.read_text("utf-8")))
    except (ValueError, TypeError, KeyError) as exc:
        raise UsageError(f"{path}: not a kvctl run record ({exc})", "remove that folder if it is left over") from None


def list_runs(override: str | Path | None = None) -> list[RunRecord]:
    base = runs_dir(override)
    if not base.is_dir():
        return []
    out = []
    for path in sorted(base.glob(f"*/{RUN_FILE}")):
        try:
            out.append(RunRecord.from_dict(json.loads(path.read_text("utf-8"))))
        except (ValueError, TypeError, KeyError):
            continue
    return out


def resolve(name: str | None, override: str | Path | None = None) -> RunRecord:
    """The named run, or the only live one when no name is given."""
    if name:
        return load(name, override)
    live = [r for r in list_runs(override) if r.state in ("starting", "running")]
    if len(live) == 1:
        return live[0]
    if not live:
        raise UsageError("no running kvctl run found", "start one with kvctl serve, or pass --run NAME")
    raise UsageError("several runs are live: " + ", ".join(r.name for r in live), "pass --run NAME")
