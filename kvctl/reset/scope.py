"""The scope of a reset's master clear: this deployment's cache_prefix, checked against what the
servers run and what their vLLM release does with it."""

from __future__ import annotations

from typing import Any

from packaging.version import Version

from kvctl.facts.capabilities import table

# The plan (kvctl.reset.plan.Plan) and its replicas (ReplicaPlan): not imported, plan.py imports this.
Plan = Any
ReplicaPlan = Any

STORE_CONNECTOR = "MooncakeStoreConnector"
AUTO = "auto"  # a cache_prefix vLLM resolves itself (AUTO_FACT)
AUTO_FACT = "mooncake_store.cache_prefix_auto"


def plan_scope(plan: Plan, planned: list[ReplicaPlan]) -> None:
    """This deployment's cache_prefix (see _scope), refused where the servers' vLLM ignores it."""
    _scope(plan, planned)
    if plan.error is None and plan.cache_prefix and not plan.options.whole_master:
        _check_prefix_is_read(plan, planned)
    if plan.error is None and plan.cache_prefix == AUTO and not plan.options.whole_master:
        _check_prefix_is_literal(plan, planned)


def _check_prefix_is_literal(plan: Plan, planned: list[ReplicaPlan]) -> None:
    """From vLLM 0.34.0 the store connector turns cache_prefix "auto" into auto-<hash> (of the build, the
    model and the cache config) and writes its keys under that: a clear scoped to "auto" would find none
    of them and pass. kvctl cannot derive the hash, and matching every auto-* prefix would take other
    builds' (other deployments') keys: refused, with where the resolved prefix is logged."""
    resolving = [r for r in planned if r.has_store and r.version and table().has(Version(r.version), AUTO_FACT)]
    if not resolving:
        return
    since = table().capability(AUTO_FACT).span.since
    plan.error = (f"the clear is scoped to cache_prefix 'auto', but "
                  + ", ".join(f"{r.name} (vLLM {r.version})" for r in resolving)
                  + f" resolve 'auto' to auto-<hash of the build, model and cache config> (vLLM >= {since}, "
                  "mooncake/store/worker.py _resolve_cache_prefix) and write their keys under that: a clear "
                  "scoped to 'auto' would find none of them")
    plan.hint = ("give the fleet the resolved prefix (each replica logs 'MooncakeStore resolved cache_prefix: "
                 "auto-...'; kvctl logs RUN shows it) as its cache_prefix (inventory cache_prefix:), or pass "
                 "--whole-master if no other deployment shares the master")


def _scope(plan: Plan, planned: list[ReplicaPlan]) -> None:
    """This deployment's cache_prefix: the inventory's (or run's), checked against what the
    servers run; or the servers' own when all agree. A wrong prefix would clear the wrong keys."""
    stores = [r for r in planned if r.has_store and r.layout_source == "server_info"]
    served = {r.cache_prefix for r in stores}
    if plan.cache_prefix:
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


def _check_prefix_is_read(plan: Plan, planned: list[ReplicaPlan]) -> None:
    """A release whose MooncakeStoreConnector does not read cache_prefix (before 0.24.0) writes keys
    without it: a clear scoped to the prefix would find none of this deployment's keys and report
    success, leaving the stale KV."""
    blind = [r for r in planned if r.has_store and r.version
             and "cache_prefix" not in (table().extra_config_keys(Version(r.version), STORE_CONNECTOR) or ())]
    if not blind:
        return
    since, _ = table().extra_config_key_span(STORE_CONNECTOR, "cache_prefix")
    plan.error = (f"the clear is scoped to cache_prefix '{plan.cache_prefix}', but "
                  + ", ".join(f"{r.name} (vLLM {r.version})" for r in blind)
                  + f" run a {STORE_CONNECTOR} that does not read cache_prefix (first read in vLLM {since}): "
                  "their keys carry no prefix, so the scoped clear would find none of them")
    plan.hint = (f"upgrade vLLM to >= {since}, or pass --whole-master if no other "
                 "deployment shares the master")
