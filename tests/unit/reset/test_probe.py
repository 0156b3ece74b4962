"""kvctl.reset.probe: the comparison rules, prompt files, and what cannot be probed (version facts)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from typing import Any

import pytest
from aiohttp import web

from kvctl.errors import EXIT_FAILED, EXIT_MATCH, EXIT_STALE, UsageError
from kvctl.reset.probe import EXIT_INCONCLUSIVE, ProbeOptions, PromptResult, _answer, _compare, load_prompts, \
    probe_fleet
from kvctl.targets import Fleet, Replica
from tests.doubles import Call, DoubleFleet, MasterDouble, VllmDouble
from tests.lib import REPO


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
    for bad in ('{"text": "a"}\n', '{"prompt": "  "}\n'):  # no prompt, or a blank one (probed as nothing)
        jsonl.write_text(bad)
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


# -- a vLLM that answers with log-probabilities ------------------------------------------
def answer(tokens: list[str], logprobs: list[float] | None = None, finish: str | None = "length",
           top: list[dict[str, float]] | None = None) -> dict:
    """The `choices` of a vLLM /v1/completions answer (greedy, logprobs=N) for these tokens."""
    lps = logprobs if logprobs is not None else [-0.1 * (i + 1) for i in range(len(tokens))]
    return {"choices": [{"index": 0, "text": "".join(tokens), "finish_reason": finish, "stop_reason": None,
                         "logprobs": {"tokens": tokens, "token_logprobs": lps, "text_offset": list(range(len(tokens))),
                                      "top_logprobs": top or [{t: lp, f"not-{t}": lp - 3.0}
                                                              for t, lp in zip(tokens, lps)]}}]}


class LogprobsVllm(VllmDouble):
    """TEST DOUBLE of vLLM's /v1/completions with log-probabilities (VllmDouble answers
    `logprobs: null`). Everything else is VllmDouble's: its routes, its cache model and the
    `usage.prompt_tokens_details.cached_tokens` of each answer. Only the answer's top-level fields
    are replaced: by `fresh` for a request that carries a `cache_salt` (computed from scratch), by
    `served` for one without (what the cache serves). `served` defaults to `fresh`: a match."""

    def __init__(self, *args: Any, fresh: dict | None = None, served: dict | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("connector", None)
        super().__init__(*args, **kwargs)
        self.fresh = fresh if fresh is not None else answer(["a", "b", "c", "d"])
        self.served = served if served is not None else self.fresh

    async def _h_completions(self, request: web.Request, call: Call) -> web.Response:
        response = await super()._h_completions(request, call)
        if response.status != 200:
            return response
        data = json.loads(response.body)
        data.update(self.fresh if "cache_salt" in call.body else self.served)
        return web.json_response(data)


# -- 1. a different length or finish_reason is a difference ------------------------------
def test_a_shorter_answer_as_served_is_stale() -> None:
    """Stale KV that makes the model stop early: 1 token as served against 4 computed fresh."""
    plain = body(["a"], [-1.0], 128)
    plain["choices"][0]["finish_reason"] = "stop"
    salted = body(["a", "b", "c", "d"], [-1.0, -0.2, -0.3, -0.4])
    salted["choices"][0]["finish_reason"] = "length"
    r = verdict(plain, salted)
    assert r.verdict == "STALE" and "1 token(s) as served, 4 computed fresh" in r.reason
    assert r.first_difference == {"index": 1, "plain": None, "salted": "b"}


def test_a_longer_answer_as_served_is_stale() -> None:
    r = verdict(body(["a", "b", "c"], [-1.0, -0.2, -0.3], 128), body(["a"], [-1.0]))
    assert r.verdict == "STALE" and r.first_difference == {"index": 1, "plain": "b", "salted": None}


def test_an_end_where_the_fresh_answer_is_a_near_tie_is_inconclusive() -> None:
    """The shorter answer stopped at an end of sequence, and the fresh computation is a near-tie
    there between ending and going on: no verdict is safe (as for a differing token)."""
    plain = body(["a"], [-1.0], 128)
    plain["choices"][0]["finish_reason"] = "stop"
    top = [{"a": -1.0}, {"b": -0.6931, "</s>": -0.6935}]
    r = verdict(plain, body(["a", "b"], [-1.0, -0.6931], top=top))
    assert r.verdict == "inconclusive" and "near-tie" in r.reason and r.hint


def test_an_early_end_that_is_not_an_end_of_sequence_is_stale_even_at_a_near_tie() -> None:
    """finish_reason "length" with fewer tokens than the fresh answer: no end of sequence explains it."""
    plain = body(["a"], [-1.0], 128)
    plain["choices"][0]["finish_reason"] = "length"
    top = [{"a": -1.0}, {"b": -0.6931, "</s>": -0.6935}]
    assert verdict(plain, body(["a", "b"], [-1.0, -0.6931], top=top)).verdict == "STALE"


def test_same_tokens_other_finish_reason_is_stale() -> None:
    plain, salted = body(["a", "b"], [-1.0, -2.0], 128), body(["a", "b"], [-1.0, -2.0])
    plain["choices"][0]["finish_reason"], salted["choices"][0]["finish_reason"] = "stop", "length"
    r = verdict(plain, salted)
    assert r.verdict == "STALE" and "finish_reason 'stop' (as served) vs 'length' (computed fresh)" in r.reason


def test_logprobs_that_differ_before_a_near_tie_are_stale() -> None:
    """The first token's log-probability already differs: the near-tie at the second token does
    not make that evidence inconclusive."""
    top = [{"a": -1.0}, {"b": -0.6931, "x": -0.6935}]
    r = verdict(body(["a", "x"], [-1.5, -0.6935], 128), body(["a", "b"], [-1.0, -0.6931], top=top))
    assert r.verdict == "STALE" and "log-probabilities differ by 0.5" in r.reason


def test_an_answer_the_server_cut_short_is_inconclusive() -> None:
    """finish_reason "abort" (vLLM aborted the request, e.g. while it was paused for a reset):
    the model did not choose to end there, so it is no evidence either way."""
    plain = body(["a"], [-1.0], 128)
    plain["choices"][0]["finish_reason"] = "abort"
    r = verdict(plain, body(["a", "b"], [-1.0, -0.2]))
    assert r.verdict == "inconclusive" and "abort" in r.reason and r.hint


def test_cli_probe_exits_stale_for_an_answer_that_stops_early(cli, tmp_path: Path) -> None:
    with DoubleFleet() as fleet:
        url = fleet.add(LogprobsVllm(served=answer(["a"], finish="stop"), fresh=answer(["a", "b", "c", "d"])))
        result = cli("probe", "--url", url, "--prompts", str(write_prompts(tmp_path, "hello")), "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == EXIT_STALE and data["replicas"][0]["verdict"] == "STALE", result.stdout


# -- 2. --verify --probe-prompts: only a match verifies ---------------------------------
def write_prompts(folder: Path, *prompts: str) -> Path:
    path = folder / "prompts.txt"
    path.write_text("\n".join(prompts) + "\n")
    return path


def test_reset_verify_probe_prompts_that_match_is_verified(cli, tmp_path: Path) -> None:
    with DoubleFleet() as fleet:
        url = fleet.add(LogprobsVllm())
        prompts = write_prompts(tmp_path, "hello")
        result = cli("reset", "--url", url, "--verify", "--probe-prompts", str(prompts), "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == 0, result.stdout
    assert data["ok"] is True and "verified" in data["summary"] and data["replicas"][0]["probe"]["verdict"] == "match"


@pytest.mark.parametrize("replica,prompt,why,fix", [
    # VllmDouble answers logprobs: null
    (lambda: VllmDouble(connector=None), "hello", "no log-probabilities", "logprobs"),
    # longer than max_model_len: vLLM refuses it with a 400
    (lambda: LogprobsVllm(max_model_len=40), " ".join(["word"] * 60), "maximum context length", "max_model_len"),
    # a cache that ignores cache_salt (a fault: real vLLM honours it): the salted request still hits
    # (the prompt fills 3 blocks)
    (lambda: VllmDouble(connector=None, cache_salt=False), " ".join(f"w{i}" for i in range(50)), "ignores cache_salt",
     "cache_salt"),
    # no cached_tokens in the answer: a fresh computation of the salted request is not confirmed
    (lambda: LogprobsVllm(prompt_tokens_details=False), "hello", "reports no cached tokens",
     "--enable-prompt-tokens-details"),
    (lambda: VllmDouble("0.9.2", connector=None), "hello", "takes no cache_salt", "0.10.0"),
], ids=["no-logprobs", "too-long", "salt-ignored", "no-cached-tokens", "no-cache-salt"])
def test_reset_verify_probe_prompts_inconclusive_is_not_verified(cli, tmp_path: Path, replica: Any, prompt: str,
                                                                 why: str, fix: str) -> None:
    """The content proof that was asked for never ran: the replica is not verified, and the
    receipt's error says why (the probe's first inconclusive reason) and how to fix it."""
    with DoubleFleet() as fleet:
        url, master = fleet.add(replica()), fleet.add_master(MasterDouble())  # 0.9.2's layout is unknown
        result = cli("reset", "--url", url, "--master", master, "--verify", "--probe-prompts",
                     str(write_prompts(tmp_path, prompt)), "--json")
    data = json.loads(result.stdout)
    (rr,) = data["replicas"]
    assert result.exit_code == EXIT_FAILED and data["ok"] is False, result.stdout
    assert rr["probe"]["verdict"] == "inconclusive" and rr["reset"] is False
    assert "kvctl probe was inconclusive" in rr["error"] and why in rr["error"], rr["error"]
    assert "fix:" in rr["error"] and fix in rr["error"].split("fix:", 1)[1], rr["error"]
    assert f"NOT reset: {rr['name']}" in data["summary"]


def test_reset_verify_probe_prompts_stale_is_not_verified(cli, tmp_path: Path) -> None:
    with DoubleFleet() as fleet:
        url = fleet.add(LogprobsVllm(served=answer(["a"], finish="stop")))
        prompts = write_prompts(tmp_path, "hello")
        result = cli("reset", "--url", url, "--verify", "--probe-prompts", str(prompts), "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == EXIT_FAILED and "found STALE KV" in data["replicas"][0]["error"]


def test_conclude_needs_the_probe_it_was_asked_for() -> None:
    """--verify with probe prompts, but no probe result for a replica (it never ran): not verified."""
    from kvctl.reset.plan import Plan, ReplicaPlan, ResetOptions
    from kvctl.reset.receipt import CanaryCheck, ReplicaReceipt, conclude

    opts = ResetOptions(verify=True, probe_prompts=["hello"])
    plan = Plan(opts, [ReplicaPlan("r", "http://r", "0.32.0")], None, None)
    rr = ReplicaReceipt("r", "http://r", "0.32.0", None, canary=CanaryCheck(True, "cached_tokens"))
    receipt = conclude(plan, [rr], None, 0.0)
    assert receipt.not_reset == ["r"] and "probe" in (rr.error or "")


# -- 3. kvctl.probe, many times a process ------------------------------------------------
def test_kvctl_probe_works_twice_in_one_process_with_a_reset_between() -> None:
    import kvctl
    import kvctl.cli.probe  # noqa: F401  # a module named probe anywhere must not shadow kvctl.probe
    import kvctl.reset.probe  # noqa: F401

    with DoubleFleet() as fleet:
        url = fleet.add(LogprobsVllm())
        first = kvctl.probe([url], prompts=["hello"], timeout=10)
        receipt = kvctl.hard_reset([url], connector=False, timeout=5)
        second = kvctl.probe([url], prompts=["hello"], timeout=10)
    assert receipt.ok, receipt.summary
    assert first.exit_code == second.exit_code == EXIT_MATCH, (first.summary, second.summary)
    assert callable(kvctl.probe) and kvctl.probe.__module__ == "kvctl.api"


def test_no_kvctl_submodule_shadows_the_python_api() -> None:
    """A submodule kvctl.<name> becomes the package attribute <name> once imported, in place of
    the API function of that name (the audit's `'module' object is not callable`)."""
    import pkgutil

    import kvctl

    submodules = {m.name for m in pkgutil.iter_modules(kvctl.__path__)}
    assert not submodules & set(kvctl._API), submodules & set(kvctl._API)


# -- 4. kvctl.probe_async, inside a running loop -----------------------------------------
def test_probe_async_runs_inside_a_running_loop() -> None:
    import kvctl

    async def trainer_step(url: str) -> Any:
        with pytest.raises(UsageError, match="probe_async"):  # the blocking twin says what to call instead
            kvctl.probe([url], prompts=["hello"], timeout=10)
        return await kvctl.probe_async([url], prompts=["hello"], timeout=10)

    with DoubleFleet() as fleet:
        url = fleet.add(LogprobsVllm())
        report = asyncio.run(trainer_step(url))
    assert report.exit_code == EXIT_MATCH, report.summary
    assert "probe_async" in kvctl._API and "probe_async" in dir(kvctl)
    assert "kvctl.probe_async" in (REPO / "docs" / "python-api.md").read_text()


def test_bad_probe_prompts_after_a_reset_keep_its_receipt() -> None:
    """ResetOptions built in code with a blank probe prompt: the reset already ran when the probe
    refuses it, so the receipt survives, and the replica is not verified (the error says why)."""
    from kvctl.reset.execute import hard_reset_fleet
    from kvctl.reset.plan import ResetOptions
    from kvctl.targets import build_fleet

    with DoubleFleet() as fleet:
        url = fleet.add(LogprobsVllm())
        receipt = asyncio.run(hard_reset_fleet(build_fleet([url], env={}),
                                               ResetOptions(verify=True, timeout=5, probe_prompts=["  "])))
    (rr,) = receipt.replicas
    assert not rr.reset and "empty prompt" in (rr.error or "") and "fix:" in (rr.error or ""), rr.error
