"""The Mooncake master phase of a reset: count, clear (scoped or whole), retry what the clear
skipped, count again; in an HA group, re-check the leader just before the clear.

Scoped clears go through Mooncake's store client (`remove_by_regex`, the HTTP admin API has none);
whole-master clears through `POST /api/v1/remove_all?force=true`. `removed_count` is never proof:
the keys are counted again after.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable
from typing import Any

from kvctl.facts.cache_prefix import key_prefix
from kvctl.reset.plan import Plan, ResetOptions, ha_group
from kvctl.reset.receipt import MasterReceipt, OpResult
from kvctl.transport.pool import HttpPool


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


async def count_before(master: MasterReceipt, plan: Plan, http: HttpPool) -> tuple[int, int]:
    """The count clear_master starts with, on its own: a paused fleet writes no key, so the executor
    runs it beside the replicas' cache resets (both wait on servers) rather than after them."""
    from kvctl.transport.master_admin import MasterAdmin

    async with MasterAdmin(master.address, timeout=plan.options.timeout, pool=http) as admin:
        return await _count_before(admin, key_prefix(plan.cache_prefix))


async def clear_master(master: MasterReceipt, plan: Plan, http: HttpPool, store: Any = None,
                       before: Awaitable[tuple[int, int]] | None = None) -> None:
    """Clear on the leader. If it refuses (HA: a 503 from a node that stopped leading), find the
    leader again once and, if it moved, clear there. `store`: a store_client.StoreSession opened
    ahead for the planned master (prepare_store_session), used where it fits; `before`: count_before
    of this master, already under way (a new leader is counted anew)."""
    from kvctl.transport.master_admin import MasterError

    started = time.perf_counter()
    try:
        return await _clear_on(master, plan, http, started, store, before)
    except MasterError as exc:
        failure = _with_fix(exc)
    if ha_group(plan):
        before = master.address
        if not await recheck_leader(master, plan, http, why=failure):
            return  # the receipt says no master leads
        if master.address != before:
            try:
                return await _clear_on(master, plan, http, started, store)
            except MasterError as exc:
                failure = _with_fix(exc)
    master.clear = OpResult("master_clear", "failed", None, round(time.perf_counter() - started, 6), 1, error=failure)
    master.error = failure


async def prepare_store_session(plan: Plan) -> Any:
    """A store client started and connected now, for a scoped clear planned through it (None otherwise,
    or when it cannot start: the clear then starts its own and reports why it fails)."""
    from kvctl.transport import store_client

    if not (plan.master_clear and plan.master_clear_scope == "scoped" and plan.master_rpc):
        return None
    try:
        return await asyncio.to_thread(store_client.StoreSession, plan.master_rpc, plan.options.clear_timeout + 30)
    except store_client.StoreClientError:
        return None


def _with_fix(exc: Any) -> str:
    """A KvctlError's message and its fix, for a receipt that has one error field."""
    return exc.message + (f"; fix: {exc.hint}" if exc.hint else "")


async def _clear_on(master: MasterReceipt, plan: Plan, http: HttpPool, started: float, store: Any = None,
                    before: Awaitable[tuple[int, int]] | None = None) -> None:
    """Clear this deployment's keys (scoped) or every key (whole) on master.address, count before and
    after, and retry within clear_timeout what the clear skipped (puts in flight, replication tasks)."""
    from kvctl.transport.master_admin import MasterAdmin

    opts, prefix = plan.options, key_prefix(plan.cache_prefix)
    master.scope = plan.master_clear_scope
    async with MasterAdmin(master.address, timeout=opts.timeout, pool=http) as admin:
        master.keys_before, master.others_before = await (before or _count_before(admin, prefix))
        removed, how = await _remove(admin, plan, prefix, master.rpc_address, store)
        deadline = started + opts.clear_timeout
        mine, others = _split(await admin.all_keys(), prefix)
        while mine and time.perf_counter() < deadline:
            await asyncio.sleep(0.5)  # puts in flight finish, replication tasks end
            removed += (await _remove(admin, plan, prefix, master.rpc_address, store))[0]
            mine, others = _split(await admin.all_keys(), prefix)
    master.removed_count, master.keys_after, master.others_after = removed, mine, others
    if master.leader_changed and master.keys_before == 0 and not master.others_before:
        master.notes.append(f"the new leader {master.address} held no key before the clear: a Mooncake failover "
                            "without snapshots starts empty (Mooncake issue 1871), so the old leader's keys went "
                            "with it; the replicas' local caches were reset as planned")
    if removed == 0 and master.keys_before:
        master.notes.append(f"the master reported 0 keys removed although {master.keys_before} were there "
                            "(remove_all answers 0 for a tenant it does not know): judged by counting again")
    if mine:
        master.remaining = (f"{mine} key(s) survived {opts.clear_timeout:g}s of forced clears: Mooncake "
                            "skips keys whose puts are still in flight or that have replication tasks, and the "
                            "keys of a writer that crashed mid-put stay PROCESSING for good (Mooncake issue 974): "
                            "restart the master to drop them, or rerun with a longer --clear-timeout")
    master.clear = OpResult("master_clear", "ok" if not mine else "failed", 200,
                            round(time.perf_counter() - started, 6), 1, error=master.remaining, detail=how)


async def _count_before(admin: Any, prefix: str | None) -> tuple[int, int]:
    """(this deployment's keys, the other keys) before the clear. A whole-master clear needs only the
    total: the master_key_count gauge (one per object's metadata, in-flight puts included, as
    /get_all_keys lists them; 0.5 ms) rather than the list (100,000 keys: ~45 ms for the master to
    write and ~15 ms to read). The count after the clear always lists the keys."""
    from kvctl.transport.master_admin import MasterError

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


async def _remove(admin: Any, plan: Plan, prefix: str | None, rpc: str | None,
                  store: Any = None) -> tuple[int, str]:
    """One clear: (what the master says it removed, how). `rpc`: the chosen master's RPC address."""
    from kvctl.transport import store_client
    from kvctl.transport.master_admin import MasterError, NoHttpRemoveAll

    if plan.master_clear_scope == "scoped":
        if prefix is None:  # a scoped plan never falls back to a master-wide clear
            raise MasterError("the clear is scoped to this deployment, but it has no cache_prefix to scope by: "
                              "nothing was cleared", "give the fleet a cache_prefix, or pass --whole-master")
        pattern = "^" + re.escape(prefix)
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


async def count_master_keys(master: MasterReceipt, opts: ResetOptions, http: HttpPool) -> None:
    """--verify: this deployment's keys left on the master must be 0. A clear that just ran ends
    by counting them (after its retries); its count is used rather than listing every key again."""
    from kvctl.transport.master_admin import MasterAdmin, MasterError

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
    if not master.cache_prefix and gauge > 0:
        master.error = master.error or (f"the master lists no key, yet its master_key_count gauge counts {gauge}: "
                                        "not verified (keys in flight? rerun the reset with --pause)")
        return False
    return True
