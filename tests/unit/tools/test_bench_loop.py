"""benchmarks/loop.py's bookkeeping: a step's verdict from its receipts (a paused fleet's pending check
then verified reads pending-then-ok), its phases summed over its receipts, the levels summarised
with failed steps named, and its section of docs/performance.md replaced in place, never duplicated."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import pytest

from tests.lib import REPO


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    sys.path.insert(0, str(REPO))
    spec = importlib.util.spec_from_file_location("bench_loop", REPO / "benchmarks" / "loop.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


@dataclass
class FakeReceipt:
    ok: bool = True
    verify: bool = True
    pending: list[str] = field(default_factory=list)
    failed: bool = False
    summary: str = "2/2 replica(s) reset and verified"
    phase_s: float = 0.1

    def metrics(self, prefix: str = "kvctl/") -> dict[str, float]:
        return {f"{prefix}{p}_s": self.phase_s for p in ("prime", "pause", "step", "reset", "resume", "verify",
                                                          "paused", "total")}


def test_verdicts(bench: ModuleType) -> None:
    assert bench.verdict(FakeReceipt()) == "ok"
    assert bench.verdict(FakeReceipt(verify=False)) == "ok (not verified)"
    assert bench.verdict(FakeReceipt(ok=False, pending=["r0"])) == "pending"
    assert bench.verdict(FakeReceipt(ok=False, failed=True, summary="STALE")) == "FAILED: STALE"


def test_phases_add_up_over_a_step_s_receipts(bench: ModuleType) -> None:
    phases = bench.phases([FakeReceipt(phase_s=0.25), FakeReceipt(phase_s=0.5)])
    assert set(phases) == set(bench.COLUMNS) and phases["verify"] == pytest.approx(0.75)


def _results(bench: ModuleType, bad: str | None = None) -> dict:
    steps = {}
    for level in bench.LEVELS:
        rows = []
        for i in range(2):
            step = bench.Step(parts={"evidence": 0.2, "reset": 1.0 + i} if level == "split" else {"reset": 1.0 + i},
                              receipts={"reset": FakeReceipt(verify=level != "reset")})
            step.verdict = "ok (not verified)" if level == "reset" else "ok"
            rows.append(step)
        steps[level] = rows
    if bad:
        steps[bad][1].verdict = "FAILED: 1/2 replica(s) STALE"
    return bench.summarize_levels(steps, "0.32.0")


def test_levels_are_summarised_and_failures_named(bench: ModuleType) -> None:
    res = _results(bench, bad="generating")
    split = res["levels"]["split"]
    assert split["total_s"]["stats"]["max"] == pytest.approx(2.2) and split["all_verified"]
    assert set(split["parts"]) == {"evidence", "reset"}
    assert not res["levels"]["generating"]["all_verified"] and not res["levels"]["reset"]["all_verified"]
    assert bench.failures(res) == ["g. generating fleet (no pause), step 2: FAILED: 1/2 replica(s) STALE"]
    table = bench.table(res)
    assert "| **1/2** |" in table and "not asked (2/2 reset)" in table and "evidence 200 ms + reset 1.50 s" in table


def test_section_is_replaced_in_place(bench: ModuleType, tmp_path: Path) -> None:
    doc, verl = tmp_path / "performance.md", tmp_path / "verl.md"
    doc.write_text("# Performance\n\nbefore\n")
    verl.write_text("# verl\n\n## 5. Weights update or hard reset?\n")
    bench.write_doc(_results(bench), "make bench-loop", doc, verl)
    res = _results(bench, bad="window")
    res["fleet_died"] = {"at": "g. generating fleet (no pause), step 1", "errors": {"r0": ["TypeError: boom"], "r1": []}}
    bench.write_doc(res, "make bench-loop", doc, verl)
    text = doc.read_text()
    assert text.count(bench.BEGIN) == 1 and text.startswith("# Performance\n\nbefore\n")
    assert "Steps that did not verify: f. update window, step 2" in text
    assert "**the fleet died** at g. generating fleet (no pause), step 1 (vLLM's engines exited: r0: `TypeError: boom`)" in text
    verl_text = verl.read_text()  # appended at the end of verl.md once, then replaced in place
    assert verl_text.count("## Cost per step") == 1 and verl_text.index("## 5.") < verl_text.index("## Cost per step")
    assert "| c. evidence split | 1.70 s | 2.20 s | ok (2/2) | mode `reset`, fleet awake and idle" in verl_text
