"""benchmarks/weights.py's arithmetic: kvctl's own share of the paused window is the window less the
union of the calls it waited on (two replicas called at once count once), and its section of
docs/performance.md is replaced in place, never duplicated."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.lib import REPO


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    sys.path.insert(0, str(REPO))
    spec = importlib.util.spec_from_file_location("bench_weights", REPO / "benchmarks" / "weights.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_union_counts_overlapping_calls_once(bench: ModuleType) -> None:
    assert bench._union([(0.0, 1.0), (0.5, 1.5), (2.0, 3.0), (2.2, 2.4)]) == pytest.approx(2.5)
    assert bench._union([]) == 0.0


def test_paused_window_runs_from_the_first_pause_to_the_last_resume(bench: ModuleType) -> None:
    calls = [("GET /version", 0.0, 0.1), ("POST /pause", 1.0, 1.2), ("POST /pause", 1.1, 1.3),
             ("POST /collective_rpc", 1.3, 2.0), ("POST /resume", 2.1, 2.2), ("POST /resume", 2.1, 2.5)]
    assert bench._paused_window(calls) == (1.0, 2.5)
    assert bench._paused_window(calls[:4]) is None  # never resumed: no window to measure
    assert bench._by_call(calls, (1.0, 2.5))["POST /pause"] == pytest.approx(0.4)
    assert "GET /version" not in bench._by_call(calls, (1.0, 2.5))


def test_section_is_replaced_in_place(bench: ModuleType, tmp_path: Path) -> None:
    stat = {"samples": [0.5], "stats": {"n": 1, "median": 0.5, "p25": 0.5, "p75": 0.5, "min": 0.5, "max": 0.5}}
    share = {"samples": [0.04], "stats": {**stat["stats"], "median": 0.04}}
    missed = {"samples": [0.7], "stats": {**stat["stats"], "median": 0.7}}
    res = {"paused_s": stat, "window_s": stat, "vllm_s": stat, "external_s": stat, "own_s": stat, "own_share": share,
           "not_vllm_s": stat, "not_vllm_share": missed, "store_clear_s": stat, "total_s": stat,
           "phases": {"reload": stat}, "by_call": {"POST /collective_rpc": 0.3}}
    doc = tmp_path / "performance.md"
    doc.write_text("# Performance\n\nbefore\n")
    bench.write_doc(res, "make bench", doc)
    bench.write_doc(res, "make bench", doc)
    text = doc.read_text()
    assert text.count(bench.BEGIN) == 1 and text.startswith("# Performance\n\nbefore\n")
    assert "70% (target < 10%: **missed**)" in text and "4.0% |" in text  # a missed target is said so
    assert "| reload | 500 ms (500 ms-500 ms, n=1) |" in text
