#!/usr/bin/env python3
"""tools/gpu_check.sh's bookkeeping: each part's JSON, the commands it ran, the final summary.

Standard library only (it runs on whatever Python the GPU machine has):

  report.py cmd     --work W --part P --label L --rc RC --output FILE   one command's output, kept for P
  report.py update  --work W --part P [--status S] [--summary TEXT] [--append/--prefix TEXT] [--set K=V ...]
                                                                        a part's result, written or added to
  report.py finish  --work W --part P --title T --rc RC --seconds S     P's final record (its own JSON, or one
                                                                        made from its exit code: 124 = timeout)
  report.py bf16    --work W --run DEVICE:RC ... [--no-gpu REASON]      part c's JSON from the runs of
                                                                        tools/gpu/bf16_prefix_logprobs.py
  report.py summary --work W --out DIR [--quiet] [--meta KEY=VALUE ...] OUT/gpu-check.json and the summary table
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

PARTS = ("machine", "discovery", "bf16", "mooncake")  # tools/gpu_check.sh's order, a-d
TIMEOUT_CODES = (124, 137)  # timeout(1): the command timed out / was killed after -k


def _load(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def cmd(args: argparse.Namespace) -> None:
    output = Path(args.output).read_text(errors="replace") if Path(args.output).exists() else ""
    record = {"command": args.label, "rc": int(args.rc), "output": output[-20000:]}
    with (Path(args.work) / f"{args.part}.commands.jsonl").open("a") as out:
        out.write(json.dumps(record) + "\n")


def update(args: argparse.Namespace) -> None:
    path = Path(args.work) / f"{args.part}.json"
    data = _load(path) or {"part": args.part}
    if args.status:
        data["status"] = args.status
    if args.summary is not None:
        data["summary"] = args.summary
    if args.append:
        data["summary"] = "; ".join(s for s in (data.get("summary"), args.append) if s)
    if args.prefix:
        data["summary"] = "; ".join(s for s in (args.prefix, data.get("summary")) if s)
    for item in args.set:
        key, _, value = item.partition("=")
        data[key] = value
    path.write_text(json.dumps(data, indent=2) + "\n")


def finish(args: argparse.Namespace) -> None:
    work, rc = Path(args.work), int(args.rc)
    data = _load(work / f"{args.part}.json")
    if data is None or "status" not in data:
        if rc in TIMEOUT_CODES:
            data = {"status": "timeout", "summary": f"stopped at its time limit (exit {rc}), no result written"}
        else:
            data = {"status": "failed", "summary": f"exit {rc} without a result (see the log above)"}
    commands = work / f"{args.part}.commands.jsonl"
    if commands.exists():
        data["commands"] = [json.loads(line) for line in commands.read_text().splitlines() if line.strip()]
    data.update(part=args.part, title=args.title, rc=rc, seconds=round(float(args.seconds), 1))
    (work / f"{args.part}.final.json").write_text(json.dumps(data, indent=2) + "\n")
    print(f"--> {args.title}: {data['status']} ({data.get('summary', '')})")


def _bf16_line(device: str, run: dict[str, Any]) -> str:
    """One line per run: each dtype's largest per-prompt log-probability difference and greedy flips."""
    cells = []
    for dtype, result in (run.get("dtypes") or {}).items():
        try:
            cells.append(f"{dtype} max {result['per_prompt_max']['max']} "
                         f"flips {result['prompts_with_greedy_flip']}/{result['prompts']}")
        except (KeyError, TypeError):
            cells.append(f"{dtype} (no per_prompt_max in its report)")
    return f"{device}: " + (", ".join(cells) or "no dtypes in its report")


def bf16(args: argparse.Namespace) -> None:
    work = Path(args.work)
    runs: dict[str, Any] = {}
    lines = []
    for item in args.run:
        device, _, rc = item.partition(":")
        report = _load(work / f"bf16-{device}.json")
        if report is not None:
            runs[device] = report
            lines.append(_bf16_line(device, report))
        else:
            runs[device] = {"error": "timeout" if int(rc) in TIMEOUT_CODES else f"exit {rc}, no JSON report"}
            lines.append(f"{device}: {runs[device]['error']}")
    if args.no_gpu:
        state, lines = "no-gpu", [f"no GPU ({args.no_gpu})", *lines]
    elif "cuda" in runs and "error" not in runs["cuda"]:
        state = "ok"
    else:
        state = "timeout" if "timeout" in str(runs.get("cuda")) else "failed"
    data = {"part": "bf16", "status": state, "summary": "; ".join(lines), "runs": runs}
    (work / "bf16.json").write_text(json.dumps(data, indent=2) + "\n")


def summary(args: argparse.Namespace) -> None:
    work, out = Path(args.work), Path(args.out)
    parts = [p for p in (_load(work / f"{name}.final.json") for name in PARTS) if p is not None]
    meta = dict(item.split("=", 1) for item in args.meta)
    report = {"tool": "tools/gpu_check.sh", **meta, "parts": parts}
    (out / "gpu-check.json").write_text(json.dumps(report, indent=2) + "\n")
    if args.quiet:
        return
    print("=" * 100)
    print("SUMMARY " + " ".join(f"{k}={v}" for k, v in meta.items()))
    for part in parts:
        print(f"  {part['title']:<28} {part['status']:<8} {part['seconds']:>6.1f} s  {part.get('summary', '')}")
    missing = [name for name in PARTS if name not in {p["part"] for p in parts}]
    if missing:
        print(f"  not run: {', '.join(missing)}")
    print(f"results: {out / 'gpu-check.json'}, log: {out / 'gpu-check.txt'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    for verb in ("cmd", "update", "finish", "bf16", "summary"):
        p = sub.add_parser(verb)
        p.add_argument("--work", required=True)
        if verb not in ("summary", "bf16"):
            p.add_argument("--part", required=True, choices=PARTS)
    sub.choices["cmd"].add_argument("--label", required=True)
    sub.choices["cmd"].add_argument("--rc", required=True)
    sub.choices["cmd"].add_argument("--output", required=True)
    sub.choices["update"].add_argument("--status")
    sub.choices["update"].add_argument("--summary")
    sub.choices["update"].add_argument("--append", help="added to the summary after '; '")
    sub.choices["update"].add_argument("--prefix", help="put before the summary, with '; '")
    sub.choices["update"].add_argument("--set", action="append", default=[], help="KEY=VALUE, a string field")
    sub.choices["finish"].add_argument("--title", required=True)
    sub.choices["finish"].add_argument("--rc", required=True)
    sub.choices["finish"].add_argument("--seconds", required=True)
    sub.choices["bf16"].add_argument("--run", action="append", default=[], help="DEVICE:EXIT_CODE")
    sub.choices["bf16"].add_argument("--no-gpu", help="why there is no CUDA run")
    sub.choices["summary"].add_argument("--out", required=True)
    sub.choices["summary"].add_argument("--meta", nargs="*", default=[])
    sub.choices["summary"].add_argument("--quiet", action="store_true", help="write the JSON, print nothing")
    args = parser.parse_args(argv)
    {"cmd": cmd, "update": update, "finish": finish, "bf16": bf16, "summary": summary}[args.verb](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
