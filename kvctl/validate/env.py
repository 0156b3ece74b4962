"""Checks of the servers' environment (PYTHONHASHSEED, VLLM_SERVER_DEV_MODE, MOONCAKE_CONFIG_PATH).
Knows nothing of file formats.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

from packaging.version import Version

from kvctl.facts.capabilities import describe_interval
from kvctl.facts.versions import release
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
    if not value or not names or "$" in value:
        return
    if any(n.startswith("LMCache") for n in names) and _lmcache_may_read(env):
        return  # LMCache's Mooncake backend reads MOONCAKE_CONFIG_PATH itself
    reader = reader_of(v, names).kind
    if reader != "none" and (reader != "lmcache" or _lmcache_may_read(env)):
        return
    out.drop(path, f"MOONCAKE_CONFIG_PATH={value} is set for this server, but no connector it runs "
             f"({', '.join(names)}) reads a mooncake.json in vLLM {v}"
             f"{' (LMCache reads it only for a mooncakestore:// remote, and none is set)' if reader == 'lmcache' else ''}"
             ": the file's settings "
             "(protocol, metadata_server, ...) are not used",
             "remove MOONCAKE_CONFIG_PATH and the file (set what the connector reads in "
             "kv_connector_extra_config), or use a connector that reads it (MooncakeStoreConnector "
             "from vLLM 0.21.0)")


def check_env_names(env: Mapping[str, str], v: Version, out: Collector) -> None:
    """VLLM_* names in the servers' environment that vLLM `v` does not read: removed, not yet
    added, or misspelled. vLLM starts without them (from 0.17.0 it logs "Unknown vLLM environment
    variable detected" for each: envs.validate_environ, envs.py:1704 at 0.17.0). Located at
    "env.NAME", where the reader records the line that set it."""
    from kvctl.facts import env_vars

    set_by = getattr(env, "set_by", {})  # names a tool sets, not the file (kvctl.validate.model.Environment)
    for name in sorted(env):
        if not name.startswith("VLLM_") or env_vars.is_plugin_name(name) or env_vars.reads(v, name):
            continue
        message, fix = _unread_name(name, str(env[name]), v)
        runs = env_vars.moot(name, str(env[name])) if env_vars.history(name) else None
        if runs is not None and Version(env_vars.history(name)[-1][1] or "0") <= _release(v):
            out.warn(join("env", name), f"{message}{_validation_note(name, v)}; {name}={env[name]} asks for "
                     f"what runs anyway: {runs[0]} ({runs[1]})", f"nothing breaks; remove {name} (vLLM {v} ignores it)")
            continue
        if name in set_by:
            out.warn(join("env", name), f"{message}{_validation_note(name, v)}; {set_by[name]} sets it, "
                     "not this file", f"nothing to change here (harmless unless vLLM runs with "
                     f"--fail-on-environ-validation); it is {set_by[name]}'s to drop")
            continue
        out.drop(join("env", name), f"{message}{_validation_note(name, v)}", fix)


def _unread_name(name: str, value: str, v: Version) -> tuple[str, str]:
    """What vLLM `v` does with `name` (it starts without it), and what to write instead."""
    from kvctl.facts import env_vars

    spans = env_vars.history(name)
    if not spans:
        # a misspelling is a letter or two off: a looser match suggests unrelated names
        close = next(iter(difflib.get_close_matches(
            name, [n for n in env_vars.names_in(v) if n.startswith("VLLM_")], n=1, cutoff=0.85)), None)
        fix = f"did you mean {close}? set {close}={value} instead" if close else \
            f"remove {name} (vLLM {v}'s vllm/envs.py defines no such name)"
        return f"vLLM {v} does not read {name}: no release kvctl knows defines it", fix
    read = ", ".join(describe_interval(since, until) for since, until in spans)
    since = spans[0][0]
    if Version(since) > _release(v):
        return (f"vLLM {v} does not read {name} (read in {read})",
                f"upgrade vLLM to >= {since}, or remove {name}")
    return f"vLLM {v} does not read {name} (read in {read}): it was removed", f"remove {name}"


def _release(v: Version) -> Version:
    return Version(release(v))  # 0.32.0+cpu reads what 0.32.0 reads


def _validation_note(name: str, v: Version) -> str:
    from kvctl.facts import env_vars

    check = env_vars.validation(v)
    if check is None:
        return f"; vLLM {v} starts without it and says nothing"
    hard = f"; with {check.flag} it raises ValueError instead" if check.flag else ""
    return f"; vLLM {v} starts without it, logging '{check.message}: {name}'{hard}"


def _lmcache_may_read(env: Mapping[str, str]) -> bool:
    """LMCache reads MOONCAKE_CONFIG_PATH only through a mooncakestore:// remote: one its env sets,
    or one a config file kvctl does not see may set (LMCACHE_CONFIG_FILE). Neither: nobody reads it."""
    remote = str(env.get("LMCACHE_REMOTE_URL", ""))
    return remote.startswith("mooncakestore://") or "$" in remote or (not remote and "LMCACHE_CONFIG_FILE" in env)
