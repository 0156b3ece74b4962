"""How often `kvctl config validate` agrees with vLLM on the real-config corpus (tests/corpus).

Runs the installed kvctl's CLI (so an older checkout can be measured the same way) on every file
for every version its entry states, and prints the agreement rate and each disagreement.
A verdict is ok | warning | error (exit 0 without / with warnings, exit 1); exit 2 (cannot read
the input) counts as a disagreement.

    python tools/corpus_report.py [--kvctl "python -m kvctl"] [--json]
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "corpus"


def verdict(kvctl: list[str], file: Path, version: str) -> str:
    run = subprocess.run([*kvctl, "config", "validate", str(file), "--vllm-version", version, "--json"],
                         capture_output=True, text=True)
    try:
        report = json.loads(run.stdout)
    except json.JSONDecodeError:
        return "unreadable"
    if run.returncode == 2:
        # A config vLLM cannot parse either (invalid JSON/YAML) is refused by both: that agrees.
        message = str((report.get("error") or {}).get("message", ""))
        return "error" if "not valid JSON" in message or "not valid YAML" in message else "unreadable"
    if run.returncode == 1 or report.get("errors"):
        return "error"
    return "warning" if report.get("warnings") else "ok"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kvctl", default=f"{sys.executable} -m kvctl")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    kvctl = shlex.split(args.kvctl)
    entries = yaml.safe_load((CORPUS / "corpus.yaml").read_text("utf-8"))
    total = agree = 0
    misses = []
    for entry in entries:
        for version, expected in entry["expect"].items():
            got = verdict(kvctl, CORPUS / entry["file"], str(version))
            total += 1
            # "ok" and "warning" both mean vLLM starts with it; the verdict that matters is
            # whether kvctl says it fails where vLLM fails.
            same = (got == "error") == (expected == "error") and got != "unreadable"
            agree += same
            if not same:
                misses.append({"file": entry["file"], "version": str(version), "expected": expected, "got": got})
    summary = {"files": len(entries), "verdicts": total, "agree": agree,
               "rate": round(agree / total, 3) if total else None, "disagreements": misses}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"{agree}/{total} verdicts agree ({summary['rate']:.1%}) over {len(entries)} files")
        for miss in misses:
            print(f"  {miss['file']} @ {miss['version']}: expected {miss['expected']}, got {miss['got']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
