"""Generate kvctl/data/vllm_facts.json from vLLM's released Python sources (ast only, never imports vllm).

    python -m tools.capabilities            fetch (cached) + extract + write the facts file
    python -m tools.capabilities --offline  use only ~/.cache/kvctl/vllm-sources
    python -m tools.capabilities --check    exit 1 if the committed file is stale
"""

from __future__ import annotations

from pathlib import Path

from tools.capabilities import config_facts, connector_facts, env_facts, offload_args_facts, offload_facts, route_facts
from tools.capabilities import cli_facts
from tools.capabilities.merge import facts_at, strip_locations
from tools.capabilities.source import SourceTree

__all__ = ["snapshot", "facts_at", "strip_locations"]


def snapshot(source_root: Path) -> dict:
    """One release's facts from a directory that contains `vllm/`."""
    tree = SourceTree(Path(source_root))
    fields, config = config_facts.extract(tree)
    offload_specs, offload_connectors = offload_facts.extract(tree)
    env_vars, env_validation = env_facts.extract(tree)
    return {
        "fields": fields,
        "config": config,
        "connectors": connector_facts.extract(tree),
        "routes": route_facts.extract_routes(tree),
        "engine": route_facts.extract_engine(tree),
        "offload_specs": offload_specs,
        "offload_connectors": offload_connectors,
        "offload_args": offload_args_facts.extract(tree),
        "serve_flags": cli_facts.extract(tree),
        "env_vars": env_vars,
        "env_validation": env_validation,
    }
