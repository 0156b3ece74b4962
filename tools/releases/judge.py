"""What a real server's answers say about each capability of kvctl/data/capabilities.yaml.

`observe` turns the transcripts of one release (dev mode on and off, plus the store story and
kvctl's own runs when they ran) into one verdict per capability id: observed present (True),
observed absent (False), or not observable on this server (None, with the reason). `disagreements`
compares them with the capability table: each one names the fact, the release and what the server did.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvctl.facts.capabilities import CapabilityTable
from kvctl.facts.versions import parse_version

from .sequence import Transcript


@dataclass(frozen=True)
class Verdict:
    observed: bool | None  # None: this server cannot show it (see `how`)
    how: str

    def to_json(self) -> dict[str, Any]:
        return {"observed": self.observed, "how": self.how}


@dataclass
class Evidence:
    """Everything observed of one release."""

    release: str
    dev: Transcript
    nodev: Transcript | None = None
    store: dict[str, Any] | None = None  # the store story (stories.py), None: not run
    kvctl: dict[str, Any] | None = None  # kvctl's runs (kvctl_runs.py), None: not run


Observer = Callable[[Evidence, CapabilityTable], Verdict]


def _route(path: str) -> Observer:
    def observe(ev: Evidence, table: CapabilityTable) -> Verdict:
        ex = ev.dev.find(f"route {path}")
        if ex is None:
            return Verdict(None, "not asked")
        return Verdict(ex.status != 404, f"GET {path} (dev mode) answered {ex.status}")
    return observe


def _param(name: str) -> Observer:
    def observe(ev: Evidence, table: CapabilityTable) -> Verdict:
        ex = ev.dev.find(f"param {name}")
        if ex is None:
            return Verdict(False, f"{name.split('.')[0]} absent: the parameter cannot be read")
        if ex.status == 200:
            return Verdict(False, f"{ex.method} {ex.path} answered 200: the value was ignored")
        return Verdict(True, f"{ex.method} {ex.path} refused the value ({ex.status}): the route reads it")
    return observe


def _metric(name: str, *, needs_connector: bool = False) -> Observer:
    def observe(ev: Evidence, table: CapabilityTable) -> Verdict:
        names = set(ev.dev.metric_names) | set((ev.store or {}).get("metric_names", []))
        if name in names:
            return Verdict(True, f"/metrics has {name}")
        if needs_connector and ev.store is None:
            return Verdict(None, f"/metrics has no {name} without a KV connector, and no connector ran")
        return Verdict(False, f"/metrics has no {name}")
    return observe


def _dev_gated(path: str) -> Observer:
    def observe(ev: Evidence, table: CapabilityTable) -> Verdict:
        dev, nodev = ev.dev.find(f"route {path}"), ev.nodev.find(f"route {path}") if ev.nodev else None
        if dev is None or nodev is None:
            return Verdict(None, "no server without dev mode ran")
        gated = dev.status != 404 and nodev.status == 404
        return Verdict(gated, f"{path}: {dev.status} with VLLM_SERVER_DEV_MODE=1, {nodev.status} without")
    return observe


def _success_body(ev: Evidence, table: CapabilityTable) -> Verdict:
    ex = ev.dev.find("reset_prefix_cache")
    if ex is None:
        return Verdict(None, "/reset_prefix_cache absent")
    has = isinstance(ex.shape, dict) and "success" in ex.shape
    return Verdict(has, f"POST /reset_prefix_cache answered {ex.status} {ex.shape}")


def _reset_without_connector(ev: Evidence, table: CapabilityTable) -> Verdict:
    ex = ev.dev.find("reset_prefix_cache external")
    if ex is None or ex.value is None:
        return Verdict(None, "the answer carries no success flag (an empty 200 before 0.26.0)")
    return Verdict(ex.value is True, f"reset_external=true with no connector answered {{'success': {ex.value}}}")


def _cache_salt(ev: Evidence, table: CapabilityTable) -> Verdict:
    salted = ev.dev.find("completion salted")  # sent right after PROMPT was primed unsalted
    if salted is None or salted.status != 200:
        return Verdict(False, f"a completion with cache_salt answered {salted.status if salted else 'nothing'}")
    hit = salted.value
    repeated = ev.dev.find("completion repeated")
    if hit is None and repeated is not None and repeated.value is True and _details(salted) == "null":
        hit = False  # the flag is on (the repeat carried the details): a null is a zero before 0.24
    if hit is None:
        return Verdict(None, "no cached_tokens in the answer")
    return Verdict(hit is False, f"PROMPT primed, then salted: {'a cache hit' if hit else 'no hit'}")


def _details(ex: Any) -> Any:
    """A completion's usage.prompt_tokens_details shape ("null", a dict, "absent"), None: no usage at all."""
    usage = ex.shape.get("usage") if isinstance(ex.shape, dict) else None
    return usage.get("prompt_tokens_details", "absent") if isinstance(usage, dict) else None


def _zero_reported(ev: Evidence, table: CapabilityTable) -> Verdict:
    """A completion that found nothing cached (the first after the local reset): details or null."""
    ex = ev.dev.find("completion after reset") or ev.dev.find("completion first")
    details = _details(ex) if ex is not None else None
    if details is None:
        return Verdict(None, "no completion answered")
    return Verdict(isinstance(details, dict), f"a completion with no cached token: prompt_tokens_details {details}")


def _abort_requests(ev: Evidence, table: CapabilityTable) -> Verdict:
    seen = _route("/abort_requests")(ev, table)
    if seen.observed is False and not table.has(ev.release, "http.abort_requests.dev"):
        return Verdict(None, "before the dev router it exists only with --tokens-only, not started so")
    return seen


def _pause_rejects(ev: Evidence, table: CapabilityTable) -> Verdict:
    ex = ev.dev.find("completion while paused")
    if ex is None:
        return Verdict(None, "/pause absent")
    return Verdict(ex.value == "rejected", f"a request sent after /pause (default mode): {ex.value}, then {ex.status}")


def _compare(ev: Evidence, table: CapabilityTable) -> Verdict:
    ex = ev.dev.find("weight_checker compare")
    if ex is None:
        return Verdict(None if ev.dev.find("weight_checker checksum") else False, "no /weight_checker checksum")
    return Verdict(ex.status == 200 and ex.value is True, f"compare with its own checksums: {ex.status}, match={ex.value}")


def _from_store(key: str, what: str) -> Observer:
    def observe(ev: Evidence, table: CapabilityTable) -> Verdict:
        if ev.store is None or key not in ev.store:
            return Verdict(None, f"{what}: needs the store connector on the CPU (not run for this release)")
        seen = ev.store[key]
        return Verdict(bool(seen["observed"]), seen["how"])
    return observe


def _from_kvctl(key: str, what: str) -> Observer:
    def observe(ev: Evidence, table: CapabilityTable) -> Verdict:
        if ev.kvctl is None or key not in ev.kvctl:
            return Verdict(None, f"{what}: kvctl's run not made for this release")
        seen = ev.kvctl[key]
        if "skipped" in seen:
            return Verdict(None, f"{what}: not run ({seen['skipped']})")
        return Verdict(seen.get("observed"), seen["how"])
    return observe


# capability id -> how the tier observes it. Ids absent here are facts of configs, Python APIs or
# source text that a running server does not show; docs list them as "read from the source".
OBSERVERS: dict[str, Observer] = {
    "http.reset_prefix_cache": _route("/reset_prefix_cache"),
    "http.reset_prefix_cache.reset_external": _param("reset_prefix_cache.reset_external"),
    "engine.reset_prefix_cache_connector": _param("reset_prefix_cache.reset_external"),
    "http.reset_prefix_cache.success_body": _success_body,
    "http.reset_mm_cache": _route("/reset_mm_cache"),
    "http.reset_encoder_cache": _route("/reset_encoder_cache"),
    "connector.reset_without_connector_true": _reset_without_connector,
    "http.pause": _route("/pause"),
    "http.pause.dev_gated": _dev_gated("/pause"),
    "http.pause.legacy_params": _param("pause.wait_for_inflight_requests"),
    "http.pause.mode": _param("pause.mode"),
    "http.pause.clear_cache": _param("pause.clear_cache"),
    "engine.pause_rejects_new_requests": _pause_rejects,
    "http.abort_requests": _abort_requests,
    "http.abort_requests.dev": _dev_gated("/abort_requests"),
    "http.sleep": _route("/sleep"),
    "http.collective_rpc": _route("/collective_rpc"),
    "http.update_weight_version": _route("/update_weight_version"),
    "http.weight_info": _route("/weight_info"),
    "http.weight_checker": _route("/weight_checker"),
    "http.weight_checker.compare": _compare,
    "http.init_weight_transfer_engine": _route("/init_weight_transfer_engine"),
    "http.update_weights": _route("/update_weights"),
    "http.start_weight_update": _route("/start_weight_update"),
    "http.finish_weight_update": _route("/finish_weight_update"),
    "api.completions.cache_salt": _cache_salt,
    "api.completions.zero_cached_tokens_reported": _zero_reported,
    "engine.cache_salt_in_block_hash": _cache_salt,
    "http.server_info": _route("/server_info"),
    "metrics.prefix_cache_hits": _metric("vllm:prefix_cache_hits"),
    "metrics.external_prefix_cache_hits": _metric("vllm:external_prefix_cache_hits", needs_connector=True),
    "metrics.prompt_tokens_cached": _metric("vllm:prompt_tokens_cached"),
    "rpc.reload_weights.weights_path": _from_kvctl("weights", "a reload from a folder"),
    "http.pause.clear_cache_resets_connector": _from_store("pause_clears", "a default pause with the store connector"),
}


# Connector facts (the table's connector spans), keyed "connector:<name>.reset" in the verdicts.
STORE_RESET = "connector:MooncakeStoreConnector.reset"


def observe(ev: Evidence, table: CapabilityTable) -> dict[str, Verdict]:
    """One verdict per capability id of the table (ids without an observer: None, 'source only'),
    plus the store connector's reset."""
    out: dict[str, Verdict] = {}
    for cid in table.capabilities:
        observer = OBSERVERS.get(cid)
        out[cid] = observer(ev, table) if observer else Verdict(None, "read from the source: a running server does not show it")
    out[STORE_RESET] = _from_store("vllm_reset_clears", "vLLM's own connector reset")(ev, table)
    return out


def claimed(release: str, fact: str, table: CapabilityTable) -> bool:
    """What the capability table says of `fact` (a capability id or a connector key) in `release`."""
    if fact == STORE_RESET:
        conn = table.connector("MooncakeStoreConnector")
        return conn is not None and conn.reset.contains(parse_version(release))
    return table.has(release, fact)


def describe(fact: str, table: CapabilityTable) -> str:
    if fact == STORE_RESET:
        conn = table.connector("MooncakeStoreConnector")
        return conn.reset.describe() if conn else "never"
    return table.capability(fact).span.describe()


def disagreements(release: str, verdicts: dict[str, Verdict], table: CapabilityTable) -> list[str]:
    """Each observed verdict that the capability table contradicts, worded for a failure."""
    out = []
    for cid, verdict in verdicts.items():
        if verdict.observed is None or (cid not in table.capabilities and cid != STORE_RESET):
            continue
        says = claimed(release, cid, table)
        if says != verdict.observed:
            out.append(f"{cid}: the capability table says vLLM {release} {'has' if says else 'lacks'} it "
                       f"({describe(cid, table)}); the real server: {verdict.how}")
    return out
