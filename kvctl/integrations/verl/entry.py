"""The driver side of `python3 -m kvctl.integrations.verl`: verl's own entry point, whose
`run_ppo(config, task_runner_class)` (verl/trainer/main_ppo.py:34) gets kvctl's TaskRunner.

verl's entry points call run_ppo by name at call time: main_ppo.main (main_ppo.py:184, :192) and the
experimental ones, which import it inside their main (one_step_off_policy/main_ppo.py:113,
fully_async_policy/fully_async_main.py:224). So replacing `verl.trainer.main_ppo.run_ppo` in this
driver process is enough, and nothing of kvctl is loaded in any other verl process but the
TaskRunner (and fully_async's trainer actor).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from kvctl.integrations.verl.hook import KvctlVerlHook

DEFAULT_ENTRY = "verl.trainer.main_ppo"
USAGE = ("usage: python3 -m kvctl.integrations.verl [VERL_MODULE] [verl's arguments...]\n"
         "  VERL_MODULE: verl.trainer.main_ppo (default), verl.experimental.one_step_off_policy.main_ppo,\n"
         "  verl.experimental.fully_async_policy.fully_async_main; settings: KVCTL_MASTER, KVCTL_VERL_POLICY\n"
         "  (warn|raise), KVCTL_VERL_MODE (reset|verify), KVCTL_VERL_ATTEMPTS, KVCTL_VERL_BUDGET_S,\n"
         "  KVCTL_VERL_RUN (the record's name; default verl-<trainer.experiment_name>), KVCTL_STATE_DIR")


def split(argv: list[str]) -> tuple[str, list[str]]:
    """(verl's module, its arguments): a first word that is neither an option nor a Hydra override
    (key=value) names the module."""
    if argv and not argv[0].startswith("-") and "=" not in argv[0]:
        return argv[0], argv[1:]
    return DEFAULT_ENTRY, argv


def hooked_run_ppo(run_ppo: Any, hook: KvctlVerlHook) -> Any:
    """verl's run_ppo, handing verl a TaskRunner with kvctl's hook."""
    from kvctl.integrations.verl.trainers import task_runner

    def run(config: Any, task_runner_class: Any) -> Any:
        return run_ppo(config, task_runner_class=task_runner(task_runner_class, hook))

    run.__wrapped__ = run_ppo  # type: ignore[attr-defined]
    return run


def main(argv: list[str] | None = None, hook: KvctlVerlHook | None = None) -> int:
    """Run verl's entry point with kvctl's hook; for a driver script of one's own:
    `kvctl.integrations.verl.main(["verl.trainer.main_ppo", *overrides], hook=KvctlVerlHook(...))`."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    module_name, rest = split(args)
    hook = hook or KvctlVerlHook.from_env()  # here, in the driver: the class carries it to the TaskRunner
    main_ppo = importlib.import_module(DEFAULT_ENTRY)
    main_ppo.run_ppo = hooked_run_ppo(getattr(main_ppo.run_ppo, "__wrapped__", main_ppo.run_ppo), hook)
    entry = importlib.import_module(module_name)
    sys.argv = [module_name, *rest]  # Hydra reads the overrides from sys.argv
    entry.main()
    return 0
