"""Does a per-version cache_salt isolate every tier of a deployment? The facts, per release and connector.

Loops that generate while they train salt each request with its weight version instead of resetting
(DESIGN.md, "Versioned caches"). Whether that isolates versions depends on the release (does the
request take cache_salt at all) and on each tier: vLLM's local prefix cache mixes the salt into its
block hashes; a connector honours it when its keys are those hashes, ignores it when it keys by
tokens (LMCache), hands it to an external server, or is no cache at all (a P/D transfer by request
id). The per-connector facts are capabilities.yaml's `salt_tiers`, each checked against the keys
vLLM's own sources build (vllm_facts.json `salt_keys`, tests/unit/facts/test_salt_facts.py).
`kvctl salt check` proves the same on a live fleet.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any, Literal

from packaging.version import Version

from kvctl import yamlio
from kvctl.facts.capabilities import _read, table

Salt = Literal["honours", "ignores", "not-a-cache", "external", "children", "unknown"]
WORDS: dict[str, str] = {
    "honours": "its keys carry the salt (vLLM's block hashes)",
    "ignores": "IGNORES the salt: its keys come from the tokens alone",
    "not-a-cache": "not a cache: a P/D transfer by request id, nothing reused across requests",
    "external": "hands the salt to an external cache server, whose keys decide",
    "unknown": "not in kvctl's salt facts",
}


@dataclass(frozen=True)
class SaltTier:
    name: str
    salt: Salt
    keys: str  # what vllm_facts.json's salt_keys must say: block_hashes, cache_salt, none, any
    source: str


@lru_cache(maxsize=1)
def salt_tiers() -> dict[str, SaltTier]:
    """capabilities.yaml's `salt_tiers`, by connector name."""
    rows = yamlio.safe_load(_read("capabilities.yaml")).get("salt_tiers") or []
    return {r["name"]: SaltTier(r["name"], r["salt"], str(r["keys"]), r["source"]) for r in rows}


@dataclass
class TierAnswer:
    tier: str  # "local prefix cache" or a connector's name
    salt: Salt
    detail: str
    source: str


@dataclass
class SaltAssessment:
    takes_salt: bool  # POST /v1/completions takes cache_salt on this release
    tiers: list[TierAnswer] = field(default_factory=list)
    isolates: bool = False  # every tier honours the salt (not-a-cache tiers need nothing)
    verdict: str = ""
    fixes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def assess_salt(version: Version, leaves: list[str]) -> SaltAssessment:
    """For a deployment that salts each request with its weight version: does the salt isolate
    every tier on `version` with these connectors (MultiConnector replaced by its children)?"""
    t = table()
    out = SaltAssessment(takes_salt=t.has(version, "api.completions.cache_salt"))
    if not out.takes_salt:
        since = t.capability("api.completions.cache_salt").span.since
        chat = t.capability("api.chat_completions.cache_salt").span.since
        out.verdict = f"vLLM {version} takes no cache_salt on /v1/completions (first in {since}; /v1/chat/completions {chat})"
        out.fixes.append(f"upgrade vLLM to >= {since}, or reset after each weight update (kvctl reset --connector)")
        return out
    local = t.capability("engine.cache_salt_in_block_hash")
    out.tiers.append(TierAnswer("local prefix cache", "honours" if local.span.contains(version) else "unknown",
                                "the salt enters the first block hash, so every chained hash", local.source))
    for name in leaves:
        row = salt_tiers().get(name)
        salt: Salt = row.salt if row else "unknown"
        out.tiers.append(TierAnswer(name, salt, WORDS.get(salt, salt), row.source if row else ""))
    bad = [a for a in out.tiers if a.salt in ("ignores", "external", "unknown")]
    out.isolates = not bad
    if out.isolates:
        out.verdict = "salting isolates every tier" + (
            "" if all(a.salt == "honours" for a in out.tiers) else " (the P/D transfer is no cache)")
        return out
    ignores = [a.tier for a in bad if a.salt == "ignores"]
    unsure = [a.tier for a in bad if a.salt != "ignores"]
    parts = ([f"tier {', '.join(ignores)} ignores the salt"] if ignores else []) + (
        [f"tier {', '.join(unsure)}: isolation not known from vLLM's sources"] if unsure else [])
    out.verdict = "; ".join(parts)
    out.fixes.append("reset after each weight update (kvctl reset --connector), or move that tier to a "
                     "connector whose keys carry the salt (MooncakeStoreConnector, OffloadingConnector)")
    if unsure:
        out.fixes.append("prove it on the live fleet: kvctl salt check")
    out.fixes.append("when to salt and when to reset: docs/salting.md")
    return out


__all__ = ["SaltAssessment", "SaltTier", "TierAnswer", "assess_salt", "salt_tiers"]
