"""kvctl's own pause of a fleet, and the one path that undoes it: every resume kvctl sends is for a pause
kvctl sent.

kvctl resumes a replica only when its /pause went out from kvctl (`Paused.sent`): one that answered, one
that failed or timed out, and one a signal cut short in flight, whose pause may still land on the server
after kvctl's resume (those are watched for a while and resumed again). Never a replica its owner paused
(read while planning, or just before kvctl's pause), nor one kvctl never reached because a signal or
another replica's failed pause came first, nor one the caller keeps paused (its step failed: it may hold
no weights, or other weights than the fleet's). Nothing here decides what to keep: the executor
(kvctl.reset.execute) passes what it holds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from kvctl.reset.plan import PlannedOp, ReplicaPlan, ResetOptions, replica_client
from kvctl.reset.receipt import OpResult, ReplicaReceipt
from kvctl.reset.window import describe
from kvctl.targets import Replica
from kvctl.transport.pool import HttpPool
from kvctl.transport.vllm_client import VllmClient

LATE_PAUSE_WATCH_S = 3.0  # after resuming a replica whose pause failed or was cut short: watch for it landing late
CUT_SHORT = "cut short by a signal while in flight: the server may still pause it"

RunOp = Callable[[VllmClient, ReplicaPlan, PlannedOp, ResetOptions], Awaitable[OpResult]]


@dataclass
class Paused:
    """What kvctl's pause reached: `sent` the replicas whose /pause kvctl sent (the only ones it resumes)."""

    sent: set[str] = field(default_factory=set)


async def pause_all(live: list[ReplicaPlan], by_name: dict[str, Replica], opts: ResetOptions, http: HttpPool,
                    sem: asyncio.Semaphore, receipts: dict[str, ReplicaReceipt], owner_paused: set[str],
                    paused: Paused, run_op: RunOp) -> list[str]:
    """Pause every replica at once. As soon as one pause fails, the others still waiting are cut
    short (the caller resumes what was sent). Returns the replicas whose pause did not succeed. A signal
    (the task cancelled) cuts every pause in flight short, each noted in its receipt, and is re-raised."""
    async def one(rp: ReplicaPlan) -> bool:
        op = next((o for o in rp.ops if o.op == "pause"), None)
        if op is None:
            return True
        if rp.name in owner_paused:  # read while planning: paused or asleep, and left so
            left = "left asleep" if rp.window == "asleep" else "left paused"
            receipts[rp.name].ops.append(OpResult("pause", "skipped", detail=f"already {describe(rp.window)}: {left}"))
            return True
        async with sem, replica_client(by_name[rp.name], opts, http) as client:
            if op.skip is None and await is_paused(client) is True:
                owner_paused.add(rp.name)
                receipts[rp.name].ops.append(OpResult("pause", "skipped", detail="already paused by its owner: "
                                                                                 "left paused"))
                return True
            if op.skip is None:
                paused.sent.add(rp.name)
            result = await run_op(client, rp, op, opts)
            receipts[rp.name].ops.append(result)
            return result.result != "failed"

    tasks = {asyncio.create_task(one(rp)): rp.name for rp in live}
    failed: list[str] = []
    pending = set(tasks)
    try:
        while pending and not failed:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            failed += [tasks[t] for t in done if t.exception() is not None or not t.result()]
    except asyncio.CancelledError:  # a signal: no pause may go on in the background past the resume
        await _cut(pending, tasks, receipts, paused, CUT_SHORT)
        raise
    await _cut(pending, tasks, receipts, paused, "cut short: another replica's pause failed")
    return failed + [tasks[t] for t in pending]


async def _cut(pending: set[asyncio.Task[bool]], tasks: dict[asyncio.Task[bool], str],
               receipts: dict[str, ReplicaReceipt], paused: Paused, why: str) -> None:
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for t in pending:
        name = tasks[t]
        if not any(o.op == "pause" for o in receipts[name].ops):
            error = why if name in paused.sent else why.split(":")[0] + " before its /pause was sent"
            receipts[name].ops.append(OpResult("pause", "failed", error=error))


async def resume_all(replicas: list[ReplicaPlan], paused: Paused, by_name: dict[str, Replica],
                     opts: ResetOptions, http: HttpPool, sem: asyncio.Semaphore,
                     receipts: dict[str, ReplicaReceipt], run_op: RunOp) -> None:
    """Resume each of `replicas` whose /pause kvctl sent. One whose pause did not answer ok (failed, timed
    out, cut short) may still get paused by that request after kvctl's resume: check /is_paused for a
    while and resume again; if it cannot be confirmed, say so with the command that resumes it."""
    async def one(rp: ReplicaPlan) -> None:
        op = next((o for o in rp.ops if o.op == "resume"), None)
        if op is None or rp.name not in paused.sent:
            return
        pause = next((o for o in receipts[rp.name].ops if o.op == "pause"), None)
        async with sem, replica_client(by_name[rp.name], opts, http) as client:
            receipts[rp.name].ops.append(await run_op(client, rp, op, opts))
            if pause is not None and pause.result == "ok":
                return
            state: bool | None = None
            deadline = time.monotonic() + LATE_PAUSE_WATCH_S
            while time.monotonic() < deadline:
                await asyncio.sleep(0.25)
                state = await is_paused(client)
                if state:
                    await client.resume()  # the late pause landed: undo it
            # a /pause that timed out, or was cut short in flight, may still be running on the server
            in_flight = pause is not None and ("timed out" in (pause.error or "") or pause.error == CUT_SHORT)
            if state is not False or in_flight:
                note = (f"it may be left paused (its /pause may still take effect): check "
                        f"`curl {rp.url}/is_paused` and resume it with `curl -X POST {rp.url}/resume`")
                rr = receipts[rp.name]
                why = rr.error or "; ".join(f"{o.op}: {o.error}" for o in rr.ops if o.result == "failed")
                rr.error = f"{why}; {note}" if why else note

    await asyncio.gather(*(one(rp) for rp in replicas))


async def is_paused(client: VllmClient) -> bool | None:
    outcome = await client.is_paused()
    body = outcome.body if outcome.ok and isinstance(outcome.body, dict) else {}
    value = body.get("is_paused")
    return value if isinstance(value, bool) else None


__all__ = ["LATE_PAUSE_WATCH_S", "Paused", "is_paused", "pause_all", "resume_all"]
