"""What kvctl's shipped facts cover: the vLLM and Mooncake releases they were read from (kvctl version).

Its own module, above capabilities (which imports versions): versions.py stays a leaf.
"""

from __future__ import annotations

from kvctl.facts.capabilities import load_facts, mooncake_facts


def facts_coverage() -> dict[str, dict[str, object]]:
    """The releases kvctl's shipped facts were read from, per project (vllm: kvctl/data/vllm_facts.json,
    mooncake: kvctl/data/mooncake_facts.json): first, last, count, every release, and how they were made.
    kvctl takes a release newer than the last to do what the last does."""
    out: dict[str, dict[str, object]] = {}
    for project, facts in (("vllm", load_facts()), ("mooncake", mooncake_facts())):
        releases = [str(r) for r in facts["releases"]]
        out[project] = {"first": releases[0], "last": releases[-1], "count": len(releases), "releases": releases,
                        "generated_by": facts.get("generated_by"), "source": facts.get("source")}
    return out
