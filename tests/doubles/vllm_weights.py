"""The weight-reload part of the vLLM TEST DOUBLE: :class:`WeightsModel`, mixed into :class:`~tests.doubles.vllm.VllmDouble`.

VllmDouble serves the routes (``/collective_rpc``, ``/update_weight_version``, ``/weight_info``,
``/weight_checker``, by version); this part gives its workers vLLM's ``reload_weights`` and makes the
cache model remember which weights computed each block:

* ``POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}`` (dev mode,
  0.10.2+; vllm/entrypoints/serve/dev/rpc/api_router.py) -> ``{"results": [null]}``, one per worker.
  ``reload_weights(weights_path=)`` exists from 0.16.0 (FACTS §8); before, the keyword is a TypeError
  in the worker (a 500). A folder that is not on this machine makes vLLM try a Hugging Face download
  (model_loader/default_loader.py ``_prepare_weights``), one without ``*.safetensors`` finds no weights:
  both end in a 500. The reload resets the mm and encoder caches, NOT the prefix cache: blocks cached
  before it keep the KV of the old weights (the bug ``kvctl weights update`` fixes).
* What the weights ARE, in the double: a digest of the ``*.safetensors`` bytes of the folder loaded
  (the served model's name before any reload), so equal files give equal ``/weight_checker``
  checksums on every replica. Each cached block (local, and in the :class:`SharedStore`) remembers
  the weights it was computed with.
* With ``weight_answers=True`` the completions derive from those weights, with log-probabilities:
  a prompt whose prefix hit blocks of other weights answers differently from a fresh computation
  (stale KV), and ``cache_salt`` (vLLM 0.10.0+) salts the block hashes as vLLM does, so ``kvctl
  probe`` can tell the two apart.

Imports nothing from ``kvctl``.
"""

from __future__ import annotations

import hashlib
import os
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .store import SharedStore

V_RELOAD_WEIGHTS_PATH = (0, 16, 0)    # reload_weights(weights_path=) (FACTS §8)
V_CACHE_SALT = (0, 10, 0)             # CompletionRequest.cache_salt (vllm_facts.json)

# The weights each store key's KV was computed with, per store (the store itself holds keys only).
_STORE_WEIGHTS: weakref.WeakKeyDictionary[SharedStore, dict[str, str]] = weakref.WeakKeyDictionary()


def store_weights(store: SharedStore) -> dict[str, str]:
    return _STORE_WEIGHTS.setdefault(store, {})


def folder_weights(path: str) -> str:
    """The weights a folder holds: a digest of its *.safetensors files' names and bytes."""
    digest = hashlib.sha256()
    for file in sorted(Path(path).glob("*.safetensors")):
        digest.update(file.name.encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


class WeightsModel:
    """The reload and the weights of the cache model, for one replica (mixed into VllmDouble, which
    provides ``v``, ``weights``, ``store``, ``store_key`` and ``rpc_methods``)."""

    v: tuple[int, int, int]
    weights: str
    store: SharedStore | None
    rpc_methods: dict[str, Callable[[dict[str, Any]], Any]]
    store_key: Callable[[str], str]

    def _init_weights(self, weight_answers: bool) -> None:
        self.weights_path: str | None = None  # the folder of the last reload
        self.weight_answers = weight_answers
        self.block_weights: dict[str, str] = {}  # local block hash -> the weights its KV was computed with
        self.reloads = 0
        self.rpc_methods["reload_weights"] = self._rpc_reload_weights

    def _rpc_reload_weights(self, kwargs: dict[str, Any]) -> None:
        """One worker's ``reload_weights(weights_path=None)``: an exception here is the route's 500."""
        path = kwargs.get("weights_path")
        if path is not None and self.v < V_RELOAD_WEIGHTS_PATH:
            raise TypeError("reload_weights() got an unexpected keyword argument 'weights_path'")
        if path is not None and not os.path.isdir(path):  # not local: vLLM takes it for a Hugging Face repo id
            raise ValueError(f"HFValidationError: Repo id must be in the form 'repo_name' or "
                             f"'namespace/repo_name': '{path}'")
        if path is not None and not any(Path(path).glob("*.safetensors")):
            raise RuntimeError(f"Cannot find any model weights with `{path}`")
        if path is not None:
            self.weights, self.weights_path = folder_weights(path), path
        self.reloads += 1  # the mm and encoder caches go with it; the prefix cache stays (FACTS §8)

    # -- the cache model's weights ----------------------------------------------------------------
    def kv_weights(self, hashes: list[str], local: int, external: int) -> set[str]:
        """The weights the KV of the hit blocks was computed with (local hits, then external ones)."""
        found = {self.block_weights.get(h, self.weights) for h in hashes[:local]}
        if external and self.store is not None:
            tags = store_weights(self.store)
            found |= {tags.get(self.store_key(h), self.weights) for h in hashes[local:local + external]}
        return found

    def remember_weights(self, new_blocks: list[str], new_keys: list[str]) -> None:
        """Blocks computed now carry the current weights; blocks already cached keep their old KV."""
        for h in new_blocks:
            self.block_weights[h] = self.weights
        if new_keys and self.store is not None:
            tags = store_weights(self.store)
            for key in new_keys:
                tags[key] = self.weights

    def weight_answer(self, ids: list[int], kv: set[str], max_tokens: int) -> dict[str, Any]:
        """A greedy answer with log-probabilities, from the weights that computed its KV: the current
        weights alone (a fresh computation, or KV of these weights) or a mix (stale KV)."""
        source = self.weights if kv <= {self.weights} else "mix:" + ",".join(sorted(kv | {self.weights}))
        prompt = ",".join(map(str, ids))
        tokens, logprobs, top = [], [], []
        for i in range(max_tokens):
            h = hashlib.sha256(f"{source}|{prompt}|{i}".encode()).hexdigest()
            token, lp = f" t{h[:6]}", -0.05 - int(h[6:10], 16) % 1000 / 1000
            tokens.append(token)
            logprobs.append(lp)
            top.append({token: lp, f" alt{h[10:14]}": lp - 2.0})  # a clear-cut choice: never a near-tie
        return {"text": "".join(tokens), "logprobs": {"tokens": tokens, "token_logprobs": logprobs,
                                                      "top_logprobs": top, "text_offset": list(range(max_tokens))}}


__all__ = ["WeightsModel", "folder_weights", "store_weights"]
