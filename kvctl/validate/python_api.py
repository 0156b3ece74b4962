"""Checks of vLLM Python API use found in scripts (KVTransferConfig.from_cli, ...) against one
vLLM release. The readers record the calls (Artifact.calls); which releases have them is here."""

from __future__ import annotations

from packaging.version import Version

from kvctl.facts.capabilities import Span
from kvctl.validate.model import Artifact, Collector, Problem
from kvctl.validate.readers.python_source import FROM_CLI

# KVTransferConfig.from_cli(cli_value) -> model_validate_json: vllm/config.py:3288 in 0.8.5 and
# 0.8.5.post1; 0.9.0 made KVTransferConfig a @config dataclass (vllm/config.py:3505) without it
# (its CLI value is read as KVTransferConfig(**json.loads(text)), vllm/config.py:170-172),
# and no later release has it (vllm/config/kv_transfer.py from 0.11.0 included). Kept here, not in
# capabilities.yaml, whose rows are the server capabilities docs/compat.md tabulates.
FROM_CLI_SPAN = Span(None, "0.9.0")


def check_python_api(artifact: Artifact, v: Version) -> list[Problem]:
    """Problems vLLM `v` has with how the script built this artifact."""
    out = Collector(artifact.lines)
    if FROM_CLI in artifact.calls and not FROM_CLI_SPAN.contains(v):
        out.error(FROM_CLI if FROM_CLI in artifact.lines else artifact.where,
                  f"{FROM_CLI} is gone since vLLM {FROM_CLI_SPAN.until} (the last release with it is "
                  f"0.8.5.post1): on vLLM {v} the script fails with AttributeError: type object "
                  "'KVTransferConfig' has no attribute 'from_cli' before vLLM starts",
                  "build it with KVTransferConfig(**json.loads(text)), or pass the dict itself "
                  "(LLM(..., kv_transfer_config={...}))")
    return out.problems
