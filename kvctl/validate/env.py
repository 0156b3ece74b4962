"""Checks of the servers' environment (PYTHONHASHSEED, VLLM_SERVER_DEV_MODE, MOONCAKE_CONFIG_PATH).
Knows nothing of file formats.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kvctl.validate.model import Collector, Problem, join

STORE_CONNECTOR = "MooncakeStoreConnector"
_HASH_SEED_MAX = 4294967295  # CPython's upper bound for PYTHONHASHSEED


def validate_env(
    env: Mapping[str, str],
    where: str = "env",
    connectors: Iterable[str] = (),
    lines: Mapping[str, int] | None = None,
) -> list[Problem]:
    """Problems with the servers' environment. `connectors`: every connector name in the
    kv_transfer_config, MultiConnector children included (kvctl.facts.kv_transfer.connector_names)."""
    out, names = Collector(lines), set(connectors)
    _check_hash_seed(env.get("PYTHONHASHSEED"), join(where, "PYTHONHASHSEED"), out)
    _check_dev_mode(env.get("VLLM_SERVER_DEV_MODE"), join(where, "VLLM_SERVER_DEV_MODE"), out)
    path = join(where, "MOONCAKE_CONFIG_PATH")
    if STORE_CONNECTOR in names and not env.get("MOONCAKE_CONFIG_PATH"):
        out.error(path, f"{STORE_CONNECTOR} is configured but MOONCAKE_CONFIG_PATH is not set: "
                  "vLLM raises ValueError at start",
                  "export MOONCAKE_CONFIG_PATH=/abs/path/mooncake.json")
    elif ("LMCacheConnectorV1" in names and not env.get("MOONCAKE_CONFIG_PATH")
          and str(env.get("LMCACHE_REMOTE_URL", "")).startswith("mooncakestore://")):
        out.warn(path, "LMCACHE_REMOTE_URL is a mooncakestore:// URL but MOONCAKE_CONFIG_PATH is "
                 "not set: LMCache's Mooncake backend looks for its mooncake.json there",
                 "export MOONCAKE_CONFIG_PATH=/abs/path/mooncake.json")
    return out.problems


def _check_hash_seed(seed: str | None, path: str, out: Collector) -> None:
    why = ("vLLM seeds block hashes randomly unless PYTHONHASHSEED is set, so servers compute "
           "different keys and never reuse each other's KV from the store")
    fix = "export PYTHONHASHSEED=0 on every server (the same value everywhere)"
    if seed is None or seed.strip() == "":
        out.warn(path, f"PYTHONHASHSEED is not set: {why}", fix)
    elif seed.strip() == "random":
        out.warn(path, f"PYTHONHASHSEED is 'random': {why}", fix)
    elif not seed.strip().isdigit() or int(seed) > _HASH_SEED_MAX:
        out.error(path, f"PYTHONHASHSEED {seed!r} is neither 'random' nor an integer in "
                  f"[0, {_HASH_SEED_MAX}]: Python refuses to start", fix)


def _check_dev_mode(value: str | None, path: str, out: Collector) -> None:
    try:
        enabled = value is not None and int(value) != 0
    except ValueError:
        out.error(path, f"VLLM_SERVER_DEV_MODE {value!r} is not an integer: vLLM reads it with "
                  "int() and fails", "export VLLM_SERVER_DEV_MODE=1")
        return
    if not enabled:
        out.warn(path, f"VLLM_SERVER_DEV_MODE is {'not set' if value is None else repr(value)}: "
                 "the reset, pause and sleep routes are 404, so kvctl reset cannot clear the "
                 "caches",
                 "export VLLM_SERVER_DEV_MODE=1 (those routes are unauthenticated: keep the servers "
                 "on a trusted network)")
