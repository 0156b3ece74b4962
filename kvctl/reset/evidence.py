"""Evidence taken before a weight update, checked after it: content proof across a training step.

A trainer often hands kvctl its fleet paused (verl pauses before a weight sync) or asleep, where no
canary may be sent, and a canary primed after the update proves only that the new weights' KV is
gone, not the old. So the proof is split: `take_evidence()` primes a canary on every serving replica
while it still serves the old weights; after the update and the reset, the same prompt must show no
cached token (local or loaded from Mooncake). A hit is KV computed before the reset: STALE.

A canary is checked once: its check caches the prompt again. The Evidence remembers which ones were
checked, so a reset on a paused fleet leaves the rest for `kvctl evidence check` after the resume.
It is plain JSON (`save`/`load`): the CLI carries it between `kvctl evidence take`, `kvctl reset
--evidence` and `kvctl evidence check`. It holds prompts and addresses, never a key or a token.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvctl.errors import UsageError
from kvctl.reset.plan import ResetOptions, replica_client
from kvctl.reset.verify import Canary
from kvctl.reset.window import accepts_requests, describe, read_window
from kvctl.targets import Fleet, Replica
from kvctl.transport.pool import HttpPool, max_concurrency, shared_pool
from kvctl.transport.vllm_client import ServerError

FORMAT = "kvctl-evidence/1"


@dataclass
class ReplicaEvidence:
    url: str
    name: str
    window: str | None
    canary: Canary | None = None
    note: str | None = None  # why there is no usable canary
    checked_at: float | None = None  # when its canary was checked (it cannot be checked twice)

    @property
    def usable(self) -> bool:
        return self.canary is not None and self.canary.error is None and self.checked_at is None


@dataclass
class Evidence:
    taken_at: float
    replicas: dict[str, ReplicaEvidence] = field(default_factory=dict)  # by replica URL
    seconds: float = 0.0  # what taking it cost

    def canary_for(self, url: str) -> Canary | None:
        """The replica's canary when it can still prove something (primed, not yet checked)."""
        entry = self.replicas.get(url)
        return entry.canary if entry is not None and entry.usable else None

    def why_none(self, url: str) -> str:
        entry = self.replicas.get(url)
        if entry is None:
            return "the evidence holds no canary for it (it joined the fleet after the evidence was taken)"
        if entry.checked_at is not None:
            return "its canary was already checked (a canary proves one reset: take new evidence before the next update)"
        return entry.note or (entry.canary.error if entry.canary and entry.canary.error else "no canary")

    def mark_checked(self, url: str) -> None:
        if url in self.replicas:
            self.replicas[url].checked_at = time.time()

    @property
    def unchecked(self) -> list[str]:
        return [url for url, e in self.replicas.items() if e.usable]

    # -- JSON ------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "taken_at": self.taken_at, "seconds": self.seconds,
                "replicas": [asdict(e) for e in self.replicas.values()]}

    @classmethod
    def from_dict(cls, data: Any, where: str = "evidence") -> Evidence:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise UsageError(f"{where} is not kvctl evidence (no \"format\": \"{FORMAT}\")",
                             "take it before the weight update with kvctl evidence take (or kvctl.take_evidence())")
        try:
            entries = [ReplicaEvidence(**{**e, "canary": Canary(**e["canary"]) if e.get("canary") else None})
                       for e in data["replicas"]]
            return cls(float(data["taken_at"]), {e.url: e for e in entries}, float(data.get("seconds", 0.0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"{where} is damaged: {exc}", "take the evidence again before the next update") from None

    def save(self, path: str | Path) -> None:
        """Written whole or not at all (a temporary file renamed over the old one)."""
        target = Path(path)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or ".")
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(self.to_dict(), out, indent=1)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: str | Path) -> Evidence:
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise UsageError(f"no evidence file {path}", "take it before the weight update with kvctl evidence "
                                                         "take") from None
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read the evidence {path}: {exc}") from None
        return cls.from_dict(data, str(path))


async def take_evidence(fleet: Fleet, options: ResetOptions, http: HttpPool | None = None) -> Evidence:
    """Prime a canary on every serving replica (never one paused by its owner or asleep)."""
    started = time.perf_counter()
    sem = asyncio.Semaphore(max_concurrency(len(fleet.replicas), options.concurrency))
    async with shared_pool(http, len(fleet.replicas)) as shared:

        async def one(replica: Replica) -> ReplicaEvidence:
            async with sem, replica_client(replica, options, shared) as client:
                return await _evidence_of(replica, client, options)

        entries = await asyncio.gather(*(one(r) for r in fleet.replicas))
    return Evidence(time.time(), {e.url: e for e in entries}, round(time.perf_counter() - started, 6))


async def _evidence_of(replica: Replica, client: Any, options: ResetOptions) -> ReplicaEvidence:
    try:
        version = await client.version()
    except ServerError as exc:
        return ReplicaEvidence(replica.url, replica.name, None, note=f"cannot read its version: {exc.message}")
    window, _ = await read_window(client, version)
    if not accepts_requests(window):
        return ReplicaEvidence(replica.url, replica.name, window,
                               note=f"{describe(window)} when the evidence was taken: no canary was sent "
                                    "(take the evidence while the fleet still serves the old weights)")
    canary = await Canary.prime(client, options, version)
    return ReplicaEvidence(replica.url, replica.name, window, canary, note=canary.error)


__all__ = ["Evidence", "ReplicaEvidence", "take_evidence"]
