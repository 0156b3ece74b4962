"""The master addresses of a reset, checked before anything is sent, and the RPC address asked for
where none was given.

A Mooncake master has two ports: the admin/metrics HTTP port (`--master`: counts, whole-master clears)
and the RPC port (`--master-rpc`: Mooncake's store client, scoped clears). One given for the other used
to plan happily and fail at the master clear, after the replicas were reset. So the plan asks each
address what it is (`MasterAdmin.port_kind`: one GET /metrics) and refuses a swapped one with the
flags to pass; an admin port given only as `--master-rpc` is used as the master, with a note.

Where no RPC address is known, the replicas may name it: a kv_transfer_config whose extra config
holds `master_server_address` (or LMCache's `lmcache.remote_url: mooncakestore://HOST:PORT/`), as
/server_info reports it. vLLM's MooncakeStoreConnector itself reads it from mooncake.json
(MOONCAKE_CONFIG_PATH, vLLM 0.32.0 distributed/mooncake_store.py), which no route shows, and a master
without HA reports no RPC address (0.3.13.post1: /health leader_address null, /leader present false),
so most fleets need `--master-rpc` (or a run record) for a scoped clear; the plan's error says so.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kvctl.targets import MASTER_ENV, MASTER_RPC_ENV, Fleet
from kvctl.transport.master_admin import MasterAdmin, PortKind
from kvctl.transport.pool import HttpPool

# The plan (kvctl.reset.plan.Plan) is typed Any here: plan.py imports this module, and a type-only
# import back would be an import cycle (tests/unit/test_layout.py)
Plan = Any

ADMIN_PORT = "the master's admin/metrics port (mooncake_master --metrics_port, default 9003)"
RPC_PORT = "the master's RPC port (mooncake_master --rpc_port, default 50051)"


def named_master_rpc(config: Any) -> str | None:
    """The master RPC address a served kv_transfer_config names (anywhere in it: a MultiConnector's
    children too), or None."""
    if isinstance(config, dict):
        for key, value in config.items():
            if key == "master_server_address" and isinstance(value, str) and value.strip():
                return value.strip()
            if key in ("lmcache.remote_url", "remote_url") and isinstance(value, str) \
                    and value.startswith("mooncakestore://"):
                return value.removeprefix("mooncakestore://").strip("/") or None
            found = named_master_rpc(value)
            if found:
                return found
    elif isinstance(config, list):
        for value in config:
            found = named_master_rpc(value)
            if found:
                return found
    return None


async def port_kinds(addresses: list[str], timeout: float, http: HttpPool) -> list[PortKind]:
    async def one(address: str) -> PortKind:
        async with MasterAdmin(address, timeout=timeout, pool=http) as admin:
            return await admin.port_kind()

    return list(await asyncio.gather(*(one(a) for a in addresses)))


async def check_addresses(plan: Plan, fleet: Fleet, http: HttpPool) -> tuple[str, str] | None:
    """Check every admin and RPC address of the plan (and learn an RPC address where none is known);
    (error, fix) for one that is the other port or no master's at all. Adjusts the plan's master and RPC
    lists and notes where it can decide on its own."""
    plan.notes.extend(fleet.notes)
    plan.master_rpc_source = fleet.master_rpc_source
    admins, rpcs = list(plan.master_group), list(plan.master_rpc_group)
    if not admins and not rpcs:
        return None
    kinds = await port_kinds(admins + rpcs, plan.options.timeout, http)
    admin_src, rpc_src = fleet.master_source or "--master", fleet.master_rpc_source or "--master-rpc"
    for address, kind in zip(admins, kinds):
        if kind.kind == "not_http":
            return (f"{admin_src} {address} answers no HTTP: it is the master's RPC port, not its admin port",
                    _fix(admin_src, rpc=address))
        if kind.kind == "other_http":
            return f"{admin_src} {address} is not a Mooncake master's admin port: {kind.detail}", _fix(admin_src)
    for address, kind in zip(rpcs, kinds[len(admins):]):
        if kind.kind == "admin" and not admins:
            plan.master_group, plan.master, plan.master_rpc_group, plan.master_rpc = [address], address, [], None
            plan.master_rpc_source = None
            plan.notes.append(f"{rpc_src} {address} is the master's admin port, not its RPC port: used as the "
                              f"master (--master {address}); its RPC port is not known")
            break
        if kind.kind == "admin":
            return (f"{rpc_src} {address} is the master's admin port, not its RPC port",
                    _fix(rpc_src, admin=address))
        if kind.kind == "other_http":
            return (f"{rpc_src} {address} answers HTTP ({kind.detail}), so it is not the master's RPC port",
                    _fix(rpc_src))
    if plan.master_group and not plan.master_rpc_group:
        await _learn_rpc(plan, http)
    return None


async def _learn_rpc(plan: Plan, http: HttpPool) -> None:
    """The RPC address the replicas' served configs name, when they all name the same one and it is
    not an HTTP port (an HA group's etcd:// address is no master's RPC port: its leader reports one)."""
    named = {r.name: r.master_rpc for r in plan.replicas if r.error is None and r.master_rpc}
    found = set(named.values())
    if not found:
        return
    if len(found) > 1:
        plan.notes.append("the replicas name different master RPC addresses ("
                          + ", ".join(f"{n}: {a}" for n, a in named.items()) + "): none is used")
        return
    address = found.pop()
    if "://" in address:
        return
    kind = (await port_kinds([address], plan.options.timeout, http))[0]
    if kind.kind in ("admin", "other_http"):
        plan.notes.append(f"the replicas' kv_transfer_config names master_server_address {address}, which "
                          f"answers HTTP: not used as the master's RPC port")
        return
    who = ", ".join(named) if len(named) < 4 else f"{len(named)} replicas"
    plan.master_rpc_group, plan.master_rpc = [address], address
    plan.master_rpc_source = f"named by {who} (kv_transfer_config, GET /server_info)"
    plan.notes.append(f"the master's RPC address {address}: {plan.master_rpc_source}")


def _fix(source: str, rpc: str | None = None, admin: str | None = None) -> str:
    """The flags to pass, spelled for where the wrong address came from."""
    rpc_text, admin_text = rpc or "RPC", admin or "ADMIN"
    if source in (MASTER_ENV, MASTER_RPC_ENV):
        return (f"set {MASTER_RPC_ENV}={rpc_text} and {MASTER_ENV}={admin_text}: {MASTER_ENV} is {ADMIN_PORT}, "
                f"{MASTER_RPC_ENV} {RPC_PORT}")
    if source.startswith("--inventory"):
        return f"in the inventory, master_rpc: {rpc_text} and master: {admin_text} (master: is {ADMIN_PORT})"
    if source.startswith("run "):
        return f"pass --master-rpc {rpc_text} and --master {admin_text}: the run's record holds another master's ports"
    return f"pass --master-rpc {rpc_text} and --master {admin_text}: --master is {ADMIN_PORT}, --master-rpc {RPC_PORT}"
