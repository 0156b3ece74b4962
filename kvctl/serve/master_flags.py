"""kvctl serve's master flags, read as every command reads them: --master is a master's admin/metrics
HTTP port (or `embedded`), --master-rpc its RPC port or an HA group's etcd://, which vLLM connects to.

The old spellings keep working with a note: --master-admin ADMIN (now --master), and --master RPC or
--master etcd://... without --master-rpc. A HOST:PORT given as --master is told apart by asking it: an
admin port answers GET /metrics with Mooncake's gauges, an RPC port speaks no HTTP (its coro_rpc server
closes the connection at once). Nothing here starts a process; the notes are the caller's to show.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kvctl.errors import UsageError
from kvctl.serve.spec import master_endpoints

if TYPE_CHECKING:
    from kvctl.serve.runs import RunRecord


@dataclass
class MasterFlags:
    """serve's master flags as the spec takes them, and the notes to show (deprecated spellings)."""

    master: str  # ServeSpec.master: "embedded", or the RPC address / etcd:// vLLM connects to
    admin: str | None = None
    notes: list[str] = field(default_factory=list)


ADMIN_HELP = "the master's admin/metrics port (mooncake_master --metrics_port, default 9003)"
RPC_PORT = "the master's RPC port (mooncake_master --rpc_port, default 50051)"
RPC_HELP = f"{RPC_PORT}, or an HA group's etcd://HOST:PORT[;HOST:PORT...]"


def master_from_flags(master: str | None, master_rpc: str | None, master_admin: str | None = None,
                      state_dir: str | None = None) -> MasterFlags:
    """`kvctl serve --master embedded|ADMIN --master-rpc RPC|etcd://...`, as every command reads --master
    (the admin port) and --master-rpc. The old spellings keep working with a note: --master-admin ADMIN,
    and --master RPC|etcd://... without --master-rpc (told apart from an admin port by asking it: an admin
    port answers GET /metrics, an RPC port speaks no HTTP). Nothing here starts a process."""
    notes: list[str] = []
    if master_admin is not None:
        if master not in (None, "embedded") and master_rpc is not None:
            raise UsageError("--master-admin is the old name of --master (the admin port): give it once",
                             f"--master ADMIN --master-rpc {master_rpc}")
        notes.append(f"--master-admin is deprecated: it is --master {master_admin} now (the admin port, as for "
                     "kvctl status and reset)")
    if master == "embedded" or (master is None and master_rpc is None):
        if master_rpc is not None or master_admin is not None:
            raise UsageError("--master embedded starts a master here; --master-rpc and --master-admin name one "
                             "that runs already", "give --master-rpc RPC (and --master ADMIN) for a running "
                             "master, or neither for an embedded one")
        return MasterFlags("embedded")
    if master is not None and master.strip().startswith("etcd://"):
        return _legacy_rpc(master.strip(), master_rpc, master_admin, notes)
    if master is not None and master_rpc is None and "," not in master:
        kind = _port_kind(master)
        if kind in ("not_http", "unreachable", "silent"):  # the RPC port (or nothing to judge by): the old spelling
            return _legacy_rpc(master.strip(), None, master_admin, notes)
        if kind == "admin":
            learned = _recorded_rpc(master, state_dir)
            if learned is None:
                raise UsageError(f"--master {master} is {ADMIN_HELP}; vLLM connects to {RPC_PORT}",
                                 f"add --master-rpc RPC: {RPC_HELP}")
            notes.append(f"--master-rpc {learned[0]}: from run {learned[1]}'s record (its master)")
            return MasterFlags(learned[0], master.strip(), notes)
        raise UsageError(f"--master {master} answers HTTP but is not a Mooncake master's admin port (its GET "
                         "/metrics has no master_key_count)", f"give --master-rpc RPC ({RPC_HELP}) and --master "
                         f"ADMIN ({ADMIN_HELP}), or --master embedded")
    if master_rpc is None:
        raise UsageError(f"--master {master} names the admin ports of an HA group; vLLM connects through its etcd",
                         "add --master-rpc etcd://HOST:PORT[;HOST:PORT...]")
    master_endpoints(master_rpc, "--master-rpc")
    if "://" not in master_rpc and _port_kind(master_rpc) == "admin":
        raise UsageError(f"--master-rpc {master_rpc} is the master's admin port, not its RPC port",
                         f"pass --master {master_rpc} and --master-rpc RPC: {RPC_HELP}")
    admins = master if master is not None else master_admin
    return MasterFlags(master_rpc.strip(), _check_admins(admins, master_rpc), notes)


def _legacy_rpc(address: str, master_rpc: str | None, admin: str | None, notes: list[str]) -> MasterFlags:
    if master_rpc is not None:
        raise UsageError(f"--master {address} is an RPC address, and --master-rpc gives one too",
                         f"--master-rpc {address} (and --master ADMIN: {ADMIN_HELP})")
    master_endpoints(address, "--master")
    notes.append(f"kvctl serve --master {address} naming the RPC address is deprecated: say --master-rpc {address}"
                 + (f" --master {admin}" if admin else " (and --master ADMIN, its admin port, for status and reset)")
                 + "; --master is the admin port in every command")
    return MasterFlags(address, admin, notes)


def _check_admins(admins: str | None, rpc: str) -> str | None:
    """The admin address(es) as recorded (comma-separated); one that speaks no HTTP is the RPC port."""
    if admins is None:
        return None
    found = [part.strip() for part in admins.split(",") if part.strip()]
    for address in found:
        if "://" in address:
            raise UsageError(f"--master {admins}: '{address}' is not HOST:PORT", f"give {ADMIN_HELP}, e.g. 127.0.0.1:9003")
        master_endpoints(address, "--master")  # HOST:PORT, or a UsageError naming the flag
    for address in found:
        kind = _port_kind(address)
        if kind == "not_http":
            raise UsageError(f"--master {address} answers no HTTP: it is the master's RPC port, not its admin port",
                             f"pass --master-rpc {address} and --master ADMIN ({ADMIN_HELP})")
        if kind in ("other_http", "silent"):  # an etcd's client port answers GET /metrics with its own metrics
            what = SILENT if kind == "silent" else ("answers HTTP but is not a Mooncake master's admin port (its GET "
                                                    "/metrics has no master_key_count: an etcd port?)")
            raise UsageError(f"--master {address} {what}", f"give each master's admin port ({ADMIN_HELP}); the etcd "
                                                          "endpoints go in --master-rpc etcd://HOST:PORT[;HOST:PORT...]")
    return ",".join(found)


def master_from_env() -> tuple[str | None, str | None]:
    """(--master, --master-rpc) from KVCTL_MASTER / KVCTL_MASTER_RPC, for a serve given neither: the pair
    joins that master; KVCTL_MASTER alone (set for kvctl reset) names no port vLLM can connect to, so
    serve starts its own master then."""
    import os

    rpc = os.environ.get("KVCTL_MASTER_RPC", "").strip() or None  # kvctl.targets reads the same two
    return (os.environ.get("KVCTL_MASTER", "").strip() or None if rpc else None), rpc


PORT_KIND_TIMEOUT = 4.0  # seconds for the whole question: an answer trickling in must not hold serve
SILENT = (f"accepts connections but gave no HTTP answer within {PORT_KIND_TIMEOUT:g} s: not a Mooncake master's "
          "admin port, whose GET /metrics answers at once (an etcd or another server that hangs?)")


def _port_kind(address: str) -> str:
    """What answers at HOST:PORT (kvctl.transport.master_admin.PortKind.kind), asked for at most
    PORT_KIND_TIMEOUT seconds; "silent" when it accepts a connection but no HTTP answer comes in time."""
    import asyncio
    import socket

    from kvctl.transport.master_admin import MasterAdmin, PortKind

    async def ask() -> PortKind:
        async with MasterAdmin(address.strip(), timeout=1.5) as admin:  # an RPC port closes at once
            return await admin.port_kind()

    try:
        found = asyncio.run(asyncio.wait_for(ask(), PORT_KIND_TIMEOUT))
    except asyncio.TimeoutError:
        found = PortKind("unreachable", f"no answer within {PORT_KIND_TIMEOUT:g} s")
    if found.kind != "unreachable" or found.detail.startswith("GET /metrics answered HTTP"):
        return found.kind  # an HTTP error status: a busy master, nothing to judge by
    host, _, port = address.strip().rpartition(":")
    try:  # refused (nothing there yet): nothing to judge by; accepted and silent: not an admin port
        with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
            return "silent"
    except (OSError, ValueError):
        return "unreachable"


def recorded_masters(state_dir: str | Path | None) -> list[RunRecord]:
    """This machine's live runs that record both ports of one master (not an HA group's etcd), whose
    embedded master is still the process they started: what they say about a master is current (the
    resolver of every fleet command asks them too, kvctl.targets)."""
    from kvctl.errors import KvctlError
    from kvctl.serve import procs, runs

    try:
        return [r for r in runs.list_runs(state_dir) if r.state in runs.LIVE_STATES and r.master is not None
                and r.master.admin_address and "://" not in r.master.rpc_address
                and (r.master.process is None or procs.is_ours(r.master.process))]
    except (OSError, KvctlError):
        return []


def own_embedded_master(record: RunRecord | None, state_dir: str | Path | None) -> str | None:
    """The run's name when its master is its own embedded one and no other live run on this machine records
    that master too (a run started against it writes there as well): kvctl.reset.wide calls such a master
    the fleet's alone."""
    master = record.master if record is not None else None
    if master is None or not master.embedded:
        return None
    ours = {master.admin_address, master.rpc_address} - {None}
    if any(r.name != record.name and r.master is not None and {r.master.admin_address, r.master.rpc_address} & ours
           for r in recorded_masters(state_dir)):
        return None
    return record.name


def _recorded_rpc(admin: str, state_dir: str | None) -> tuple[str, str] | None:
    """(RPC address, run name) of a live run whose master has this admin address."""
    for r in recorded_masters(state_dir):
        if r.master is not None and r.master.admin_address == admin.strip():
            return r.master.rpc_address, r.name
    return None
