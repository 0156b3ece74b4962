"""Does this machine hold the Mooncake memory of the fleet about to start?

vLLM's MooncakeStoreConnector creates one store client per worker rank (store/worker.py:1419 in
0.32.0: every TP/PP rank runs its own), and each contributes `global_segment_size` to the pool (in
embedded mode; 0 in standalone-store) and allocates `local_buffer_size` for its transfers, both
counted per rank, not per server; a key left out takes vLLM's default (4 GiB each,
vllm/distributed/mooncake_store.py:12-13 in 0.32.0). With `protocol: rdma` both are registered with
the NIC, which pins them: the locked-memory limit (`ulimit -l`) of each rank must hold them.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass
from typing import Any

from kvctl.errors import UsageError
from kvctl.facts.sizes import parse_size

VLLM_DEFAULT_SIZE = 4 * 1024**3  # global_segment_size and local_buffer_size when mooncake.json omits them


@dataclass(frozen=True)
class MooncakeMemory:
    per_rank: int  # bytes one worker rank allocates for Mooncake
    ranks: int  # worker ranks on this machine, all replicas together
    pinned: bool  # registered with an RDMA NIC (protocol rdma)

    @property
    def total(self) -> int:
        return self.per_rank * self.ranks


def mooncake_memory(mooncake: dict[str, Any] | None, replicas: int, ranks_per_replica: int) -> MooncakeMemory | None:
    """What the fleet's Mooncake store clients take on this machine (None: the layout has no mooncake.json)."""
    if not mooncake:
        return None
    segment = 0 if mooncake.get("mode") == "standalone-store" else _size(mooncake, "global_segment_size")
    per_rank = segment + _size(mooncake, "local_buffer_size")
    return MooncakeMemory(per_rank, replicas * ranks_per_replica, str(mooncake.get("protocol", "rdma")) == "rdma")


def check_host_memory(need: MooncakeMemory | None, available: int | None = None,
                      memlock: int | None = None) -> None:
    """Refuse a fleet whose Mooncake memory this machine cannot hold, or cannot pin for RDMA."""
    if need is None or need.total == 0:
        return
    if available is None:
        import psutil

        available = int(psutil.virtual_memory().available)
    sizes = (f"{need.ranks} worker rank(s) x {_gib(need.per_rank)} (global_segment_size + local_buffer_size, "
             "per rank: every tensor/pipeline parallel rank runs its own Mooncake client)")
    if need.total > available:
        raise UsageError(f"the fleet's Mooncake memory, {sizes} = {_gib(need.total)}, is more than this machine has "
                         f"available ({_gib(available)})",
                         "lower --set global_segment_size / local_buffer_size (they are per rank), or --replicas")
    if need.pinned:
        limit = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0] if memlock is None else memlock
        if limit != resource.RLIM_INFINITY and limit < need.per_rank:
            raise UsageError(f"protocol rdma pins {_gib(need.per_rank)} per worker rank, but the locked-memory limit "
                             f"here is {_gib(limit)} (ulimit -l)",
                             "raise it (ulimit -l unlimited; in a container --ulimit memlock=-1; in systemd "
                             "LimitMEMLOCK=infinity), or use protocol tcp")


def _size(mooncake: dict[str, Any], key: str) -> int:
    value = mooncake.get(key)
    return VLLM_DEFAULT_SIZE if value is None else parse_size(value)


def _gib(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB" if n >= 1024**3 else f"{n / 1024**2:.0f} MiB"
