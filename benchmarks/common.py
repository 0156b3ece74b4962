"""Shared helpers for the benchmarks: repetition, statistics, timed child processes, helper servers.

Every measurement is a list of samples (seconds, unless named otherwise) taken after warm-up runs
that are thrown away; a `Stats` summarises it (median, interquartile range, min, max). Ratios are
always between medians of the same run: this machine is shared and noisy, absolute times move
between runs, ratios taken side by side hold.
"""

from __future__ import annotations

import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = ROOT / "benchmarks"
PY = sys.executable  # the kvctl venv's python (make bench runs run.py with it)
KVCTL = [str(Path(PY).parent / "kvctl")] if (Path(PY).parent / "kvctl").exists() else [PY, "-m", "kvctl"]
LOOPBACK = "127.0.0.1"


# The CPU stack every real-vLLM benchmark starts (kvctl serve ... -- VLLM_ARGS): the tiny model's
# window, float32 on the CPU, few sequences, no graph capture; its start may take minutes on 2 cores.
VLLM_ARGS = ["--max-model-len", "256", "--dtype", "float32", "--max-num-seqs", "4", "--enforce-eager"]
START_TIMEOUT = 900.0
# > 128 tokens (one CPU block) and < 256 with the tiny tokenizer: one full block to reuse
PROMPT = ("The quick brown fox jumps over the lazy dog while the cache keeps every block it has seen. " * 4).strip()

def log(text: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# -- statistics ---------------------------------------------------------------------------------
@dataclass
class Stats:
    n: int
    median: float
    p25: float
    p75: float
    min: float
    max: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> Stats:
        xs = sorted(float(x) for x in samples)
        if not xs:
            raise ValueError("no samples")
        if len(xs) == 1:
            q1 = q3 = xs[0]
        else:
            q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
        return cls(len(xs), statistics.median(xs), q1, q3, xs[0], xs[-1])

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def summarize(samples: Sequence[float]) -> dict[str, Any]:
    """`{"samples": [...], "stats": {...}}`, the shape every result in results.json uses."""
    return {"samples": [round(float(x), 6) for x in samples], "stats": Stats.of(samples).to_dict()}


def repeat(func: Callable[[], float], reps: int, warmup: int = 1) -> list[float]:
    """Run `func` warmup + reps times; keep the last `reps` values it returns."""
    for _ in range(warmup):
        func()
    return [func() for _ in range(reps)]


def ratio(a: float, b: float) -> float | None:
    return None if not b else a / b


# -- timed child processes -----------------------------------------------------------------------
@dataclass
class ProcResult:
    wall_s: float
    returncode: int
    maxrss_kb: int  # peak resident set of the child (and the descendants it waited for)
    stdout: str
    stderr: str
    cpu_s: float = 0.0  # user + system CPU of the child (and the descendants it waited for)


def run_timed(cmd: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 600,
              check: bool = True, stdin: str | None = None) -> ProcResult:
    """Run `cmd` as its own process; wall time from spawn to exit, peak RSS from wait4().

    stdout/stderr go to temporary files (not pipes) so a chatty child never blocks on a full pipe
    and no reader thread competes with it for the CPU.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=err, env=env,
                                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL)
        if stdin is not None:
            assert proc.stdin is not None
            proc.stdin.write(stdin.encode())
            proc.stdin.close()
        # a blocking wait4 costs no CPU while the child runs; a timer kills a child that hangs
        killer = threading.Timer(timeout, proc.kill)
        killer.start()
        try:
            _, status, rusage = os.wait4(proc.pid, 0)
        finally:
            killer.cancel()
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode == -9 and wall >= timeout:
            raise TimeoutError(f"{' '.join(cmd)} did not finish within {timeout:g} s")
        out.seek(0)
        err.seek(0)
        result = ProcResult(wall, proc.returncode, int(rusage.ru_maxrss), out.read().decode(errors="replace"),
                            err.read().decode(errors="replace"), rusage.ru_utime + rusage.ru_stime)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {result.returncode}:\n{result.stdout[-2000:]}\n"
                           f"{result.stderr[-2000:]}")
    return result


def kvctl_json(args: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 600,
               ok_codes: tuple[int, ...] = (0,)) -> tuple[ProcResult, dict[str, Any]]:
    """Run `kvctl ARGS --json` as a process; return the timing and the parsed receipt."""
    result = run_timed([*KVCTL, *args, "--json"], env=env, timeout=timeout, check=False)
    if result.returncode not in ok_codes:
        raise RuntimeError(f"kvctl {' '.join(args)} exited {result.returncode}:\n{result.stdout[-3000:]}\n"
                           f"{result.stderr[-3000:]}")
    return result, json.loads(result.stdout)


# -- helper servers in their own process ----------------------------------------------------------
class Helper:
    """A helper process (benchmarks/*.py) that prints one `READY ...` line and then serves until its
    stdin closes. Used for the HTTP doubles and the store writer, so that what they cost is never
    charged to the process being measured."""

    def __init__(self, script: str, *args: str, env: dict[str, str] | None = None, timeout: float = 300) -> None:
        self._err = tempfile.TemporaryFile()  # a file, not a pipe: a chatty helper never blocks
        self.proc = subprocess.Popen([PY, str(BENCH_DIR / script), *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._err, text=True,
                                     env={**os.environ, **(env or {})})
        line = self.readline(timeout)
        if not line.startswith("READY"):
            self.close()
            raise RuntimeError(f"{script} failed to start: {line!r}; stderr: {self.stderr_tail()}")
        self.ready = line.split()[1:]

    def readline(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise RuntimeError(f"helper gave no answer within {timeout:g} s; stderr: {self.stderr_tail()}")
        return self.proc.stdout.readline().strip()

    def command(self, text: str, timeout: float = 600) -> list[str]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()
        answer = self.readline(timeout)
        if not answer.startswith("OK"):
            raise RuntimeError(f"helper: {text!r} -> {answer!r}; stderr: {self.stderr_tail()}")
        return answer.split()[1:]

    def stderr_tail(self) -> str:
        self._err.seek(0)
        return self._err.read().decode(errors="replace")[-2000:]

    def close(self, timeout: float = 15) -> None:
        """Close stdin (the helper's signal to stop), then wait; SIGKILL it if it lingers."""
        if self.proc.poll() is None:
            try:
                if self.proc.stdin is not None:
                    self.proc.stdin.close()
                self.proc.wait(timeout=timeout)
            except (subprocess.TimeoutExpired, BrokenPipeError):
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._err.close()

    def __enter__(self) -> Helper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def foreign_vllm_pids(own: set[int] = frozenset()) -> list[int]:  # type: ignore[assignment]
    """PIDs of vLLM API servers on this machine that the benchmark did not start."""
    out = subprocess.run(["pgrep", "-f", "vllm.entrypoints.openai.api_server"], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split() if int(p) not in own and int(p) != os.getpid()]


def wait_for_quiet_machine(max_wait: float, poll: float = 15.0) -> float:
    """Wait (bounded) until no vLLM server that we did not start runs; returns the seconds waited."""
    began = time.monotonic()
    announced = False
    while foreign_vllm_pids():
        if time.monotonic() - began > max_wait:
            log(f"other vLLM servers still run after {max_wait:.0f} s: going on (numbers will be noisier)")
            break
        if not announced:
            log(f"other vLLM servers run on this machine (pids {foreign_vllm_pids()}): waiting for them to end")
            announced = True
        time.sleep(poll)
    return time.monotonic() - began


def replace_section(doc: Path, begin: str, end: str, new: str) -> None:
    """Put `new` (which starts with `begin` and ends with `end`) where the page's begin..end section
    is, or append it: the generated sections of docs/performance.md that scripts other than
    benchmarks/run.py write."""
    text = doc.read_text()
    if begin in text and end in text:
        rest = text[text.index(end) + len(end):].lstrip("\n")
        text = text[:text.index(begin)] + new + ("\n" + rest if rest else "")
    else:
        text = text.rstrip("\n") + "\n\n" + new
    doc.write_text(text)
