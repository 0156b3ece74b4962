"""Connectors users load from outside vLLM by kv_connector_module_path whose code kvctl knows:
the vLLM V1 connectors Mooncake's wheel ships (kvctl/data/mooncake_facts.json, read from every
Mooncake release tag by tools/capabilities/mooncake_facts.py). Others stay unknown to kvctl."""

from __future__ import annotations

from dataclasses import dataclass

from kvctl.facts.capabilities import mooncake_facts


@dataclass(frozen=True)
class ExternalConnector:
    module: str
    name: str
    takes_kv_cache_config: bool  # in any Mooncake release
    reads_mooncake_config_path: bool  # in any Mooncake release
    where: str  # "Mooncake <first>-<newest> <file>:<line>", for messages


def known_external(module: str, name: str) -> ExternalConnector | None:
    """What Mooncake's releases say of connector `name` in `module`, or None when no release ships it."""
    spans = mooncake_facts().get("vllm_connectors", {}).get(f"{module}:{name}", {}).get("spans", [])
    if not spans:
        return None
    newest = mooncake_facts()["releases"][-1]
    where = f"Mooncake {spans[0]['since']}-{newest} {spans[-1]['file']}:{spans[-1]['line']}"
    return ExternalConnector(module, name, any(s["takes_kv_cache_config"] for s in spans),
                             any(s["reads_mooncake_config_path"] for s in spans), where)
