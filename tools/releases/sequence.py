"""The request sequence the tier sends, the same to a real vLLM server and to the vLLM double.

Every step is chosen to show one fact without changing what later steps see:
- a route's presence: the wrong method (GET on a POST route) answers 405 where the route exists
  and 404 where it does not, and runs nothing; GET routes are asked plainly;
- a query parameter's reading: an invalid value ("maybe") is refused (4xx) by a route that reads
  the parameter and ignored (200) by one that does not;
- behaviour: cached tokens of a repeated prompt, after a local reset, with a cache_salt; pause and
  resume as /is_paused reports them; the weight version label written and read back.

An answer is kept as its status and its JSON *shape* (keys and value types, not values), plus a
value where the value is the behaviour (a boolean the sequence derives, or a label it wrote).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from benchmarks.common import PROMPT  # > 128 tokens with the tiny tokenizer: one full CPU block
from kvctl.reset import cached_tokens

SALT = "kvctl-tier-salt"
LABEL = "kvctl-tier-label"
BOGUS = "maybe"  # not a bool, not a pause mode: only a route that reads the parameter refuses it
TIMEOUT = 120.0
HELD_S = 3.0  # how long a request sent while paused must stay unanswered to count as held

# Routes whose presence is observed: path -> the method that does NOT act (a POST route asked by GET).
ROUTES: dict[str, str] = {
    "/reset_prefix_cache": "GET", "/reset_mm_cache": "GET", "/reset_encoder_cache": "GET",
    "/pause": "GET", "/resume": "GET", "/is_paused": "GET",
    "/sleep": "GET", "/wake_up": "GET", "/is_sleeping": "GET",
    "/collective_rpc": "GET", "/server_info": "GET", "/abort_requests": "GET",
    "/update_weight_version": "GET", "/weight_info": "GET", "/weight_checker": "GET",
    "/init_weight_transfer_engine": "GET", "/update_weights": "GET",
    "/start_weight_update": "GET", "/finish_weight_update": "GET",
}

# Query parameters whose reading is observed: name -> (method, path).
PARAMS: dict[str, tuple[str, str]] = {
    "reset_prefix_cache.reset_external": ("POST", "/reset_prefix_cache"),
    "reset_prefix_cache.reset_running_requests": ("POST", "/reset_prefix_cache"),
    "pause.mode": ("POST", "/pause"),
    "pause.clear_cache": ("POST", "/pause"),
    "pause.wait_for_inflight_requests": ("POST", "/pause"),
}

# Metric families kvctl's verification reads (kvctl/transport/vllm_metrics.py), and their old names.
METRICS = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_queries",
           "vllm:gpu_prefix_cache_hits", "vllm:external_prefix_cache_queries",
           "vllm:external_prefix_cache_hits", "vllm:prompt_tokens_cached", "vllm:cache_config_info")


def shape(value: Any) -> Any:
    """The JSON skeleton of a value: keys kept, values replaced by their type names. A dict keyed by
    data (worker and parameter names: "dp0:pp0:tp0:lm_head.weight") is a map: {"<key>": shape}."""
    if isinstance(value, dict):
        if value and all(any(c in key for c in ":./") for key in value):
            return {"<key>": shape(next(iter(value.values())))}
        return {key: shape(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if value is None:
        return "null"
    return "str"


def body_shape(response: httpx.Response) -> Any:
    if not response.content:
        return "empty"
    try:
        return shape(response.json())
    except ValueError:
        return "text"


@dataclass
class Exchange:
    step: str
    method: str
    path: str
    status: int
    shape: Any
    value: Any = None  # only where the value is what the step observes


@dataclass
class Transcript:
    """What one server answered to the sequence."""

    dev_mode: bool
    exchanges: list[Exchange] = field(default_factory=list)
    metric_names: list[str] = field(default_factory=list)

    def find(self, step: str) -> Exchange | None:
        return next((e for e in self.exchanges if e.step == step), None)

    def to_json(self) -> dict[str, Any]:
        return {"dev_mode": self.dev_mode, "exchanges": [asdict(e) for e in self.exchanges],
                "metric_names": self.metric_names}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Transcript:
        return cls(data["dev_mode"], [Exchange(**e) for e in data["exchanges"]], list(data["metric_names"]))


class Runner:
    """Sends the sequence to one server (base URL) serving `model`."""

    def __init__(self, url: str, model: str, *, dev_mode: bool) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.transcript = Transcript(dev_mode)
        self.client = httpx.Client(base_url=self.url, timeout=TIMEOUT, trust_env=False)

    def send(self, step: str, method: str, path: str, *, params: dict[str, str] | None = None,
             json: Any = None, value: Callable[[httpx.Response], Any] | None = None) -> Exchange:
        response = self.client.request(method, path, params=params, json=json)
        ex = Exchange(step, method, _with_query(path, params), response.status_code, body_shape(response),
                      value(response) if value is not None and response.status_code == 200 else None)
        self.transcript.exchanges.append(ex)
        return ex

    def present(self, path: str) -> bool:
        ex = self.transcript.find(f"route {path}")
        return ex is not None and ex.status != 404

    def cached_tokens(self, step: str, **extra: Any) -> Exchange:
        """One completion of PROMPT; its value: cached prompt tokens > 0 (None: not reported)."""
        body = {"model": self.model, "prompt": PROMPT, "max_tokens": 1, "temperature": 0, **extra}
        ex = self.send(step, "POST", "/v1/completions", json=body, value=_cached_hit)
        ex.shape = _completion_shape(ex.shape)
        return ex

    def close(self) -> None:
        self.client.close()


def _with_query(path: str, params: dict[str, str] | None) -> str:
    return path + ("?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else "")


def _cached_hit(response: httpx.Response) -> bool | None:
    """Cached prompt tokens > 0, as the answer gives them (None: no count, e.g. a null before 0.24)."""
    count = cached_tokens.read(response.json()).count
    return None if count is None else count > 0


def _completion_shape(full: Any) -> Any:
    """The part of a completion kvctl reads: choices[].text and usage (other fields vary by
    release and are not kvctl's business)."""
    if not isinstance(full, dict):
        return full
    choices = full.get("choices") or []
    return {"choices": [{"text": choices[0].get("text")}] if choices and isinstance(choices[0], dict) else choices,
            "usage": full.get("usage")}


def _success(response: httpx.Response) -> Any:
    """{"success": bool} from 0.26.0; an empty answer before (no value)."""
    if not response.content:
        return None
    body = response.json()
    return body.get("success") if isinstance(body, dict) else None


class _Background:
    """A completion sent in a thread (while the engine is paused)."""

    def __init__(self, url: str, model: str) -> None:
        self.response: httpx.Response | None = None
        body = {"model": model, "prompt": "a request sent while paused", "max_tokens": 1, "temperature": 0}
        self.thread = threading.Thread(target=self._send, args=(url, body), daemon=True)
        self.thread.start()

    def _send(self, url: str, body: dict[str, Any]) -> None:
        self.response = httpx.post(f"{url}/v1/completions", json=body, timeout=TIMEOUT, trust_env=False)

    def outcome(self) -> str:
        """"held" while unanswered, else "answered <status>"."""
        return "held" if self.response is None else f"answered {self.response.status_code}"

    def finish(self, held: str) -> tuple[int, Any, Any]:
        """(status, shape, value) once answered after the resume; value: "held" (queued until the
        resume) or "rejected" (answered before it)."""
        self.thread.join(TIMEOUT)
        response = self.response
        if response is None:
            return 0, "no answer", held
        return response.status_code, _completion_shape(body_shape(response)), "held" if held == "held" else "rejected"


def _paused(response: httpx.Response) -> Any:
    return response.json().get("is_paused")


def _label(response: httpx.Response) -> Any:
    return response.json().get("weight_version")


_METRIC_LINE = re.compile(r"^(vllm:[A-Za-z0-9_:]+?)(?:_total|_created)?(?:\{| )", re.MULTILINE)


def metric_names(text: str) -> list[str]:
    """The vLLM metric families a /metrics text exposes, among those kvctl reads."""
    found = {m.group(1) for m in _METRIC_LINE.finditer(text)}
    return sorted(name for name in METRICS if name in found)


def run(url: str, model: str, *, dev_mode: bool, held_s: float = HELD_S) -> Transcript:
    """The whole sequence. Without dev mode only the routes are asked (which of them vLLM gates)."""
    r = Runner(url, model, dev_mode=dev_mode)
    try:
        r.send("version", "GET", "/version", value=lambda resp: resp.json().get("version"))
        for path, method in ROUTES.items():
            ex = r.send(f"route {path}", method, path)
            if isinstance(ex.shape, dict):
                ex.shape = sorted(ex.shape)  # a GET route's answer: its sections, asked again below
        if dev_mode:
            _behaviour(r, held_s)
        return r.transcript
    finally:
        r.close()


def _behaviour(r: Runner, held_s: float) -> None:
    # metrics, and the local prefix cache: a repeated prompt hits, a reset empties it
    metrics = r.client.get("/metrics")
    r.transcript.metric_names = metric_names(metrics.text)
    r.cached_tokens("completion first")
    r.cached_tokens("completion repeated")
    if r.present("/reset_prefix_cache"):
        r.send("reset_prefix_cache", "POST", "/reset_prefix_cache", value=_success)
        r.cached_tokens("completion after reset")  # primes PROMPT again for the salt step
    r.cached_tokens("completion salted", cache_salt=SALT)
    # which query parameters each route reads
    for name, (method, path) in PARAMS.items():
        if not r.present(path):
            continue
        param = name.split(".", 1)[1]
        ex = r.send(f"param {name}", method, path, params={param: BOGUS})
        if path == "/pause" and ex.status == 200:  # ignored: it paused with the defaults
            r.send(f"param {name} resume", "POST", "/resume")
    if r.present("/reset_prefix_cache"):
        r.send("reset_prefix_cache external", "POST", "/reset_prefix_cache", params={"reset_external": "true"},
               value=_success)
    for path in ("/reset_mm_cache", "/reset_encoder_cache"):
        if r.present(path):
            r.send(path.lstrip("/"), "POST", path)
    # pause and resume as /is_paused reports them
    if r.present("/pause"):
        r.send("pause", "POST", "/pause")
        r.send("is_paused after pause", "GET", "/is_paused", value=_paused)
        waiting = _Background(r.url, r.model)  # a request sent while paused: answered at once, or held
        time.sleep(held_s)
        held = waiting.outcome()
        r.send("resume", "POST", "/resume")
        r.transcript.exchanges.append(Exchange("completion while paused", "POST", "/v1/completions",
                                               *waiting.finish(held)))
        r.send("is_paused after resume", "GET", "/is_paused", value=_paused)
    if r.present("/server_info"):
        ex = r.send("server_info", "GET", "/server_info", params={"config_format": "json"})
        if isinstance(ex.shape, dict):
            ex.shape = sorted(ex.shape)  # top-level sections only: their contents are vLLM's config
    # the weight version label and checksums
    if r.present("/weight_info"):
        r.send("weight_info", "GET", "/weight_info", value=_label)
    if r.present("/update_weight_version"):
        r.send("update_weight_version", "POST", "/update_weight_version", json={"new_version": LABEL})
        if r.present("/weight_info"):
            r.send("weight_info after update", "GET", "/weight_info", value=_label)
    if r.present("/weight_checker"):
        ex = r.send("weight_checker checksum", "POST", "/weight_checker", json={"action": "checksum"})
        if ex.status == 200:
            baseline = r.client.post("/weight_checker", json={"action": "checksum"}).json()
            r.send("weight_checker compare", "POST", "/weight_checker",
                   json={"action": "compare", "baseline": baseline.get("checksums", baseline)},
                   value=lambda resp: resp.json().get("match"))
