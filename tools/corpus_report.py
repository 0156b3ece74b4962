"""How often `kvctl config validate` agrees with vLLM on the real-config corpus (tests/corpus).

Runs the installed kvctl's CLI (so an older checkout can be measured the same way) on every file
for every version its entry states, and prints the agreement rate and each disagreement.
A verdict is ok | warning | dropped | error: error = kvctl says vLLM refuses it (an error that is
not a dropped setting), dropped = kvctl says vLLM starts and silently drops a setting, ok / warning
= it starts (both count as one outcome). An older kvctl that knows no "dropped" is measured by its
errors and warnings alone. Exit 2 (cannot read the input) counts as a disagreement. Each corpus
part (corpus.yaml, corpus-*.yaml) is reported on its own and in total.

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
    problems = report.get("problems") or []
    if any(p.get("severity") == "error" and not p.get("dropped") for p in problems):
        return "error"
    if any(p.get("dropped") for p in problems):
        return "dropped"
    return "warning" if report.get("warnings") else "ok"


def outcome(verdict: str) -> str:
    return {"error": "refused", "dropped": "dropped"}.get(verdict, "starts")


def measure(kvctl: list[str], entries: list[dict]) -> dict:
    total = agree = 0
    misses = []
    for entry in entries:
        for version, expected in entry["expect"].items():
            got = verdict(kvctl, CORPUS / entry["file"], str(version))
            total += 1
            same = got != "unreadable" and outcome(got) == outcome(expected)
            agree += same
            if not same:
                misses.append({"file": entry["file"], "version": str(version), "expected": expected, "got": got})
    return {"verdicts": total, "agree": agree, "rate": round(agree / total, 3) if total else None,
            "disagreements": misses}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kvctl", default=f"{sys.executable} -m kvctl")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    kvctl = shlex.split(args.kvctl)
    parts = {}
    for part in sorted(CORPUS.glob("corpus*.yaml")):
        entries = yaml.safe_load(part.read_text("utf-8"))
        parts[part.name] = measure(kvctl, entries)
        parts[part.name]["files"] = len(entries)
    total = {k: sum(p[k] for p in parts.values()) for k in ("files", "verdicts", "agree")}
    total["rate"] = round(total["agree"] / total["verdicts"], 3) if total["verdicts"] else None
    if args.json:
        print(json.dumps({"total": total, "parts": parts}, indent=2))
        return 0
    for name, part in parts.items():
        print(f"{name}: {part['agree']}/{part['verdicts']} verdicts agree ({part['rate']:.1%}) "
              f"over {part['files']} files")
        for miss in part["disagreements"]:
            print(f"  {miss['file']} @ {miss['version']}: expected {miss['expected']}, got {miss['got']}")
    print(f"total: {total['agree']}/{total['verdicts']} ({total['rate']:.1%}) over {total['files']} files")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
