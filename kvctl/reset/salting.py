"""Proof that a per-version `cache_salt` isolates every tier of a live fleet, without disturbing it.

RL loops that generate while they train salt each request with its weight version instead of
resetting (several versions are live at once). vLLM mixes the salt into the first block's hash, so
into every chained block hash and the store keys built from them; a tier whose keys ignore it serves
one version's KV to another. For each replica and tier this module shows which, with positive
controls so that "no hit" cannot come from a tier that is simply off:

- local prefix cache, on the replica itself, prompt P: P salted S1 (primes), P salted S2 (the
  cross-salt probe: must have 0 cached tokens), P salted S1 again (the control: must hit);
- external store, across replicas (a ring: replica i reads what replica i-1 primed), prompt Q:
  Q salted S1 on the primer, a settle time for the connector's asynchronous put, then on the reader
  Q salted S2 (must be 0) and Q salted S1 (the control: must hit; the reader never saw Q, so a hit
  can only come from a tier the two replicas share).

Fresh random prompts only (a nonce at their head makes every block hash new, so nobody else's
traffic can hit them, nor they anyone's), longer than one KV block; no reset, no pause; a paused or
sleeping replica gets no request. The verdict of each probe is read from the request's own
`usage.prompt_tokens_details.cached_tokens` (vLLM's --enable-prompt-tokens-details; vLLM < 0.24
answers a null for 0, read as 0 once the replica's control showed the flag: kvctl.reset.cached_tokens),
immune to other traffic; without it, from the replica's hit counters, which other traffic also moves (the
receipt says which `signal` was used). Counter deltas also tell a local hit from a store hit on
the replica that primed. With one replica the store cannot be told apart from the local cache
without evicting it: that tier stays unproven. Core library: no printing; never imports vllm.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from kvctl.errors import EXIT_FAILED, EXIT_OK, UsageError
from kvctl.facts.capabilities import table
from kvctl.reset.cached_tokens import FALLBACK_BLOCK_SIZE, ZERO_OMITTED, CachedTokens, Reading, unique_prompt
from kvctl.reset.window import accepts_requests, describe, read_window
from kvctl.targets import Fleet, Replica
from kvctl.transport.http import HttpPool
from kvctl.transport.pool import max_concurrency, shared_pool
from kvctl.transport.vllm_client import CallOutcome, ServerError, VllmClient
from kvctl.transport.vllm_metrics import CacheCounters

Verdict = Literal["isolated", "LEAKS", "unproven"]
EXIT_UNPROVEN = 3
PROMPT_BLOCKS = 4  # KV blocks per probe prompt, where max_model_len leaves room
NO_CONNECTOR = "no KV connector"
FIX_CACHED = "start vLLM with --enable-prompt-tokens-details: a per-request count no other traffic moves"
FIX_STORE = ("check that the replicas share one store (the same master, cache_prefix and PYTHONHASHSEED), "
             "or give the connector's asynchronous put more time (--settle S)")
FIX_LEAK = ("this tier serves KV across salts: reset it after each weight update (kvctl reset --connector), "
            "or move to a connector whose keys carry the salt (kvctl compat check)")


@dataclass
class SaltOptions:
    salts: tuple[str, str] | None = None  # None: two fresh random salts
    settle: float = 3.0  # seconds between the primer's request and the reader's (the store put is async)
    timeout: float = 120.0  # per completion: one may wait on a Mooncake transfer
    concurrency: int = 16

    def check(self) -> SaltOptions:
        """UsageError unless these options can mean anything (the Python API hands them in unchecked)."""
        if self.salts is None:
            nonce = secrets.token_hex(6)
            self.salts = (f"kvctl-salt-check-{nonce}-1", f"kvctl-salt-check-{nonce}-2")
        salts = self.salts
        if not isinstance(salts, (list, tuple)) or len(salts) != 2 or not all(isinstance(s, str) and s for s in salts):
            raise UsageError(f"salts must be two non-empty strings, got {salts!r}",
                             "e.g. --salt v7 --salt v8 (vLLM refuses an empty cache_salt)")
        if salts[0] == salts[1]:
            raise UsageError(f"the two salts are the same ({salts[0]!r}): nothing to isolate",
                             "give two different salts (or two different weight versions)")
        for name, value, low in (("settle", self.settle, 0), ("timeout", self.timeout, 1e-9)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= low:
                raise UsageError(f"{name} must be a number of seconds >= {low:g}, got {value!r}", "settle=3.0")
        self.salts = (salts[0], salts[1])
        return self


def salts_of_versions(versions: object, salt_format: str = "{version}") -> tuple[str, str]:
    """Two weight versions as the salts a loop sends (`salt_format` with {version}, e.g. SGLang's
    "weight-version:{version}")."""
    if isinstance(versions, (str, bytes)) or not isinstance(versions, (list, tuple)) or len(versions) != 2:
        raise UsageError(f"give two weight versions, got {versions!r}", "e.g. --weight-version 7 --weight-version 8")
    if "{version}" not in salt_format:
        raise UsageError(f"--salt-format {salt_format!r} has no {{version}}", "e.g. --salt-format 'weight-version:{version}'")
    a, b = (salt_format.replace("{version}", str(v)) for v in versions)
    return a, b


@dataclass
class Probe:
    """One request of the proof: what it asked and what it found."""

    salt: str
    cached_tokens: float | None  # usage.prompt_tokens_details.cached_tokens (None: not reported)
    local_hits: float | None = None  # counter deltas around it (others' traffic included)
    external_hits: float | None = None
    error: str | None = None
    details_null: bool = False  # the answer's usage.prompt_tokens_details was null (vLLM < 0.24: maybe a 0)

    @property
    def hit(self) -> float | None:
        """Cached tokens by the request's own count, else by the counters; None: unknown."""
        if self.error:
            return None
        if self.cached_tokens is not None:
            return self.cached_tokens
        if self.local_hits is None and self.external_hits is None:
            return None
        return (self.local_hits or 0) + (self.external_hits or 0)


@dataclass
class TierCheck:
    tier: str  # "local" (prefix cache) or "store" (the connector's external tier)
    verdict: Verdict = "unproven"
    reason: str = ""
    signal: str | None = None  # "cached_tokens" or "metrics"
    cross: Probe | None = None  # the other salt: must not hit
    control: Probe | None = None  # the same salt: must hit
    primed_on: str | None = None  # store: the replica that wrote the prompt
    hint: str | None = None


@dataclass
class ReplicaSalt:
    name: str
    url: str
    version: str | None = None
    connector: str | None = None  # kv_transfer_config.kv_connector (None: none, or unknown: see notes)
    prompt_tokens: int | None = None
    local: TierCheck = field(default_factory=lambda: TierCheck("local"))
    store: TierCheck = field(default_factory=lambda: TierCheck("store"))
    error: str | None = None  # the replica could not be checked at all
    notes: list[str] = field(default_factory=list)

    def verdicts(self) -> list[Verdict]:
        return [self.local.verdict, self.store.verdict]


@dataclass
class SaltReport:
    salts: tuple[str, str]
    replicas: list[ReplicaSalt]
    settle: float
    seconds: float

    @property
    def exit_code(self) -> int:
        verdicts = {v for r in self.replicas for v in r.verdicts()}
        return EXIT_FAILED if "LEAKS" in verdicts else EXIT_UNPROVEN if "unproven" in verdicts else EXIT_OK

    @property
    def summary(self) -> str:
        leaks = [f"{r.name} {t.tier}" for r in self.replicas for t in (r.local, r.store) if t.verdict == "LEAKS"]
        unsure = [f"{r.name} {t.tier}" for r in self.replicas for t in (r.local, r.store) if t.verdict == "unproven"]
        if leaks:
            return f"the salt LEAKS: a request salted {self.salts[1]!r} reused KV of {self.salts[0]!r} ({', '.join(leaks)})"
        if unsure:
            return f"isolation unproven for {', '.join(unsure)}; no cross-salt hit anywhere"
        return f"cache_salt isolates every tier on {len(self.replicas)}/{len(self.replicas)} replica(s) " \
               "(local prefix cache and external store)"

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.exit_code == EXIT_OK, "exit_code": self.exit_code, "summary": self.summary,
                "salts": list(self.salts), "settle": self.settle, "seconds": self.seconds,
                "replicas": [asdict(r) for r in self.replicas]}


@dataclass
class _Live:
    """A replica that takes requests, and what phase one left for phase two."""

    replica: Replica
    out: ReplicaSalt
    model: str = ""
    block: int = FALLBACK_BLOCK_SIZE
    store_prompt: str | None = None  # primed here with the first salt, for the next replica to read
    prime_error: str | None = None
    signal: CachedTokens = field(default_factory=lambda: CachedTokens(omits_zero=False))  # its answers' reader


async def check_salt_isolation(fleet: Fleet, options: SaltOptions | None = None,
                               http: HttpPool | None = None) -> SaltReport:
    options = (options or SaltOptions()).check()
    assert options.salts is not None
    started = time.perf_counter()
    sem = asyncio.Semaphore(max_concurrency(len(fleet.replicas), options.concurrency))
    async with shared_pool(http, len(fleet.replicas)) as pool:
        def client(r: Replica) -> VllmClient:
            return VllmClient(r.url, timeout=options.timeout, retries=1, api_key=r.api_key(), pool=pool)

        async def first(r: Replica) -> _Live:
            async with sem, client(r) as c:
                return await _local_and_prime(c, r, options)

        lives = list(await asyncio.gather(*(first(r) for r in fleet.replicas)))
        # the ring: replicas that take requests and may have a store (a connector, or one not known)
        ring = [x for x in lives if x.out.error is None and NO_CONNECTOR not in x.out.store.reason]
        if len(ring) > 1:
            await asyncio.sleep(options.settle)

        async def second(reader: _Live, primer: _Live) -> None:
            async with sem, client(reader.replica) as c:
                await _read_store(c, reader, primer, options)

        await asyncio.gather(*(second(x, ring[i - 1]) for i, x in enumerate(ring) if len(ring) > 1))
        for x in ring:
            if len(ring) == 1 and not x.out.store.reason:
                _unproven(x.out.store, "one replica with a store: a store hit cannot be told apart from a local one "
                          "without evicting the local cache (no reset is made)", "check a fleet of two or more replicas")
    return SaltReport(options.salts, [x.out for x in lives], options.settle, round(time.perf_counter() - started, 3))


async def _local_and_prime(client: VllmClient, replica: Replica, options: SaltOptions) -> _Live:
    """Phase one on one replica: the local tier's three requests, then the store prompt primed."""
    live = _Live(replica, ReplicaSalt(replica.name, replica.url))
    out = live.out
    try:
        version = await client.version()
        out.version = str(version)
        live.signal = CachedTokens.of(version)
        if not table().has(version, "api.completions.cache_salt"):
            since = table().capability("api.completions.cache_salt").span.since
            out.error = f"vLLM {version} takes no cache_salt on /v1/completions (first in {since})"
        else:
            window, _ = await read_window(client, version)
            if not accepts_requests(window):
                out.error = f"{describe(window)}: kvctl sends it no request (check again once it serves)"
        if out.error:
            _unproven(out.local, out.error)
            _unproven(out.store, out.error)
            return live
        live.model = (await client.models())[0]
        live.block = (await client.metrics()).block_size or FALLBACK_BLOCK_SIZE
        out.connector = await _connector(client, out)
        prompt, out.prompt_tokens = await unique_prompt(client, live.model, live.block, PROMPT_BLOCKS,
                                                        "kvctl salt check")
        store_prompt, _ = await unique_prompt(client, live.model, live.block, PROMPT_BLOCKS, "kvctl salt check")
    except (ServerError, IndexError, ValueError) as exc:
        out.error = getattr(exc, "message", None) or str(exc) or "the server lists no model"
        _unproven(out.local, f"could not start: {out.error}")
        _unproven(out.store, f"could not start: {out.error}")
        return live
    s1, s2 = options.salts  # type: ignore[misc]
    prime = await _probe(client, live, prompt, s1)
    cross = await _probe(client, live, prompt, s2)
    control = await _probe(client, live, prompt, s1)
    _resolve(live, prime, cross, control)  # the control's count shows the flag: only then is a null a 0
    _judge_local(out, prime, cross, control)
    _note_zero(out.local)
    if out.connector is None and "no KV connector" in " ".join(out.notes):
        _unproven(out.store, f"{NO_CONNECTOR} on this replica: it has no external tier to isolate")
    primed = await _probe(client, live, store_prompt, s1)
    if primed.error:
        live.prime_error = primed.error
    else:
        live.store_prompt = store_prompt
    return live


async def _read_store(client: VllmClient, reader: _Live, primer: _Live, options: SaltOptions) -> None:
    """Phase two: the reader asks for the primer's prompt with the other salt, then the same salt."""
    tier = reader.out.store
    tier.primed_on = primer.out.name
    if tier.reason:  # already settled (no connector here)
        return
    if primer.store_prompt is None:
        why = primer.prime_error or primer.out.error or "its prompt was not primed"
        return _unproven(tier, f"the store prompt could not be primed on {primer.out.name}: {why}")
    s1, s2 = options.salts  # type: ignore[misc]
    tier.cross = await _probe(client, reader, primer.store_prompt, s2)
    tier.control = await _probe(client, reader, primer.store_prompt, s1)
    _resolve(reader, tier.cross, tier.control)
    _judge(tier, tier.cross, tier.control, reader.out.name, f"primed on {primer.out.name} salted {s1!r}",
           f"read on {reader.out.name}")
    _note_zero(tier)


async def _connector(client: VllmClient, out: ReplicaSalt) -> str | None:
    """The replica's kv_connector (MultiConnector: with its children), from /server_info; None and a note otherwise."""
    try:
        ktc = await client.kv_transfer_config()
    except ServerError as exc:
        out.notes.append(f"connector unknown ({exc.message})")
        return None
    if ktc is None:
        out.notes.append("no KV connector (/server_info)")
        return None
    from kvctl.facts.compat import layout_of

    return ", ".join(layout_of(ktc))


async def _probe(client: VllmClient, live: _Live, prompt: str, salt: str) -> Probe:
    try:
        before = (await client.metrics()).counters
        outcome: CallOutcome = await client.complete(live.model, prompt, timeout=client.timeout, cache_salt=salt)
        after = (await client.metrics()).counters
    except ServerError as exc:
        return Probe(salt, None, error=exc.message)
    if not outcome.ok:
        return Probe(salt, None, error=f"the request failed: {outcome.error}")
    delta: CacheCounters = after.delta(before)
    reading = live.signal.read(outcome.body)
    return Probe(salt, reading.count, delta.local_hits, delta.external_hits, details_null=reading.omitted)


def _resolve(live: _Live, *probes: Probe) -> None:
    """Read the nulls of these probes with every answer the replica gave in this check: on vLLM < 0.24
    a null is 0 cached tokens once one of them carried the details (kvctl.reset.cached_tokens)."""
    for probe in probes:
        if probe.cached_tokens is None and not probe.error:
            probe.cached_tokens = live.signal.value(Reading(None, probe.details_null))


def _note_zero(tier: TierCheck) -> None:
    """Say so where the verdict's 0 across salts was read from a null (vLLM < 0.24)."""
    if tier.cross is not None and tier.cross.details_null and tier.cross.cached_tokens == 0:
        tier.reason += f" ({ZERO_OMITTED})"


def _judge_local(out: ReplicaSalt, prime: Probe, cross: Probe, control: Probe) -> None:
    tier = out.local
    tier.cross, tier.control = cross, control
    if prime.error:
        return _unproven(tier, f"the priming request failed: {prime.error}")
    # a cross-salt hit that the counters put in the store alone is the store's leak, not the cache's
    moved = None
    if (cross.hit or 0) > 0 and (cross.local_hits == 0 and (cross.external_hits or 0) > 0):
        out.store.cross, moved = cross, cross.hit
        _judge(out.store, cross, None, out.name, "primed here", "read here (counted as external hits)")
        cross = Probe(cross.salt, None if cross.cached_tokens is None else 0.0, 0.0, 0.0)
    if (control.hit or 0) > 0 and control.local_hits == 0 and (control.external_hits or 0) > 0:
        _judge(tier, cross, None, out.name, "primed here", "read here")
        if tier.verdict != "LEAKS":
            _unproven(tier, f"the same salt hit {control.hit:g} token(s), all from the store by the counters: the "
                      "local prefix cache did not serve it (--enable-prefix-caching off?)")
        return
    _judge(tier, cross, control, out.name, "primed here", "read here")
    if moved:
        tier.reason += f"; the other salt's {moved:g} cached token(s) were the store's by the counters (its LEAKS)"


def _judge(tier: TierCheck, cross: Probe, control: Probe | None, name: str, primed: str, read: str) -> None:
    """isolated: the other salt had 0 cached tokens and the same salt hit; LEAKS: the other salt hit."""
    tier.signal = "cached_tokens" if cross.cached_tokens is not None else (
        "metrics" if cross.hit is not None else None)
    what = "local prefix cache" if tier.tier == "local" else "external store"
    if cross.error:
        return _unproven(tier, f"the cross-salt request failed: {cross.error}")
    if cross.hit is None:
        return _unproven(tier, "neither the answer (cached_tokens) nor the counters say what hit", FIX_CACHED)
    if cross.hit > 0:
        caveat = "" if tier.signal == "cached_tokens" else \
            " (by the counters, which other traffic also moves: confirm with --enable-prompt-tokens-details)"
        tier.verdict, tier.hint = "LEAKS", FIX_LEAK
        tier.reason = (f"{primed}, {read} salted {cross.salt!r}: {cross.hit:g} cached token(s) from the {what} "
                       f"under another salt{caveat}")
        return
    if control is None:
        return
    if control.error:
        return _unproven(tier, f"the same-salt control failed: {control.error}")
    if not (control.hit or 0) > 0:
        hint = FIX_STORE if tier.tier == "store" else "start vLLM with --enable-prefix-caching"
        return _unproven(tier, f"{primed}, {read} with the same salt: 0 cached tokens, so the {what} served "
                         "nothing and its 0 across salts proves nothing", hint)
    tier.verdict, tier.hint = "isolated", None
    tier.reason = (f"{primed}, {read}: the other salt 0 cached tokens, the same salt {control.hit:g} "
                   f"(by {tier.signal})")


def _unproven(tier: TierCheck, reason: str, hint: str | None = None) -> None:
    tier.verdict, tier.reason, tier.hint = "unproven", reason, hint


__all__ = ["Probe", "ReplicaSalt", "SaltOptions", "SaltReport", "TierCheck", "check_salt_isolation",
           "salts_of_versions"]
