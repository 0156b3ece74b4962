"""Mooncake tenants and what kvctl can count: the keys a reset claims to clear must be counted in the
namespace where they live, or the reset refuses before it sends anything.

Measured on a real mooncake_master 0.3.13.post1 with store clients of tenant "t1" and "default"
(docs/reset.md, "Shared masters"; tests/integration/test_tenants_real_master.py):

- default flags: tenants are ignored: one namespace (the same key name from two tenants is one key),
  GET /get_all_keys lists every tenant's keys, any client sees and removes any tenant's keys. kvctl's
  counts see them all: a declared tenant only earns a note that it isolates nothing;
- --enable_multi_tenants=true (with --tenant_quota_connector_uri=FILE): each tenant is a namespace.
  GET /get_all_keys and /query_key see only the default tenant (tenant_id ignored there), master_key_count
  counts every tenant, a store client (kvctl's scoped clear) sees and removes only its own tenant's keys,
  POST /api/v1/remove_all?force=true&tenant_id=X removes only X's (without tenant_id: every tenant's), and
  GET /api/v1/tenant_quotas gives each tenant's charged bytes. kvctl lists and clears the default tenant:
  a fleet in another tenant (or one whose tenant kvctl does not know while other tenants hold keys)
  would be counted where its keys are not, so the plan refuses it.

vLLM's /server_info does not show the tenant (it lives in mooncake.json): the inventory's tenant_id or the
run's rendered one says it (kvctl.targets.Fleet.tenant_id).
"""

from __future__ import annotations

from typing import Any

from kvctl.transport.pool import HttpPool

DEFAULT_TENANT = "default"
Plan = Any  # kvctl.reset.plan.Plan: not imported (plan.py imports this module)


async def plan_tenancy(plan: Plan, http: HttpPool) -> None:
    """Ask the planned master whether it isolates tenants, and refuse a plan whose counts (or scoped
    clear) could not see this fleet's keys."""
    from kvctl.transport.master_admin import MasterAdmin, MasterError, Tenancy

    async with MasterAdmin(plan.master, timeout=plan.options.timeout, pool=http) as admin:
        try:
            tenancy = await admin.tenancy()
        except MasterError as exc:
            tenancy = Tenancy("unknown", detail=exc.message)
    plan.tenancy = tenancy.mode
    declared = plan.tenant_id
    foreign = _foreign(tenancy.charged_bytes)
    if tenancy.mode == "off":
        if declared not in (None, DEFAULT_TENANT):
            plan.notes.append(f"tenant '{declared}' isolates nothing on master {plan.master}: it runs without "
                              f"multi-tenancy ({tenancy.detail}), so every tenant's keys share one namespace, "
                              "which kvctl lists, counts and clears whole")
        return
    if tenancy.mode == "unknown":
        if declared in (None, DEFAULT_TENANT):
            plan.notes.append(f"could not tell whether master {plan.master} isolates tenants ({tenancy.detail}): "
                              "this fleet is counted in the default tenant")
            return
        _refuse(plan, f"master {plan.master} did not say whether it isolates tenants ({tenancy.detail}), and this "
                      f"fleet's keys live in tenant '{declared}'")
        return
    if declared not in (None, DEFAULT_TENANT):
        _refuse(plan, f"this fleet's keys live in Mooncake tenant '{declared}' ({_source(plan)}), and master "
                      f"{plan.master} isolates tenants ({tenancy.detail})")
    elif declared is None and foreign:
        held = ", ".join(f"'{name}' ({size} bytes)" for name, size in sorted(foreign.items()))
        _refuse(plan, f"master {plan.master} isolates tenants and holds keys in tenant(s) {held}, and kvctl does "
                      "not know which tenant this fleet writes into (vLLM's /server_info does not show mooncake.json's "
                      "tenant_id)", undeclared=True)
    else:
        plan.notes.append(f"master {plan.master} isolates tenants ({tenancy.detail}): kvctl counts and clears this "
                          "fleet's keys in the default tenant, the one GET /get_all_keys lists"
                          + (f"; other tenants ({', '.join(sorted(foreign))}) are not counted" if foreign else ""))


def _refuse(plan: Plan, why: str, undeclared: bool = False) -> None:
    plan.error = (f"kvctl cannot count this fleet's keys where they live: {why}. kvctl counts keys through GET "
                  "/get_all_keys and /metrics and clears a cache_prefix through Mooncake's store client of the "
                  "default tenant; on a master with multi-tenancy those see only the default tenant's keys (measured "
                  "on 0.3.13.post1: a tenant's keys are absent from /get_all_keys and /query_key, and a default "
                  "client's remove_by_regex removes none of them), so a count of 0 would prove nothing: refused "
                  "before anything is sent")
    declare = "if it runs in the default tenant, say so: tenant_id: default in the inventory; " if undeclared else ""
    plan.hint = (declare + "give the deployment a private master, or run it in the default tenant; or, without a "
                 "cache_prefix on vLLM >= 0.23 (whose connector reset is a forced remove_all of its own tenant's "
                 "keys), reset it with --connector and without --verify: cleared by vLLM, not counted by kvctl")


def _foreign(charged: dict[str, int] | None) -> dict[str, int]:
    """Tenants other than the default one that hold keys."""
    return {name: size for name, size in (charged or {}).items() if name != DEFAULT_TENANT and size > 0}


def _source(plan: Plan) -> str:
    return f"tenant_id of {plan.tenant_source}" if plan.tenant_source else "its declared tenant_id"
