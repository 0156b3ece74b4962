"""verl's own config path, run on verl configs in a process of its own (used by tests/unit/config/test_verl.py).

A verl trainer turns its Hydra config into vLLM arguments in four steps. This script runs verl's
installed code for each step it can import without torch, vLLM or Ray (the light install:
`pip install --no-deps verl` plus omegaconf and hydra-core), and says which step refused a config:

1. compose: Hydra composes the trainer config from verl's YAML files (verl/trainer/main_ppo.py:166,
   `@hydra.main(config_path="config", config_name="ppo_trainer")`; a user's
   `--config-path DIR --config-name NAME` is `initialize_config_dir(DIR)` + `compose(NAME)`).
2. rollout_config: verl/utils/config.py `omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)`, as
   verl/workers/engine_workers.py:651 and verl/workers/rollout/replica.py:104 call it: Hydra
   instantiates `verl.workers.config.RolloutConfig` (verl/workers/config/rollout.py) from the node.
3. engine_kwargs: vLLMHttpServer.launch_server reads `engine_kwargs.vllm` from the RolloutConfig
   (verl/workers/rollout/vllm_rollout/vllm_async_server.py:287-288). That method needs a running
   vLLM and Ray, so its few lines are reproduced below, and checked verbatim against the installed
   file (`source_check` in the answer) so a change in verl shows up here.
4. cli_args: `["serve", model] + build_cli_args_from_config(args)` (vllm_async_server.py:456):
   verl's real `build_cli_args_from_config` (verl/workers/rollout/vllm_rollout/utils.py), compiled
   from the installed file's own text (its module imports torch and vLLM at the top; the function
   itself uses only json, dataclasses and functools). The argv goes to vLLM's argument parser.

Importing verl's config modules without torch: verl's package `__init__` files import torch, Ray
and transformers for other modules (verl/__init__.py imports verl.protocol -> torch, ray), so the
packages `verl`, `verl.utils`, `verl.utils.profiler` and `verl.workers.config` are set up as bare
packages over the installed folders, and their real modules load from there. Stubs stand in only
for names that the modules on this path import but never call while building a RolloutConfig
(transformers.AutoConfig, verl.utils.hf_tokenizer / hf_processor, verl.utils.model.*: used by
HFModelConfig in verl/workers/config/model.py); any use of a stub raises. This runs in its own
process so that no test of kvctl ever sees a bare verl or a stub module.

Usage: python tests/lib/verl_judge.py < request.json   (answer JSON on stdout)
  request: {"cases": [{"id": str, "config_dir": str, "config_name": str, "overrides": [str]}]}
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import importlib.metadata
import importlib.util
import json
import multiprocessing
import os
import sys
import traceback
import types
from pathlib import Path
from typing import Any, get_args

# The lines of vllm_async_server.py that step 3 and 4 reproduce (checked verbatim).
REPRODUCED = (
    'engine_kwargs = self.config.get("engine_kwargs", {}).get(self._get_engine_kwargs_key(), {}) or {}',
    "engine_kwargs = {key: val for key, val in engine_kwargs.items() if val is not None}",
    "**engine_kwargs,",
    'server_args = ["serve", self.model_config.local_path] + build_cli_args_from_config(args)',
    'return "vllm"',  # _get_engine_kwargs_key
)
MODEL_PATH = "/models/policy"  # stands for model_config.local_path
HEAVY = ("torch", "vllm", "ray", "numpy")  # never imported here


class _Unused:
    """A name verl's modules import but never use on the config path; using it is a test error."""

    def __init__(self, what: str) -> None:
        self._what = what

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"verl used {self._what}.{name}, stubbed by tests/lib/verl_judge.py")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"verl called {self._what}, stubbed by tests/lib/verl_judge.py")


def _bare_package(name: str, folder: Path) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = [str(folder)]
    module.__file__ = str(folder / "__init__.py")
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)
    return module


def load_verl() -> dict[str, Any]:
    """Import verl's config modules (real files) without torch; return what was loaded from where."""
    spec = importlib.util.find_spec("verl")
    if spec is None or spec.origin is None:
        raise SystemExit(json.dumps({"missing": "verl is not installed"}))
    root = Path(spec.origin).parent
    _bare_package("verl", root)
    utils = _bare_package("verl.utils", root / "utils")
    profiler = _bare_package("verl.utils.profiler", root / "utils" / "profiler")
    importlib.import_module("verl.workers")  # its real __init__ is empty
    workers_config = _bare_package("verl.workers.config", root / "workers" / "config")

    # Imported by verl/workers/config/model.py for HFModelConfig, never used by RolloutConfig.
    transformers = types.ModuleType("transformers")
    transformers.AutoConfig = _Unused("transformers.AutoConfig")  # type: ignore[attr-defined]
    sys.modules["transformers"] = transformers
    utils.hf_processor = _Unused("verl.utils.hf_processor")  # type: ignore[attr-defined]
    utils.hf_tokenizer = _Unused("verl.utils.hf_tokenizer")  # type: ignore[attr-defined]
    model_utils = types.ModuleType("verl.utils.model")
    model_utils.get_generation_config = _Unused("verl.utils.model.get_generation_config")  # type: ignore[attr-defined]
    model_utils.update_model_config = _Unused("verl.utils.model.update_model_config")  # type: ignore[attr-defined]
    sys.modules["verl.utils.model"] = model_utils

    # What the skipped package __init__ files would export, from the real modules that define it.
    profiler_config = importlib.import_module("verl.utils.profiler.config")
    profiler.ProfilerConfig = profiler_config.ProfilerConfig  # type: ignore[attr-defined]
    # rollout.yaml's `_target_`s: verl.workers.config.{RolloutConfig, SamplingConfig, ...}, and
    # through its interpolations MtpConfig (model.py) and QATEngineConfig (engine.py).
    for name in ("rollout", "model", "disaggregation", "engine", "optimizer"):
        module = importlib.import_module(f"verl.workers.config.{name}")
        for exported in module.__all__:
            setattr(workers_config, exported, getattr(module, exported))
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in HEAVY)
    if heavy:
        raise AssertionError(f"the light path imported {heavy}")
    return {"root": str(root), "version": importlib.metadata.version("verl")}


def load_build_cli_args(root: Path) -> tuple[Any, str]:
    """verl's build_cli_args_from_config (and the helper it calls), compiled from its own file."""
    path = root / "workers" / "rollout" / "vllm_rollout" / "utils.py"
    source = path.read_text()
    tree = ast.parse(source)
    wanted = {"build_cli_args_from_config", "_optional_bool_vllm_args"}
    nodes = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    if {n.name for n in nodes} != wanted:
        raise AssertionError(f"{path} no longer defines {sorted(wanted)}")
    namespace: dict[str, Any] = {"json": json, "dataclasses": dataclasses, "functools": functools,
                                 "get_args": get_args, "Any": Any, "__name__": "verl_build_cli_args"}
    exec(compile(ast.Module(body=nodes, type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102
    where = ", ".join(f"{path.relative_to(root.parent)}:{n.lineno}" for n in nodes)
    return namespace["build_cli_args_from_config"], where


def source_check(root: Path) -> dict[str, int | None]:
    """Line number of each reproduced line in the installed vllm_async_server.py (None: gone)."""
    lines = (root / "workers" / "rollout" / "vllm_rollout" / "vllm_async_server.py").read_text().splitlines()
    found: dict[str, int | None] = {}
    for wanted in REPRODUCED:
        found[wanted] = next((i for i, line in enumerate(lines, 1) if line.strip() == wanted), None)
    return found


def engine_args(rollout_config: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """vllm_async_server.py:287-288 and the `args` dict of :325-350 (its keys that come from the
    RolloutConfig alone; model_config / worker keys left out), then `**engine_kwargs` last."""
    engine_kwargs = rollout_config.get("engine_kwargs", {}).get("vllm", {}) or {}
    engine_kwargs = {key: val for key, val in engine_kwargs.items() if val is not None}
    args = {
        "dtype": rollout_config.dtype,
        "load_format": rollout_config.load_format,
        "max_model_len": rollout_config.max_model_len,
        "max_num_seqs": rollout_config.max_num_seqs,
        "max_num_batched_tokens": rollout_config.max_num_batched_tokens,
        "gpu_memory_utilization": rollout_config.gpu_memory_utilization,
        "tensor_parallel_size": rollout_config.tensor_model_parallel_size,
        "scheduling_policy": rollout_config.scheduling_policy,
        **engine_kwargs,
    }
    return engine_kwargs, args


def judge(case: dict[str, Any], build_cli_args: Any) -> dict[str, Any]:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass

    out: dict[str, Any] = {"id": case["id"], "ok": False}
    stage = "compose"
    try:
        with initialize_config_dir(config_dir=case["config_dir"], version_base=None):
            cfg = compose(config_name=case["config_name"], overrides=case.get("overrides", []))
        out["composed"] = OmegaConf.to_container(cfg.actor_rollout_ref.rollout.engine_kwargs, resolve=True)
        out["ray_env_vars"] = OmegaConf.to_container(
            cfg.ray_kwargs.ray_init.runtime_env, resolve=True).get("env_vars")
        stage = "rollout_config"
        rollout_config = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
        out["rollout_config"] = f"{type(rollout_config).__module__}.{type(rollout_config).__qualname__}"
        stage = "engine_kwargs"
        engine_kwargs, args = engine_args(rollout_config)
        stage = "cli_args"
        argv = ["serve", MODEL_PATH] + build_cli_args(args)
        out["argv"] = argv
        flags = [i for i, a in enumerate(argv) if a in ("--kv_transfer_config", "--kv-transfer-config")]
        out["kv_transfer_config"] = [json.loads(argv[i + 1]) for i in flags]
        out["ok"] = True
    except Exception as exc:  # noqa: BLE001 - the answer says which step refused and why
        out["stage"] = stage
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc(limit=-4)
    # what this process (a forked copy, with several cases) has loaded by now
    out["verl_modules"] = sorted(m for m in sys.modules if m.startswith("verl"))
    out["heavy_modules"] = sorted(m for m in sys.modules if m.split(".")[0] in HEAVY)
    return out


_BUILD_CLI_ARGS: Any = None


def _judge_one(case: dict[str, Any]) -> dict[str, Any]:
    return judge(case, _BUILD_CLI_ARGS)


def judge_all(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each case in a forked copy of this process (Hydra's compose takes ~0.35 s, mostly reading
    verl's ~30 YAML files), as many at once as there are CPUs."""
    workers = min(len(cases), os.cpu_count() or 1)
    if workers < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return [_judge_one(case) for case in cases]
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        return pool.map(_judge_one, cases, chunksize=1)


def main() -> int:
    global _BUILD_CLI_ARGS
    request = json.load(sys.stdin)
    loaded = load_verl()
    root = Path(loaded["root"])
    _BUILD_CLI_ARGS, where = load_build_cli_args(root)
    answer = {
        "verl_version": loaded["version"],
        "verl_root": loaded["root"],
        "config_dir": str(root / "trainer" / "config"),
        "build_cli_args_from": where,
        "source_check": source_check(root),
        "cases": judge_all(request["cases"]),
    }
    for key in ("verl_modules", "heavy_modules"):
        answer[key] = sorted({m for case in answer["cases"] for m in case[key]})
    json.dump(answer, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
