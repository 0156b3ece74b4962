"""The real-config corpus (tests/corpus): kvctl's verdict on each file, for each vLLM release its
entry states, equals the verdict derived from that release's source (corpus.yaml says where).

A verdict is "error" (vLLM refuses to start with it), "dropped" (vLLM starts and silently does
nothing with a setting the config states: kvctl fails it unless --allow-dropped), or "ok" /
"warning" (both start; a warning names a trap). `kvctl_limits` lists the verdicts kvctl cannot reach, each with why: they run as strict xfails,
so one that starts agreeing is noticed. tools/corpus_report.py prints the agreement rate.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kvctl.errors import UsageError
from kvctl.validate import validate_path
from tests.lib import REPO

CORPUS = REPO / "tests" / "corpus"
# corpus.yaml: the configs validate was built against; corpus-*.yaml: parts added later, from
# sources the first part does not use (reported apart by tools/corpus_report.py).
PARTS = sorted(CORPUS.glob("corpus*.yaml"))
ENTRIES = [entry for part in PARTS for entry in yaml.safe_load(part.read_text("utf-8"))]
VERDICTS = ("ok", "warning", "dropped", "error")


def outcome(verdict: str) -> str:
    """What a verdict means for the server: refused, started without a setting, or started."""
    return {"error": "refused", "dropped": "dropped"}.get(verdict, "starts")


def _cases() -> list:
    cases = []
    for entry in ENTRIES:
        limits = entry.get("kvctl_limits") or {}
        for version, expected in entry["expect"].items():
            marks = [pytest.mark.xfail(strict=True, reason=limits[version])] if version in limits else []
            cases.append(pytest.param(entry["file"], str(version), expected, marks=marks,
                                      id=f"{Path(entry['file']).name}@{version}"))
    return cases


def kvctl_verdict(path: Path, version: str) -> str:
    try:
        report = validate_path(path, version)
    except UsageError as exc:
        # A file vLLM cannot parse either (invalid JSON/YAML) is refused by both.
        return "error" if "not valid JSON" in exc.message or "not valid YAML" in exc.message \
            else f"unreadable: {exc.message}"
    if any(not p.dropped for p in report.errors):
        return "error"
    return "dropped" if report.dropped else "warning" if report.warnings else "ok"


@pytest.mark.parametrize(("file", "version", "expected"), _cases())
def test_verdict_matches_vllm(file: str, version: str, expected: str) -> None:
    got = kvctl_verdict(CORPUS / file, version)
    assert not got.startswith("unreadable") and outcome(got) == outcome(expected), \
        f"{file} @ {version}: vLLM's source says {expected}, kvctl says {got}"


def test_corpus_is_real_and_sourced() -> None:
    assert len(ENTRIES) >= 40
    files = [entry["file"] for entry in ENTRIES]
    assert len(files) == len(set(files)), "a file has two entries"
    for entry in ENTRIES:
        assert set(entry["expect"].values()) <= set(VERDICTS), entry["file"]
        assert (CORPUS / entry["file"]).is_file(), entry["file"]
        assert entry.get("source"), f"{entry['file']} has no provenance"
        assert set(entry["expect"]) == set(entry.get("why", {})), f"{entry['file']}: a verdict without its why"
        assert set(entry.get("kvctl_limits") or {}) <= set(entry["expect"]), entry["file"]
