"""The Mooncake master phase of a reset: count, clear (scoped or whole), retry what the clear
skipped, count again; in an HA group, re-check the leader just before the clear.

Scoped clears go through Mooncake's store client (`remove_by_regex`, the HTTP admin API has none);
whole-master clears through `POST /api/v1/remove_all?force=true`. `removed_count` is never proof:
the keys are counted again after.

Counting at scale (issue 29): a master holding millions of keys answers GET /get_all_keys only after
building all of it (~3.5 s and ~90 MB per million vLLM keys here). So each phase counts once, and as
cheaply as the number it must give allows: totals come from the master's master_key_count gauge (one per
key's metadata, exact, 0.5 ms); a listing is read as a stream (MasterAdmin.key_counts: kvctl's memory
does not grow with it) and only where a number per deployment is needed: after a scoped clear (the
proof), and before one when the master holds few enough keys (EXACT_BEFORE_MAX) for it to be cheap.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from kvctl.facts.cache_prefix import key_pattern, key_prefix
from kvctl.reset.plan import Plan, ResetOptions, ha_group
from kvctl.reset.receipt import MasterReceipt, OpResult
from kvctl.transport.pool import HttpPool

# Up to this many keys on the master (its gauge) the count before a clear lists them, so the receipt
# has this deployment's and the others' exact numbers before. Above it the receipt says "not counted"
# (and, scoped, at least what the clear removed): the listing grows with the keys and costs as much as
# the clear itself (100,000 vLLM keys: 120-340 ms vs a 135-195 ms remove_by_regex; 1,000,000: ~3.5 s vs
# ~3.4 s; benchmarks/scale.json), while under 50,000 it stays well under 0.1 s and runs beside the
# replicas' cache resets.
EXACT_BEFORE_MAX = 50_000


@dataclass(frozen=True)
class Counted:
    """The master's keys at one moment: this deployment's and the others' (None: not counted), and the
    total of its master_key_count gauge (None: it has none). Without a cache_prefix, mine is every key."""

    mine: int | None
    others: int | None
    total: int | None = None


async def recheck_leader(master: MasterReceipt, plan: Plan, http: HttpPool, why: str | None = None) -> bool:
    """Ask the HA group again just before the clear (or after a refused one): leadership may have
    moved since the plan. Waits up to clear_timeout for a leader that serves (an election plus a new
    leader's warm-up took ~10 s on 0.3.13.post1). False, and the receipt says why, when none leads."""
    from kvctl.reset.leader import choose_serving

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


async def count_before(master: MasterReceipt, plan: Plan, http: HttpPool) -> Counted:
    """The count clear_master starts with, on its own: a paused fleet writes no key, so the executor
    runs it beside the replicas' cache resets (both wait on servers) rather than after them."""
    from kvctl.transport.master_admin import MasterAdmin

    async with MasterAdmin(master.address, timeout=plan.options.timeout, pool=http) as admin:
        return await _count_before(admin, key_prefix(plan.cache_prefix), master.tenancy == "on", master.key_pattern)


async def clear_master(master: MasterReceipt, plan: Plan, http: HttpPool, store: Any = None,
                       before: Awaitable[Counted] | None = None, quiet: bool = True) -> None:
    """Clear on the leader. If it refuses (HA: a 503 from a node that stopped leading), find the
    leader again once and, if it moved, clear there. `store`: a store_client.StoreSession opened
    ahead for the planned master (prepare_store_session), used where it fits; `before`: count_before
    of this master, already under way (a new leader is counted anew). `quiet`: no replica writes now
    (see _clear_on)."""
    from kvctl.transport.master_admin import MasterError

    started = time.perf_counter()
    try:
        return await _clear_on(master, plan, http, started, store, before, quiet)
    except MasterError as exc:
        failure = _with_fix(exc)
    if ha_group(plan):
        before = master.address
        if not await recheck_leader(master, plan, http, why=failure):
            return  # the receipt says no master leads
        if master.address != before:
            try:
                return await _clear_on(master, plan, http, started, store, quiet=quiet)
            except MasterError as exc:
                failure = _with_fix(exc)
    master.clear = OpResult("master_clear", "failed", None, round(time.perf_counter() - started, 6), 1, error=failure)
    master.error = failure


async def prepare_store_session(plan: Plan) -> Any:
    """A store client started and connected now, for a scoped clear planned through it (None otherwise,
    or when it cannot start: the clear then starts its own and reports why it fails). Cancelled (a
    signal), the child is killed and nothing waits for it."""
    from kvctl.transport import store_client

    if not (plan.master_clear and plan.master_clear_scope == "scoped" and plan.master_rpc):
        return None
    # waited for in short steps, each in a thread: a signal meanwhile ends the child at once, and no thread is
    # left waiting out the start's timeout (asyncio.run joins its threads before it returns)
    session = store_client.StoreSession(plan.master_rpc, plan.options.clear_timeout + 30, wait=False)
    try:
        while not await asyncio.to_thread(session.ready_within, 0.1):
            pass
    except store_client.StoreClientError:
        return None
    except BaseException:
        session.kill()
        raise
    return session


def deployment_pattern(plan: Plan) -> str | None:
    """The regex of exactly this deployment's keys on the master, in the shape the replicas' vLLM
    releases write (kvctl.facts.cache_prefix.key_pattern): what a scoped clear removes and counts as its
    own. None: no cache_prefix."""
    return key_pattern(plan.cache_prefix, [r.version for r in plan.replicas if r.error is None])


def _with_fix(exc: Any) -> str:
    """A KvctlError's message and its fix, for a receipt that has one error field."""
    return exc.message + (f"; fix: {exc.hint}" if exc.hint else "")


async def _clear_on(master: MasterReceipt, plan: Plan, http: HttpPool, started: float, store: Any = None,
                    before: Awaitable[Counted] | None = None, quiet: bool = True) -> None:
    """Clear this deployment's keys (scoped) or every key (whole) on master.address, count before and
    after, and, when `quiet` (no replica writes: kvctl or their owner paused them all), retry within
    clear_timeout what the clear skipped (puts in flight, replication tasks). On a generating fleet
    the keys counted after are live traffic's, written after the clear: one clear, and the count
    after it is a fact for the reader, not a failure (the canary proves the store there)."""
    from kvctl.transport.master_admin import MasterAdmin

    opts, prefix, scope = plan.options, key_prefix(plan.cache_prefix), plan.master_clear_scope
    master.scope = scope
    async with MasterAdmin(master.address, timeout=opts.timeout, pool=http) as admin:
        counted = await (before or _count_before(admin, prefix, master.tenancy == "on", master.key_pattern))
        master.keys_before, master.others_before = counted.mine, counted.others
        master.total_before = counted.total
        removed, how = await _remove(admin, plan, master.key_pattern, master.rpc_address, store)
        deadline = started + opts.clear_timeout
        mine, others = await _count_after(admin, prefix, scope, master.key_pattern)
        while quiet and mine and time.perf_counter() < deadline:
            await asyncio.sleep(0.5)  # puts in flight finish, replication tasks end
            removed += (await _remove(admin, plan, master.key_pattern, master.rpc_address, store))[0]
            mine, others = await _count_after(admin, prefix, scope, master.key_pattern)
    master.removed_count, master.keys_after, master.others_after = removed, mine, others
    if counted.mine is None:
        _note_not_counted(master, counted, removed)
    if master.leader_changed and master.keys_before == 0 and not master.others_before:
        master.notes.append(f"the new leader {master.address} held no key before the clear: a Mooncake failover "
                            "without snapshots starts empty (Mooncake issue 1871), so the old leader's keys went "
                            "with it; the replicas' local caches were reset as planned")
    if removed == 0 and master.keys_before:
        master.notes.append(f"the master reported 0 keys removed although {master.keys_before} were there "
                            "(remove_all answers 0 for a tenant it does not know): judged by counting again")
    if mine and not quiet:
        master.notes.append(f"{mine} key(s) on the master after the clear: the fleet was generating, so they may "
                            "be live traffic's (written after the clear); judged by the canary, not by this count")
        mine_failed = False
    else:
        mine_failed = bool(mine)
    if mine and quiet:
        master.remaining = (f"{mine} key(s) survived {opts.clear_timeout:g}s of forced clears: Mooncake "
                            "skips keys whose puts are still in flight or that have replication tasks, and the "
                            "keys of a writer that crashed mid-put stay PROCESSING for good (Mooncake issue 974): "
                            "restart the master to drop them, or rerun with a longer --clear-timeout")
    master.clear = OpResult("master_clear", "failed" if mine_failed else "ok", 200,
                            round(time.perf_counter() - started, 6), 1, error=master.remaining, detail=how)


async def _count_before(admin: Any, prefix: str | None, tenants: bool = False, shape: str | None = None) -> Counted:
    """The keys before the clear. First the master_key_count gauge (0.5 ms): without a cache_prefix
    it is the whole count; with one, a listing gives the split, unless the gauge says it would be long
    (over EXACT_BEFORE_MAX keys): then the split is not counted and the receipt says so. `tenants`: the
    master keeps tenants apart, and its gauge counts every tenant's keys: the default tenant's (this
    fleet's, kvctl.reset.tenancy) are listed instead."""
    total = await _gauge(admin)
    if prefix is None and total is not None and not tenants:
        return Counted(total, 0, total)
    if total is not None and total > EXACT_BEFORE_MAX:
        return Counted(None, None, total)
    mine, others = await _listed(admin, prefix, shape)
    return Counted(mine, others, total)


async def _count_after(admin: Any, prefix: str | None, scope: str | None, shape: str | None = None) -> tuple[int, int]:
    """(this deployment's keys, the other keys) after a clear. After a whole-master clear the gauge
    at 0 is the count (no key's metadata is left, so none is listed); anything else is listed."""
    if scope == "whole" and await _gauge(admin) == 0:
        return 0, 0
    return await _listed(admin, prefix, shape)


async def _gauge(admin: Any) -> int | None:
    """The master's master_key_count (None: no usable /metrics on this master)."""
    from kvctl.transport.master_admin import MasterError

    try:
        return int((await admin.metrics()).key_count)
    except MasterError:
        return None


async def _listed(admin: Any, prefix: str | None, shape: str | None = None) -> tuple[int, int]:
    """(this deployment's keys, the other keys) from one streamed listing; without a prefix (all, 0).
    `shape`: the regex this deployment's keys match whole (deployment_pattern); a key that only starts
    with the prefix (another deployment's `rl@eval@...` beside `rl`) is another's."""
    counted = await admin.key_counts(prefix, shape)
    if prefix is None:
        return counted.total, 0
    return counted.matching, counted.total - counted.matching


def _note_not_counted(master: MasterReceipt, counted: Counted, removed: int) -> None:
    """Say what the receipt does not count before a clear on a large master, and what it knows instead."""
    if master.scope == "scoped":
        master.keys_before_min = removed  # what the clear removed was there before it
    held = f"{counted.total} keys" if counted.total is not None else "too many keys"
    master.notes.append(f"the master held {held} before the clear (its master_key_count gauge): this deployment's "
                        f"and the other deployments' keys before it were not counted (listing them costs the master "
                        f"~3.5 s per million keys; kvctl lists at most {EXACT_BEFORE_MAX} before a clear)"
                        + (f"; at least {removed} of this deployment's were there (the clear removed them)"
                           if master.scope == "scoped" else ""))


async def _remove(admin: Any, plan: Plan, pattern: str | None, rpc: str | None,
                  store: Any = None) -> tuple[int, str]:
    """One clear: (what the master says it removed, how). `pattern`: this deployment's keys, whole
    (deployment_pattern); `rpc`: the chosen master's RPC address."""
    from kvctl.transport import store_client
    from kvctl.transport.master_admin import MasterError, NoHttpRemoveAll

    if plan.master_clear_scope == "scoped":
        if pattern is None:  # a scoped plan never falls back to a master-wide clear
            raise MasterError("the clear is scoped to this deployment, but it has no cache_prefix to scope by: "
                              "nothing was cleared", "give the fleet a cache_prefix, or pass --whole-master")
        removed = await _store_client_remove(rpc, pattern, plan.options.clear_timeout, store)
        return removed, f"remove_by_regex('{pattern}', force=True) via {rpc}"
    try:
        return await admin.remove_all(force=True), "POST /api/v1/remove_all?force=true"
    except NoHttpRemoveAll:
        if rpc is None or not store_client.available():
            raise
    # an older master: the store client clears it through the RPC port
    removed = await _store_client_remove(rpc, None, plan.options.clear_timeout, store)
    return removed, f"remove_all(force=True) via {rpc} (no HTTP remove_all on this master)"


async def _store_client_remove(rpc: str | None, pattern: str | None, clear_timeout: float, store: Any = None) -> int:
    """Mooncake's store client (a child process: `store` when it is open for `rpc`) removes `pattern`'s
    keys (None: all), forced."""
    from kvctl.transport import store_client
    from kvctl.transport.master_admin import MasterError

    try:
        done = await asyncio.to_thread(store_client.remove_matching, rpc, pattern, clear_timeout + 30, store)
    except store_client.StoreClientError as exc:
        raise MasterError(exc.message, exc.hint) from None
    return done.removed


async def count_master_keys(master: MasterReceipt, opts: ResetOptions, http: HttpPool, quiet: bool = True) -> None:
    """--verify: this deployment's keys left on the master must be 0. A clear that just ran ends
    by counting them (after its retries); its count is used rather than listing every key again.
    Not `quiet` (some replica generates): the count is taken and noted, but proves nothing either
    way (verified stays None): live traffic writes new keys, and the canary judges the store."""
    from kvctl.transport.master_admin import MasterAdmin, MasterError

    mine = master.keys_after
    if mine is None:
        async with MasterAdmin(master.address, timeout=opts.timeout, pool=http) as admin:
            try:
                mine, others = await _listed(admin, key_prefix(master.cache_prefix), master.key_pattern)
            except MasterError as exc:
                master.error = master.error or exc.message
                master.verified = False
                return
        master.keys_after = mine
        if master.cache_prefix:
            master.others_after = others
    if not quiet:
        master.verified = None
        if mine:
            note = (f"{mine} key(s) on the master after the reset: the fleet was generating, so they may be live "
                    "traffic's; the canary judges the store instead of this count")
            if note not in master.notes and not any("judged by the canary" in n for n in master.notes):
                master.notes.append(note)
        return
    if mine == 0:
        master.verified = await _confirm_empty(master, opts, http)
        return
    master.verified = False
    scope = f"under prefix '{master.cache_prefix}'" if master.cache_prefix else "in total"
    master.error = master.error or (f"{mine} key(s) remain on the master {scope} after the reset"
                                    + ("" if opts.pausing else " (traffic during the reset writes new ones: use --pause)"))


async def _confirm_empty(master: MasterReceipt, opts: ResetOptions, http: HttpPool) -> bool:
    """An empty key list is proof only from a Mooncake master: a server answering an empty 200 to
    everything lists no key either. The master's own master_key_count gauge (/metrics; in-flight puts
    counted as /get_all_keys lists them) must exist, and, unscoped, be 0 too."""
    from kvctl.transport.master_admin import MasterAdmin, MasterError

    async with MasterAdmin(master.address, timeout=opts.timeout, pool=http) as admin:
        try:
            gauge = (await admin.metrics()).key_count
        except MasterError as exc:
            master.error = master.error or (
                f"the master lists no key, but {exc.message}: an empty answer from a server that is not a "
                "Mooncake master's admin port proves nothing (check --master: the admin/metrics port, e.g. :9003)")
            return False
    if not master.cache_prefix and master.tenancy == "on":
        return await _default_tenant_empty(master, opts, http)
    if not master.cache_prefix and gauge > 0:
        master.error = master.error or (f"the master lists no key, yet its master_key_count gauge counts {gauge}: "
                                        "not verified (keys in flight? rerun the reset with --pause)")
        return False
    return True


async def _default_tenant_empty(master: MasterReceipt, opts: ResetOptions, http: HttpPool) -> bool:
    """On a master that keeps tenants apart the gauge counts every tenant's keys: the default tenant's own
    charged bytes (GET /api/v1/tenant_quotas) must be 0 instead, as its listing said."""
    from kvctl.transport.master_admin import MasterAdmin, MasterError

    async with MasterAdmin(master.address, timeout=opts.timeout, pool=http) as admin:
        try:
            tenancy = await admin.tenancy()
        except MasterError as exc:
            master.error = master.error or f"the master lists no key of the default tenant, but {exc.message}"
            return False
    if tenancy.mode == "on" and not (tenancy.charged_bytes or {}).get("default"):
        return True
    held = (f"that tenant is charged {tenancy.charged_bytes['default']} bytes" if tenancy.mode == "on"
            else f"its tenants could not be read ({tenancy.detail})")
    master.error = master.error or (f"the master lists no key of the default tenant, yet {held}: not verified "
                                    "(keys in flight? rerun the reset with --pause)")
    return False
