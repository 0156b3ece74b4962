"""kvctl.reset.probe: the comparison rules, prompt files, and what cannot be probed (version facts)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from kvctl.errors import UsageError
from kvctl.reset.probe import EXIT_INCONCLUSIVE, ProbeOptions, PromptResult, _answer, _compare, load_prompts, \
    probe_fleet
from kvctl.targets import Fleet, Replica
from tests.doubles import DoubleFleet, VllmDouble


def body(tokens: list[str], logprobs: list[float], cached: int | None = 0,
         top: list[dict[str, float]] | None = None) -> dict:
    return {"choices": [{"logprobs": {"tokens": tokens, "token_logprobs": logprobs,
                                      "top_logprobs": top or [{t: lp} for t, lp in zip(tokens, logprobs)]}}],
            "usage": {"prompt_tokens_details": None if cached is None else {"cached_tokens": cached}}}


def verdict(plain: dict, salted: dict, tolerance: float = 1e-3) -> PromptResult:
    result = PromptResult("p", "match", "")
    _compare(_answer(plain), _answer(salted), tolerance, result)
    return result


def test_same_tokens_and_logprobs_match() -> None:
    r = verdict(body(["a", "b"], [-1.0, -2.0], 128), body(["a", "b"], [-1.0, -2.0000001]))
    assert r.verdict == "match" and r.max_logprob_difference < 1e-3


def test_a_different_token_is_stale_with_where_it_differs() -> None:
    r = verdict(body(["a", "x", "y"], [-1.0, -0.5, -0.1], 128), body(["a", "b", "c"], [-1.0, -0.2, -0.3]))
    assert r.verdict == "STALE" and r.first_difference == {"index": 1, "plain": "x", "salted": "b"}


def test_same_tokens_other_logprobs_is_stale() -> None:
    r = verdict(body(["a", "b"], [-1.0, -2.0], 128), body(["a", "b"], [-1.3, -2.0]))
    assert r.verdict == "STALE" and r.max_logprob_difference == pytest.approx(0.3)


def test_a_near_tie_in_the_fresh_answer_is_inconclusive() -> None:
    top = [{"a": -1.0}, {"b": -0.6931, "x": -0.6935}]
    r = verdict(body(["a", "x"], [-1.0, -0.6935], 128), body(["a", "b"], [-1.0, -0.6931], top=top))
    assert r.verdict == "inconclusive" and "near-tie" in r.reason


def test_prompt_files(tmp_path: Path) -> None:
    text = tmp_path / "p.txt"
    text.write_text("first prompt\n\nsecond prompt\n")
    assert load_prompts(text) == ["first prompt", "second prompt"]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text(json.dumps({"prompt": "a"}) + "\n" + json.dumps({"prompt": "b", "id": 2}) + "\n")
    assert load_prompts(jsonl) == ["a", "b"]
    jsonl.write_text('{"text": "a"}\n')
    with pytest.raises(UsageError, match=r"p.jsonl:1: no \"prompt\" string"):
        load_prompts(jsonl)
    (tmp_path / "e.txt").write_text("\n")
    with pytest.raises(UsageError, match="no prompts"):
        load_prompts(tmp_path / "e.txt")


def test_versions_without_cache_salt_are_inconclusive_not_guessed() -> None:
    """cache_salt first appears in vLLM 0.10.0 (vllm_facts.json): before, no fresh computation
    can be forced, and the probe says so instead of comparing."""
    with DoubleFleet() as fleet:
        url = fleet.add(VllmDouble("0.9.2", connector=None))
        report = asyncio.run(probe_fleet(Fleet([Replica(url, "old")]), ["hello"], ProbeOptions(timeout=10)))
    (replica,) = report.replicas
    assert replica.verdict == "inconclusive" and "takes no cache_salt (first in 0.10.0)" in replica.error
    assert report.exit_code == EXIT_INCONCLUSIVE


def test_cli_json_and_exit_code_for_an_inconclusive_fleet(cli) -> None:
    with DoubleFleet() as fleet:
        url = fleet.add(VllmDouble("0.9.2", connector=None))
        result = cli("probe", "--url", url, "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == EXIT_INCONCLUSIVE and data["exit_code"] == EXIT_INCONCLUSIVE
    assert data["replicas"][0]["verdict"] == "inconclusive" and "cache_salt" in data["summary"] + \
        data["replicas"][0]["error"]


def test_reset_probe_prompts_needs_verify(cli, tmp_path: Path) -> None:
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    result = cli("reset", "--url", "http://127.0.0.1:9", "--probe-prompts", str(prompts))
    assert result.exit_code == 2 and "needs --verify" in result.stderr
