"""tools/coinstall.py's comparison of two pip resolutions (no pip, no network).

The reports below are FABRICATED FIXTURES in the shape of `pip install --dry-run --report`
(report version "1"): small made-up package sets that exercise the comparison, not statements
about any real release. The real matrix is `make coinstall` (benchmarks/coinstall.json).
"""

from __future__ import annotations

import json
import sys

import pytest

from tests.lib import REPO

ROOT = REPO
sys.path.insert(0, str(ROOT / "tools"))

import coinstall  # noqa: E402


def fixture_pip_report(**packages: str) -> dict:
    """A fabricated pip report installing `packages` (name=version; '_' in a name stays '_')."""
    return {
        "version": "1",
        "pip_version": "26.3",
        "install": [{"download_info": {"url": f"https://example.invalid/{name}-{version}.whl", "archive_info": {}},
                     "is_direct": False, "requested": False,
                     "metadata": {"metadata_version": "2.1", "name": name, "version": version}}
                    for name, version in packages.items()],
        "environment": {"python_full_version": "3.11.7", "sys_platform": "linux", "platform_machine": "x86_64"},
    }


FIXTURE_TARGET_ALONE = fixture_pip_report(**{"fake-engine": "1.0", "typer": "0.29.2", "fastapi-cli": "0.0.34",
                                             "PyYAML": "6.0.4", "prometheus_client": "0.26.0"})


def versions(report: dict) -> dict[str, str]:
    return coinstall.resolved_versions(report)


def test_names_are_canonical_and_versions_compare_as_versions() -> None:
    alone = versions(FIXTURE_TARGET_ALONE)
    assert alone["pyyaml"] == "6.0.4" and alone["prometheus-client"] == "0.26.0"
    joint = versions(fixture_pip_report(**{"fake-engine": "1.0.0", "typer": "0.29.2", "fastapi_cli": "0.0.34",
                                           "pyyaml": "6.0.4", "Prometheus-Client": "0.26.0", "tenacity": "9.1.2"}))
    result = coinstall.verdict(alone, joint)
    assert result["verdict"] == "co-installable"
    assert result["changes"] == [] and result["added"] == {"tenacity": "9.1.2"}


def test_a_moved_version_is_a_change_even_when_the_rest_only_adds() -> None:
    # the shape: the old `typer<0.26` pin pulls typer (and what needs a newer typer) back
    joint = versions(fixture_pip_report(**{"fake-engine": "1.0", "typer": "0.25.1", "fastapi-cli": "0.0.32",
                                           "PyYAML": "6.0.4", "prometheus_client": "0.26.0", "psutil": "7.2.2"}))
    result = coinstall.verdict(versions(FIXTURE_TARGET_ALONE), joint)
    assert result["verdict"] == "changes"
    assert result["changes"] == [{"package": "fastapi-cli", "alone": "0.0.34", "with_kvctl": "0.0.32"},
                                 {"package": "typer", "alone": "0.29.2", "with_kvctl": "0.25.1"}]
    assert result["summary"] == "kvctl would change fastapi-cli 0.0.34 -> 0.0.32, typer 0.29.2 -> 0.25.1"
    assert result["added"] == {"psutil": "7.2.2"}


def test_a_package_that_leaves_is_a_change() -> None:
    joint = versions(fixture_pip_report(**{"fake-engine": "1.0", "typer": "0.29.2", "PyYAML": "6.0.4",
                                           "prometheus_client": "0.26.0"}))
    result = coinstall.verdict(versions(FIXTURE_TARGET_ALONE), joint)
    assert result["verdict"] == "changes"
    assert result["changes"] == [{"package": "fastapi-cli", "alone": "0.0.34", "with_kvctl": None}]
    assert "fastapi-cli 0.0.34 -> (removed)" in result["summary"]


def test_failures_are_verdicts_not_skips() -> None:
    alone = versions(FIXTURE_TARGET_ALONE)
    assert coinstall.verdict(alone, None, "typer conflict")["verdict"] == "unresolvable"
    missing = coinstall.verdict(None, None, alone_reason="no torch")
    assert missing["verdict"] == "target-unresolvable" and "no torch" in missing["summary"]


def test_an_unknown_report_version_is_refused() -> None:
    with pytest.raises(ValueError):
        coinstall.resolved_versions({**FIXTURE_TARGET_ALONE, "version": "2"})


# pip 26's words when a target pins a torch build the index lacks (fabricated package name)
FIXTURE_PIP_OUTPUT = """\
WARNING: pip is using lazily downloaded wheels using HTTP range requests to obtain dependency information.
Collecting fake-engine==1.0
WARNING: Location 'file:///opt/pypi/simple/fake-engine/' is ignored: it is neither a file nor a directory.
ERROR: Cannot install fake-engine==1.0 because these package versions have conflicting dependencies.

The conflict is caused by:
    fake-engine 1.0 depends on torch==2.9.1+cpu; platform_machine == "x86_64"
    The user requested (constraint) torch<=2.14.1

Additionally, some packages in these conflicts have no matching distributions available for your environment:
    torch

To fix this you could try to:
1. loosen the range of package versions you've specified

ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/en/latest/topics/dependency-resolution/
"""


def test_failure_reason_keeps_pips_explanation() -> None:
    reason = coinstall.failure_reason(FIXTURE_PIP_OUTPUT)
    assert reason == ('fake-engine 1.0 depends on torch==2.9.1+cpu; platform_machine == "x86_64"; '
                      "The user requested (constraint) torch<=2.14.1; no distribution matches for: torch")
    long = ("ERROR: Could not find a version that satisfies the requirement torch==2.9.1+cpu "
            "(from versions: 2.0.0, 2.13.0+cpu, 2.14.1)\n")
    assert coinstall.failure_reason(long).endswith("(local builds found: 2.13.0+cpu)")
    ignored = "ERROR: Ignored the following versions that require a different python version: 0.52.0\n"
    assert coinstall.failure_reason(ignored + long).startswith("Could not find a version")


def test_requirements_come_from_pyproject_with_overrides_and_extras() -> None:
    pyproject = ROOT / "pyproject.toml"
    plain = coinstall.kvctl_requirements(pyproject)
    assert any(r.startswith("typer") for r in plain) and not any(r.startswith("kvctl") for r in plain)
    old = coinstall.kvctl_requirements(pyproject, ["typer>=0.20,<0.26"])
    assert [r for r in old if r.startswith("typer")] == ["typer>=0.20,<0.26"]
    assert len(old) == len(plain)
    # kvctl[bench] -> kvctl[test] -> kvctl[mooncake-cpu]: self-references expand, never reach pip
    bench = coinstall.kvctl_requirements(pyproject, extras=["bench"])
    assert any(r.startswith("mooncake-transfer-engine") for r in bench)
    assert not any(r.startswith("kvctl") for r in bench)
    assert coinstall.apply_overrides(["a>=1"], ["b<2"]) == ["a>=1", "b<2"]


def _fixture_matrix() -> dict:
    alone = versions(FIXTURE_TARGET_ALONE)
    before = versions(fixture_pip_report(**{"fake-engine": "1.0", "typer": "0.25.1", "fastapi-cli": "0.0.32",
                                            "PyYAML": "6.0.4", "prometheus_client": "0.26.0"}))
    now = versions(fixture_pip_report(**{**dict(alone), "tenacity": "9.1.2"}))
    entry = {"target": "fake-engine==1.0", "alone": {"ok": True, "seconds": 3.0, "versions": alone},
             "variants": {}}
    for name, joint in (("kvctl", now), ("before", before)):
        result = coinstall.verdict(alone, joint)
        result["seconds"] = 4.0
        result["shared"] = {p: {"alone": alone.get(p), "with_kvctl": joint.get(p)} for p in coinstall.SHARED}
        entry["variants"][name] = result
    entry["variants"]["before"]["held"] = {"ok": False, "seconds": 1.0, "reason": "typer conflict"}
    return {"generated": "2026-01-01T00:00:00+00:00", "pip": "26.3", "python": "3.11.7", "platform": "linux x86_64",
            "variants": {"kvctl": {"label": "kvctl", "requirements": ["typer>=0.20"]},
                         "before": {"label": "Before: typer>=0.20,<0.26", "requirements": ["typer>=0.20,<0.26"]}},
            "targets": [entry]}


def test_the_table_shows_moves_and_additions() -> None:
    text = coinstall.render_markdown(_fixture_matrix())
    row = next(line for line in text.splitlines() if line.startswith("| `fake-engine==1.0` | 3+4 |"))
    assert "| 0.29.2 |" in row and "| +9.1.2 |" in row and row.endswith("| co-installable |")
    assert "### Before: typer>=0.20,<0.26" in text
    assert coinstall._cell({"alone": "0.0.34", "with_kvctl": None}, resolved=True) == "**0.0.34 -> removed**"
    assert coinstall._cell({"alone": "0.0.34", "with_kvctl": None}, resolved=False) == "0.0.34"
    assert ("| `fake-engine==1.0` | 0.29.2 | 0.25.1 | kvctl would change fastapi-cli 0.0.34 -> 0.0.32, "
            "typer 0.29.2 -> 0.25.1; with the target's versions held: unresolvable (typer conflict) |") in text


def test_install_md_shows_the_committed_matrix() -> None:
    results = ROOT / "benchmarks" / "coinstall.json"
    doc = (ROOT / "docs" / "install.md").read_text("utf-8")
    body = coinstall.render_markdown(json.loads(results.read_text()))
    assert coinstall.replace_section(doc, body) == doc, \
        "docs/install.md is stale: run `python tools/coinstall.py --render-only`"
