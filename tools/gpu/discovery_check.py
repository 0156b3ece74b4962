#!/usr/bin/env python3
"""Does kvctl's GPU discovery (kvctl/serve/gpus.py) name the GPUs CUDA itself sees? (tools/gpu_check.sh part b)

kvctl reads nvidia-smi (index, UUID, MIG) and hands a replica nvidia-smi's index with
CUDA_DEVICE_ORDER=PCI_BUS_ID. This compares, for several CUDA_VISIBLE_DEVICES values (unset, "0",
GPU 0's UUID, a prefix of it, ""), what `visible_gpus(env)` returns with what torch enumerates in a
fresh process under the same environment (CUDA fixes its device list at the first CUDA call, so one
process per value): the count and the UUIDs in order. Then it checks that the value `allocate(1, 1, env)`
gives a replica makes torch see exactly the GPU kvctl meant, and that a process computing on GPU 0
(`nvidia-smi --query-compute-apps`) keeps allocate() off it.

Imports only kvctl.serve.gpus (stdlib only; psutil lazily, for allocate() with a process on the GPU)
and no torch itself: torch runs in the child processes.

    PYTHONPATH=. python tools/gpu/discovery_check.py [--python PY] [--json PATH]

Exit 0 with the report (its checks are data); 2 when kvctl.serve.gpus cannot be imported.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TORCH_VIEW = r"""
import json, torch
out = {"count": torch.cuda.device_count() if torch.cuda.is_available() else 0, "devices": []}
for i in range(out["count"]):
    p = torch.cuda.get_device_properties(i)
    uuid = str(getattr(p, "uuid", ""))
    out["devices"].append({"name": p.name, "uuid": ("GPU-" + uuid) if uuid and not uuid.startswith(("GPU-", "MIG-"))
                           else uuid, "pci_bus_id": getattr(p, "pci_bus_id", None)})
print(json.dumps(out))
"""
HOLD_GPU = "import sys, torch; torch.zeros(1, device='cuda'); print('ready', flush=True); sys.stdin.read()"
TORCH_TIMEOUT = 60


class Report:
    def __init__(self) -> None:
        self.checks: list[dict[str, Any]] = []

    def add(self, name: str, ok: bool | None, detail: str, **data: Any) -> None:
        """ok None: nothing to compare (no GPU)."""
        self.checks.append({"name": name, "ok": ok, "detail": detail, **data})
        mark = {True: "ok  ", False: "FAIL", None: "--  "}[ok]
        print(f"  [{mark}] {name}: {detail}", flush=True)


def import_gpus() -> tuple[Any, list[str]]:
    """kvctl.serve.gpus, and the non-stdlib modules importing it loaded (none expected: no typer, rich)."""
    before = set(sys.modules)
    import kvctl.serve.gpus as gpus

    stdlib = getattr(sys, "stdlib_module_names", frozenset())
    loaded = sorted({m.split(".")[0] for m in set(sys.modules) - before} - set(stdlib) - {"kvctl", "_distutils_hack"})
    return gpus, loaded


def torch_view(python: str, env: dict[str, str]) -> dict[str, Any]:
    """What torch enumerates in a fresh process under `env`."""
    try:
        done = subprocess.run([python, "-c", TORCH_VIEW], capture_output=True, text=True, env=env,
                              timeout=TORCH_TIMEOUT)
    except subprocess.TimeoutExpired:
        return {"error": f"torch did not answer within {TORCH_TIMEOUT} s"}
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1][:300]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def kvctl_view(gpus: Any, env: dict[str, str]) -> dict[str, Any]:
    try:
        units = gpus.visible_gpus(env)
    except Exception as exc:  # noqa: BLE001 - kvctl's UsageError (or a bug) is the finding
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"count": len(units), "devices": [{"index": u.index, "uuid": u.uuid, "name": u.name, "mig": u.mig,
                                              "cuda_id": u.cuda_id} for u in units]}


def env_with(base: dict[str, str], visible: str | None) -> dict[str, str]:
    env = dict(base, CUDA_DEVICE_ORDER="PCI_BUS_ID")  # what kvctl gives a replica (vllm_launch.replica_env)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    return env


def compare(report: Report, label: str, kvctl: dict[str, Any], torch: dict[str, Any]) -> None:
    data = {"kvctl": kvctl, "torch": torch}
    if "error" in kvctl or "error" in torch:
        both_refuse = "error" in kvctl and ("error" in torch or torch.get("count") == 0)
        report.add(label, both_refuse, f"kvctl: {kvctl.get('error', kvctl.get('count'))}; "
                   f"torch: {torch.get('error', torch.get('count'))}", **data)
        return
    mine = [d["uuid"] for d in kvctl["devices"]]
    theirs = [d["uuid"] for d in torch["devices"]]
    same = mine == theirs if all(theirs) else len(mine) == len(theirs)  # torch < 2.? has no uuid: count only
    report.add(label, same, f"kvctl {len(mine)} {mine}; torch {len(theirs)} {theirs}", **data)


def check_views(report: Report, gpus: Any, python: str, base: dict[str, str]) -> list[dict[str, Any]]:
    """kvctl against torch under each CUDA_VISIBLE_DEVICES value; returns kvctl's unset view's GPUs."""
    whole = kvctl_view(gpus, env_with(base, None))
    compare(report, "CUDA_VISIBLE_DEVICES unset", whole, torch_view(python, env_with(base, None)))
    devices = whole.get("devices", [])
    values: list[tuple[str, str]] = [("0", '"0"'), ("", '"" (no GPU)')]
    if devices and devices[0]["uuid"]:
        uuid = devices[0]["uuid"]
        values[1:1] = [(uuid, f"GPU 0's UUID {uuid}"), (uuid[:12], f"a UUID prefix {uuid[:12]}")]
    for value, label in values:
        env = env_with(base, value)
        compare(report, f"CUDA_VISIBLE_DEVICES={label}", kvctl_view(gpus, env), torch_view(python, env))
    return devices


def check_allocate(report: Report, gpus: Any, python: str, base: dict[str, str], first: dict[str, Any]) -> None:
    """allocate(1, 1) hands out a value under which torch sees the GPU kvctl meant."""
    env = env_with(base, None)
    try:
        value = gpus.allocate(1, 1, env)[0]
    except Exception as exc:  # noqa: BLE001
        report.add("allocate(1, 1)", False, f"{type(exc).__name__}: {exc}")
        return
    seen = torch_view(python, env_with(base, value))
    wanted = [u.uuid for u in gpus.visible_gpus(env) if u.cuda_id == value.split(",")[0]]
    got = [d["uuid"] for d in seen.get("devices", [])]
    report.add("allocate(1, 1)", got == wanted, f"CUDA_VISIBLE_DEVICES={value}: torch sees {got or seen}, "
               f"kvctl meant {wanted}", value=value, torch=seen)


def check_busy(report: Report, gpus: Any, python: str, base: dict[str, str], devices: list[dict[str, Any]]) -> None:
    """A process with a CUDA context on GPU 0: nvidia-smi lists it, allocate() for every GPU refuses and
    names it, and (with more GPUs) allocate() for the others leaves GPU 0 out."""
    env = env_with(base, None)
    holder = subprocess.Popen([python, "-c", HOLD_GPU], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=env)
    try:
        ready = holder.stdout.readline().strip() if holder.stdout else ""
        if ready != "ready":
            report.add("busy GPU", False, f"the holder process did not start (exit {holder.poll()})")
            return
        apps = _settle(gpus, env, holder.pid)
        report.add("compute apps", any(pid == holder.pid for _, pid, _ in apps),
                   f"nvidia-smi --query-compute-apps shows {apps or 'nothing'} (holder pid {holder.pid} on GPU 0)",
                   apps=[list(a) for a in apps])
        count = len(devices)
        try:
            values = gpus.allocate(count, 1, env)
            report.add("allocate with GPU 0 busy", False, f"allocate({count}, 1) gave {values}: it should refuse")
        except Exception as exc:  # noqa: BLE001
            refused = type(exc).__name__ == "UsageError" and str(holder.pid) in str(exc)
            report.add("allocate with GPU 0 busy", refused, f"allocate({count}, 1): {type(exc).__name__}: {exc}")
        if count > 1:
            try:
                values = gpus.allocate(count - 1, 1, env)
                report.add("allocate around GPU 0", devices[0]["cuda_id"] not in values,
                           f"allocate({count - 1}, 1) gave {values}")
            except Exception as exc:  # noqa: BLE001
                report.add("allocate around GPU 0", False, f"{type(exc).__name__}: {exc}")
    finally:
        holder.kill()
        holder.wait()


def _settle(gpus: Any, env: dict[str, str], pid: int) -> list[tuple[str, int, str]]:
    """nvidia-smi may list a new context a moment late: ask a few times."""
    apps: list[tuple[str, int, str]] = []
    for _ in range(5):
        apps = gpus.compute_apps(env)
        if any(p == pid for _, p, _ in apps):
            break
        time.sleep(0.5)
    return apps


def run(args: argparse.Namespace) -> dict[str, Any]:
    report = Report()
    try:
        gpus, loaded = import_gpus()
    except Exception as exc:  # noqa: BLE001
        return {"part": "discovery", "status": "failed", "summary": f"import kvctl.serve.gpus: {exc}", "checks": []}
    report.add("import kvctl.serve.gpus", not loaded, f"non-stdlib modules loaded: {loaded or 'none'}")
    base = dict(os.environ)
    smi = shutil.which("nvidia-smi", path=base.get("PATH"))
    torch = torch_view(args.python, env_with(base, None))
    if smi is None or "error" in torch or torch.get("count", 0) == 0:
        why = "nvidia-smi not on PATH" if smi is None else f"torch: {torch.get('error') or 'no CUDA device'}"
        kvctl = kvctl_view(gpus, env_with(base, None))
        report.add("kvctl without a GPU", None, f"visible_gpus: {kvctl.get('error', kvctl.get('devices'))}",
                   kvctl=kvctl, torch=torch)
        return {"part": "discovery", "status": "no-gpu", "summary": f"no GPU ({why})", "checks": report.checks}
    devices = check_views(report, gpus, args.python, base)
    if devices:
        check_allocate(report, gpus, args.python, base, devices[0])
        check_busy(report, gpus, args.python, base, devices)
    failed = [c["name"] for c in report.checks if c["ok"] is False]
    summary = f"{len(devices)} GPU(s); " + (f"differs: {', '.join(failed)}" if failed else "kvctl and torch agree")
    return {"part": "discovery", "status": "failed" if failed else "ok", "summary": summary, "checks": report.checks}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--python", default=sys.executable, help="the interpreter with torch (default: this one)")
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args(argv)
    result = run(args)
    print(f"discovery: {result['status']} ({result['summary']})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 2 if result["status"] == "failed" and not result["checks"] else 0


if __name__ == "__main__":
    sys.exit(main())
