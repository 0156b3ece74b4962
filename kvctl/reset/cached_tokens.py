"""One reader of a completion's own cache signal, usage.prompt_tokens_details.cached_tokens, for every
check that reads it: the reset's canary, kvctl probe, the salt check.

vLLM fills the details only with --enable-prompt-tokens-details, and up to 0.23 only for a non-zero
count (`if self.enable_prompt_tokens_details and num_cached_tokens:`; from 0.24.0 `... is not None`,
capability api.completions.zero_cached_tokens_reported). There a null means "flag off" or "0 cached".
The sound reading: a null is 0 only on such a release, and only once an answer of the same replica
in the same check carried the details (so the flag is on, and a null can only be a zero); otherwise
it stays "not reported" (None), never a false 0. On a release that reports zeros nothing changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from packaging.version import Version

from kvctl.errors import KvctlError
from kvctl.facts.capabilities import table
from kvctl.transport.vllm_client import ServerError, VllmClient

ZERO_REPORTED = "api.completions.zero_cached_tokens_reported"
ZERO_OMITTED = ("vLLM < 0.24 omits a zero count: a null usage.prompt_tokens_details was read as 0 cached tokens "
                "(another answer of this replica carried it, so --enable-prompt-tokens-details is on)")
FALLBACK_BLOCK_SIZE = 128  # vLLM's CPU default; GPU builds default to 16 (a longer prompt is fine)


@dataclass(frozen=True)
class Reading:
    """One answer's signal as given: a count, or none (`omitted`: a usage object without details)."""

    count: float | None
    omitted: bool = False


def read(body: Any) -> Reading:
    """An answer's count, read defensively: NaN or a negative number would pass for a count, so only
    a real, finite count >= 0 is one."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return Reading(None)
    details = usage.get("prompt_tokens_details")
    if details is None:
        return Reading(None, omitted=True)
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    real = isinstance(cached, (int, float)) and not isinstance(cached, bool)
    return Reading(float(cached) if real and 0 <= float(cached) < math.inf else None)


def omits_zero(version: str | Version | None) -> bool:
    """Whether `version` answers a null for 0 cached tokens (False where the version is not known:
    then a null is never read as 0)."""
    if version is None:
        return False
    try:
        return not table().has(version, ZERO_REPORTED)
    except KvctlError:  # not a version string
        return False


@dataclass
class CachedTokens:
    """The signal of one replica over one check: what its answers showed of the flag."""

    omits_zero: bool
    flag_on: bool = False  # an answer of this replica in this check carried the details
    zero_read: bool = False  # a 0 was read from an omitted field (the receipt says so)

    @classmethod
    def of(cls, version: str | Version | None, flag_on: bool = False) -> CachedTokens:
        return cls(omits_zero(version), flag_on)

    def read(self, body: Any) -> Reading:
        """Read an answer of this replica, noting the flag when the answer shows it."""
        reading = read(body)
        self.flag_on = self.flag_on or reading.count is not None
        return reading

    def value(self, reading: Reading) -> float | None:
        """The cached tokens of a reading, judged with every answer read so far; None: not reported."""
        if reading.count is not None:
            return reading.count
        if reading.omitted and self.omits_zero and self.flag_on:
            self.zero_read = True
            return 0.0
        return None

    def count(self, body: Any) -> float | None:
        """read() then value(): for an answer judged once the flag is known (the canary's check)."""
        return self.value(self.read(body))

    @property
    def note(self) -> str | None:
        """What the receipt says once a 0 was read from an omitted field."""
        return ZERO_OMITTED if self.zero_read else None

    def note_for(self, *readings: Reading) -> str | None:
        """The note, for these readings only (one prompt of several)."""
        return ZERO_OMITTED if any(r.count is None and self.value(r) == 0 for r in readings) else None

    def unreported(self) -> str:
        """Why no count: in words, for a reason."""
        if self.omits_zero:
            return ("the server reports no cached tokens (start it with --enable-prompt-tokens-details; vLLM < 0.24 "
                    "also leaves them out for 0 cached tokens, and no answer of this replica carried them)")
        return "the server reports no cached tokens (start it with --enable-prompt-tokens-details)"

    async def show_flag(self, client: VllmClient, model: str, timeout: float | None = None) -> None:
        """A control where a release omits zeros and no answer showed the flag yet: a fresh prompt
        longer than one KV block, sent twice; with the flag on (and prefix caching) the second answer
        hits the first's blocks and carries the details. Any failure leaves the flag unknown."""
        if not self.omits_zero or self.flag_on:
            return
        try:
            block = (await client.metrics()).block_size or FALLBACK_BLOCK_SIZE
            prompt, _ = await unique_prompt(client, model, block, label="kvctl control")
            for _ in range(2):
                outcome = await client.complete(model, prompt, timeout=timeout)
                if not outcome.ok:
                    return
                self.read(outcome.body)
        except (ServerError, IndexError, KeyError, ValueError):
            return


async def unique_prompt(client: VllmClient, model: str, block_size: int, blocks: int = 2,
                        label: str = "kvctl canary") -> tuple[str, int | None]:
    """A unique prompt of more than one KV block (`blocks` when max_model_len allows), sized with /tokenize."""
    import secrets  # lazily: only the checks need a nonce

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


__all__ = ["CachedTokens", "FALLBACK_BLOCK_SIZE", "Reading", "ZERO_OMITTED", "omits_zero", "read", "unique_prompt"]
