"""Which Mooncake master of an HA group to clear: the one that leads, asked just before it matters.

In HA mode (mooncake_master --enable_ha) only the leader serves; a standby answers 503 ("service
plane is not active") to every data route, remove_all included, and binds no RPC port. So kvctl
asks every admin address given (`GET /health`: role, ha_state, service_ready, leader_address;
`GET /role` where /health has no role) and uses the one whose role is "leader":
- several addresses, exactly one leader: that one; none or several: no choice, nothing is sent;
- no HA routes anywhere (an older master): a single address that answers is simply used;
- one address only: used as before, unless it says it is a standby.

The scoped clear goes to the leader's RPC port. In HA mode the leader reports it (`GET /leader`
-> leader_address, the --rpc_address:--rpc_port it advertises to clients through the HA
backend, which is what vLLM's store clients follow too), so kvctl trusts that over the
inventory; without HA it pairs the admin and RPC addresses by position (one RPC address: used
for whichever master is chosen).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from kvctl.transport.http import HttpPool
from kvctl.transport.master_admin import HaInfo, MasterAdmin, MasterError

# A new leader spends ~5 s in "leader_warmup" (service_ready false) before it serves (0.3.13.post1).
WAIT_STEP_S = 0.5


@dataclass
class MasterNode:
    """One admin address and what it said about leadership."""

    address: str
    role: str | None = None  # leader | standby | ... ; None: no HA routes, or no answer
    ha_state: str | None = None  # serving | leader_warmup | standby | ...
    service_ready: bool | None = None
    leader_rpc: str | None = None  # the leader's RPC address as this node sees it
    view_version: int | None = None
    error: str | None = None  # no usable answer

    def describe(self) -> str:
        if self.error:
            return f"{self.address}: no answer ({self.error})"
        if self.role is None:
            return f"{self.address}: answers, no HA role (no /role route)"
        state = f", {self.ha_state}" if self.ha_state and self.ha_state != self.role else ""
        return f"{self.address}: {self.role}{state}"


@dataclass
class MasterChoice:
    """The master to use (admin and RPC address), or why there is none."""

    nodes: list[MasterNode] = field(default_factory=list)
    address: str | None = None
    rpc: str | None = None
    rpc_source: str | None = None  # "leader's /leader" | "inventory" | ...
    ha: bool = False  # some node reported an HA view (leader_address / view_version)
    error: str | None = None
    hint: str | None = None

    @property
    def serving(self) -> bool:
        node = next((n for n in self.nodes if n.address == self.address), None)
        return node is not None and node.service_ready is not False

    def roles(self) -> str:
        return "; ".join(n.describe() for n in self.nodes)


async def _probe(address: str, timeout: float, pool: HttpPool | None) -> MasterNode:
    async with MasterAdmin(address, timeout=timeout, pool=pool) as admin:
        try:
            info: HaInfo = await admin.ha_info()
        except MasterError as exc:
            return MasterNode(address, error=exc.message.split(": ", 1)[-1])
    return MasterNode(address, info.role, info.ha_state, info.service_ready, info.leader_rpc, info.view_version)


async def choose(admins: tuple[str, ...], rpcs: tuple[str, ...], timeout: float,
                 pool: HttpPool | None = None) -> MasterChoice:
    """Ask every address at once and pick the leader (see the module doc for the rules)."""
    nodes = list(await asyncio.gather(*(_probe(a, timeout, pool) for a in admins)))
    choice = MasterChoice(nodes, ha=any(n.leader_rpc or n.view_version is not None for n in nodes))
    leaders = [n for n in nodes if n.role == "leader"]
    if len(leaders) > 1:  # a stale leader that has not yet seen it lost its lease: prefer the newest view
        newest = max(n.view_version or -1 for n in leaders)
        leaders = [n for n in leaders if (n.view_version or -1) == newest]
    answering = [n for n in nodes if n.error is None]
    if len(leaders) == 1:
        chosen = leaders[0]
    elif len(admins) == 1 and nodes[0].role in (None, "leader"):
        chosen = nodes[0]  # a lone master is used as before, even unreachable (the clear then says so)
    elif not leaders and len(answering) == 1 and answering[0].role is None:
        chosen = answering[0]  # masters without HA routes: the only one that answers
    else:
        what = "several masters claim to lead" if leaders else "no master leads"
        choice.error = f"{what}: {choice.roles()}"
        choice.hint = ("wait for the HA election to settle (a new leader takes ~10 s) and retry, or give the "
                       "addresses of every master of the group (admin/metrics ports)")
        return choice
    choice.address = chosen.address
    await _leader_rpc(choice, chosen, admins, rpcs, timeout, pool)
    return choice


async def _leader_rpc(choice: MasterChoice, chosen: MasterNode, admins: tuple[str, ...], rpcs: tuple[str, ...],
                      timeout: float, pool: HttpPool | None) -> None:
    """The chosen master's RPC address: the HA leader's own word first, else the inventory's."""
    reported = chosen.leader_rpc
    if chosen.role == "leader" and choice.ha:
        async with MasterAdmin(chosen.address, timeout=timeout, pool=pool) as admin:
            try:
                reported = await admin.leader_rpc() or reported
            except MasterError:
                pass  # /health's leader_address (same view) stands
    if reported and choice.ha and not reported.startswith("0.0.0.0:"):
        choice.rpc, choice.rpc_source = reported, f"leader_address reported by {chosen.address} (/leader)"
    elif len(rpcs) == len(admins) and len(rpcs) > 1:
        choice.rpc, choice.rpc_source = rpcs[admins.index(chosen.address)], "paired with its admin address"
    elif len(rpcs) == 1:
        choice.rpc, choice.rpc_source = rpcs[0], "given"


async def choose_serving(admins: tuple[str, ...], rpcs: tuple[str, ...], timeout: float, wait: float,
                         pool: HttpPool | None = None) -> MasterChoice:
    """`choose`, waiting up to `wait` seconds for a leader that serves (an election or a leader's
    warm-up in progress): what execution uses just before it clears."""
    deadline = time.monotonic() + wait
    while True:
        choice = await choose(admins, rpcs, timeout, pool)
        if (choice.error is None and choice.serving) or time.monotonic() >= deadline:
            return choice
        await asyncio.sleep(WAIT_STEP_S)
