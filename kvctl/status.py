"""A fleet's live state: each replica's health, version, model and prefix-cache hit rates, the
Mooncake master's key count and memory, and (for a run started by `kvctl serve`) whether the
recorded processes are still alive.

Read-only: every call is a GET, but for /weight_checker (a POST that changes nothing) when weight
checksums are asked for. All replicas and the master are asked at once over one shared kvctl
HttpPool; a replica that is down, dead or slow is reported in its own row, never raised. Replicas of
one fleet that share its master's cache namespace but serve different weights are flagged: their KV
mixes in one store.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from kvctl.targets import Replica
from kvctl.transport.http import HttpPool
from kvctl.transport.pool import max_concurrency, shared_pool

if TYPE_CHECKING:
    from collections.abc import Callable

    from kvctl.serve.procs import ProcessRef
    from kvctl.serve.runs import RunRecord

DEFAULT_TIMEOUT = 5.0


# -- results ------------------------------------------------------------------------------------
@dataclass
class ReplicaStatus:
    name: str
    url: str
    healthy: bool  # GET /health answered 200
    health: str  # "ok" | "engine dead" (503) | "down" (no HTTP answer) | "HTTP <code>"
    http_status: int | None  # of GET /health; None when nothing answered
    version: str | None = None
    models: list[str] = field(default_factory=list)
    block_size: int | None = None
    local_hit_rate: float | None = None  # hits / queries; None before the first query
    external_hit_rate: float | None = None
    counters: dict[str, float | None] | None = None  # cumulative prefix-cache token counters
    latency_s: float | None = None  # of GET /health
    error: str | None = None  # everything that went wrong, "; "-joined
    weight_version: str | None = None  # GET /weight_info (vLLM 0.27+, dev mode); None: see weight_note
    weight_digest: str | None = None  # of /weight_checker's checksums (0.32+), when asked for
    weight_note: str | None = None  # why the version (or the digest asked for) is not known
    weight_disagreeing: int = 0  # shards whose dp/pcp copies differ inside this replica


@dataclass
class MasterStatus:
    address: str  # host:port of the admin/metrics HTTP port
    reachable: bool  # GET /health answered ok and ready
    key_count: int | None = None
    allocated_bytes: int | None = None
    total_capacity_bytes: int | None = None
    active_clients: int | None = None
    error: str | None = None


@dataclass
class ProcessStatus:
    name: str
    pid: int
    alive: bool  # the very process the run started (pid AND start time match)
    node: str | None = None  # a Ray run: the IP of the node it runs on


@dataclass
class RunStatus:
    name: str
    state: str  # as recorded: starting | running | stopped | failed
    dir: str
    model: str
    template: str
    created: float
    cache_prefix: str | None
    processes: list[ProcessStatus]
    error: str | None = None  # the record's own error (why a start failed)
    ray: str | None = None  # a Ray run: the cluster's address (its processes run on its nodes)

    @property
    def alive(self) -> int:
        return sum(1 for p in self.processes if p.alive)


@dataclass
class FleetStatus:
    replicas: list[ReplicaStatus]
    master: MasterStatus | None = None  # of an HA group: the leader (the one that serves), else the first
    run: RunStatus | None = None
    elapsed_s: float = 0.0
    masters: list[MasterStatus] = field(default_factory=list)  # every master of the fleet, in order
    weights_mixed: list[str] = field(default_factory=list)  # each problem that vllm_weights.mixed_weights found
    # The replicas' own sleep / default pause / connector reset wipe every deployment on the master this fleet
    # shares (kvctl.facts.shared_master): what to say and what isolates; None when it does not apply. A fact
    # about the deployment, not a failure: ok and the exit code ignore it.
    shared_master: dict[str, str] | None = None

    @property
    def healthy(self) -> int:
        return sum(1 for r in self.replicas if r.healthy)

    @property
    def ok(self) -> bool:
        """Every replica healthy, the master reachable when one is targeted, and no mixed weights."""
        return self.healthy == len(self.replicas) and (self.master is None or self.master.reachable) \
            and not self.weights_mixed

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    @property
    def summary(self) -> str:
        parts = [f"{self.healthy}/{len(self.replicas)} replica(s) healthy"]
        if self.master is not None:
            parts.append("master reachable" if self.master.reachable else "master NOT reachable")
        if self.run is not None and self.run.processes:
            parts.append(f"{self.run.alive}/{len(self.run.processes)} recorded process(es) alive")
        if self.weights_mixed:
            parts.append("MIXED WEIGHTS: " + "; ".join(self.weights_mixed))
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "exit_code": self.exit_code,
            "summary": self.summary,
            "elapsed_s": round(self.elapsed_s, 4),
            "run": None if self.run is None else {**asdict(self.run), "alive": self.run.alive},
            "replicas": [asdict(r) for r in self.replicas],
            "master": None if self.master is None else asdict(self.master),
            "masters": [asdict(m) for m in self.masters],
            "weights_mixed": list(self.weights_mixed),
            "shared_master": self.shared_master,
        }


# -- the status ---------------------------------------------------------------------------------
STATUS_CONCURRENCY = 256  # replicas asked at once (as kvctl reset's default)


async def fleet_status(replicas: list[Replica], masters: tuple[str, ...] | str | None, timeout: float = DEFAULT_TIMEOUT,
                       *, run: RunRecord | None = None, http: HttpPool | None = None,
                       cache_prefix: str | None = None, checksums: bool = False,
                       state_dir: str | None = None, tenant_id: str | None = None) -> FleetStatus:
    """Ask every replica (and every master: one, or an HA group) at once; failures land in each
    row's `error`. In an HA group only the leader serves (a standby's /health says not ready), so
    the fleet's `master` is the first master that serves, else the first. `checksums`: also ask each
    replica for its weight checksums (vLLM hashes every weight for it: seconds on a large model)."""
    start = time.perf_counter()
    group = (masters,) if isinstance(masters, str) else tuple(masters or ())
    hosts = len(replicas) + len(group)
    sem = asyncio.Semaphore(max_concurrency(hosts, STATUS_CONCURRENCY))

    async def bounded(job: Any) -> Any:
        async with sem:
            return await job

    async with shared_pool(http, hosts) as client:
        jobs: list[Any] = [bounded(replica_status(r, timeout, client, checksums)) for r in replicas]
        jobs += [bounded(master_status(m, timeout, client)) for m in group]
        results = await asyncio.gather(*jobs)
    rows: list[MasterStatus] = list(results[len(replicas):])
    leader = next((m for m in rows if m.reachable), rows[0] if rows else None)
    status = FleetStatus(replicas=list(results[:len(replicas)]), master=leader, masters=rows)
    status.weights_mixed = _mixed(status.replicas, cache_prefix, bool(group))
    if run is not None:
        from kvctl.serve.lifecycle import liveness

        alive = liveness(run)  # pid and start time here; a Ray run's actors answer for theirs
        status.run = run_status(run, alive)
        _flag_strangers(status, run, alive)
    if status.master is not None:
        status.shared_master = shared_master(status.replicas, status.master.address, cache_prefix, run, state_dir)
        if status.shared_master and tenant_id not in (None, "default") and status.master.reachable \
                and await _own_tenant(status.master.address, timeout, http):
            status.shared_master = None  # vLLM's wipe is a remove_all of its own tenant's keys only
    status.elapsed_s = time.perf_counter() - start
    return status


def _mixed(rows: list[ReplicaStatus], cache_prefix: str | None, has_master: bool) -> list[str]:
    """Status reads no /server_info (slow, dev mode): a fleet with a master is taken to share its
    namespace, as kvctl reset takes it (kvctl weights show reads each replica's connector)."""
    from kvctl.transport.vllm_weights import WeightRow, mixed_weights, namespace_of

    space = namespace_of(None, None, cache_prefix, has_master)
    return [m.problem for m in mixed_weights(WeightRow(r.name, space, r.weight_version, r.weight_digest,
                                                       r.weight_disagreeing) for r in rows)]


def shared_master(rows: list[ReplicaStatus], master: str, cache_prefix: str | None, run: RunRecord | None,
                  state_dir: str | None = None) -> dict[str, str] | None:
    """Do these replicas' own calls wipe other deployments on `master`? Status reads no /server_info, so a
    fleet with a master is taken to run MooncakeStoreConnector (as _mixed takes it). It applies where the
    master is shared or meant to be: another live run here records it, or the fleet scopes its keys
    (a cache_prefix) on a master that is not its own run's embedded one."""
    from kvctl.facts.shared_master import STORE_CONNECTOR, isolation, master_wipe

    wiping = [(r, w) for r in rows if r.version and (w := master_wipe(r.version, [STORE_CONNECTOR]))]
    if not wiping:
        return None
    others = _other_runs_on(master, run, state_dir)
    own_embedded = run is not None and run.master is not None and run.master.embedded
    if not others and not (cache_prefix and not own_embedded):
        return None
    names = ", ".join(r.name for r, _ in wiping)
    why = (f"live run(s) {', '.join(others)} use this master too" if others else
           f"the fleet scopes its keys by cache_prefix '{cache_prefix}' on a master it does not own")
    wipe = wiping[0][1]
    return {"replicas": names, "calls": wipe.call_names, "since": wipe.since, "why": why,
            "message": f"{wipe.message(f'{names} (vLLM {wipe.version}, taken as {STORE_CONNECTOR})')}; {why}",
            "isolation": isolation(wipe.version)}


async def _own_tenant(master: str, timeout: float, http: HttpPool | None) -> bool:
    """Does `master` keep tenants apart (GET /api/v1/tenant_quotas)? Then a fleet in its own tenant (vLLM
    >= 0.28 sets its store client up with mooncake.json's tenant_id) wipes only that tenant's keys: measured
    on 0.3.13.post1, a tenant's client's remove_all(force=True) left the other tenant's keys."""
    from kvctl.transport.master_admin import MasterAdmin, MasterError

    async with shared_pool(http, 1) as pool, MasterAdmin(master, timeout=timeout, pool=pool) as admin:
        try:
            return (await admin.tenancy()).mode == "on"
        except MasterError:
            return False


def _other_runs_on(master: str, run: RunRecord | None, state_dir: str | None) -> list[str]:
    """Live runs on this machine, other than `run`, that record `master` (its admin address)."""
    from kvctl.serve.master_flags import recorded_masters

    mine = run.name if run is not None else None
    return [r.name for r in recorded_masters(state_dir)
            if r.name != mine and r.master is not None and r.master.admin_address == master]


def _flag_strangers(status: FleetStatus, run: RunRecord, is_ours: Callable[[ProcessRef], bool]) -> None:
    """A run's replica (or master) whose process is gone, yet something answers on its port, is not
    healthy: that answer comes from another server that took the port (kvctl checks pid + start time)."""
    records = {r.name: r for r in run.replicas}
    for row in status.replicas:
        ref = records[row.name].process if row.name in records else None
        if ref is not None and row.http_status is not None and not is_ours(ref):
            row.healthy = False
            row.health = "not ours"
            row.error = "; ".join(filter(None, [
                f"the replica process this run started (pid {ref.pid}) is gone, yet {row.url} answers: "
                "another server holds the port (restart the run: kvctl stop, then kvctl serve)", row.error]))
    master, recorded = status.master, run.master
    ref = recorded.process if recorded is not None and master is not None \
        and master.address == recorded.admin_address else None  # not a --master given instead
    if master is not None and master.reachable and ref is not None and not is_ours(ref):
        master.reachable = False
        master.error = (f"the master process this run started (pid {ref.pid}) is gone, yet {master.address} "
                        "answers: another master holds the port")


async def replica_status(replica: Replica, timeout: float, http: HttpPool, checksums: bool = False) -> ReplicaStatus:
    """One replica: /health first; if anything answered, /version, /v1/models, /metrics and its weights,
    one after the other on one connection (a fleet of thousands then needs one connection per replica)."""
    from kvctl.transport.vllm_client import VllmClient

    client = VllmClient(replica.url, timeout=timeout, retries=0, api_key=replica.api_key(), pool=http)
    health = await client.health()
    row = ReplicaStatus(replica.name, replica.url, healthy=health.status == 200,
                        health=_health_word(health.status), http_status=health.status,
                        latency_s=round(health.latency_s, 4))
    if health.status is None:  # refused or timed out: nothing else will answer
        row.error = f"GET /health: {health.error}"
        return row
    errors = [] if row.healthy else [f"GET /health: {health.error or f'HTTP {health.status}'}"]
    version = await _attempt(client.version())
    models = await _attempt(client.models())
    metrics = await _attempt(client.metrics())
    if isinstance(version, Exception):
        errors.append(f"version: {_message(version)}")
    else:
        row.version = str(version)
        await _read_weights(row, client, version, checksums)
    if isinstance(models, Exception):
        errors.append(f"models: {_message(models)}")
    else:
        row.models = list(models)
    if isinstance(metrics, Exception):
        errors.append(f"metrics: {_message(metrics)}")
    else:
        c = metrics.counters
        row.block_size = metrics.block_size
        row.counters = asdict(c)
        row.local_hit_rate = hit_rate(c.local_hits, c.local_queries)
        row.external_hit_rate = hit_rate(c.external_hits, c.external_queries)
    row.error = "; ".join(errors) or None
    return row


async def _read_weights(row: ReplicaStatus, client: Any, version: Any, checksums: bool) -> None:
    from kvctl.transport.vllm_weights import read_weight_state

    state = await read_weight_state(client, version, checksums=checksums)
    row.weight_version, row.weight_digest = state.version, state.digest
    row.weight_disagreeing, row.weight_note = len(state.disagreeing), state.note


async def master_status(address: str, timeout: float, http: HttpPool) -> MasterStatus:
    """The master's /health and /metrics, asked at once."""
    from kvctl.transport.master_admin import MasterAdmin

    admin = MasterAdmin(address, timeout=timeout, pool=http)
    row = MasterStatus(address=address, reachable=False)
    health, metrics = await asyncio.gather(_attempt(admin.health()), _attempt(admin.metrics()))
    prefix = f"Mooncake master at {admin.base_url}: "
    errors: list[str] = []
    if isinstance(health, Exception):
        errors.append(_message(health).removeprefix(prefix))
    else:
        row.reachable = True
    if isinstance(metrics, Exception):
        message = _message(metrics).removeprefix(prefix)
        # a dead master fails both routes the same way: say it once
        if not errors or _cause(message) != _cause(errors[0]):
            errors.append(message)
    else:
        row.key_count = metrics.key_count
        row.allocated_bytes = metrics.allocated_bytes
        row.total_capacity_bytes = metrics.total_capacity_bytes
        row.active_clients = metrics.active_clients
    row.error = "; ".join(errors) or None
    return row


def run_status(record: RunRecord, is_ours: Callable[[ProcessRef], bool] | None = None) -> RunStatus:
    """The run as recorded, and which of its processes are still the ones it started (`is_ours`:
    kvctl.serve.lifecycle.liveness of the run)."""
    if is_ours is None:
        from kvctl.serve.lifecycle import liveness

        is_ours = liveness(record)
    return RunStatus(
        name=record.name, state=record.state, dir=record.dir, model=record.model, template=record.template,
        created=record.created, cache_prefix=record.cache_prefix, error=record.error,
        processes=[ProcessStatus(ref.name, ref.pid, is_ours(ref), (node or {}).get("ip"))
                   for ref, node in _processes_and_nodes(record)],
        ray=record.ray["address"] if record.ray else None,
    )


def _processes_and_nodes(record: RunRecord) -> list[tuple[ProcessRef, dict[str, str] | None]]:
    out = [(r.process, r.node) for r in record.replicas if r.process is not None]
    m = record.master
    if m is not None and m.embedded and m.process is not None:
        out.append((m.process, m.node))
    return out


def hit_rate(hits: float | None, queries: float | None) -> float | None:
    """hits / queries, or None when the counter is missing or nothing was queried yet."""
    if hits is None or not queries:
        return None
    return hits / queries


def _cause(message: str) -> str:
    """'GET /metrics: ConnectError: ...' -> 'ConnectError: ...' (the part after the route)."""
    return message.split(": ", 1)[-1]


def _health_word(status: int | None) -> str:
    if status is None:
        return "down"
    if status == 200:
        return "ok"
    if status == 503:
        return "engine dead"
    return f"HTTP {status}"


async def _attempt(coro: Any) -> Any:
    """The coroutine's result, or the exception it raised (one bad route must not hide the rest)."""
    try:
        return await coro
    except Exception as exc:  # noqa: BLE001 - reported per replica, never raised
        return exc


def _message(exc: BaseException) -> str:
    from kvctl.errors import KvctlError

    if isinstance(exc, KvctlError):
        return exc.message
    return f"{type(exc).__name__}: {exc}"


__all__ = ["FleetStatus", "MasterStatus", "ProcessStatus", "ReplicaStatus", "RunStatus",
           "fleet_status", "hit_rate", "master_status", "replica_status", "run_status"]
