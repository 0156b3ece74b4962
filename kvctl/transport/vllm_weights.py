"""vLLM's weight answers, parsed: /weight_info's version and /weight_checker's per-worker checksums.

vLLM 0.32's /weight_checker {"action": "checksum"} (vllm/entrypoints/rl/online/api_router.py:229-263)
merges every worker's `compute_weight_checksums()` into one flat object. Each worker prefixes its keys
with its ranks, `dp{dp}:pp{pp}:pcp{pcp}:tp{tp}:` (vllm/v1/worker/gpu_worker.py:367-378 of the 0.32.0
wheel), before the parameter name, and each value is the sha256 of that parameter's bytes
(vllm/model_executor/model_loader/weight_checksum.py). Tensor- and pipeline-parallel workers hold
different shards; data- and context-parallel (dp, pcp) workers hold copies, so their checksums of one
shard must agree, except a MoE layer's experts, which vLLM shards across dp x pcp x tp
(FusedMoEParallelConfig.make, vllm/model_executor/layers/fused_moe/config.py:1189-1199 of the wheel).
A replica's digest is one short hash over its shards, comparable between replicas of the same
parallel layout.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from packaging.version import Version

from kvctl.facts.capabilities import table
from kvctl.transport.vllm_client import ServerError, VllmClient

DIGEST_CHARS = 12
# The rank fields that hold copies of the same shard (data and prefill-context parallel).
_COPY_RANKS = ("dp", "pcp")
_RANK = re.compile(r"([a-z]+)(\d+)")
_EXPERTS = re.compile(r"(^|\.)experts\.")  # FusedMoE modules are named `experts` in vLLM's models


@dataclass(frozen=True)
class WeightChecksums:
    """One replica's /weight_checker checksums, summarised."""

    digest: str  # DIGEST_CHARS hex characters over every shard's checksum
    parameters: int  # checksummed tensors, over all workers
    workers: int  # distinct rank prefixes
    # Shards whose copies (dp/pcp workers) differ: the replica itself serves from two sets of weights.
    disagreeing: list[str] = field(default_factory=list)

    @property
    def workers_agree(self) -> bool:
        return not self.disagreeing


def split_rank(key: str) -> tuple[dict[str, str], str]:
    """'dp0:pp0:pcp0:tp1:model.w' -> ({'dp': '0', 'pp': '0', 'pcp': '0', 'tp': '1'}, 'model.w').

    Leading `<letters><digits>:` fields are ranks; the rest is the parameter name (which may hold
    colons of its own only after them). A key without rank fields is one worker's bare name."""
    ranks: dict[str, str] = {}
    rest = key
    while ":" in rest:
        head, tail = rest.split(":", 1)
        match = _RANK.fullmatch(head)
        if match is None:
            break
        ranks[match.group(1)] = match.group(2)
        rest = tail
    return ranks, rest


def summarise_checksums(checksums: dict[str, str]) -> WeightChecksums:
    """Collapse the copies (dp, pcp ranks) of each shard and hash what is left into one digest."""
    shards: dict[str, set[str]] = {}
    workers: set[str] = set()
    for key, value in checksums.items():
        ranks, name = split_rank(key)
        workers.add(":".join(f"{k}{v}" for k, v in ranks.items()))
        copies = () if _EXPERTS.search(name) else _COPY_RANKS
        shard = ":".join(f"{k}{v}" for k, v in ranks.items() if k not in copies)
        shards.setdefault(f"{shard}:{name}" if shard else name, set()).add(str(value))
    disagreeing = sorted(name for name, values in shards.items() if len(values) > 1)
    lines = "\n".join(f"{name}={','.join(sorted(values))}" for name, values in sorted(shards.items()))
    digest = hashlib.sha256(lines.encode()).hexdigest()[:DIGEST_CHARS]
    return WeightChecksums(digest, len(checksums), len(workers), disagreeing)


# -- one replica's weights -------------------------------------------------------------------
@dataclass
class WeightState:
    """What one replica says of its weights: the version label, and a digest of its checksums."""

    version: str | None = None  # /weight_info's weight_version; None: not known (see `unknown`)
    unknown: str | None = None  # why the version is not known, e.g. "vLLM 0.26.0 has no /weight_info"
    digest: str | None = None  # summarise_checksums(...).digest; None: not read (see `digest_note`)
    digest_note: str | None = None  # why there is no digest, when one was asked for
    workers: int | None = None  # workers whose checksums the digest covers
    disagreeing: list[str] = field(default_factory=list)  # shards whose dp/pcp copies differ

    @property
    def version_text(self) -> str:
        return self.version if self.version is not None else f"unknown ({self.unknown})"

    @property
    def note(self) -> str | None:
        """Why the version (or the digest asked for) is not known, in one line."""
        return "; ".join(n for n in (self.unknown, self.digest_note) if n) or None


async def read_weight_state(client: VllmClient, version: Version, *, checksums: bool) -> WeightState:
    """/weight_info (and, with `checksums`, /weight_checker) of one replica, asked only where its vLLM
    release has the route. Never raises for a failed answer: it lands in `unknown`/`digest_note`."""
    state = WeightState()
    missing = _missing(version, "http.weight_info", "/weight_info")
    if missing:
        state.unknown = missing
    else:
        try:
            state.version = await client.weight_info()
            if state.version is None:
                state.unknown = "/weight_info answered 404 (dev mode off? it needs VLLM_SERVER_DEV_MODE=1)"
        except ServerError as exc:
            state.unknown = f"/weight_info failed: {exc.message}"
    if not checksums:
        return state
    missing = _missing(version, "http.weight_checker", "/weight_checker")
    if missing:
        state.digest_note = missing
        return state
    try:
        found = await client.weight_checksums()
    except ServerError as exc:
        state.digest_note = f"/weight_checker failed: {exc.message}"
        return state
    if found is None:
        state.digest_note = "/weight_checker answered 404 (dev mode off?)"
        return state
    summary = summarise_checksums(found)
    state.digest, state.workers, state.disagreeing = summary.digest, summary.workers, summary.disagreeing
    return state


def _missing(version: Version, capability: str, route: str) -> str | None:
    """Why `version` cannot answer `route` (the capability table says so), or None: ask it."""
    if table().has(version, capability):
        return None
    since = table().capability(capability).span.since
    return f"vLLM {version} has no {route}" + (f" (first in {since})" if since and since != "never" else "")


# -- a fleet's weights --------------------------------------------------------------------------
@dataclass(frozen=True)
class WeightRow:
    """One replica as the mixed-weights check sees it. `namespace`: the cache namespace its KV
    lives in (see `namespace_of`); None: it shares no store with anyone."""

    name: str
    namespace: str | None
    version: str | None
    digest: str | None = None
    disagreeing: int = 0


def namespace_of(layout: list[str] | None, served_prefix: str | None, fleet_prefix: str | None,
                 fleet_has_master: bool) -> str | None:
    """The cache namespace a replica's KV shares with the rest of its fleet, or None when it shares
    none. A fleet's replicas talk to the fleet's master; on it, keys are `<cache_prefix>@<hash>` (or
    the bare hash), so one namespace is one cache_prefix. A replica that names no store-backed
    connector (layout [], or P2P connectors only) keeps its KV to itself; one whose layout is not
    known shares the fleet's namespace only when the fleet names its master."""
    if layout is None:
        return (fleet_prefix or "") if fleet_has_master else None
    t = table()
    stores = [n for n in layout if n != "MultiConnector" and (t.connector(n) is None or t.connector(n).store != "none")]
    if not stores:
        return None
    return served_prefix if served_prefix is not None else (fleet_prefix or "")


@dataclass(frozen=True)
class MixedWeights:
    """Replicas whose KV mixes in one store although it comes from different weights."""

    problem: str  # one sentence: which replicas, which versions or digests
    replicas: list[str]  # every replica of the namespace (or the one whose workers disagree)


def mixed_weights(rows: Iterable[WeightRow]) -> list[MixedWeights]:
    """Each cache namespace whose replicas serve different weights: different versions or, where
    they have one, different digests; [] when none. A replica whose own workers disagree is named too
    (it mixes on its own). Replicas whose weights are not known are not judged."""
    groups: dict[str, list[WeightRow]] = {}
    found: list[MixedWeights] = []
    for row in rows:
        if row.disagreeing:
            found.append(MixedWeights(f"{row.name}'s workers hold different weights ({row.disagreeing} shard(s) "
                                      "differ between its data/context-parallel copies)", [row.name]))
        if row.namespace is not None:
            groups.setdefault(row.namespace, []).append(row)
    for namespace, members in sorted(groups.items()):
        where = f"cache_prefix '{namespace}'" if namespace else "the master's unprefixed keys"
        for what, values in (("weight versions", {r.name: r.version for r in members if r.version is not None}),
                             ("weight checksums", {r.name: r.digest for r in members if r.digest is not None})):
            if len(set(values.values())) > 1:
                listed = ", ".join(f"{name}={value}" for name, value in values.items())
                found.append(MixedWeights(f"replicas sharing {where} run different {what} ({listed}): their KV "
                                          "mixes in one store", [r.name for r in members]))
                break  # different versions say it; their checksums differ too
    return found


__all__ = ["DIGEST_CHARS", "MixedWeights", "WeightChecksums", "WeightRow", "WeightState", "mixed_weights",
           "namespace_of", "read_weight_state", "split_rank", "summarise_checksums"]
