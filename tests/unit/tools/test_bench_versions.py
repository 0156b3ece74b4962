"""benchmarks/versions.py's bookkeeping: keys shaped as vLLM's store connector names them with the version
invisible in them, the summary of a run's timeline (when version N's keys were half gone, the live hit
rate per window), findings computed from the numbers, and its section of docs/performance.md replaced in
place, never duplicated. The measurement itself needs a real master: `make bench-versions`."""

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
    spec = importlib.util.spec_from_file_location("bench_versions", REPO / "benchmarks" / "versions.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


def test_keys_look_like_vllms_and_hide_the_version(bench: ModuleType) -> None:
    a, b = bench.block_key(0, 5), bench.block_key(1, 5)
    assert a != b and a.rsplit("@", 1)[0] == b.rsplit("@", 1)[0]  # same prefix: no prefix tells versions apart
    assert a.startswith("tiny-llama@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@") and len(a.rsplit("@", 1)[1]) == 64


def _run(bench: ModuleType, name: str, update: str, hits: list[tuple[int, int]], dead: list[int]) -> dict:
    timeline = [{"t": 0.5 * i, "allocated_bytes": 90.0, "capacity_bytes": 100.0, "keys": 10, "dead_keys": d,
                 "live_keys": 10 - d, "evicted_keys": float(i), "failed_put_items": 0.0, "n1_written": 5,
                 "live_lookups": 0, "live_hits": 0} for i, d in enumerate(dead)]
    live = {f"{10 * i}-{10 * i + 10}s": {"lookups": n, "hits": h} for i, (n, h) in enumerate(hits)}
    return {"name": name, "update": update, "flags": [], "what": name, "capacity_blocks": 100,
            "n_keys_written": 8, "n1_keys_written": 8, "update_s": 0.0, "removed": 8 if update == "reset" else None,
            "store_misses": 0, "put_calls_failed": 0, "live": live, "inflight": {"lookups": 10, "hits": 4},
            "timeline": timeline}


def _data(bench: ModuleType) -> dict:
    runs = [_run(bench, "reset", "reset", [(100, 95), (100, 99)], [0, 0, 0]),
            _run(bench, "salt", "salt", [(100, 30), (100, 90)], [8, 6, 4, 2])]
    data = {"date": "2026-12-03 13:52 UTC", "mooncake": "0.3.13.post1", "wall_s": 12.0,
            "config": {"segment_mb": 256, "block_kib": 128, "fill": 0.85, "warm_s": 3.0, "live_s": 40.0,
                       "new_rate": 200.0, "reuse_rate": 400.0, "inflight_s": 5.0, "inflight_rate": 200.0,
                       "sample_s": 0.5},
            "runs": runs}
    data["findings"] = bench.findings(data)
    return data


def test_summary_reads_the_timeline(bench: ModuleType) -> None:
    s = bench.summarize(_data(bench)["runs"][1])
    assert s["dead_half_gone_s"] == 1.0  # 4 of 8 left at t = 1.0
    assert s["dead_gone_s"] is None and s["dead_at_end"] == 2
    assert s["live_hit_rate"] == pytest.approx(0.6) and s["live_hit_first_10s"] == pytest.approx(0.3)
    assert s["live_hit_last_10s"] == pytest.approx(0.9) and s["inflight_hit_rate"] == pytest.approx(0.4)


def test_findings_come_from_the_numbers(bench: ModuleType) -> None:
    text = "\n".join(_data(bench)["findings"])
    assert "60.0% of N+1 re-references hit with the salt" in text and "97.0% after a reset" in text
    assert "it removed all 8 keys" in text and "0-10s 30.0%, 10-20s 90.0%" in text


def test_section_replaced_in_place(bench: ModuleType, tmp_path: Path) -> None:
    doc = tmp_path / "performance.md"
    doc.write_text("# Performance\n\n## 8. Loop\n\ntext\n")
    data = _data(bench)
    for _ in range(2):
        bench.replace_section(doc, bench.BEGIN, bench.END, bench.render(data))
    text = doc.read_text()
    assert text.count(bench.BEGIN) == 1 and text.count(bench.END) == 1 and text.startswith("# Performance")
    assert "| salt: salt | defaults | 8 of 8 | 1.0 s | 2 (at 2 s) | 30.0% / 90.0% | 60.0% | 40.0% | 3 |" in text


def test_the_real_vllm_check_renders_below_the_store_table(bench: ModuleType) -> None:
    data = _data(bench)
    data["real_vllm"] = {"date": "2026-12-03 14:20 UTC", "segment_mb": 16, "cases": [
        {"name": "salt", "update": "salt", "flags": [], "what": "salted", "prompts": 108, "n_keys": 108,
         "n1_in_store": 20, "dead_before_read": 100, "live_first_at_s": 6.4, "live_hit_first": 0.0,
         "dead_after_first": 51, "live_later_at_s": 28.1, "live_hit_later": 0.5, "dead_at_end": 6,
         "evicted_keys": 318.0, "capacity_blocks": 128, "vllm": "0.32.0", "failed_requests": {"HTTP 500": 2},
         "replica_errors": ["RuntimeError: load failed"]}]}
    text = bench.render(data)
    assert text.index("### The same on real vLLM") < text.index(bench.END)
    assert "| salt: salted | defaults | 20 of 108 (100) | 6 s, 0.0% (51) | 28 s, 50.0% (6) | 318 | 2 x HTTP 500 |" in text
    assert "`RuntimeError: load failed`" in text
