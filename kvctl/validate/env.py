"""Checks of the servers' environment (PYTHONHASHSEED, VLLM_SERVER_DEV_MODE, MOONCAKE_CONFIG_PATH).
Knows nothing of file formats.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from packaging.version import Version

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


def check_unread_mooncake_config(env: Mapping[str, str], names: tuple[str, ...], v: Version,
                                 path: str, out: Collector) -> None:
    """MOONCAKE_CONFIG_PATH set for a server none of whose connectors reads a mooncake.json in
    `v` (the V1 P2P MooncakeConnector takes its settings from kv_connector_extra_config; before
    0.21 no V1 store connector exists): the file the user wrote is silently not read."""
    from kvctl.validate.mooncake_file import reader_of

    value = env.get("MOONCAKE_CONFIG_PATH")
    if not value or not names or "$" in value or any(n.startswith("LMCache") for n in names):
        return  # LMCache's Mooncake backend reads MOONCAKE_CONFIG_PATH itself
    if reader_of(v, names).kind != "none":
        return
    out.drop(path, f"MOONCAKE_CONFIG_PATH={value} is set for this server, but no connector it runs "
             f"({', '.join(names)}) reads a mooncake.json in vLLM {v}: the file's settings "
             "(protocol, metadata_server, ...) are not used",
             "remove MOONCAKE_CONFIG_PATH and the file (set what the connector reads in "
             "kv_connector_extra_config), or use a connector that reads it (MooncakeStoreConnector "
             "from vLLM 0.21.0)")
