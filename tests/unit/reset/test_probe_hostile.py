"""kvctl probe against hostile or broken answers: a replica (or whatever sits in front of it) that
answers /v1/completions out of vLLM's layout must never get a `match`, nor crash the probe of the
other replicas; the Python API refuses bad arguments with a kvctl UsageError that says the fix."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from kvctl.errors import EXIT_INCONCLUSIVE, UsageError
from kvctl.reset.probe import ProbeOptions, probe_fleet
from kvctl.targets import Fleet, Replica
from tests.doubles import DoubleFleet
from tests.unit.reset.test_probe import LogprobsVllm, answer, body, verdict


def probe(*replicas: LogprobsVllm, prompts: list[str] | None = None) -> Any:
    with DoubleFleet() as fleet:
        urls = [fleet.add(r) for r in replicas]
        return asyncio.run(probe_fleet(Fleet([Replica(u, f"r{i}") for i, u in enumerate(urls)]),
                                       prompts or ["hello"], ProbeOptions(timeout=10)))


def test_a_logprobs_list_shorter_than_its_tokens_is_inconclusive() -> None:
    """4 tokens but 1 log-probability: comparing the first only would call the rest a match."""
    plain = body(["a", "b", "c", "d"], [-1.0], 128)
    r = verdict(plain, body(["a", "b", "c", "d"], [-1.0, -0.2, -0.3, -0.4]))
    assert r.verdict == "inconclusive" and "malformed" in r.reason and "1 log-probabilities for 4 tokens" in r.reason


def test_a_null_inside_the_logprobs_does_not_shift_the_comparison() -> None:
    """[-1, null, -3]: dropping the null would compare -3 with the fresh answer's second token."""
    r = verdict(body(["a", "b", "c"], [-1.0, None, -0.3], 128), body(["a", "b", "c"], [-1.0, -0.3, -0.3]))
    assert r.verdict == "inconclusive" and "malformed" in r.reason


@pytest.mark.parametrize("bad", [math.nan, -math.inf])
def test_a_logprob_that_is_not_a_finite_number_is_not_a_match(bad: float) -> None:
    """NaN (JSON parsers accept it) or -inf as served: a difference that cannot be measured is
    not a difference of 0."""
    r = verdict(body(["a", "b"], [-1.0, bad], 128), body(["a", "b"], [-1.0, -0.2]))
    assert r.verdict == "inconclusive" and "finite" in r.reason


def test_logprobs_that_are_not_numbers_do_not_crash_the_probe_of_the_others() -> None:
    """One replica answers token_logprobs ["x", {}]: it is inconclusive, the other is still judged."""
    broken = LogprobsVllm(served={"choices": [{"finish_reason": "length", "logprobs": {
        "tokens": ["a", "b"], "token_logprobs": ["x", {}], "top_logprobs": [{}, {}]}}]})
    report = probe(broken, LogprobsVllm())
    assert [r.verdict for r in report.replicas] == ["inconclusive", "match"]
    assert "malformed" in report.replicas[0].results[0].reason and report.exit_code == EXIT_INCONCLUSIVE


def test_top_logprobs_that_are_not_maps_do_not_crash_the_probe() -> None:
    """top_logprobs entries as lists, read where the near-tie rule looks: inconclusive, no crash."""
    fresh = answer(["a", "b"])
    fresh["choices"][0]["logprobs"]["top_logprobs"] = [["a", -0.1], ["b", -0.2]]
    report = probe(LogprobsVllm(fresh=fresh, served=answer(["a", "x"])))
    assert report.replicas[0].verdict == "inconclusive" and "malformed" in report.replicas[0].results[0].reason


def test_finish_reason_missing_on_one_side() -> None:
    """An answer without finish_reason: equal answers still match (an absent field is no
    difference), but a shorter one is STALE even where the fresh answer is a near-tie: nothing
    says it ended at an end of sequence."""
    plain, salted = body(["a", "b"], [-1.0, -0.2], 128), body(["a", "b"], [-1.0, -0.2])
    salted["choices"][0]["finish_reason"] = "length"
    assert verdict(plain, salted).verdict == "match"
    top = [{"a": -1.0}, {"b": -0.6931, "</s>": -0.6935}]
    assert verdict(body(["a"], [-1.0], 128), body(["a", "b"], [-1.0, -0.6931], top=top)).verdict == "STALE"


def test_a_finish_reason_that_is_not_a_string_is_malformed() -> None:
    plain = body(["a"], [-1.0], 128)
    plain["choices"][0]["finish_reason"] = {"stop": True}
    r = verdict(plain, body(["a"], [-1.0]))
    assert r.verdict == "inconclusive" and "finish_reason" in r.reason


def test_an_empty_choices_list_is_inconclusive_and_says_so() -> None:
    """{"choices": []}: no answer at all, said as such (not "no log-probabilities")."""
    report = probe(LogprobsVllm(served={"choices": []}))
    (result,) = report.replicas[0].results
    assert result.verdict == "inconclusive" and "no choices" in result.reason


@pytest.mark.parametrize("choices", ["abc", [5], [{"logprobs": ["a"]}], [{"logprobs": {"tokens": "abcd"}}]],
                         ids=["choices-a-string", "choice-a-number", "logprobs-a-list", "tokens-a-string"])
def test_answers_of_the_wrong_shape_do_not_crash_the_probe(choices: Any) -> None:
    report = probe(LogprobsVllm(served={"choices": choices}), LogprobsVllm())
    assert [r.verdict for r in report.replicas] == ["inconclusive", "match"]
    assert "malformed" in report.replicas[0].results[0].reason


def test_a_usage_that_is_not_a_map_does_not_crash_the_probe() -> None:
    """usage: "lots": no cached-token count can be read, so no fresh computation is confirmed."""
    report = probe(LogprobsVllm(fresh={**answer(["a"]), "usage": "lots"}, served=answer(["a"])))
    assert report.replicas[0].verdict == "inconclusive"
    assert "no cached tokens" in report.replicas[0].results[0].reason


@pytest.mark.parametrize("cached", [math.nan, -16, False], ids=["nan", "negative", "false"])
def test_a_cached_tokens_that_is_not_a_count_confirms_no_fresh_computation(cached: Any) -> None:
    """The salted answer's cached_tokens is NaN, negative or false: each compared as "0 cached
    tokens" would pass a cached answer for a fresh computation."""
    fresh = {**answer(["a", "b"]), "usage": {"prompt_tokens_details": {"cached_tokens": cached}}}
    report = probe(LogprobsVllm(fresh=fresh, served=answer(["a", "b"])))
    assert report.replicas[0].verdict == "inconclusive"
    assert "no cached tokens" in report.replicas[0].results[0].reason


def test_an_answer_longer_than_asked_is_malformed_and_not_kept() -> None:
    """100000 tokens for max_tokens=4: a server bug or an attack, not evidence; the report keeps
    no more than was asked for."""
    many = [f"t{i}" for i in range(100_000)]
    report = probe(LogprobsVllm(served=answer(many)))
    (result,) = report.replicas[0].results
    assert result.verdict == "inconclusive" and "more tokens than asked" in result.reason
    assert len(result.plain_tokens) <= 4


@pytest.mark.parametrize("kwargs,what", [
    ({"urls": "http://127.0.0.1:9"}, "a list of URLs"),
    ({"prompts": "one prompt"}, "a list of strings"),
    ({"prompts": [1]}, "a list of strings"),
    ({"prompts": [""]}, "empty"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"timeout": 0}, "timeout"),
    ({"tolerance": -1.0}, "tolerance"),
    ({"tolerance": math.nan}, "tolerance"),
])
def test_the_python_api_refuses_bad_arguments_with_a_usage_error(kwargs: dict[str, Any], what: str) -> None:
    """kvctl.probe(urls="http://...") would probe each character as a URL, prompts="text" each
    character as a prompt, prompts=[1] raised a TypeError deep inside: a UsageError with a fix."""
    import kvctl

    kwargs = {"urls": ["http://127.0.0.1:9"], "timeout": 1.0, **kwargs}
    with pytest.raises(UsageError, match=what) as caught:
        kvctl.probe(**kwargs)
    assert caught.value.hint


@pytest.mark.parametrize(("name", "text", "expected"), [
    ("p.json", '{"prompt": "a b c"}\n{"prompt": "d e f"}\n', ["a b c", "d e f"]),  # JSONL under .json
    ("p.json", '["x y", "z w"]', ["x y", "z w"]),
    ("p.json", '[{"prompt": "x y"}]', ["x y"]),
    ("p.jsonl", '{"prompt": "a b"}\n', ["a b"]),
    ("p.txt", '{"prompt": "kept as text"}\n', ['{"prompt": "kept as text"}']),
])
def test_a_json_prompts_file_is_read_as_json_whatever_its_layout(tmp_path, name: str, text: str,
                                                                  expected: list[str]) -> None:
    """Attack (careless): a .json prompts file holding JSONL was read as plain lines, so the probe sent
    '{"prompt": ...}' itself as the prompt. Must hold: .json is a JSON list or JSONL; .txt stays text."""
    from kvctl.reset.probe import load_prompts

    path = tmp_path / name
    path.write_text(text)
    assert load_prompts(path) == expected


def test_a_json_prompts_file_of_the_wrong_shape_is_refused(tmp_path) -> None:
    from kvctl.errors import UsageError
    from kvctl.reset.probe import load_prompts

    path = tmp_path / "p.json"
    path.write_text('{"prompts": 3}')
    with pytest.raises(UsageError, match="must hold a list of prompts"):
        load_prompts(path)
