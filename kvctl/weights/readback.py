"""What a weight update reads back, so that its receipt states only what kvctl checked (issue 39).

* The label: `set_version` sends /update_weight_version and reads /weight_info back; vLLM's success
  answer is not taken for the label.
* The weights: `weights_changed` compares each reloaded replica's checksums before and after
  (/weight_checker). A reload that changed no replica's weights, to a label none of them carried
  (`stale_reload`: a stale mirror of the folder, say), loaded nothing new: those replicas get their
  old label back (`restore_labels`) and the update fails, rather than give the old weights the new
  name. Without checksums (vLLM < 0.32) this cannot be known, and the receipt says so.
* Each replica after the resume (`read_after`): its label (/weight_info) and its window
  (/is_paused, /is_sleeping: kvctl.reset.window), so that "serving" is what the replica says.
Nothing here prints.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from kvctl.facts.versions import parse_version
from kvctl.reset.plan import replica_client
from kvctl.reset.window import read_window
from kvctl.targets import Replica
from kvctl.transport.pool import HttpPool, max_concurrency
from kvctl.transport.vllm_client import CallOutcome, ServerError, VllmClient, reset_answer_error
from kvctl.transport.vllm_weights import WeightChecksums
from kvctl.weights.plan import ReplicaWeightsPlan, WeightsPlan
from kvctl.weights.receipt import WeightsReplica

Checksums = dict[str, tuple[WeightChecksums | None, dict[str, str] | None, str | None]]


async def set_version(client: VllmClient, version: str) -> CallOutcome:
    """/update_weight_version, then /weight_info read back: an outcome whose `error` says what
    /weight_info reports instead of `version`."""
    answer = await client.update_weight_version(version)
    if reset_answer_error(answer):
        return answer
    try:
        found = await client.weight_info()
    except ServerError as exc:
        found, why = None, f"/weight_info could not be read back: {exc.message}"
    else:
        why = f"/update_weight_version answered success, but /weight_info reports {found!r}"
    if found != version:
        answer.error = why
    return answer


def weights_changed(before: Checksums, after: Checksums, rows: list[WeightsReplica]) -> bool | None:
    """True: some reloaded replica's checksums changed; False: every reloaded replica that reports
    them before and after reports the same ones; None: none does."""
    pairs = [(before[r.name][0], after[r.name][0]) for r in rows if r.reload.result == "ok"
             and before.get(r.name, (None,))[0] is not None and after.get(r.name, (None,))[0] is not None]
    if not pairs:
        return None
    return any(b.digest != a.digest for b, a in pairs if a is not None and b is not None)


def stale_reload(rows: list[WeightsReplica], version: str | None, changed: bool | None) -> bool:
    """No replica's weights changed, and the label asked for is one none of them carried: the folder
    holds the weights they already ran, and the new label would name old weights. (A label some
    replica carried before is the same update again, or the finish of one: nothing new expected.)"""
    return version is not None and changed is False and not any(
        r.version_before == version for r in rows if r.reload.result == "ok")


async def restore_labels(plan: WeightsPlan, by_name: dict[str, Replica], http: HttpPool,
                         rows: dict[str, WeightsReplica]) -> None:
    """Set each relabelled replica's label back to the one it carried before (read back)."""
    version = plan.options.version

    async def one(rp: ReplicaWeightsPlan, client: VllmClient) -> None:
        row = rows[rp.name]
        old = row.version_before
        if row.set_version.result != "ok" or old is None or old == version:
            return
        error = reset_answer_error(await set_version(client, old))
        row.label_restored = error is None
        row.label_restore_error = error

    await _each(plan, by_name, http, one)


async def read_after(plan: WeightsPlan, by_name: dict[str, Replica], http: HttpPool,
                     rows: dict[str, WeightsReplica]) -> None:
    """Each replica's label and window (serving, paused, asleep) after the update."""
    async def one(rp: ReplicaWeightsPlan, client: VllmClient) -> None:
        row = rows[rp.name]
        if rp.reports_version:
            try:
                row.version_after = await client.weight_info()
            except ServerError:
                row.version_after = None
        row.window, _ = await read_window(client, parse_version(rp.vllm_version or "0"))

    await _each(plan, by_name, http, one)


async def _each(plan: WeightsPlan, by_name: dict[str, Replica], http: HttpPool,
                func: Callable[[ReplicaWeightsPlan, VllmClient], Awaitable[None]]) -> None:
    opts = plan.reset.options
    sem = asyncio.Semaphore(max_concurrency(len(plan.replicas), opts.concurrency))

    async def guarded(rp: ReplicaWeightsPlan) -> None:
        if rp.error is None:
            async with sem, replica_client(by_name[rp.name], opts, http) as client:
                await func(rp, client)

    await asyncio.gather(*(guarded(rp) for rp in plan.replicas))


__all__ = ["Checksums", "read_after", "restore_labels", "set_version", "stale_reload", "weights_changed"]
