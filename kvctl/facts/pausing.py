"""What a vLLM release's /pause does to the requests that arrive while it lasts (from vllm_facts.json).

vLLM 0.33.0 answers each of them with a retryable RequestError "engine_paused" (HTTP 503) while the
engine is paused in mode abort or wait (EngineCore._reject_add_while_paused); keep, and every mode
before 0.33, queue them. The facts: engine/pause.rejects_new_requests (the rejecting function) and
its modes (evaluated from pause_generation's `reject_new_requests = mode != "keep"`).
"""

from __future__ import annotations

from packaging.version import Version

from kvctl.facts.capabilities import _interval_at, table
from kvctl.facts.versions import parse_version

FACT = "pause.rejects_new_requests"


# Read in vLLM 0.33.0: OutputProcessor.process_outputs hands a request rejected on arrival its error and
# `continue`s before _update_stats_from_finished, so vllm:request_success{finished_reason="error"} and every
# other metric miss it (the rejection itself is not logged either, core.py:1796).
REJECTED_UNCOUNTED = ("vLLM counts none of them (vllm/v1/engine/output_processor.py:765 finishes a request rejected "
                      "on arrival before any metric), so only the clients that got the 503 know")


def pause_rejects(version: str | Version, mode: str) -> bool:
    """Does a /pause in `mode` make `version` answer every new request with 503 engine_paused until
    /resume, instead of queueing it?"""
    entry = table().facts.get("engine", {}).get(FACT, {})
    row = _interval_at(entry.get("modes", {}).get("values", []), parse_version(version))
    return row is not None and mode in (row.get("value") or ())


def pause_rejection_source(version: str | Version) -> str | None:
    """'vllm/v1/engine/core.py:1796' (where the facts read it) for a release that rejects, else None."""
    row = _interval_at(table().facts.get("engine", {}).get(FACT, {}).get("spans", []), parse_version(version))
    return None if row is None else f"{row.get('file', '?')}:{row.get('line', '?')}"


__all__ = ["REJECTED_UNCOUNTED", "pause_rejection_source", "pause_rejects"]
