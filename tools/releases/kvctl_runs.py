"""kvctl's own commands against a real server of one release, and the stale-KV story where the
release runs MooncakeStoreConnector on the CPU.

Each result is {"exit": code, "ok": bool, "summary": ..., "observed"/"how" where it shows a fact}.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import VLLM_ARGS
from kvctl.facts.capabilities import CapabilityTable
from kvctl.reset import cached_tokens
from kvctl.serve import runs

from .sequence import PROMPT
from .server import first_cause

KVCTL = [sys.executable, "-m", "kvctl"]
RUN_TIMEOUT = 900.0


def kvctl(*args: str, state: Path | None = None, timeout: float = RUN_TIMEOUT) -> dict[str, Any]:
    """`kvctl ARGS --json`: its exit code and JSON answer (or the text it printed instead)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVCTL_")}
    if state is not None:
        env["KVCTL_STATE_DIR"] = str(state)
    args = _with_json(list(args))
    done = subprocess.run([*KVCTL, *args], check=False, capture_output=True, text=True, env=env, timeout=timeout)
    try:
        data = json.loads(done.stdout)
    except ValueError:
        data = {"text": (done.stdout + done.stderr)[-2000:]}
    return {"exit": done.returncode, "ok": done.returncode == 0, "summary": _summary(data), "json": data}


def _with_json(args: list[str]) -> list[str]:
    """--json before a `--` (what follows it is vLLM's)."""
    cut = args.index("--") if "--" in args else len(args)
    return [*args[:cut], "--json", *args[cut:]]


def _summary(data: Any) -> str:
    """kvctl's one-line account: its summary, else its error's message (and fix), else its text."""
    if not isinstance(data, dict):
        return ""
    error = data.get("error")
    if isinstance(error, dict):
        fix = f" (fix: {error['fix']})" if error.get("fix") else ""
        return f"{error.get('message', '')}{fix}"[:600]
    for key in ("summary", "message", "error", "text"):
        if isinstance(data.get(key), str):
            return data[key][:600]
    return ""


def replica_runs(release: str, url: str, weights: Path, table: CapabilityTable) -> dict[str, Any]:
    """kvctl reset --verify, kvctl probe and (where the release reloads from a folder) kvctl
    weights update, against one real replica with no KV connector."""
    out: dict[str, Any] = {}
    if not table.is_supported(release):
        return {"skipped": f"vLLM {release} is older than kvctl's floor {table.min_supported}: kvctl refuses it"}
    out["reset"] = _slim(kvctl("reset", "--url", url, "--verify"))
    out["probe"] = _slim(kvctl("probe", "--url", url))
    if table.has(release, "rpc.reload_weights.weights_path"):
        label = ["--version", "tier-2"] if table.has(release, "http.update_weight_version") else []
        # without --verify: the fact is the reload from a folder (reset --verify above proves the canary)
        run = kvctl("weights", "update", "--url", url, "--from", str(weights), *label)
        out["weights"] = {**_slim(run), "observed": run["ok"],
                          "how": f"kvctl weights update --from a second model folder: exit {run['exit']}"}
    else:
        out["weights"] = {"skipped": "no reload_weights(weights_path=) in this release (kvctl refuses)"}
    return out


def _slim(run: dict[str, Any]) -> dict[str, Any]:
    return {"exit": run["exit"], "ok": run["ok"], "summary": run["summary"]}


# -- the stale-KV story ---------------------------------------------------------------------
def store_story(release: str, python: str, model: Path, table: CapabilityTable) -> dict[str, Any]:
    """Two replicas on one embedded master (kvctl serve --template mooncake-store): stale KV after a
    local-only reset, none after kvctl's; and what a default /pause does to the store."""
    with tempfile.TemporaryDirectory(prefix="kvctl-tier-") as tmp:
        state, name = Path(tmp), "tier"
        started = kvctl("serve", str(model), "--template", "mooncake-store", "--replicas", "2", "--name", name,
                        "--detach", "--health-timeout", "600", "--vllm-python", python, "--", *VLLM_ARGS,
                        state=state)
        if not started["ok"]:
            return {"ran": False, "reason": f"kvctl serve failed (exit {started['exit']}): {started['summary']}"}
        try:
            return {"ran": True, **_story(release, name, state, str(model), table)}
        except httpx.HTTPError as exc:  # a replica that cannot serve with the connector: the story's outcome
            return {"ran": False, "reason": f"the store connector's stack answered {_status(exc)}: {_replica_cause(name, state)}"}
        finally:
            kvctl("stop", "--run", name, state=state, timeout=120)


def _status(exc: httpx.HTTPError) -> str:
    return f"HTTP {exc.response.status_code}" if isinstance(exc, httpx.HTTPStatusError) else type(exc).__name__


def _replica_cause(name: str, state: Path) -> str:
    """The first error line any replica of the run logged."""
    for replica in runs.load(name, state).replicas:
        cause = first_cause(Path(replica.log))
        if not cause.startswith("("):
            return cause
    return "no error line in the replicas' logs"


def _story(release: str, name: str, state: Path, model: str, table: CapabilityTable) -> dict[str, Any]:
    record = runs.load(name, state)
    urls = [r.url for r in record.replicas]
    assert record.master is not None and record.master.admin_address
    admin = record.master.admin_address
    a, b = urls
    out: dict[str, Any] = {}
    with httpx.Client(timeout=120, trust_env=False) as client:
        def hit(url: str) -> int:
            return _cached(client, url, model)

        hit(a)
        out["keys_after_prime"] = len(_wait_keys(client, admin))
        for url in urls:
            client.post(f"{url}/reset_prefix_cache", params={"reset_external": "false"})
        out["stale_hit_after_local_reset"] = hit(b)
        out["metric_names"] = sorted(n for n in ("vllm:external_prefix_cache_hits", "vllm:external_prefix_cache_queries")
                                     if n in client.get(f"{b}/metrics").text)
        # vLLM's own connector reset (what verl sends), on a paused replica as 0.23's connector asks
        # (paused with clear_cache=false: a default pause resets the connector itself from 0.23)
        paused = table.has(release, "http.pause") and \
            client.post(f"{a}/pause", params={"clear_cache": "false"}).status_code == 200
        answer = client.post(f"{a}/reset_prefix_cache", params={"reset_external": "true"})
        if paused:
            client.post(f"{a}/resume")
        left = len(_keys(client, admin))
        out["vllm_reset_clears"] = {"observed": left == 0,
                                    "how": f"POST /reset_prefix_cache?reset_external=true answered {answer.status_code} "
                                           f"{answer.text[:40]!r}; {left} of {out['keys_after_prime']}+ keys left"}
        hit(a)
        _wait_keys(client, admin)
        reset = kvctl("reset", "--run", name, "--connector", "--verify", state=state)
        out["kvctl_reset"] = _slim(reset)
        kvctl("reset", "--run", name, "--connector", state=state)  # the canaries' own blocks
        out["keys_after_kvctl_reset"] = len(_keys(client, admin))
        out["hit_after_kvctl_reset"] = hit(b)
        out["reset_clears"] = {"observed": out["keys_after_kvctl_reset"] == 0 and reset["ok"],
                               "how": f"kvctl reset --connector --verify: exit {reset['exit']}, "
                                      f"{out['keys_after_kvctl_reset']} keys left"}
        # a default /pause (clear_cache true) with the store connector: from 0.23 it resets the connector
        if table.has(release, "http.pause"):
            hit(a)
            before = len(_wait_keys(client, admin))
            client.post(f"{a}/pause")
            after = len(_keys(client, admin))
            client.post(f"{a}/resume")
            out["pause_clears"] = {"observed": before > 0 and after == 0,
                                   "how": f"a default /pause on one replica: master keys {before} -> {after}"}
    return out


def _cached(client: httpx.Client, url: str, model: str) -> int:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 1, "temperature": 0}
    answer = client.post(f"{url}/v1/completions", json=body)
    answer.raise_for_status()
    return int(cached_tokens.read(answer.json()).count or 0)  # a null: none cached (0.23+ runs the story)


def _keys(client: httpx.Client, admin: str) -> list[str]:
    return [k for k in client.get(f"http://{admin}/get_all_keys").text.splitlines() if k.strip()]


def _wait_keys(client: httpx.Client, admin: str, timeout: float = 90.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        keys = _keys(client, admin)
        if keys:
            return keys
        time.sleep(0.5)
    return []
