"""benchmarks/scale_report.py: section 7 of docs/performance.md judges the issue-29 targets from the
numbers (a failed size is a failure, never a gap), and is replaced in place, never duplicated."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.lib import REPO

sys.path.insert(0, str(REPO))

from benchmarks import scale_report  # noqa: E402


def _stat(x: float) -> dict[str, Any]:
    return {"samples": [x], "stats": {"n": 1, "median": x, "p25": x, "p75": x, "min": x, "max": x}}


def _scope(raw: float, clear: float, rss_kb: int) -> dict[str, Any]:
    return {"reps": 1, "raw_s": _stat(raw), "kvctl_clear_s": _stat(clear), "kvctl_total_s": _stat(clear + 0.1),
            "kvctl_wall_s": _stat(clear + 0.1), "kvctl_cpu_s": _stat(0.05), "kvctl_rss_self_kb": rss_kb,
            "store_client_rss_kb": 80_000, "calls": {"key_counts": {"n": 1, "s": clear - raw},
                                                     "metrics": {"n": 2, "s": 0.001},
                                                     "remove_by_regex": {"n": 1, "s": raw}},
            "receipt": {}, "process_wall_s": _stat(clear + 0.6), "process_clear_s": _stat(clear),
            "process_maxrss_kb": rss_kb + 30_000, "added_s": clear - raw, "added_ratio": (clear - raw) / raw}


def _row(keys: int, scoped: dict[str, Any], whole: dict[str, Any]) -> dict[str, Any]:
    return {"keys": keys, "mine": keys // 20, "others": keys - keys // 20, "fill_s": 1.0, "master_rss_kb": 1_700_000,
            "listing_bytes": keys * 91, "listing_first_byte_s": _stat(1.0), "listing_s": _stat(1.2),
            "metrics_s": _stat(0.0005), "scoped": scoped, "whole": whole}


def _res(five: dict[str, Any] | None) -> dict[str, Any]:
    empty = {"keys": 0, "scoped": {"kvctl_rss_self_kb": 42_000}, "whole": {"kvctl_rss_self_kb": 42_000}}
    rows = [empty, _row(1_000_000, _scope(3.0, 6.0, 45_000), _scope(5.0, 5.2, 44_000))]
    rows += [five] if five else []
    return {"machine": {"cpu": "cpu", "cores": 2, "memory_gib": 24, "commit": "abc", "elapsed_s": 600},
            "rows": rows, "skipped": [], "mine_share": 0.05}


def test_targets_are_judged_from_the_numbers() -> None:
    res = _res(_row(5_000_000, _scope(15.0, 30.0, 46_000), {"failed": "kvctl reset failed after 130.0 s (peak RSS "
                                                                      "44 MB): master: GET /get_all_keys: no answer"}))
    got = {t["target"]: t["met"] for t in scale_report.targets(res)}
    # judged against the removal call made in the same reset: +100% scoped, +4% whole
    assert got["scale (scoped): kvctl adds under 10% to the removal at 1,000,000 keys"] is False
    assert got["scale (whole): kvctl adds under 10% to the removal at 1,000,000 keys"] is True
    assert got["scale (scoped): kvctl's peak memory independent of the keys (within 16 MiB of an empty master)"]
    assert got["scale: no failure at 5,000,000 keys"] is False  # the whole clear failed there
    text = scale_report.section(res)
    assert "**failed**: GET /get_all_keys: no answer" in text and "| 5,000,000 | whole, **now** |" in text


def test_no_failure_at_five_million_needs_both_scopes() -> None:
    res = _res(_row(5_000_000, _scope(15.0, 16.0, 46_000), _scope(25.0, 25.5, 44_000)))
    got = {t["target"]: t for t in scale_report.targets(res)}
    assert got["scale: no failure at 5,000,000 keys"]["met"] is True
    assert "+4 MiB" in got["scale (scoped): kvctl's peak memory independent of the keys (within 16 MiB of an "
                           "empty master)"]["measured"]


def test_section_is_replaced_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scale_report, "plot", lambda *a, **k: None)  # matplotlib is the bench extra's
    monkeypatch.setattr(scale_report, "BEFORE", tmp_path / "none.json")
    doc = tmp_path / "performance.md"
    doc.write_text("# Performance\n\nbefore\n")
    scale_report.write_doc(_res(None), doc)
    scale_report.write_doc(_res(None), doc)
    text = doc.read_text()
    assert text.count(scale_report.BEGIN) == 1 and text.startswith("# Performance\n\nbefore\n")
    assert "![the reset at scale](performance-scale.png)" in text
