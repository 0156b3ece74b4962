"""Content-level proof: does a replica serve KV computed with other weights, for given prompts?

Each prompt is sent twice, greedy, with log-probabilities: as is (it may be served from the local
prefix cache or the external store) and with a fresh `cache_salt` (vLLM >= 0.10.0 salts the block
hashes of that request, so it is computed from scratch). When the salted answer had 0 cached
tokens, the two must agree: same tokens (as many, ending the same way), log-probabilities within a
tolerance fitted to what the replica computes in (kvctl/reset/tolerance.py: 1e-3 in float32, 0.25
in bfloat16/float16, from its /server_info) unless one is given. Verdicts: match, STALE (the plain
answer differs), or inconclusive (why, and how to fix it). An answer is read defensively: a replica, or whatever sits
in front of it, may answer anything, and an answer out of vLLM's layout proves nothing either way.
Core library: no printing; never imports vllm, torch or mooncake.
"""

from __future__ import annotations

import asyncio
import json
import math
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from packaging.version import Version

from kvctl.errors import EXIT_INCONCLUSIVE, EXIT_MATCH, EXIT_STALE, UsageError
from kvctl.facts.capabilities import table
from kvctl.reset.cached_tokens import CachedTokens, read
from kvctl.reset.tolerance import replica_tolerance
from kvctl.targets import Fleet, Replica
from kvctl.transport.http import HttpPool
from kvctl.transport.pool import max_concurrency, shared_pool
from kvctl.transport.vllm_client import CallOutcome, ServerError, VllmClient

Verdict = Literal["match", "STALE", "inconclusive"]
DEFAULT_PROMPT = ("kvctl probe: a fixed prompt whose cached blocks are compared with a fresh computation. "
                  "The quick brown fox jumps over the lazy dog while the weights of the model change under it, "
                  "and every replica must answer as if it had never seen this prompt before.")
# finish_reasons of an answer the server cut short (vLLM's FinishReason ABORT, ERROR): the model did
# not choose to end there, so its length is no evidence
CUT_SHORT = ("abort", "error")
# How to fix each kind of inconclusive verdict (the reason says what happened)
FIX_REQUEST = ("check that the replica answers POST /v1/completions for this prompt: one that does not fit "
               "max_model_len with max_tokens is refused (shorten it)")
FIX_CACHED = "start vLLM with --enable-prompt-tokens-details (kvctl serve sets it)"
FIX_SALT = ("a content check needs a KV cache that honours cache_salt (LMCache did not: LMCache issue 2878); "
            "probe replicas whose connector does")
FIX_LOGPROBS = ("the server must return logprobs for /v1/completions (vLLM does): check what sits in front "
                "of the replica (a proxy, another server)")
FIX_MALFORMED = ("the answer is not in vLLM's /v1/completions layout: check the replica, or what sits in "
                 "front of it (a proxy, another server)")
FIX_CUT_SHORT = "probe again once the replica is not being paused, reset or shut down"
FIX_TIE = "probe with a prompt whose greedy answer is clear-cut (no near-tie in its first tokens)"
FIX_SERVER = "check that the replica is up and answers /version and /v1/models (kvctl status)"


@dataclass
class ProbeOptions:
    max_tokens: int = 4
    logprobs: int = 5
    tolerance: float | None = None  # None: each replica's own (kvctl/reset/tolerance.py)
    timeout: float = 120.0  # a completion may wait on a Mooncake transfer
    concurrency: int = 16

    def check(self) -> None:
        """UsageError unless these options can mean anything (the Python API hands them in unchecked)."""
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise UsageError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}",
                             "max_tokens=4 compares 4 greedy tokens per prompt")
        if not _real(self.timeout) or not self.timeout > 0:
            raise UsageError(f"timeout must be a number of seconds > 0, got {self.timeout!r}", "timeout=120.0")
        if self.tolerance is not None and (not _real(self.tolerance) or not 0 <= self.tolerance < math.inf):
            raise UsageError(f"tolerance must be a finite number >= 0, got {self.tolerance!r}",
                             "leave it out for each replica's own (1e-3 in float32, 0.25 in half precision)")


@dataclass
class PromptResult:
    prompt: str  # its first 60 characters
    verdict: Verdict
    reason: str
    plain_cached: float | None = None  # cached tokens of the plain request
    salted_cached: float | None = None  # must be 0 for the comparison to mean anything
    # {"index", "plain", "salted"}: the tokens there; None for the answer that had ended before it
    first_difference: dict[str, Any] | None = None
    max_logprob_difference: float | None = None
    plain_tokens: list[str] = field(default_factory=list)
    salted_tokens: list[str] = field(default_factory=list)
    hint: str | None = None  # how to fix an inconclusive verdict


@dataclass
class ReplicaProbe:
    name: str
    url: str
    version: str | None = None
    tolerance: float | None = None  # the one its prompts were compared with
    tolerance_reason: str | None = None  # why: given, or the replica's dtype (its /server_info)
    results: list[PromptResult] = field(default_factory=list)
    error: str | None = None  # the replica could not be probed at all (inconclusive)
    hint: str | None = None  # how to fix `error`

    @property
    def verdict(self) -> Verdict:
        verdicts = {r.verdict for r in self.results}
        if "STALE" in verdicts:
            return "STALE"
        if self.error or not self.results or "inconclusive" in verdicts:
            return "inconclusive"
        return "match"


@dataclass
class ProbeReport:
    replicas: list[ReplicaProbe]
    tolerance: float | None  # the one given for every replica; None: each replica's own
    seconds: float

    @property
    def exit_code(self) -> int:
        verdicts = {r.verdict for r in self.replicas}
        return EXIT_STALE if "STALE" in verdicts else EXIT_INCONCLUSIVE if "inconclusive" in verdicts \
            else EXIT_MATCH

    @property
    def summary(self) -> str:
        stale = [r.name for r in self.replicas if r.verdict == "STALE"]
        unsure = [r.name for r in self.replicas if r.verdict == "inconclusive"]
        if stale:
            return f"STALE KV served by {', '.join(stale)}: their answers differ from a fresh computation"
        if unsure:
            others = "; the others match a fresh computation" if len(unsure) < len(self.replicas) else ""
            return f"inconclusive on {', '.join(unsure)}{others}"
        return f"{len(self.replicas)}/{len(self.replicas)} replica(s) match a fresh computation"

    def to_dict(self) -> dict[str, Any]:
        return {"exit_code": self.exit_code, "summary": self.summary, "tolerance": self.tolerance,
                "seconds": self.seconds,
                "replicas": [{**asdict(r), "verdict": r.verdict} for r in self.replicas]}


def load_prompts(path: Path) -> list[str]:
    """Prompts from a text file (one per line), JSONL ({"prompt": ...} per line) or a .json list."""
    try:
        text = Path(path).read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--prompts {path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    suffix = Path(path).suffix.lower()
    if suffix == ".json":  # a JSON document (a list of prompts), or JSONL under a .json name
        try:
            document = json.loads(text)
        except json.JSONDecodeError:
            suffix = ".jsonl"  # several documents, one a line: read as JSONL (with its line numbers)
        else:
            return _prompts_of_document(document, path)
    prompts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if suffix == ".jsonl":
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UsageError(f"--prompts {path}:{number}: not JSON: {exc.msg}",
                                 'write one {"prompt": "..."} per line') from None
            if not isinstance(item, dict) or not isinstance(item.get("prompt"), str) or not item["prompt"].strip():
                raise UsageError(f"--prompts {path}:{number}: no \"prompt\" string",
                                 'write one {"prompt": "..."} per line')
            prompts.append(item["prompt"])
        else:
            prompts.append(line)
    if not prompts:
        raise UsageError(f"--prompts {path}: no prompts in it", "one prompt a line, or JSONL with \"prompt\"")
    return prompts


def _prompts_of_document(document: object, path: Path) -> list[str]:
    """A .json file's prompts: a list of strings or of {"prompt": ...} objects (one object: one prompt)."""
    items = document if isinstance(document, list) else [document]
    prompts = [item.get("prompt") if isinstance(item, dict) else item for item in items]
    if not prompts or not all(isinstance(p, str) and p.strip() for p in prompts):
        raise UsageError(f"--prompts {path}: a JSON file must hold a list of prompts (strings, or objects with a "
                         "\"prompt\" string)",
                         'e.g. ["first prompt", "second prompt"], or JSONL: one {"prompt": "..."} a line')
    return prompts  # type: ignore[return-value]


def check_prompts(prompts: object) -> list[str]:
    """The prompts to probe (None: kvctl's fixed one); UsageError for anything but a list of text."""
    if prompts is None:
        return [DEFAULT_PROMPT]
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, (list, tuple)) \
            or not all(isinstance(p, str) for p in prompts):
        # a string would be probed one character at a time
        raise UsageError(f"prompts must be a list of strings, got {type(prompts).__name__}",
                         'prompts=["..."], or None for kvctl\'s fixed probe prompt')
    if not prompts or not all(p.strip() for p in prompts):
        raise UsageError("prompts is empty, or holds an empty prompt", "give at least one non-blank prompt")
    return list(prompts)


async def probe_fleet(fleet: Fleet, prompts: list[str] | None = None, options: ProbeOptions | None = None,
                      http: HttpPool | None = None) -> ProbeReport:
    options = options or ProbeOptions()
    options.check()
    prompts = check_prompts(prompts)
    started = time.perf_counter()
    sem = asyncio.Semaphore(max_concurrency(len(fleet.replicas), options.concurrency))
    async with shared_pool(http, len(fleet.replicas)) as pool:
        async def one(replica: Replica) -> ReplicaProbe:
            async with sem:
                return await _probe_replica(replica, prompts, options, pool)

        replicas = await asyncio.gather(*(one(r) for r in fleet.replicas))
    return ProbeReport(list(replicas), options.tolerance, round(time.perf_counter() - started, 3))


async def _probe_replica(replica: Replica, prompts: list[str], options: ProbeOptions,
                         http: HttpPool) -> ReplicaProbe:
    out = ReplicaProbe(replica.name, replica.url)
    async with VllmClient(replica.url, timeout=options.timeout, retries=1, api_key=replica.api_key(),
                          pool=http) as client:
        try:
            version = await client.version()
            out.version = str(version)
            why = await _cannot_probe(client, version)
            if why:
                out.error, out.hint = why
                return out
            model = (await client.models())[0]
        except (ServerError, IndexError) as exc:
            out.error, out.hint = getattr(exc, "message", None) or "the server lists no model", FIX_SERVER
            return out
        out.tolerance, out.tolerance_reason = await replica_tolerance(client, version, options.tolerance)
        signal = CachedTokens.of(version)  # one reader over the replica's answers (vLLM < 0.24 omits a zero)
        for prompt in prompts:
            out.results.append(await _probe_prompt(client, model, prompt, options, out.tolerance, signal))
    return out


async def _cannot_probe(client: VllmClient, version: Version) -> tuple[str, str] | None:
    """Why this replica cannot be probed by content (the version facts say so) and the fix, or None."""
    if not table().has(version, "api.completions.cache_salt"):
        since = table().capability("api.completions.cache_salt").span.since
        return (f"vLLM {version} takes no cache_salt (first in {since}): a fresh computation cannot be forced",
                f"run vLLM >= {since} on that replica")
    return None


async def _probe_prompt(client: VllmClient, model: str, prompt: str, options: ProbeOptions,
                        tolerance: float, signal: CachedTokens) -> PromptResult:
    short = prompt[:60]
    plain = await _complete(client, model, prompt, options, salt=None)
    salted = await _complete(client, model, prompt, options, salt=secrets.token_hex(16))
    for label, outcome in (("plain", plain), ("salted", salted)):
        if not outcome.ok or not isinstance(outcome.body, dict):
            why = outcome.error if not outcome.ok else "its body is not a JSON object"
            return PromptResult(short, "inconclusive", f"the {label} request failed: {why}", hint=FIX_REQUEST)
    p, s = _answer(plain.body, options.max_tokens), _answer(salted.body, options.max_tokens)
    p.cached, s.cached, note = await _counts(client, model, options, signal, plain.body, salted.body)
    result = PromptResult(short, "match", "", p.cached, s.cached, plain_tokens=p.tokens, salted_tokens=s.tokens)
    if s.cached is None:
        _inconclusive(result, f"{signal.unreported()}, so a fresh computation of the salted request cannot be "
                      "confirmed", FIX_CACHED)
    elif s.cached > 0:
        _inconclusive(result, f"the salted request still had {s.cached:g} cached tokens: the cache ignores "
                      "cache_salt (LMCache did, LMCache issue 2878), so no fresh computation to compare with",
                      FIX_SALT)
    else:
        _compare(p, s, tolerance, result)
        result.reason += f" ({note})" if note else ""
    return result


async def _counts(client: VllmClient, model: str, options: ProbeOptions, signal: CachedTokens,
                  plain: Any, salted: Any) -> tuple[float | None, float | None, str | None]:
    """Both answers' cached tokens, read by the replica's one reader: where its release omits a
    zero and no answer showed the flag yet, a control shows it first (kvctl.reset.cached_tokens)."""
    first, second = signal.read(plain), signal.read(salted)
    if first.omitted or second.omitted:
        await signal.show_flag(client, model, options.timeout)
    return signal.value(first), signal.value(second), signal.note_for(first, second)


async def _complete(client: VllmClient, model: str, prompt: str, options: ProbeOptions,
                    salt: str | None) -> CallOutcome:
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": options.max_tokens,
                            "temperature": 0.0, "logprobs": options.logprobs}
    if salt is not None:
        body["cache_salt"] = salt
    return await client.call("POST", "/v1/completions", json=body, retries=0)


@dataclass
class _Answer:
    tokens: list[str]
    logprobs: list[float]
    top: list[dict[str, float]]
    cached: float | None
    finish: str | None = None
    malformed: str | None = None  # why it is out of vLLM's layout (then it proves nothing)
    choices: bool = True  # False: an empty choices list


class _Malformed(Exception):
    pass


def _real(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _answer(body: Any, max_tokens: int | None = None) -> _Answer:
    """One /v1/completions answer, read defensively. Tokens beyond max_tokens are not kept."""
    # NaN or a negative count would pass for "0 cached tokens": only a real count is one (read())
    out = _Answer([], [], [], read(body).count)
    try:
        _read_choices(body.get("choices") if isinstance(body, dict) else None, max_tokens, out)
    except _Malformed as exc:
        out.malformed = str(exc)
    return out


def _read_choices(choices: Any, max_tokens: int | None, out: _Answer) -> None:
    if not isinstance(choices, list):
        raise _Malformed("choices is not a list")
    if not choices:
        out.choices = False
        return
    choice = choices[0]
    if not isinstance(choice, dict):
        raise _Malformed("its choice is not an object")
    finish = choice.get("finish_reason")
    if finish is not None and not isinstance(finish, str):
        raise _Malformed("finish_reason is not a string")
    out.finish = finish
    lp = choice.get("logprobs")
    if lp is None:
        return  # no log-probabilities at all (said so by the comparison)
    if not isinstance(lp, dict):
        raise _Malformed("logprobs is not an object")
    tokens, logprobs, top = lp.get("tokens") or [], lp.get("token_logprobs") or [], lp.get("top_logprobs") or []
    if not all(isinstance(x, list) for x in (tokens, logprobs, top)):
        raise _Malformed("logprobs.tokens, token_logprobs or top_logprobs is not a list")
    out.tokens = [str(t) for t in tokens[:max_tokens]]
    if max_tokens is not None and len(tokens) > max_tokens:
        raise _Malformed(f"{len(tokens)} tokens, more tokens than asked for ({max_tokens})")
    # one log-probability and one top list per token, in step: a shorter or shifted list would
    # compare the wrong tokens, or none
    if len(logprobs) != len(tokens) or len(top) != len(tokens):
        raise _Malformed(f"{len(logprobs)} log-probabilities for {len(tokens)} tokens "
                         f"({len(top)} top_logprobs)")
    for i, x in enumerate(logprobs):
        if not _real(x) or not math.isfinite(x):
            raise _Malformed(f"token_logprobs[{i}] is {x!r}, not a finite number")
    for i, d in enumerate(top):
        if d is not None and not (isinstance(d, dict) and all(_real(v) and math.isfinite(v) for v in d.values())):
            raise _Malformed(f"top_logprobs[{i}] is not a map of tokens to finite numbers")
    out.logprobs = [float(x) for x in logprobs]
    out.top = [{str(k): float(v) for k, v in (d or {}).items()} for d in top]


def _inconclusive(result: PromptResult, reason: str, hint: str) -> None:
    result.verdict, result.reason, result.hint = "inconclusive", reason, hint


def _unusable(answer: _Answer) -> tuple[str, str] | None:
    """Why this answer cannot be compared at all, and the fix; None when it can."""
    if answer.malformed:
        return f"is malformed: {answer.malformed}", FIX_MALFORMED
    if not answer.choices:
        return "has no choices (no completion at all)", FIX_MALFORMED
    if answer.finish in CUT_SHORT:
        return f"was cut short by the server (finish_reason {answer.finish!r})", FIX_CUT_SHORT
    if not answer.tokens:
        return "has no log-probabilities", FIX_LOGPROBS
    return None


def _compare(plain: _Answer, salted: _Answer, tolerance: float, result: PromptResult) -> None:
    """Same tokens, as many, ending the same way, log-probabilities within tolerance: match.
    Otherwise STALE, unless the fresh computation itself is a near-tie where the answers part (a
    different token, or an end of sequence against going on): then no verdict is safe."""
    for label, answer in (("plain", plain), ("salted", salted)):
        unusable = _unusable(answer)
        if unusable:
            _inconclusive(result, f"the {label} answer {unusable[0]}", unusable[1])
            return
    n = min(len(plain.tokens), len(salted.tokens))
    index = next((i for i in range(n) if plain.tokens[i] != salted.tokens[i]), None)
    agree = n if index is None else index  # the tokens both answers share
    result.max_logprob_difference = round(max(
        (abs(a - b) for a, b in zip(plain.logprobs[:agree], salted.logprobs[:agree])), default=0.0), 6)
    longer = len(plain.tokens) != len(salted.tokens)
    if index is not None or longer:
        at = agree
        result.first_difference = {"index": at, "plain": plain.tokens[at] if at < len(plain.tokens) else None,
                                   "salted": salted.tokens[at] if at < len(salted.tokens) else None}
    # the fresh computation's own choice at the first difference: where a near-tie makes either answer right
    tie = agree < len(salted.top) and _near_tie(salted.top[agree], tolerance)
    if index is not None and not tie:
        result.verdict, result.reason = "STALE", (
            f"token {index} differs: {plain.tokens[index]!r} (as served) vs {salted.tokens[index]!r} "
            "(computed fresh)")
    elif result.max_logprob_difference > tolerance:
        # measured on the tokens both share: evidence whatever comes after them
        what = "same tokens" if index is None and not longer else f"the first {agree} token(s) agree"
        result.verdict, result.reason = "STALE", (
            f"{what}, but log-probabilities differ by {result.max_logprob_difference:g} "
            f"(> {tolerance:g}): the served KV was computed differently")
    elif index is not None:
        _inconclusive(result, f"token {index} differs, but the fresh computation is a near-tie there (within "
                      f"{tolerance:g}): the model is not deterministic enough for this prompt", FIX_TIE)
    elif longer:
        shorter = plain if len(plain.tokens) < len(salted.tokens) else salted
        # only an end of sequence (finish_reason "stop") can end an answer early; where the fresh
        # computation is a near-tie between ending and going on, either answer may be right
        if shorter.finish == "stop" and tie:
            _inconclusive(result, f"the answer {'as served' if shorter is plain else 'computed fresh'} ended "
                          f"after {agree} token(s), where the fresh computation is a near-tie between ending and "
                          f"going on (within {tolerance:g}): the model is not deterministic enough for this prompt",
                          FIX_TIE)
        else:
            result.verdict, result.reason = "STALE", (
                f"the answers differ in length: {len(plain.tokens)} token(s) as served, {len(salted.tokens)} "
                f"computed fresh (finish_reason {plain.finish!r} vs {salted.finish!r})")
    elif plain.finish is not None and salted.finish is not None and plain.finish != salted.finish:
        result.verdict, result.reason = "STALE", (
            f"same tokens, but finish_reason {plain.finish!r} (as served) vs {salted.finish!r} (computed fresh)")
    else:
        result.reason = (f"same {n} tokens, log-probabilities within {result.max_logprob_difference:g}"
                         + ("" if (result.plain_cached or 0) > 0 else
                            " (the plain request used no cache either)"))


def _near_tie(top: dict[str, float], tolerance: float) -> bool:
    values = sorted(top.values(), reverse=True)
    return len(values) >= 2 and values[0] - values[1] <= tolerance


__all__ = ["ProbeOptions", "ProbeReport", "PromptResult", "ReplicaProbe",
           "check_prompts", "load_prompts", "probe_fleet"]
