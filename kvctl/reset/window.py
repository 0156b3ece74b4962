"""The window a reset runs in: what each replica is doing when kvctl arrives.

An RL trainer hands a reset whatever state its loop is in (DESIGN.md, "Inside the training loop"):
a replica may be serving (idle or generating), paused by its owner (verl's abort_all_requests ->
pause_generation; prime-rl's `/pause?mode=keep`), or asleep (verl's hybrid engines in trainer mode).
A paused or sleeping replica must never get a generation request: with `mode=keep` it queues it
until the owner resumes (a canary then waits out its timeout: 181 s and a failure on vLLM 0.24,
FACTS.md section 9), and vLLM 0.33 rejects it with 503 in the other modes.

What the window allows to prove:
- serving: the canary (a prompt cached before the reset shows no cached token after it); the
  master's key count is proof only when nothing writes meanwhile (kvctl paused the fleet);
- paused or asleep: no request, so the store is proven by the master's count (nothing writes) and
  the content check waits for the owner's resume (`kvctl evidence check`).

Nothing here sends anything but the two read-only routes /is_paused and /is_sleeping.
"""

from __future__ import annotations

from typing import Literal

from packaging.version import Version

from kvctl.facts.capabilities import table
from kvctl.transport.vllm_client import CallOutcome, VllmClient

Window = Literal["serving", "paused", "asleep", "unknown"]

# Where a replica cannot be sent a generation request
NO_REQUESTS: tuple[Window, ...] = ("paused", "asleep")


async def read_window(client: VllmClient, version: Version) -> tuple[Window, str | None]:
    """The replica's window, and why when it is "unknown" (a route missing or failing: the replica is
    then treated as serving, as every kvctl before this one did)."""
    notes = []
    if table().has(version, "http.sleep"):
        asleep = _flag(await client.is_sleeping(), "is_sleeping")
        if asleep is True:
            return "asleep", None
        if asleep is None:
            notes.append("/is_sleeping gave no answer")
    if table().has(version, "http.pause"):
        paused = _flag(await client.is_paused(), "is_paused")
        if paused is True:
            return "paused", None
        if paused is None:
            notes.append("/is_paused gave no answer")
    else:
        notes.append(f"vLLM {version} has no /is_paused (first in {table().capability('http.pause').span.since})")
    return ("unknown", "; ".join(notes)) if notes else ("serving", None)


def _flag(outcome: CallOutcome, key: str) -> bool | None:
    body = outcome.body if outcome.ok and isinstance(outcome.body, dict) else {}
    value = body.get(key)
    return value if isinstance(value, bool) else None


def accepts_requests(window: str | None) -> bool:
    return window not in NO_REQUESTS


def describe(window: str | None) -> str:
    return {"paused": "paused by its owner", "asleep": "asleep (its owner put it to sleep)",
            "serving": "serving", "unknown": "serving (its pause state is unknown)"}.get(window or "", "unknown")


__all__ = ["NO_REQUESTS", "Window", "accepts_requests", "describe", "read_window"]
