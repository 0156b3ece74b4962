"""The environment variables each vLLM release reads (sections "env_vars" and "env_validation" of
vllm_facts.json, read by tools/capabilities/env_facts.py from vllm/envs.py and arg_utils.py), and
the names outside vLLM that the servers' processes read (LMCache, Mooncake, Python)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from packaging.version import Version

from kvctl.facts.capabilities import _interval_at, _where, table
from kvctl.facts.versions import parse_version

# Names a server process reads besides vLLM's own registry, by prefix: LMCache's config
# (LMCACHE_CONFIG_FILE and every LMCACHE_<KEY> override), Mooncake's client and transfer engine
# (MOONCAKE_CONFIG_PATH in mooncake-wheel/mooncake/mooncake_config.py, MC_* through getenv in
# mooncake-integration/transfer_engine/transfer_engine_py.cpp), and vLLM's own VLLM_* namespace
# (a VLLM_ name no release defines is still meant for vLLM: a misspelling).
SERVER_PREFIXES = ("VLLM_", "LMCACHE_", "MOONCAKE_", "MC_")
# CPython reads it at start-up; vLLM's block hashes depend on it (kvctl/validate/env.py).
SERVER_NAMES = frozenset({"PYTHONHASHSEED"})
# Names in vLLM's envs.py that a plain `NAME=value` line does reach vLLM with, because the job's
# environment (Slurm, torchrun, a login shell) normally exports them already, or that only
# `pip install` / setup.py reads: a shell assignment to an exported name changes the exported value.
INHERITED_OR_BUILD = frozenset({"CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "CUDA_HOME", "LOCAL_RANK",
                                "MAX_JOBS", "NVCC_THREADS", "CMAKE_BUILD_TYPE", "VERBOSE"})
# Platform plugins read their own VLLM_<PLUGIN>_* names (vllm_ascend/envs.py): kvctl has no facts
# for them, so it says nothing about them.
PLUGIN_PREFIXES = ("VLLM_ASCEND_",)
# Names a release stopped reading because what they chose became the only behaviour: set to that
# choice, they ask for what runs anyway (vLLM logs an unknown name from 0.17.0 and acts as asked).
# name -> (the value's meaning as vLLM read it, what runs since, the source).
MOOT_AFTER_REMOVAL = {
    "VLLM_USE_V1": (lambda value: _int(value) not in (None, 0), "V1 is the only engine",
                    "vllm/engine/llm_engine.py:6 in 0.11.1: LLMEngine = V1LLMEngine; vllm/envs.py:901 in "
                    "0.11.0 read it as bool(int(...))"),
}


def _int(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def moot(name: str, value: str) -> tuple[str, str] | None:
    """(what runs, source) when a release that no longer reads `name` does what `value` asked."""
    row = MOOT_AFTER_REMOVAL.get(name)
    return (row[1], row[2]) if row is not None and row[0](str(value).strip()) else None


@dataclass(frozen=True)
class EnvValidation:
    """How a release treats VLLM_* names its registry does not define."""

    call: str  # "envs.validate_environ" / "current_platform.validate_environ"
    source: str  # where engine/arg_utils.py calls it
    message: str  # what vLLM logs: "Unknown vLLM environment variable detected"
    flag: str | None  # the option that makes it a ValueError: --fail-on-environ-validation


def _section(name: str) -> dict[str, Any]:
    return table().facts.get(name, {})


def _rows(entry: dict[str, Any], attr: str) -> list[dict[str, Any]]:
    rows = entry.get(attr, [])
    return rows.get("values", []) if isinstance(rows, dict) else rows


def defined(version: str | Version, name: str) -> str | None:
    """Where `version`'s envs.py defines `name` ("vllm/envs.py:1097 in 0.13.0"), else None."""
    row = _interval_at(_rows(_section("env_vars").get(name, {}), "spans"), parse_version(version))
    return _where(row) if row else None


def reads(version: str | Version, name: str) -> bool:
    """`version` reads `name`: its registry defines it, or a file of the release reads it directly."""
    entry, v = _section("env_vars").get(name, {}), parse_version(version)
    return any(_interval_at(_rows(entry, attr), v) is not None for attr in ("spans", "read_outside"))


@lru_cache(maxsize=None)
def names_in(version: str | Version) -> tuple[str, ...]:
    """Every name `version`'s registry defines (for a did-you-mean)."""
    v = parse_version(version)
    return tuple(sorted(n for n, e in _section("env_vars").items() if _interval_at(_rows(e, "spans"), v)))


def history(name: str) -> list[tuple[str, str | None]]:
    """The [since, until) intervals of the releases that read `name`, oldest first ([]: never)."""
    entry = _section("env_vars").get(name, {})
    rows = [r for attr in ("spans", "read_outside") for r in _rows(entry, attr)]
    return sorted(((r["since"], r.get("until")) for r in rows), key=lambda span: Version(span[0]))


@lru_cache(maxsize=1)
def ever_defined() -> frozenset[str]:
    """Every name some known release's envs.py defines."""
    return frozenset(n for n, e in _section("env_vars").items() if _rows(e, "spans"))


def validation(version: str | Version) -> EnvValidation | None:
    """How `version` checks VLLM_* names at start (0.17.0+: a warning each), else None."""
    entry, v = _section("env_validation").get("unknown_names", {}), parse_version(version)
    call = _interval_at(_rows(entry, "call"), v)
    if call is None:
        return None
    check, flag = _interval_at(_rows(entry, "check"), v), _interval_at(_rows(entry, "hard_fail_flag"), v)
    message = (check or {}).get("message") or "Unknown vLLM environment variable detected"
    return EnvValidation(call["value"], _where(call), message, flag["value"] if flag else None)


def is_plugin_name(name: str) -> bool:
    return name.startswith(PLUGIN_PREFIXES)


def server_reads(name: str) -> bool:
    """`name` is meant for the server process (vLLM, LMCache, Mooncake, Python), so a script that
    assigns it without exporting it before starting vLLM loses it. One list, for every release: a
    name some release defines, or one in the namespaces above."""
    if name in INHERITED_OR_BUILD:
        return False
    return name in SERVER_NAMES or name.startswith(SERVER_PREFIXES) or name in ever_defined()
