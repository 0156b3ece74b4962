"""A reset that would clear the WHOLE Mooncake master although nobody asked for it (issue 39 finding 11).

A fleet without a cache_prefix has no keys kvctl can tell apart: its connector reset (vLLM's
MooncakeStoreConnector from 0.23.0: `reset_external=true` is a master-wide `remove_all(force=True)`) or
kvctl's own clear where vLLM cannot clear (a whole-master `remove_all`) wipes every deployment sharing the
master. What kvctl does before it pauses anything:

- the master is private: the embedded master of the `kvctl serve` run the fleet comes from, or a master
  that holds no key, or only keys in the shape of this fleet's unprefixed keys
  (`<model>[<store_namespace>]@tp_rank:...@<hex>`, the model being each replica's /v1/models root):
  the reset goes ahead, the plan says why, and the receipt says `scope: whole`;
- otherwise (another deployment's keys there, or kvctl cannot tell: no master known, a listing too large
  to read before the pause) it is refused, with the two ways on: a cache_prefix, or `--whole-master`.

`--whole-master` (whole_master=True) is the operator's consent: nothing is checked then.
"""

from __future__ import annotations

import re
from typing import Any

from kvctl.facts.cache_prefix import unprefixed_key_pattern
from kvctl.facts.capabilities import table
from kvctl.transport.pool import HttpPool

Plan = Any  # kvctl.reset.plan.Plan: not imported, plan.py imports this
ReplicaPlan = Any

LIST_AT_MOST = 50_000  # as kvctl.reset.master.EXACT_BEFORE_MAX: a listing this long costs well under 0.1 s


def master_wide(plan: Plan) -> str | None:
    """How this reset clears every key of the master (None: it does not)."""
    opts = plan.options
    if plan.error or not opts.connector or opts.check_only or (plan.cache_prefix and not opts.whole_master):
        return None
    live = [r for r in plan.replicas if r.error is None]
    wide = [r for r in live if r.store_cleared_by_vllm and _sends_reset_external(r)
            and any(table().connector_reset_is_master_wide(r.version or "0", n) for n in (r.layout or []))]
    if wide:
        return (f"vLLM's own connector reset on {', '.join(r.name for r in wide)} (reset_external=true: "
                "MooncakeStoreConnector's reset_cache is a master-wide remove_all)")
    if plan.master_clear and plan.master_clear_scope == "whole":
        return "kvctl's clear of the store (POST /api/v1/remove_all?force=true: the fleet has no cache_prefix)"
    return None


async def check_master_wide(plan: Plan, fleet: Any, http: HttpPool) -> None:
    """Refuse (plan.error) a master-wide clear nobody asked for unless the master is this fleet's alone;
    where it goes ahead, say why in the plan's notes and mark it (plan.master_wide)."""
    how = master_wide(plan)
    if how is None:
        return
    if plan.options.whole_master:  # asked for: the receipt says scope whole
        plan.master_wide = how
        return
    private, seen = await _private(plan, fleet, http)
    if private is not None:
        plan.master_wide = how
        plan.notes.append(f"the master is cleared WHOLE by {how}: {private}")
        return
    plan.error = (f"this reset would wipe EVERY deployment's keys on the master {plan.master or '(not given)'}: "
                  f"{how}, and the fleet has no cache_prefix to scope it; {seen}. Nothing was paused or sent")
    plan.hint = ("give the fleet a cache_prefix (kv_connector_extra_config.cache_prefix, e.g. kvctl config render "
                 "--set cache_prefix=NAME; then only its keys are cleared), or pass --whole-master to clear every "
                 "deployment's keys on purpose" + ("" if plan.master else ", or --master HOST:PORT (the master's "
                                                   "admin port) so kvctl can see whose keys it holds"))


async def _private(plan: Plan, fleet: Any, http: HttpPool) -> tuple[str | None, str]:
    """(why the master holds only this fleet's keys, None when it may hold others' or kvctl cannot tell;
    what kvctl saw)."""
    from kvctl.transport.master_admin import MasterAdmin, MasterError

    run = getattr(fleet, "embedded_master_of", None)
    if plan.master and run:
        return f"it is the embedded master of kvctl serve run {run}, and no other live run records it", ""
    if plan.master is None:
        return None, "no Mooncake master is known, so kvctl cannot tell whether another deployment shares it"
    models = await _models(plan, fleet, http)
    pattern = unprefixed_key_pattern(models)  # vLLM's unprefixed key shape (kvctl.facts.cache_prefix)
    shape = re.compile(pattern) if pattern else None
    opts = plan.options
    try:
        async with MasterAdmin(plan.master, timeout=opts.timeout, pool=http) as admin:
            try:
                total: int | None = int((await admin.metrics()).key_count)
            except MasterError:
                total = None
            if total == 0:
                return "it holds no key now (its master_key_count gauge), so no other deployment's key is lost", ""
            if total is not None and total > LIST_AT_MOST:
                return None, f"the master holds {total} keys, too many to read before the pause to tell whose"
            keys = await admin.all_keys()
    except MasterError as exc:
        return None, f"the master's keys could not be read to tell whose they are ({exc.message})"
    if not keys:
        return "it lists no key now, so no other deployment's key is lost", ""
    foreign = [k for k in keys if shape is None or not shape.match(k)]
    if not foreign:
        return (f"its {len(keys)} key(s) all have the shape of this fleet's own (unprefixed, model "
                f"{' or '.join(models)})"), ""
    if shape is None:
        return None, (f"the master holds {len(keys)} key(s), and the replicas' models could not be read to tell "
                      "which are this fleet's")
    return None, f"the master holds {len(foreign)} key(s) that are not this fleet's (e.g. {foreign[0][:80]!r})"


async def _models(plan: Plan, fleet: Any, http: HttpPool) -> list[str]:
    """The model name each live replica writes into its keys: the basename of its model path (/v1/models
    `root`; vLLM's store worker: model_config.model.rstrip("/").split("/")[-1]). Empty when any is unknown."""
    from kvctl.transport.vllm_client import VllmClient

    opts = plan.options
    by_url = {r.url: r for r in fleet.replicas}
    names: list[str] = []
    for rp in plan.replicas:
        if rp.error is not None:
            continue
        replica = by_url[rp.url]
        async with VllmClient(replica.url, timeout=opts.timeout, retries=opts.retries, api_key=replica.api_key(),
                              pool=http) as client:
            try:
                data = await client._get_json("/v1/models")
            except Exception:  # noqa: BLE001 - unknown: kvctl cannot tell which keys are this fleet's
                return []
        roots = [m.get("root") or m.get("id") for m in data.get("data", []) if isinstance(m, dict)] \
            if isinstance(data, dict) else []
        roots = [r for r in roots if isinstance(r, str) and r.strip("/")]
        if not roots:
            return []
        names += [r.rstrip("/").split("/")[-1] for r in roots]
    return sorted(set(names))


def _sends_reset_external(r: ReplicaPlan) -> bool:
    return any(op.op == "prefix_cache" and op.params.get("reset_external") for op in r.ops)


__all__ = ["check_master_wide", "master_wide"]
