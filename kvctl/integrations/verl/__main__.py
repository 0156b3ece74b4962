"""`python3 -m kvctl.integrations.verl [VERL_MODULE] ARGS...`: run verl's entry point with kvctl's hook.

The one line that enables kvctl in a verl run: put `-m kvctl.integrations.verl` in front of verl's
own module (default verl.trainer.main_ppo; also verl.experimental.one_step_off_policy.main_ppo and
verl.experimental.fully_async_policy.fully_async_main), everything after it unchanged. Settings come
from this shell's environment (KVCTL_MASTER, KVCTL_VERL_POLICY, ... kvctl.integrations.verl.hook.ENV)
and travel to verl's TaskRunner with its class.
"""

from __future__ import annotations

import sys

from kvctl.integrations.verl.entry import main

if __name__ == "__main__":
    sys.exit(main())
