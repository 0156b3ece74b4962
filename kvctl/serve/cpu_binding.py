"""How vLLM CPU replicas that share one machine share its cores.

vLLM's CPU worker binds its OpenMP threads (VLLM_CPU_OMP_THREADS_BIND=auto): every replica takes the
same cores, and its main thread, with every thread it creates afterwards (all of Mooncake's:
heartbeat, handshake listener, TCP transport), is pinned to the first of them. Two replicas on one
machine then pile all their Mooncake threads onto one core, where a thread of one replica that
spins (vLLM's busy loop after a step, or a transfer waiting for its peer) starves the other
replica's runnable threads for tens of seconds (each replica is its own session, so its own
scheduler autogroup). Measured on 2 cores (docs/evidence.md): missed heartbeats make the master
drop a replica's segment and every key in it (client_ttl 10 s), handshakes time out after 60 s,
TCP transfers after 30 s, and requests fail with HTTP 500.

So kvctl gives each CPU replica its own cores, among the cores no other vLLM CPU worker on this
machine is bound to (whoever started it), and turns binding off when there are not enough. A
VLLM_CPU_OMP_THREADS_BIND the user set wins.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
NOBIND = "nobind"


@dataclass(frozen=True)
class CpuPlan:
    binds: list[str | None]  # VLLM_CPU_OMP_THREADS_BIND per replica; None = leave the environment as it is
    reason: str

    @property
    def changed(self) -> bool:
        return any(b is not None for b in self.binds)


def allowed_cpus() -> list[int]:
    """The CPUs this process may run on (respects taskset/cgroup cpusets)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def plan(replicas: int, env: Mapping[str, str], cpus: Sequence[int] | None = None,
         taken: set[int] | None = None) -> CpuPlan:
    """Per-replica binding for `replicas` new CPU replicas; `taken`: cores other vLLM workers are bound to
    (default: looked up on this machine)."""
    if env.get(BIND_ENV):
        return CpuPlan([None] * replicas, f"{BIND_ENV}={env[BIND_ENV]} set by you: kept for every replica")
    cpus = list(cpus) if cpus is not None else allowed_cpus()
    taken = taken if taken is not None else bound_by_other_workers(cpus)
    free = [c for c in cpus if c not in taken]
    others = f", {len(cpus) - len(free)} bound by other vLLM workers" if taken else ""
    if replicas == 1 and not taken:
        return CpuPlan([None], "one replica alone on this machine: vLLM's own binding")
    per = len(free) // replicas
    if per < 1:
        return CpuPlan([NOBIND] * replicas, f"{replicas} replica(s), {len(cpus)} CPU(s){others}: no binding "
                                            "(the kernel places every thread)")
    binds: list[str | None] = [id_list(free[i * per:(i + 1) * per]) for i in range(replicas)]
    return CpuPlan(binds, f"{replicas} replica(s), {len(cpus)} CPU(s){others}: {per} core(s) each, none shared")


def bound_by_other_workers(cpus: Sequence[int]) -> set[int]:
    """Cores that threads of running vLLM processes are pinned to."""
    taken: set[int] = set()
    for cores in pinned_vllm_processes(cpus).values():
        taken |= cores
    return taken


def pinned_vllm_processes(cpus: Sequence[int] | None = None) -> dict[int, set[int]]:
    """pid -> the cores its threads are pinned to, for running vLLM processes (`VLLM::Worker`,
    `VLLM::EngineCore`) that pin any thread to less than all of `cpus`."""
    import psutil

    everything = set(cpus if cpus is not None else allowed_cpus())
    found: dict[int, set[int]] = {}
    for proc in psutil.process_iter(["name"]):
        if not (proc.info.get("name") or "").startswith("VLLM::"):
            continue
        try:
            tids = [t.id for t in proc.threads()]
        except psutil.Error:
            continue
        cores: set[int] = set()
        for tid in tids:
            try:
                affinity = os.sched_getaffinity(tid)
            except OSError:  # the thread ended
                continue
            if affinity and set(affinity) < everything:
                cores |= affinity
        if cores & everything:
            found[proc.pid] = cores & everything
    return found


def shared_cores(pinned: Mapping[int, set[int]]) -> list[tuple[int, int, set[int]]]:
    """Pairs of processes pinned to some of the same cores: (pid, pid, cores)."""
    pids = sorted(pinned)
    return [(p, q, pinned[p] & pinned[q]) for i, p in enumerate(pids) for q in pids[i + 1:]
            if pinned[p] & pinned[q]]


def id_list(ids: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5' (the syntax VLLM_CPU_OMP_THREADS_BIND takes)."""
    parts: list[str] = []
    start = prev = None
    for i in sorted(ids):
        if prev is not None and i == prev + 1:
            prev = i
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = i
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(parts)


def parse_ids(text: str) -> set[int]:
    """'0-2,5' -> {0, 1, 2, 5}; 'nobind' or '' -> set()."""
    ids: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part or not part[0].isdigit():
            continue
        lo, _, hi = part.partition("-")
        ids.update(range(int(lo), int(hi or lo) + 1))
    return ids
