"""What each replica is left running after a weight update, in one sentence, and the commands that
finish or undo what did not complete (the receipt's `state` and `next_steps`)."""

from __future__ import annotations

import shlex

from kvctl.targets import Fleet
from kvctl.weights.receipt import WeightsReceipt, WeightsReplica, found_paused


def describe(row: WeightsReplica, receipt: WeightsReceipt, fleet: Fleet) -> None:
    """Fill `row.state` and `row.next_steps` from its outcome."""
    resume = f"curl -X POST {row.url}/resume"
    redo = update_command(receipt, fleet, [row.url])
    if receipt.interrupted:
        row.state = f"{_reload_words(row)}; {_resumed_words(row)}"
        row.next_steps = [f"finish the update of the whole fleet: {update_command(receipt, fleet, None)}"]
        if "NOT confirmed" in row.state:
            row.next_steps.append(f"resume it: {resume}")
        return
    if row.updated:
        label = f" (version {row.version_after})" if row.version_after else ""
        row.state = f"runs the new weights{label}, caches cleared{_serving(row)}"
        if row.window == "paused":
            row.next_steps = [f"resume it when it may serve: {resume}"]
        return
    undo = undo_step(receipt, fleet)
    if row.reload.result == "failed" or row.set_version.result == "failed":
        what = "its reload failed" if row.reload.result == "failed" else "reloaded, but its version label was not set"
        if not receipt.plan.options.resume_failed:  # kvctl kept it paused
            row.state = f"kept paused: {what}; it serves nothing until resumed"
            row.next_steps = [f"finish: {redo} (it finds the replica paused and leaves it so), then {resume}",
                              f"or {undo}, then {resume}"]
            if row.window == "serving":
                row.state = f"{what}; kvctl kept it paused, but its /is_paused says it serves: something resumed it"
                row.next_steps = [f"finish: {redo}", f"or {undo}"]
            if row.reload.result == "failed" and row.window != "serving":
                # vLLM 0.32's reload_weights moves every layer to the meta device before it reads a weight
                # (model_executor/model_loader/reload/inplace.py:84-95): a failed one leaves no weights at all
                row.state += " (a failed in-place reload can leave it with no weights loaded: do not resume it as is)"
            elif row.reload.result != "failed" and row.window != "serving":
                row.next_steps.append(f"or serve it as it is (the new weights, its version label unset): {resume}")
        else:
            row.state = (f"{what}; not kept paused (--resume-failed){_serving(row)}: it may serve other weights "
                         "than the others")
            row.next_steps = [f"finish: {redo}", f"or {undo}"]
        return
    if row.error and ("differ from the other replicas'" in row.error or "workers hold different" in row.error):
        row.state = f"reloaded, but its weights differ from the others'{_serving(row)}"
        row.next_steps = [f"reload it again: {redo}"]
        return
    if row.error and "did not change" in row.error:
        label = (f"its label set back to {row.version_before!r}" if row.label_restored
                 else f"its label NOT set back ({row.label_restore_error})" if row.label_restore_error else "")
        row.state = ("reloaded, but its weights did not change: it runs the weights it ran before"
                     + (f", {label}" if label else "") + f", caches cleared{_serving(row)}")
        row.next_steps = [(f"put the new weights in the folder on every server (check its *.safetensors), then: "
                           f"{update_command(receipt, fleet, None)}")]
        return
    if row.error and "after the update, not" in row.error:
        row.state = f"reloaded and its caches cleared, but {row.error.removeprefix('its ')}"
        row.next_steps = [f"label it again: {redo}"]
        return
    if row.reload.result == "ok":
        row.state = (f"runs the new weights, but its caches were NOT confirmed clear{_serving(row)}: it may serve KV "
                     "of the old ones")
        row.next_steps = [f"clear them: {reset_command(fleet, row.url, receipt.verify)}"]
        return
    row.state = (f"not reloaded: runs the weights it ran before{_serving(row) if row.window else ''}"
                 + ("" if not row.error else f" ({row.error})"))
    row.next_steps = [f"update it: {redo}"]


def _serving(row: WeightsReplica) -> str:
    """Whether it serves, as its /is_paused (and /is_sleeping) said after the update, else as kvctl's resume did."""
    if row.window == "serving":
        return ", serving"
    if row.window == "paused":
        return (", paused (it was paused before the update; kvctl left it so): it serves nothing until resumed"
                if found_paused(row) else ", paused: it serves nothing until resumed")
    if row.window == "asleep":
        return ", asleep: it serves nothing until woken up"
    ops = row.reset.ops if row.reset is not None else []
    if any(o.op == "resume" and o.result == "ok" for o in ops):
        return ", resumed by kvctl (/is_paused gave no answer after it)"
    return ", whether it serves is not known (/is_paused gave no answer)"


def _reload_words(row: WeightsReplica) -> str:
    state = row.reload.result
    if state == "ok":
        return "reloaded before the signal, but its caches were not confirmed clear"
    if state == "interrupted":
        return "its reload was in flight when the signal came: it may still complete on the server"
    if state == "failed":
        return f"its reload failed ({row.reload.error})"
    return "not reloaded (the signal came first): it runs the weights it ran before"


def _resumed_words(row: WeightsReplica) -> str:
    ops = row.reset.ops if row.reset is not None else []
    resumed = next((o for o in ops if o.op == "resume"), None)
    if resumed is None:
        return "not paused by kvctl"
    return "resumed" if resumed.result == "ok" else f"NOT confirmed resumed: {resumed.error}"


def _targets(fleet: Fleet, urls: list[str] | None) -> list[str]:
    words: list[str] = []
    for url in urls if urls is not None else [r.url for r in fleet.replicas]:
        words += ["--url", url]
    if fleet.masters:
        words += ["--master", ",".join(fleet.masters)]
    if fleet.master_rpcs:
        words += ["--master-rpc", ",".join(fleet.master_rpcs)]
    return words


PREVIOUS = "PREVIOUS_WEIGHTS"  # the shell variable the undo reads its folder from


def undo_step(receipt: WeightsReceipt, fleet: Fleet) -> str:
    """`undo (...): <command>`: the whole fleet back to the weights (and label) it ran before. Every
    replica, not only the one that failed: the others run the new weights, and a fleet on two sets of
    weights in one cache namespace is what the update prevents (a replica that did not change reloads
    what it runs). kvctl does not know that folder (the one each server started with or last reloaded
    from), so the command reads it from $PREVIOUS_WEIGHTS, named outside it: nothing in the command is
    a placeholder a shell would take for a redirection, and an unset variable is refused (an empty --from)."""
    labels = {r.version_before for r in receipt.replicas}
    label = next(iter(labels)) if len(labels) == 1 else None
    words = ["kvctl", "weights", "update", "--from"]
    tail = (["--version", label] if label is not None else []) + \
        (["--remote-path"] if receipt.plan.options.remote_path else []) + _targets(fleet, None)
    command = " ".join(words) + f' "${PREVIOUS}" ' + " ".join(shlex.quote(w) for w in tail)
    what = f"version {label}" if label is not None else ("their labels before differed: "
                                                          + ", ".join(sorted(str(v) for v in labels)))
    return f"undo, the whole fleet (set {PREVIOUS} to the folder of the weights it ran before, {what}): {command}"


def update_command(receipt: WeightsReceipt, fleet: Fleet, urls: list[str] | None) -> str:
    """`kvctl weights update` of this update's folder and label for these replicas (all: None)."""
    targets = " ".join(shlex.quote(w) for w in _targets(fleet, urls))
    words = ["kvctl", "weights", "update", "--from", receipt.weights_path]
    if receipt.version:
        words += ["--version", receipt.version]
    if receipt.plan.options.remote_path:
        words.append("--remote-path")
    return " ".join(shlex.quote(w) for w in words) + " " + targets


def reset_command(fleet: Fleet, url: str, verify: bool) -> str:
    words = ["kvctl", "reset", "--connector"] + (["--verify"] if verify else []) + _targets(fleet, [url])
    return " ".join(shlex.quote(w) for w in words)


__all__ = ["describe", "reset_command", "undo_step", "update_command"]
