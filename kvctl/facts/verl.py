"""What verl does with the config kvctl renders for it (verl 0.9.1, read from its wheel).

Data only: render writes verl's layout from it, validate judges verl configs against it. Every line
cited is of verl 0.9.1 (`pip install --no-deps verl==0.9.1`).
"""

from __future__ import annotations

import shlex

VERL_RELEASE = "0.9.1"
VLLM_PIN = "0.24.0"  # the `vllm` extra of verl 0.9.1 (its METADATA); examples target it

# The rollout section verl builds its RolloutConfig from (verl/workers/rollout/replica.py:104,
# verl/workers/engine_workers.py:651); unknown keys there make verl refuse the config.
ROLLOUT = "actor_rollout_ref.rollout"
# The one key of engine_kwargs the vLLM server reads (vllm_async_server.py:287 and :1130-1132):
# every key under it becomes a `vllm serve` flag (utils.py build_cli_args_from_config).
ENGINE_KWARGS = f"{ROLLOUT}.engine_kwargs"
VLLM_KWARGS = f"{ENGINE_KWARGS}.vllm"
FULL_DETERMINISM = f"{ROLLOUT}.full_determinism"  # trainer/config/rollout/rollout.yaml:27
# A hybrid rollout (the trainer's workers run the engines: replica.py:131-137) sleeps them every step
# when it frees the cache engine: both default true (trainer/config/ppo_trainer.yaml:60,
# trainer/config/rollout/rollout.yaml:61); only the v1 separate_async trainer runs with hybrid_engine false.
HYBRID_ENGINE = "actor_rollout_ref.hybrid_engine"
FREE_CACHE_ENGINE = f"{ROLLOUT}.free_cache_engine"
# Ray's runtime environment, merged over verl's defaults and passed to ray.init (main_ppo.py:62-73):
# the form in which every Ray worker, the vLLM servers included, gets environment variables.
# Ray takes only strings as their values.
RUNTIME_ENV_VARS = ("ray_kwargs", "ray_init", "runtime_env", "env_vars")

# Command-line options of verl's Hydra entry point that load another config than verl's own
# ppo_trainer (main_ppo.py:166): a key Hydra would refuse to override may exist in that config.
CONFIG_OPTIONS = ("--config-path", "--config-name", "--config-dir", "-cp", "-cn", "-cd")


def runtime_env_override(name: str, value: str) -> str:
    """The Hydra override that gives verl's Ray workers NAME=value, quoted for the shell. The value is
    a quoted Hydra string (Ray takes only strings); `++` adds the key or replaces it, so it works
    whether or not the config already has it."""
    quoted = value.replace("\\", "\\\\").replace('"', '\\"')
    return shlex.quote(f'++{".".join(RUNTIME_ENV_VARS)}.{name}="{quoted}"')
