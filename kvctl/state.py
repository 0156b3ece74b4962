"""Where kvctl keeps its state on this machine: run folders (kvctl serve) and reset locks.

--state-dir, else $KVCTL_STATE_DIR, else the user's state dir (platformdirs). A leaf module, so that
serve/ and reset/ share it without importing each other.
"""

from __future__ import annotations

import os
from pathlib import Path

STATE_DIR_ENV = "KVCTL_STATE_DIR"


def state_dir(override: str | Path | None = None) -> Path:
    # absolute: run records hold paths, and replicas run in folders of their own
    if override:
        return Path(override).expanduser().resolve()
    if os.environ.get(STATE_DIR_ENV):
        return Path(os.environ[STATE_DIR_ENV]).expanduser().resolve()
    from platformdirs import user_state_dir

    return Path(user_state_dir("kvctl"))
