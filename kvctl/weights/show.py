"""`kvctl weights show`: which weights each replica serves, and whether a shared store mixes them.

Per replica: its vLLM version, its weight version (GET /weight_info, 0.27+), a digest of its workers'
weight checksums (POST /weight_checker, 0.32+; asked unless told not to: vLLM hashes every weight for
it) and the cache namespace its KV lives in (its connector and cache_prefix from /server_info, else the
inventory's word). Replicas of one namespace serving different weights are flagged: their KV mixes in
one store. Reads only; nothing here prints.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from packaging.version import Version

from kvctl.errors import EXIT_FAILED, EXIT_OK
from kvctl.facts.capabilities import table
from kvctl.facts.compat import cache_prefix_of, layout_of
from kvctl.reset.plan import plain_data
from kvctl.targets import Fleet, Replica
from kvctl.transport.pool import HttpPool, max_concurrency, shared_pool
from kvctl.transport.vllm_client import ServerError, VllmClient
from kvctl.transport.vllm_weights import MixedWeights, WeightRow, WeightState, mixed_weights, namespace_of, \
    read_weight_state

SHOW_CONCURRENCY = 256  # replicas asked at once (as kvctl reset's default)


@dataclass
class ReplicaWeights:
    name: str
    url: str
    vllm_version: str | None = None
    weight_version: str | None = None  # None: not known (weight_note says why)
    digest: str | None = None  # of its workers' checksums; None: not read (weight_note says why)
    workers: int | None = None  # workers the digest covers
    disagreeing: list[str] = field(default_factory=list)  # shards whose dp/pcp copies differ
    weight_note: str | None = None
    connector: list[str] | None = None  # None: not known
    connector_source: str | None = None  # "server_info" | "inventory" | why unknown
    cache_prefix: str | None = None  # the one its server runs with (server_info)
    namespace: str | None = None  # the cache namespace it shares (None: none); "" = the unprefixed keys
    error: str | None = None  # could not be read at all


@dataclass
class WeightsReport:
    replicas: list[ReplicaWeights]
    mixed: list[MixedWeights]
    master: str | None
    cache_prefix: str | None
    checksums: bool  # whether digests were asked for
    elapsed_s: float = 0.0

    @property
    def exit_code(self) -> int:
        """1 when a namespace mixes weights or a replica could not be read; else 0."""
        return EXIT_FAILED if self.mixed or any(r.error for r in self.replicas) else EXIT_OK

    @property
    def ok(self) -> bool:
        return self.exit_code == EXIT_OK

    @property
    def summary(self) -> str:
        read = [r for r in self.replicas if r.error is None]
        versions = sorted({r.weight_version for r in read if r.weight_version is not None})
        parts = [f"{len(read)}/{len(self.replicas)} replica(s) read"]
        if versions:
            parts.append(f"weight version(s): {', '.join(versions)}")
        unknown = sum(1 for r in read if r.weight_version is None)
        if unknown:
            parts.append(f"{unknown} without a known version" + ("" if self.checksums and all(
                r.digest for r in read if r.weight_version is None) else " (not judged)"))
        if not self.checksums:
            parts.append("checksums not read (--no-checksums): replicas judged by their version labels only")
        elif any(r.digest is None for r in read):
            parts.append(f"{sum(1 for r in read if r.digest is None)} without checksums (see weight_note): "
                         "judged by their version labels only")
        if self.mixed:
            parts.append("MIXED WEIGHTS: " + "; ".join(m.problem for m in self.mixed))
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        data = plain_data(self)
        data.update(ok=self.ok, exit_code=self.exit_code, summary=self.summary, elapsed_s=round(self.elapsed_s, 4))
        return data


async def show_weights(fleet: Fleet, *, checksums: bool = True, timeout: float = 10.0, retries: int = 1,
                       http: HttpPool | None = None) -> WeightsReport:
    """Read every replica at once; one that cannot be read is reported in its row, never raised."""
    start = time.perf_counter()
    sem = asyncio.Semaphore(max_concurrency(len(fleet.replicas), SHOW_CONCURRENCY))
    async with shared_pool(http, len(fleet.replicas)) as shared:

        async def one(replica: Replica) -> ReplicaWeights:
            async with sem:
                return await replica_weights(replica, checksums, timeout, retries, shared)

        rows = list(await asyncio.gather(*(one(r) for r in fleet.replicas)))
    for row in rows:
        if row.error is None:
            row.namespace = namespace_of(row.connector, row.cache_prefix, fleet.cache_prefix, bool(fleet.masters))
    mixed = mixed_weights(WeightRow(r.name, r.namespace, r.weight_version, r.digest, len(r.disagreeing))
                          for r in rows if r.error is None)
    return WeightsReport(rows, mixed, fleet.master, fleet.cache_prefix, checksums, time.perf_counter() - start)


async def replica_weights(replica: Replica, checksums: bool, timeout: float, retries: int,
                          http: HttpPool) -> ReplicaWeights:
    row = ReplicaWeights(replica.name, replica.url)
    async with VllmClient(replica.url, timeout=timeout, retries=retries, api_key=replica.api_key(),
                          pool=http) as client:
        try:
            version = await client.version()
        except ServerError as exc:
            row.error = f"cannot read its version: {exc.message}"
            return row
        row.vllm_version = str(version)
        await _learn_connector(client, replica, version, row)
        _take(row, await read_weight_state(client, version, checksums=checksums))
    return row


async def _learn_connector(client: VllmClient, replica: Replica, version: Version, row: ReplicaWeights) -> None:
    """Its connector and cache_prefix: the server's /server_info where it has one, else the inventory's."""
    if table().has(version, "http.server_info"):
        try:
            config = await client.kv_transfer_config()
            row.connector, row.cache_prefix, row.connector_source = layout_of(config), cache_prefix_of(config), \
                "server_info"
            return
        except ServerError as exc:
            reason = f"unknown (/server_info: {exc.message})"
    else:
        reason = f"unknown (vLLM {version} has no /server_info)"
    if replica.connector:
        row.connector, row.connector_source = [replica.connector], "inventory"
    else:
        row.connector_source = reason


def _take(row: ReplicaWeights, state: WeightState) -> None:
    row.weight_version, row.digest, row.workers = state.version, state.digest, state.workers
    row.disagreeing, row.weight_note = list(state.disagreeing), state.note


__all__ = ["ReplicaWeights", "WeightsReport", "replica_weights", "show_weights"]
