"""Async HTTP client for a vLLM OpenAI-compatible server: the routes kvctl reads or calls.

Each call returns a `CallOutcome` instead of raising on HTTP or transport errors, so a fleet
operation can report every replica's result. Refused connections, timeouts and 5xx answers are
retried with exponential backoff (tenacity); 4xx answers are final. Request parameters and
response shapes follow the server's version, from the capability table.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from packaging.version import Version

from kvctl.errors import KvctlError
from kvctl.facts.capabilities import table
from kvctl.facts.pausing import pause_rejects
from kvctl.facts.versions import version_from_server_payload
from kvctl.transport.http import HttpClientBase, HttpPool, HttpResponse, TransportError

DEFAULT_TIMEOUT = 10.0
SERVER_INFO_TIMEOUT = 90.0
# /pause?mode=wait answers once every in-flight request has finished: as long as the longest one
# (a Mooncake transfer stall alone held it past 30 s in an e2e run), so it gets its own bound.
PAUSE_TIMEOUT = 120.0
# /weight_checker hashes every weight on every worker (sha256 of each tensor's bytes, copied to CPU):
# about a second per few GB, so a large model needs far more than the per-call bound.
CHECKSUM_TIMEOUT = 120.0
DEV_MODE_HINT = "start the server with VLLM_SERVER_DEV_MODE=1 (reset, pause and server_info routes exist only in dev mode)"


class ServerError(KvctlError):
    """A vLLM server could not be reached or answered something unusable."""


class _Retryable(Exception):
    """An answer worth retrying (5xx); carries the response for the final report."""

    def __init__(self, response: HttpResponse) -> None:
        super().__init__(f"HTTP {response.status}")
        self.response = response


@dataclass
class CallOutcome:
    """One HTTP call as kvctl reports it."""

    method: str
    url: str
    status: int | None  # None: no HTTP answer (refused, timeout)
    body: Any  # parsed JSON, else text ('' for an empty body)
    latency_s: float  # all attempts, backoff included
    attempts: int
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.status is not None and 200 <= self.status < 300


class VllmClient(HttpClientBase):
    def __init__(self, base_url: str, *, timeout: float = DEFAULT_TIMEOUT, retries: int = 2,
                 backoff: float = 0.2, api_key: str | None = None,
                 pool: HttpPool | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self._api_key = api_key
        super().__init__(pool)

    # -- transport --------------------------------------------------------------------------
    async def call(self, method: str, path: str, *, params: dict[str, Any] | None = None,
                   json: Any = None, retries: int | None = None, timeout: float | None = None) -> CallOutcome:
        """One request with bounded retries; never raises for HTTP or transport failures."""
        url = f"{self.base_url}{path}"
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key and path.startswith("/v1") else None
        limit = timeout or self.timeout
        tries = 1 + (self.retries if retries is None else retries)
        attempts = 1
        start = time.perf_counter()

        async def once() -> HttpResponse:
            response = await self._http.request(method, url, params=params, json=json, headers=headers,
                                                timeout=limit)
            if response.status >= 500:
                raise _Retryable(response)
            return response

        result: HttpResponse | Exception
        try:
            result = await once()  # the common case, without building a retry policy per call
        except (TransportError, _Retryable) as first:
            result, more = (first, 0) if tries == 1 else await self._retry(once, first, tries)
            attempts += more
        if isinstance(result, TransportError):
            return CallOutcome(method, url, None, None, time.perf_counter() - start, attempts,
                               _describe(result, limit, attempts))
        response = result.response if isinstance(result, _Retryable) else result
        assert isinstance(response, HttpResponse)
        outcome = CallOutcome(method, url, response.status, _body(response), time.perf_counter() - start, attempts)
        if not 200 <= response.status < 300:
            outcome.error = _http_error(response, path)
        return outcome

    async def _retry(self, once: Callable[[], Awaitable[HttpResponse]], first: Exception,
                     tries: int) -> tuple[HttpResponse | Exception, int]:
        """Attempts 2..tries with exponential backoff (tenacity), after `first` failed.

        tenacity's attempt 1 re-raises `first` at once, so its stop and wait rules count the
        request already sent. Returns the answer (or the last retryable failure) and how many
        more requests were sent.
        """
        from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

        pending: Exception | None = first
        sent = 0

        async def attempt() -> HttpResponse:
            nonlocal pending, sent
            if pending is not None:
                failure, pending = pending, None
                raise failure
            sent += 1
            return await once()

        retrying = AsyncRetrying(
            stop=stop_after_attempt(tries),
            wait=wait_exponential(multiplier=self.backoff, max=5 * self.backoff + 1),
            retry=retry_if_exception_type((TransportError, _Retryable)),
            reraise=True,
        )
        try:
            return await retrying(attempt), sent
        except (TransportError, _Retryable) as exc:
            return exc, sent

    async def _get_json(self, path: str, **params: Any) -> Any:
        outcome = await self.call("GET", path, params=params or None)
        if not outcome.ok:
            hint = DEV_MODE_HINT if outcome.status == 404 else "check the URL and that the server is up"
            raise ServerError(f"{outcome.url}: {outcome.error}", hint)
        if isinstance(outcome.body, str):
            raise ServerError(f"{outcome.url}: answer is not JSON: {outcome.body[:200]!r}")
        return outcome.body

    # -- reads -----------------------------------------------------------------------------
    async def version(self) -> Version:
        """GET /version -> {"version": "0.32.0+cpu"}."""
        return version_from_server_payload(await self._get_json("/version"))

    async def health(self) -> CallOutcome:
        """GET /health: 200 when the engine is up, 503 when it is dead (no retries)."""
        return await self.call("GET", "/health", retries=0)

    async def models(self) -> list[str]:
        data = await self._get_json("/v1/models")
        return [m["id"] for m in data.get("data", []) if isinstance(m, dict) and "id" in m]

    async def metrics_text(self) -> str:
        outcome = await self.call("GET", "/metrics")
        if not outcome.ok:
            raise ServerError(f"{outcome.url}: {outcome.error}")
        return outcome.body if isinstance(outcome.body, str) else str(outcome.body)

    async def metrics(self) -> Any:
        """Parsed /metrics (kvctl.transport.vllm_metrics.VllmMetrics)."""
        from kvctl.transport.vllm_metrics import parse_vllm_metrics

        return parse_vllm_metrics(await self.metrics_text())

    async def server_info(self) -> dict[str, Any]:
        """GET /server_info?config_format=json (dev mode, 0.13+): {"vllm_config": {...}}.

        Its first answer can take long: vLLM 0.32 also collects system info (collect_env) for it,
        seen taking over 10 s on a busy 2-core machine; so a longer timeout, and no retry storm.
        """
        outcome = await self.call("GET", "/server_info", params={"config_format": "json"}, retries=0,
                                  timeout=max(self.timeout, SERVER_INFO_TIMEOUT))
        if not outcome.ok:
            hint = DEV_MODE_HINT if outcome.status == 404 else "check the URL and that the server is up"
            raise ServerError(f"{outcome.url}: {outcome.error}", hint)
        if not isinstance(outcome.body, dict):
            raise ServerError(f"{outcome.url}: answer is not a JSON object: {str(outcome.body)[:200]!r}")
        return outcome.body

    async def kv_transfer_config(self) -> dict[str, Any] | None:
        """The kv_transfer_config the server runs with (None: no connector)."""
        info = await self.server_info()
        config = info.get("vllm_config", info) if isinstance(info, dict) else {}
        ktc = config.get("kv_transfer_config") if isinstance(config, dict) else None
        return ktc if isinstance(ktc, dict) and ktc.get("kv_connector") else None

    async def tokenize(self, model: str, prompt: str) -> tuple[int, int | None]:
        """POST /tokenize -> (token count, max_model_len)."""
        outcome = await self.call("POST", "/tokenize", json={"model": model, "prompt": prompt})
        if not outcome.ok or not isinstance(outcome.body, dict):
            raise ServerError(f"{outcome.url}: {outcome.error or 'unexpected answer'}")
        return int(outcome.body["count"]), outcome.body.get("max_model_len")

    async def complete(self, model: str, prompt: str, max_tokens: int = 1,
                       timeout: float | None = None, cache_salt: str | None = None) -> CallOutcome:
        """POST /v1/completions, greedy, sent once: a completion is not idempotent for the cache
        (a retried request would hit blocks its timed-out first attempt computed). `cache_salt`:
        vLLM's request field (/v1/completions from 0.10.0), mixed into the request's block hashes."""
        body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
        if cache_salt is not None:
            body["cache_salt"] = cache_salt
        return await self.call("POST", "/v1/completions", json=body, retries=0, timeout=timeout)

    # -- dev-mode actions ------------------------------------------------------------------
    async def reset_prefix_cache(self, version: Version, *, reset_external: bool,
                                 reset_running_requests: bool = False) -> CallOutcome:
        params: dict[str, Any] = {}
        if table().has(version, "http.reset_prefix_cache.reset_external"):
            params = {"reset_running_requests": reset_running_requests, "reset_external": reset_external}
        return await self.call("POST", "/reset_prefix_cache", params=params or None)

    async def reset_mm_cache(self) -> CallOutcome:
        return await self.call("POST", "/reset_mm_cache")

    async def reset_encoder_cache(self) -> CallOutcome:
        return await self.call("POST", "/reset_encoder_cache")

    async def pause(self, version: Version, timeout: float = PAUSE_TIMEOUT, mode: str | None = None) -> CallOutcome:
        """Pause generation so that no request fails: in-flight requests finish first (wait) or are
        frozen in place (keep); `mode` None: the release's own choice (pause_mode_for).

        Waits up to `timeout` (not the short per-call one: the server may still be draining
        requests it has accepted), and is tried at most twice: a stuck pause must not hold the
        rest of the fleet paused for minutes."""
        return await self.call("POST", "/pause", params=pause_params(version, mode) or None,
                               timeout=timeout, retries=min(self.retries, 1))

    async def resume(self) -> CallOutcome:
        return await self.call("POST", "/resume")

    async def is_paused(self) -> CallOutcome:
        return await self.call("GET", "/is_paused")

    async def is_sleeping(self) -> CallOutcome:
        return await self.call("GET", "/is_sleeping")

    # -- weights (dev mode) ------------------------------------------------------------------
    async def collective_rpc(self, method: str, kwargs: dict[str, Any] | None = None, *,
                             timeout: float | None = None) -> CallOutcome:
        """POST /collective_rpc {"method", "kwargs"[, "timeout"]}: `method` on every worker.

        Answers {"results": [one per worker]} (None, dicts and lists as they are, anything else as
        str), or an empty 200 when the engine returns nothing (serve/dev/rpc/api_router.py:23-58 in
        0.32.0). Sent once: a retried reload_weights after a timeout would queue a second reload
        behind the first. `timeout` bounds both the HTTP wait and vLLM's own wait for its workers."""
        body: dict[str, Any] = {"method": method, "kwargs": dict(kwargs or {})}
        if timeout is not None:
            body["timeout"] = timeout
        return await self.call("POST", "/collective_rpc", json=body, retries=0, timeout=timeout)

    async def update_weight_version(self, version: str) -> CallOutcome:
        """POST /update_weight_version {"new_version": V} -> {"success": true, "new_version": V} (0.27+)."""
        return await self.call("POST", "/update_weight_version", json={"new_version": version})

    async def weight_info(self) -> str | None:
        """GET /weight_info -> {"weight_version": V}: the version vLLM serves ("default" until one is set).

        None where the route is missing (404: before 0.27.0, or dev mode off); ServerError for
        any other failure or an answer without a string version."""
        outcome = await self.call("GET", "/weight_info")
        if outcome.status == 404:
            return None
        if not outcome.ok:
            raise ServerError(f"{outcome.url}: {outcome.error}", "check the URL and that the server is up")
        version = outcome.body.get("weight_version") if isinstance(outcome.body, dict) else None
        if not isinstance(version, str):
            raise ServerError(f"{outcome.url}: answer has no weight_version string: {str(outcome.body)[:200]!r}")
        return version

    async def weight_checksums(self, timeout: float = CHECKSUM_TIMEOUT) -> dict[str, str] | None:
        """POST /weight_checker {"action": "checksum"} -> every worker's {"<ranks>:<param>": sha256} (0.32+).

        None where the route is missing (404). vLLM hashes every weight on every worker for it, on
        the workers' own loop (generation waits meanwhile): seconds on a large model, hence its own
        bound and no retry. Summarise with kvctl.transport.vllm_weights.summarise_checksums."""
        outcome = await self.call("POST", "/weight_checker", json={"action": "checksum"}, retries=0,
                                  timeout=max(self.timeout, timeout))
        if outcome.status == 404:
            return None
        if not outcome.ok:
            raise ServerError(f"{outcome.url}: {outcome.error}", "check the URL and that the server is up")
        checksums = outcome.body.get("checksums") if isinstance(outcome.body, dict) else None
        if not isinstance(checksums, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                      for k, v in checksums.items()):
            raise ServerError(f"{outcome.url}: answer is not {{\"checksums\": {{...}}}}: {str(outcome.body)[:200]!r}")
        return checksums


PAUSE_MODES = ("wait", "keep")  # kvctl's own pause: never "abort" (it would fail the requests)


def pause_mode_for(version: Version, requested: str | None = None, can_preempt: bool = False) -> str:
    """The mode kvctl's pause uses on `version`: `requested` where given, else "wait" (in-flight
    requests finish; new ones queue) unless a wait pause makes that release reject the requests that
    arrive meanwhile (0.33+: 503 engine_paused, EngineCore._reject_add_while_paused) and the replica's
    running requests may be preempted (`can_preempt`: no KV connector, kvctl.reset.plan): there "keep",
    which queues new requests and freezes the running ones for the reset to preempt. With a connector
    frozen requests keep their KV blocks (kvctl never preempts there), so "wait", the one mode that
    drains them, stays the default, and the plan says its window's requests get 503
    (kvctl.reset.pausing). Before 0.16 /pause has no mode: it waits (wait_for_inflight_requests=true)."""
    if not table().has(version, "http.pause.mode"):
        return "wait"
    if requested is not None:
        return requested
    return "keep" if can_preempt and pause_rejects(version, "wait") else "wait"


def pause_params(version: Version, mode: str | None = None) -> dict[str, Any]:
    """The version's way to say "wait for in-flight requests (or, mode keep, freeze them), keep the caches".

    clear_cache defaults to true in every release that takes it (vllm_facts.json), and from 0.23 a
    clearing pause also resets the connector: a master-wide remove_all on a shared Mooncake
    master. kvctl clears what it means to clear itself, so it always says clear_cache=false, as long
    as the route takes it: marked DEPRECATED from 0.16.0, it is still passed to the engine and acted
    on through 0.33.0 (http.pause.clear_cache_deprecated)."""
    params: dict[str, Any] = {}
    if table().has(version, "http.pause.mode"):
        params["mode"] = pause_mode_for(version, mode)
    elif table().has(version, "http.pause.legacy_params"):
        params["wait_for_inflight_requests"] = True
    if table().has(version, "http.pause.clear_cache"):
        params["clear_cache"] = False
    return params


def reset_answer_error(outcome: CallOutcome) -> str | None:
    """Why a reset call did not succeed, or None. `{"success": false}` is a failure (0.26+)."""
    if outcome.error:
        return outcome.error
    if isinstance(outcome.body, dict) and outcome.body.get("success") is False:
        return 'the server answered {"success": false}: nothing was reset'
    return None


def _body(response: HttpResponse) -> Any:
    if not response.content:
        return ""
    try:
        return response.json()
    except ValueError:
        return response.text


def _http_error(response: HttpResponse, path: str) -> str:
    if response.status == 404 and path not in ("/version", "/health", "/metrics"):
        return f"HTTP 404 on {path}: the route is missing, dev mode is off ({DEV_MODE_HINT})"
    text = response.text.strip().replace("\n", " ")
    return f"HTTP {response.status}" + (f": {text[:200]}" if text else "")


def _describe(exc: TransportError, timeout: float, attempts: int = 1) -> str:
    if exc.kind == "timeout":
        tries = f", {attempts} attempts" if attempts > 1 else ""
        return f"timed out after {timeout:g} s ({exc.cause_name}{tries})"
    if exc.kind == "connect":
        return f"connection refused or unreachable ({exc.detail})" if exc.detail else "connection refused or unreachable"
    return str(exc)
