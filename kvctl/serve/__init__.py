"""`kvctl serve` and what runs a fleet: the spec and its checks, the local path (master process,
replicas, health), the Ray path (placement, actors, the run kept in the cluster), run records and
their lifecycle (stop, rm), processes, ports, CPU binding and the vLLM command line.

The names below stay importable from `kvctl.serve` (loaded on first use).
"""

from __future__ import annotations

from kvctl._faces import lazy_face

_FACE = {
    "ServeSpec": "kvctl.serve.spec", "ServeError": "kvctl.serve.spec", "check_spec": "kvctl.serve.spec",
    "start_run": "kvctl.serve.local", "stop_run": "kvctl.serve.lifecycle",
}

__getattr__, __dir__ = lazy_face(__name__, _FACE, globals())
