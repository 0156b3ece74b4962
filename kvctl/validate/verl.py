"""Checks of what verl does with a config on top of what vLLM does: where verl reads the connector,
what Hydra refuses on its command line, and the settings verl changes for every replica.

Knows nothing of file formats: it gets a VerlConfig (a verl YAML's tree, or the tree a command
line's Hydra overrides build) or a kv_transfer_config read from verl's engine_kwargs.vllm. Every
line cited is of verl 0.9.1 (kvctl.facts.verl).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from packaging.version import Version

from kvctl.facts.verl import ENGINE_KWARGS, FULL_DETERMINISM, ROLLOUT, VLLM_KWARGS, runtime_env_override
from kvctl.validate.env import STORE_CONNECTOR
from kvctl.validate.model import (
    Artifact,
    Collector,
    HydraOverride,
    Problem,
    VerlConfig,
    find_key,
    placeholder,
    value_at,
)

_ONE_SIDED = {"kv_producer": "kv_consumer", "kv_consumer": "kv_producer"}
_TRUE = ("true", "yes", "on", "1")


def check_verl(artifact: Artifact, connectors: Iterable[str], v: Version | None = None) -> list[Problem]:
    """Problems verl 0.9.1 has with this config. `connectors`: every connector the input names;
    `v`: the vLLM release its servers run (the shared-master hazard depends on it)."""
    from kvctl.validate.shared_master import check_verl_shared_master

    config: VerlConfig = artifact.data
    out = Collector(artifact.lines)
    _check_placement(config.tree, out)
    _check_full_determinism(config.tree, set(connectors), out)
    if v is not None:
        check_verl_shared_master(config.tree, set(connectors), v, ROLLOUT, out)
    for override in config.overrides:
        _check_plus(override, config.own_config, out)
    return out.problems


def _check_placement(tree: dict[str, Any], out: Collector) -> None:
    """verl reads the connector only from engine_kwargs.vllm."""
    right = f"{VLLM_KWARGS}.kv_transfer_config"
    no_level = f"{ENGINE_KWARGS}.kv_transfer_config"
    if value_at(tree, no_level) is not None:
        # vllm_async_server.py:287-288: the server takes engine_kwargs["vllm"] and nothing else of
        # engine_kwargs, which RolloutConfig types as a free dict (verl/workers/config/rollout.py:217),
        # so verl accepts the key and drops it: the servers run with no connector at all.
        out.error(no_level, "kv_transfer_config is under engine_kwargs without the 'vllm' level: verl "
                  "accepts it and hands vLLM only engine_kwargs.vllm (verl/workers/rollout/vllm_rollout/"
                  "vllm_async_server.py:287), so the servers start with no KV connector and nothing "
                  "reaches Mooncake", f"move it one level down, to {right}")
    too_high = f"{ROLLOUT}.kv_transfer_config"
    if value_at(tree, too_high) is not None:
        # RolloutConfig (verl/workers/config/rollout.py:145) is built from this section
        # (verl/workers/rollout/replica.py:104) and has no such field.
        out.error(too_high, "kv_transfer_config directly under actor_rollout_ref.rollout: verl builds its "
                  "RolloutConfig from this section (verl/workers/rollout/replica.py:104), which has no "
                  "such field, so the trainer stops at start with \"RolloutConfig.__init__() got an "
                  "unexpected keyword argument 'kv_transfer_config'\"", f"move it under engine_kwargs.vllm: {right}")


def _check_full_determinism(tree: dict[str, Any], connectors: set[str], out: Collector) -> None:
    """full_determinism makes verl seed each replica apart, PYTHONHASHSEED included."""
    value = value_at(tree, FULL_DETERMINISM)
    if not _on(value):
        return
    # vllm_async_server.py:149-156: with full_determinism each replica calls
    # enable_full_determinism(seed + replica_rank), which sets PYTHONHASHSEED to that number
    # (verl/workers/engine/utils.py:37) before vLLM starts; vLLM seeds its block hashes from it.
    why = ("verl then gives every rollout replica its own PYTHONHASHSEED (seed + replica rank: "
           "verl/workers/rollout/vllm_rollout/vllm_async_server.py:149-156, verl/workers/engine/"
           "utils.py:37), over the PYTHONHASHSEED=0 of the environment, and vLLM seeds its block "
           "hashes from it: no replica computes another's keys")
    fix = (f"set {FULL_DETERMINISM}=false to share KV across replicas; keep it only if reproducible "
           "rollouts matter more than cross-replica reuse")
    if STORE_CONNECTOR in connectors:
        # An error: the shared store this config sets up is never shared (each replica hits only
        # what it wrote itself, and the store holds one copy of every prefix per replica).
        out.error(FULL_DETERMINISM, f"full_determinism is on with {STORE_CONNECTOR}: {why}, so "
                  "cross-replica hits in the Mooncake store drop to zero and the store keeps one copy "
                  "of every prefix per replica", fix)
    else:
        # A warning: this input names no store connector; one set elsewhere (an included file,
        # another override) loses its cross-replica hits the same way.
        out.warn(FULL_DETERMINISM, f"full_determinism is on: {why}, so a Mooncake store connector "
                 "(set in another file, or later) gets no cross-replica hits", fix)


def _check_plus(override: HydraOverride, own_config: bool, out: Collector) -> None:
    """Keys under engine_kwargs.vllm need '+' on the command line."""
    key = override.key
    if override.prefix or not (key == VLLM_KWARGS or key.startswith(VLLM_KWARGS + ".")):
        return
    if key == VLLM_KWARGS and override.value in ({}, None):
        return  # nothing added: Hydra takes it
    # verl's rollout.yaml:142 ships `vllm: {}` and Hydra composes it in struct mode: a key it does
    # not have is refused unless the override adds it ('+', or '++' to add or replace).
    refusal = (f"Hydra refuses the command line with \"Could not override '{key}'\": verl's own config "
               "has no such key (engine_kwargs.vllm is empty, verl/trainer/config/rollout/rollout.yaml:142)")
    fix = f"write +{key}=... (or ++{key}=... to add it or replace it either way)"
    if own_config:
        out.warn(key, f"'{key}=...' has no leading '+': unless the config this command loads "
                 f"(--config-name) sets the key, {refusal}", fix)
    else:
        out.error(key, f"'{key}=...' has no leading '+': {refusal}", fix)


def check_verl_kv_transfer_config(artifact: Artifact) -> list[Problem]:
    """A kv_transfer_config from verl's engine_kwargs.vllm: one side of a prefill/decode split."""
    out = Collector(artifact.lines)
    for path, role in find_key(artifact.data, "kv_role", artifact.where):
        if role not in _ONE_SIDED:
            continue
        # One RolloutConfig for every replica (replica.py:104), its engine_kwargs.vllm turned into
        # each server's flags (vllm_async_server.py:287-288): every server gets this role.
        out.error(path, f"kv_role {role} in verl's engine_kwargs.vllm: verl passes the same "
                  "engine_kwargs.vllm to every rollout replica (verl/workers/rollout/vllm_rollout/"
                  f"vllm_async_server.py:287), so every server is a {role} and none a {_ONE_SIDED[role]}: "
                  "the prefill/decode split this config is one side of never forms",
                  "use kv_role kv_both with a store connector (kvctl config render mooncake-store "
                  "--format verl), or verl's own prefill/decode split "
                  "(actor_rollout_ref.rollout.disaggregation.enabled=true), which gives each server its "
                  "role itself (verl/workers/rollout/replica.py:411-414) and replaces this "
                  "kv_transfer_config (vllm_async_server.py:453-454)")
        break  # one problem per config: its children follow the same role
    return out.problems


def with_verl_fixes(artifact: Artifact, problems: list[Problem]) -> list[Problem]:
    """vLLM's checks of a kv_transfer_config from verl, with fixes in verl's terms: the Mooncake
    config path goes in the servers' environment, which verl's servers get from Ray."""
    paths = dict(find_key(artifact.data, "mooncake_config_path", artifact.where))
    out = []
    for problem in problems:
        path = next((p for p in paths if problem.where == p or problem.where.endswith(" " + p)), None)
        out.append(problem if path is None else replace(problem, fix=_config_path_fix(paths[path])))
    return out


def _config_path_fix(value: Any) -> str:
    """vLLM reads the Mooncake config only from MOONCAKE_CONFIG_PATH (FACTS section 8): give verl's
    servers the variable where Ray passes it to every worker (verl/trainer/main_ppo.py:62-73)."""
    path = str(value)
    return ("remove the key and give verl's servers the variable instead: "
            f"ray_kwargs.ray_init.runtime_env.env_vars.MOONCAKE_CONFIG_PATH: '{path}' in the trainer config "
            f"(kvctl config render --format verl writes it), or {runtime_env_override('MOONCAKE_CONFIG_PATH', path)} "
            "on the command line; the file must exist at that path on every node")


def _on(value: Any) -> bool:
    """Whether verl reads `value` as true (a value filled in later is not judged)."""
    if placeholder(value):
        return False
    if isinstance(value, str):
        return value.strip().lower() in _TRUE
    return bool(value)

