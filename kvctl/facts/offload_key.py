"""One kv_connector_extra_config key an offloading spec or connector reads in one vLLM release
(from the offload_specs / offload_connectors sections of kvctl/data/vllm_facts.json)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class OffloadKey:
    name: str
    required: bool  # vLLM raises `message` at start without it
    when: str | None  # what counts as "without": absent | none | falsy (0 and "" too)
    message: str | None  # vLLM's words when required, or for a value outside `choices`
    cast: str | None  # int / float / bool / str(...) that vLLM applies to the value
    annotation: str | None
    default: str | None  # as vLLM's source writes it
    choices: tuple[str, ...]
    source: str  # "file:line in <release>"

    @classmethod
    def from_fact(cls, name: str, row: dict[str, Any], source: str) -> OffloadKey:
        return cls(name, bool(row.get("required")), row.get("when"),
                   row.get("message") or row.get("choices_message"), row.get("cast"), row.get("annotation"),
                   row.get("default"), tuple(row.get("choices", ())), source)
