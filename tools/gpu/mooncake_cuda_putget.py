#!/usr/bin/env python3
"""Can Mooncake's store client move GPU memory? Put from and get into CUDA tensors, on loopback.

Against a running `mooncake_master` (tools/gpu_check.sh starts one on 127.0.0.1), each variant runs
in its own child process (a store client that reads GPU memory as host memory dies of SIGSEGV, and a
crash must not take the other variants' results with it):

  cpu        host buffers (ctypes), the client's default path
  cpu-tcp    the same with MC_STORE_MEMCPY=0
  cpu-torch  torch tensors in host memory (skipped without torch): the cuda variants' code on host
             memory, so that a cuda failure is the GPU memory's, not the tensor handling's
  cuda       CUDA tensors (torch), the default path
  cuda-tcp   CUDA tensors with MC_STORE_MEMCPY=0

Why two paths: with only the TCP transport the client copies to and from its own segment with a
local memcpy (MC_STORE_MEMCPY unset -> auto: "TCP-only environment, memcpy enabled",
mooncake-store/src/transfer_task.cpp:958-988), which asks the CUDA runtime whether a pointer is GPU
memory (transfer_task.cpp:669-710); MC_STORE_MEMCPY=0 sends the bytes through the TCP transport,
which copies GPU memory through a host buffer in CUDA builds only
(mooncake-transfer-engine/src/transport/tcp_transport/tcp_transport_session_impl.h:51-78, 219-240).
Line numbers are those of Mooncake's main branch at 3b5a594 (newer than 0.3.14): what the installed
wheel does is what this script finds out.

Each variant: setup (P2PHANDSHAKE, tcp), register_buffer for a source and a destination buffer,
put_from / get_into one object, batch_put_from / batch_get_into several, and a plain put(bytes) /
get; every op timed, every read compared byte for byte with what was written. For CUDA it also
reports what a plain put() of a CUDA tensor itself does. The API is that of
mooncake-integration/store/store_py.cpp:2787-2935 (register_buffer, get_into, batch_get_into,
put_from, batch_put_from, put).

    python tools/gpu/mooncake_cuda_putget.py --master 127.0.0.1:50051 --metrics-url http://127.0.0.1:9003 \\
        --device cpu --device cuda [--quick] [--json report.json]

Exit 0 with a report whatever the variants found (their results are data); 2 when the master never
answered GET /health (setup against a dead master blocks ~90 s, so no client is started then).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

MB = 1024 * 1024
# variant -> (device, MC_STORE_MEMCPY value or None for unset, buffers: ctypes or torch tensors)
VARIANTS: dict[str, tuple[str, str | None, str]] = {
    "cpu": ("cpu", None, "ctypes"), "cpu-tcp": ("cpu", "0", "ctypes"), "cpu-torch": ("cpu", None, "torch"),
    "cuda": ("cuda", None, "torch"), "cuda-tcp": ("cuda", "0", "torch")}
SIZES = {  # MiB; the local buffer stages plain put/get, so it must hold one object
    "quick": {"object_mb": 4, "batch": 4, "batch_mb": 1, "segment_mb": 64, "local_mb": 32},
    "full": {"object_mb": 64, "batch": 8, "batch_mb": 8, "segment_mb": 512, "local_mb": 256},
}
FAILED = {"failed", "mismatch", "crashed", "timeout"}
# Mooncake's ErrorCode values an op here may return (mooncake-store/include/types.h:281-357)
ERROR_NAMES = {-1: "INTERNAL_ERROR", -10: "BUFFER_OVERFLOW", -101: "SEGMENT_NOT_FOUND", -600: "INVALID_PARAMS",
               -700: "INVALID_WRITE", -701: "INVALID_READ", -703: "REPLICA_IS_NOT_READY", -704: "OBJECT_NOT_FOUND",
               -705: "OBJECT_ALREADY_EXISTS", -706: "OBJECT_HAS_LEASE", -707: "LEASE_EXPIRED", -800: "TRANSFER_FAIL",
               -900: "RPC_FAIL", -901: "RPC_TIMEOUT", -1012: "NOT_SUPPORTED"}


# --------------------------------------------------------------------------------------------
# The parent: health probe, one child per variant, the report


def master_healthy(url: str, timeout: float) -> tuple[bool, str]:
    """Poll GET {url}/health until it says ok (no proxy: the master is on loopback)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + timeout
    last = "no answer"
    while True:
        try:
            with opener.open(f"{url.rstrip('/')}/health", timeout=1) as response:
                body = response.read().decode(errors="replace")
            if json.loads(body).get("status") == "ok":
                return True, body.strip()
            last = body.strip()
        except (OSError, ValueError, AttributeError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() >= deadline:
            return False, last
        time.sleep(0.2)


def read_progress(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except ValueError:
            pass  # a line cut by a crash
    return events


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return "\n".join(line[:300] for line in text)


def run_variant(variant: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Run one variant in a child process; a crash or a hang is reported with the op it happened in."""
    progress, log = workdir / f"{variant}.jsonl", workdir / f"{variant}.log"
    progress.unlink(missing_ok=True)  # the child appends: an old run's result must not count
    env = dict(os.environ)
    env.setdefault("MC_LOG_LEVEL", "ERROR")
    env.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
    env["MC_STORE_CLIENT_SETUP_RETRIES"] = "1"  # one try: a failed setup must not retry for minutes
    memcpy = VARIANTS[variant][1]
    if memcpy is None:
        env.pop("MC_STORE_MEMCPY", None)
    else:
        env["MC_STORE_MEMCPY"] = memcpy
    # -X faulthandler: a crash in the native client leaves the Python stack of the op in the log
    command = [sys.executable, "-X", "faulthandler", __file__, "--child", variant, "--progress", str(progress),
               "--master", args.master, "--sizes", "quick" if args.quick else "full"]
    began = time.monotonic()
    code = _spawn(command, env, log, args.variant_timeout)
    events = read_progress(progress)
    result = next((e for e in events if e.get("event") == "done"), None) or _no_result(code, events, args)
    result = {k: v for k, v in result.items() if k != "event"}
    info: dict[str, Any] = {}
    for event in events:
        if event.get("event") == "info":
            info.update({k: v for k, v in event.items() if k != "event"})
    ops = [e for e in events if e.get("event") == "op"]
    result.update(variant=variant, device=VARIANTS[variant][0],
                  MC_STORE_MEMCPY=memcpy if memcpy is not None else "unset (auto)",
                  seconds=round(time.monotonic() - began, 2), info=info, ops=ops, exit_code=code)
    if result["status"] in FAILED or any(not op.get("ok", True) and not op.get("probe") for op in ops):
        result["log_tail"] = _tail(log)
    return result


def _spawn(command: list[str], env: dict[str, str], log: Path, timeout: float) -> int | None:
    """The child's exit code (negative: the signal that killed it), None when it ran past `timeout`."""
    with log.open("wb") as out:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            return child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        finally:
            if child.poll() is None:  # a timeout, or SIGTERM on the parent
                child.kill()
                child.wait()


def _no_result(code: int | None, events: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    where = _where(events)
    if code is None:
        return {"status": "timeout", "summary": f"no answer within {args.variant_timeout:g} s ({where})"}
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return {"status": "crashed", "summary": f"killed by {name} ({where})"}
    return {"status": "failed", "summary": f"exit {code} without a result ({where})"}


def _where(events: list[dict[str, Any]]) -> str:
    """Where a child that left no result stopped: in the op it had started, else after the last one."""
    pending, last = None, None
    for event in events:
        if event.get("event") == "start":
            pending = event["op"]
        elif event.get("event") == "op":
            last = event["op"]
            pending = None if event["op"] == pending else pending
    return f"in {pending}" if pending else f"after {last}" if last else "before its first op"


def part_status(results: list[dict[str, Any]], devices: list[str]) -> str:
    if any(r["status"] in FAILED for r in results):
        return "failed"
    if "cuda" in devices and all(r["status"] == "no-gpu" for r in results if r["device"] == "cuda"):
        return "no-gpu"
    return "ok"


def print_report(report: dict[str, Any]) -> None:
    print(f"mooncake store client on {report['master']}: {report['status']} ({report['summary']})")
    for r in report["variants"]:
        print(f"  {r['variant']:<9} {r['status']:<8} MC_STORE_MEMCPY={r['MC_STORE_MEMCPY']}: {r['summary']}")
        for op in r["ops"]:
            if "match" in op:  # a comparison, not a call
                untouched = " (destination untouched)" if op.get("untouched") else ""
                verdict = "match" if op["match"] else "DIFFER" + untouched
                print(f"      {op['op']:<22} {verdict}")
                continue
            speed = f" {op['gb_per_s']:6.2f} GB/s" if op.get("gb_per_s") else ""
            note = f" ({op['error']})" if op.get("error") else ""
            print(f"      {op['op']:<22} {op['seconds'] * 1000:9.1f} ms{speed}  rc={op.get('rc')}{note}")
        if r.get("log_tail"):
            print("      log: " + r["log_tail"].replace("\n", "\n           "))


def summarize(results: list[dict[str, Any]]) -> str:
    return "; ".join(f"{r['variant']}: {r['status']}" + ("" if r["status"] == "ok" else f" ({r['summary']})")
                     for r in results)


def parent(args: argparse.Namespace) -> int:
    devices = list(dict.fromkeys(args.device or ["cpu"]))
    variants = [v for v, (device, _, _) in VARIANTS.items() if device in devices]
    report: dict[str, Any] = {"part": "mooncake", "master": args.master, "metrics_url": args.metrics_url,
                              "quick": args.quick, "sizes": SIZES["quick" if args.quick else "full"]}
    healthy, health = master_healthy(args.metrics_url, args.health_timeout)
    report["health"] = health
    if not healthy:
        report.update(status="failed", summary=f"master not healthy at {args.metrics_url}/health: {health}",
                      variants=[])
        code = 2
    else:
        results: list[dict[str, Any]] = []
        try:
            with tempfile.TemporaryDirectory(prefix="mooncake-putget-") as tmp:
                workdir = Path(args.workdir or tmp)  # --workdir keeps each variant's log and progress
                workdir.mkdir(parents=True, exist_ok=True)
                for variant in variants:
                    alive, said = master_healthy(args.metrics_url, 2.0)  # a crash may have taken the master
                    results.append(run_variant(variant, args, workdir) if alive else {
                        "variant": variant, "device": VARIANTS[variant][0], "status": "failed", "ops": [],
                        "MC_STORE_MEMCPY": VARIANTS[variant][1] or "unset (auto)",
                        "summary": f"not run: the master stopped answering /health ({said})"})
            report.update(status=part_status(results, devices), summary=summarize(results))
        except KeyboardInterrupt:
            report.update(status="timeout", summary=f"stopped after {len(results)} of {len(variants)} variants: "
                          + (summarize(results) or "none done"))
        report["variants"] = results
        code = 0
    print_report(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return code


# --------------------------------------------------------------------------------------------
# The child: one store client, one device


class Progress:
    """One JSON line per event, written at once: what a crash leaves behind is still readable."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - kept open for the child's life

    def emit(self, **event: Any) -> None:
        self._file.write(json.dumps(event) + "\n")
        self._file.flush()

    def op(self, name: str, call: Callable[[], Any], ok: Callable[[Any], bool], nbytes: int = 0,
           sync: Callable[[], None] = lambda: None, probe: bool = False) -> Any:
        """Run and record one op. probe: an op asked only to see what it does (its failure is no fault)."""
        self.emit(event="start", op=name)
        began = time.perf_counter()
        try:
            value = call()
            sync()
        except Exception as exc:  # noqa: BLE001 - what the API raises is the finding
            self.emit(event="op", op=name, ok=False, rc=None, seconds=time.perf_counter() - began,
                      error=f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"[:300],
                      **({"probe": True} if probe else {}))
            return exc
        seconds = time.perf_counter() - began
        rc = value if isinstance(value, (int, list)) else (len(value) if isinstance(value, bytes) else repr(value))
        record = {"ok": bool(ok(value)), "rc": rc if not isinstance(rc, list) or len(rc) <= 16 else rc[:16],
                  "seconds": seconds}
        if nbytes and seconds > 0:
            record.update(bytes=nbytes, gb_per_s=nbytes / seconds / 1e9)
        codes = [c for c in (rc if isinstance(rc, list) else [rc]) if isinstance(c, int) and c < 0]
        if codes:
            record["error"] = ", ".join(sorted({ERROR_NAMES.get(c, str(c)) for c in codes}))
        if probe:
            record["probe"] = True
        self.emit(event="op", op=name, **record)
        return value


class HostBuffers:
    """Host memory from ctypes (no torch needed): the cpu variants."""

    device = "cpu"

    def __init__(self, nbytes: int, seed: int) -> None:
        self.nbytes = nbytes
        self._src = ctypes.create_string_buffer(nbytes)
        self._dst = ctypes.create_string_buffer(nbytes)
        self.expected = random.Random(seed).randbytes(nbytes)
        ctypes.memmove(self._src, self.expected, nbytes)
        self.src, self.dst = ctypes.addressof(self._src), ctypes.addressof(self._dst)

    def sync(self) -> None:
        pass

    def compare(self, offset: int = 0, size: int | None = None) -> dict[str, Any]:
        size = self.nbytes - offset if size is None else size
        got = ctypes.string_at(self.dst + offset, size)
        want = self.expected[offset:offset + size]
        return {"match": got == want, "untouched": got == bytes(size)}

    def clear(self) -> None:
        ctypes.memset(self._dst, 0, self.nbytes)

    def host_bytes(self) -> bytes:
        return self.expected


class TorchBuffers:
    """uint8 tensors from torch, on the GPU (the cuda variants) or in host memory (cpu-torch)."""

    def __init__(self, torch: Any, nbytes: int, seed: int, device: str) -> None:
        self.torch, self.nbytes, self.device = torch, nbytes, device
        generator = torch.Generator(device=device).manual_seed(seed)
        self._src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device, generator=generator)
        self._dst = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        self.src, self.dst = self._src.data_ptr(), self._dst.data_ptr()
        self.sync()

    def sync(self) -> None:
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def compare(self, offset: int = 0, size: int | None = None) -> dict[str, Any]:
        size = self.nbytes - offset if size is None else size
        got, want = self._dst[offset:offset + size], self._src[offset:offset + size]
        return {"match": bool(self.torch.equal(got, want)), "untouched": not bool(got.any())}

    def clear(self) -> None:
        self._dst.zero_()
        self.sync()

    def host_bytes(self) -> bytes:
        return self._src.cpu().numpy().tobytes()

    def tensor(self) -> Any:
        return self._src


def _import_torch(progress: Progress, device: str) -> Any | None:
    """torch (with a visible GPU for cuda), else None after emitting why not. Imported before mooncake: its
    libcudart.so.13 is then loaded, which the CUDA wheel's _store extension needs."""
    try:
        import torch
    except ImportError as exc:
        status = "no-gpu" if device == "cuda" else "skipped"
        progress.emit(event="done", status=status, summary=f"torch is not installed ({exc})")
        return None
    if device == "cuda" and not torch.cuda.is_available():
        progress.emit(event="done", status="no-gpu",
                      summary=f"torch {torch.__version__} sees no GPU (torch.cuda.is_available() is False)")
        return None
    progress.emit(event="info", torch=torch.__version__, cuda=torch.version.cuda,
                  gpu=torch.cuda.get_device_name(0) if device == "cuda" else None)
    return torch


def _mooncake_version() -> str:
    from importlib import metadata

    found = []
    for name in ("mooncake-transfer-engine-cuda13", "mooncake-transfer-engine", "mooncake-transfer-engine-non-cuda"):
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    return ", ".join(found) or "no mooncake distribution metadata"


def exercise(store: Any, buffers: Any, sizes: dict[str, int], progress: Progress, variant: str) -> list[str]:
    """The put/get ops on registered buffers, plain put/get, and cleanup. Returns the failed ops' names."""
    n, prefix = buffers.nbytes, f"kvctl-gpu-check/{variant}/{os.getpid()}"
    batch, part = sizes["batch"], sizes["batch_mb"] * MB
    failed: list[str] = []

    def check(name: str, offset: int = 0, size: int | None = None) -> None:
        verdict = buffers.compare(offset, size)
        progress.emit(event="op", op=name, ok=verdict["match"], **verdict)
        if not verdict["match"]:
            failed.append(name)

    def op(name: str, call: Callable[[], Any], ok: Callable[[Any], bool], nbytes: int = 0) -> Any:
        value = progress.op(name, call, ok, nbytes, buffers.sync)
        if isinstance(value, Exception) or not ok(value):
            failed.append(name)
        return value

    op("register_buffer(src)", lambda: store.register_buffer(buffers.src, n), lambda rc: rc == 0)
    op("register_buffer(dst)", lambda: store.register_buffer(buffers.dst, n), lambda rc: rc == 0)
    op("put_from", lambda: store.put_from(f"{prefix}/one", buffers.src, n), lambda rc: rc == 0, n)
    op("get_into", lambda: store.get_into(f"{prefix}/one", buffers.dst, n), lambda rc: rc == n, n)
    check("get_into bytes")
    buffers.clear()
    keys = [f"{prefix}/batch-{i}" for i in range(batch)]
    src_ptrs = [buffers.src + i * part for i in range(batch)]
    dst_ptrs = [buffers.dst + i * part for i in range(batch)]
    op("batch_put_from", lambda: store.batch_put_from(keys, src_ptrs, [part] * batch),
       lambda rcs: list(rcs) == [0] * batch, batch * part)
    op("batch_get_into", lambda: store.batch_get_into(keys, dst_ptrs, [part] * batch),
       lambda rcs: list(rcs) == [part] * batch, batch * part)
    check("batch_get_into bytes", 0, batch * part)
    host = buffers.host_bytes()
    op("put(bytes)", lambda: store.put(f"{prefix}/plain", host), lambda rc: rc == 0, n)
    got = op("get", lambda: store.get(f"{prefix}/plain"), lambda value: isinstance(value, bytes) and len(value) == n, n)
    if isinstance(got, bytes):
        progress.emit(event="op", op="get bytes", ok=got == host, match=got == host)
        if got != host:
            failed.append("get bytes")
    if isinstance(buffers, TorchBuffers):  # a tensor has no buffer protocol: what does put() say?
        progress.op(f"put({buffers.device} tensor)", lambda: store.put(f"{prefix}/tensor", buffers.tensor()),
                    lambda rc: rc == 0, probe=True)
    every = [f"{prefix}/one", *keys, f"{prefix}/plain"]  # force: a key just read holds a read lease
    progress.op(f"remove ({len(every)} keys)", lambda: [store.remove(key, force=True) for key in every],
                lambda rcs: rcs == [0] * len(every))
    op("unregister_buffer(src)", lambda: store.unregister_buffer(buffers.src), lambda rc: rc == 0)
    op("unregister_buffer(dst)", lambda: store.unregister_buffer(buffers.dst), lambda rc: rc == 0)
    return failed


def child(args: argparse.Namespace) -> int:
    progress = Progress(args.progress)
    device, _, kind = VARIANTS[args.child]
    sizes = SIZES[args.sizes]
    torch = _import_torch(progress, device) if kind == "torch" else None
    if kind == "torch" and torch is None:
        return 0
    began = time.perf_counter()
    try:
        from mooncake.store import MooncakeDistributedStore
    except Exception as exc:  # noqa: BLE001 - ImportError, or OSError for a missing system library
        progress.emit(event="done", status="failed", summary=f"import mooncake.store: {type(exc).__name__}: {exc}")
        return 0
    progress.emit(event="info", mooncake=_mooncake_version(), import_seconds=time.perf_counter() - began)
    store = MooncakeDistributedStore()
    rc = progress.op("setup", lambda: store.setup("127.0.0.1", "P2PHANDSHAKE", sizes["segment_mb"] * MB,
                                                   sizes["local_mb"] * MB, "tcp", "", args.master),
                     lambda rc: rc == 0)
    if rc != 0:
        progress.emit(event="done", status="failed", summary=f"setup returned {rc!r}")
        return 0
    nbytes = max(sizes["object_mb"], sizes["batch"] * sizes["batch_mb"]) * MB
    buffers = progress.op(f"allocate 2 x {nbytes // MB} MiB ({device})", lambda: TorchBuffers(
        torch, nbytes, 1, device) if torch is not None else HostBuffers(nbytes, seed=1), lambda _: True)
    if isinstance(buffers, Exception):
        progress.emit(event="done", status="failed", summary=f"allocating the buffers: {buffers}")
        return 0
    failed = exercise(store, buffers, sizes, progress, args.child)
    progress.op("close", store.close, lambda rc: rc in (0, None))
    if failed:
        progress.emit(event="done", status="mismatch" if all(f.endswith("bytes") for f in failed) else "failed",
                      summary="failed: " + ", ".join(failed))
    else:
        progress.emit(event="done", status="ok", summary=f"every op ok, bytes match ({nbytes // MB} MiB buffers)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--master", required=True, help="the master's RPC address, 127.0.0.1:PORT")
    parser.add_argument("--metrics-url", help="the master's admin/metrics URL (GET /health), http://127.0.0.1:PORT")
    parser.add_argument("--device", action="append", choices=("cpu", "cuda"), help="repeat for both (default cpu)")
    parser.add_argument("--quick", action="store_true", help="4 MiB objects instead of 64 MiB")
    parser.add_argument("--json", help="write the report here")
    parser.add_argument("--workdir", help="keep each variant's log and progress here (default: a temporary folder)")
    parser.add_argument("--health-timeout", type=float, default=20.0)
    parser.add_argument("--variant-timeout", type=float, default=90.0, help="seconds per variant's child")
    parser.add_argument("--child", choices=tuple(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--progress", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", choices=tuple(SIZES), default="full", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    if not args.metrics_url:
        parser.error("--metrics-url is required (the master's GET /health is probed before any setup)")
    signal.signal(signal.SIGTERM, _stop)
    return parent(args)


def _stop(signum: int, frame: object) -> None:
    """tools/gpu_check.sh ends a part with SIGTERM at its timeout: unwind as after Ctrl-C (children killed,
    the variants done so far reported)."""
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
