"""Shell completion of template and run names (`kvctl --install-completion`).

Completion runs kvctl once per <TAB>: these read folder listings only (no YAML parsed, no run
record opened) and never raise, so a broken template path or state dir completes nothing
instead of printing a traceback into the user's prompt.
"""

from __future__ import annotations


def template_names(incomplete: str) -> list[str]:
    try:
        from kvctl.config.templates import discover

        return [name for name in discover() if name.startswith(incomplete)]
    except Exception:  # noqa: BLE001 - completion must never fail loudly
        return []


def run_names(incomplete: str) -> list[str]:
    try:
        from kvctl.serve.runs import RUN_FILE, runs_dir

        base = runs_dir()
        names = sorted(p.parent.name for p in base.glob(f"*/{RUN_FILE}")) if base.is_dir() else []
        return [name for name in names if name.startswith(incomplete)]
    except Exception:  # noqa: BLE001
        return []
