"""Checks that only a rendered bundle allows: its files agree with each other, and the env it
carries points at its own mooncake.json."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvctl.facts.bundle_layout import BUNDLE_FILES
from kvctl.validate.env import STORE_CONNECTOR
from kvctl.validate.model import ERROR, WARNING, Collector, Problem, SourceLines

EnvLines = tuple[Mapping[str, str], SourceLines]  # an env and the line of each variable


def check_bundle(folder: Path, config: dict[str, Any], env: EnvLines | None,
                 names: tuple[str, ...], copies: Mapping[str, Any]) -> list[Problem]:
    problems = []
    env_file = folder / BUNDLE_FILES["env"]
    if env is None:
        severity = ERROR if STORE_CONNECTOR in names else WARNING
        problems.append(Problem(str(env_file), "the bundle has no kvctl.env, so the servers' "
                                "environment (PYTHONHASHSEED, VLLM_SERVER_DEV_MODE, "
                                "MOONCAKE_CONFIG_PATH) is unchecked",
                                f"re-render with kvctl config render NAME --out {folder}", severity))
    else:
        problems += _config_path(env[0], env[1], folder)
    for name, copy in copies.items():
        if copy == config:
            continue
        state = "cannot be read" if copy is None else \
            f"differs from the one in {BUNDLE_FILES['json']}"
        problems.append(Problem(str(folder / name), f"the kv_transfer_config in {name} {state}",
                                f"re-render the bundle (kvctl config render NAME --out {folder}) "
                                "instead of editing one file", WARNING))
    return problems


def _config_path(env: Mapping[str, str], lines: SourceLines, folder: Path) -> list[Problem]:
    """MOONCAKE_CONFIG_PATH must name a file that exists, ideally this bundle's mooncake.json."""
    value = env.get("MOONCAKE_CONFIG_PATH")
    if not value:
        return []
    out, path = Collector(lines), "env.MOONCAKE_CONFIG_PATH"
    target, ours = Path(value).expanduser(), folder / BUNDLE_FILES["mooncake"]
    fix = f"export MOONCAKE_CONFIG_PATH={ours.resolve()}"
    if not target.is_absolute():
        out.warn(path, f"MOONCAKE_CONFIG_PATH {value!r} is relative: each server resolves it from "
                 "its own working directory", fix)
        target = folder / target
    if not target.is_file():
        out.warn(path, f"MOONCAKE_CONFIG_PATH points at {target}, which does not exist here "
                 "(moved bundle?)", f"{fix}, or copy mooncake.json there")
    elif ours.is_file() and not target.samefile(ours):
        out.warn(path, f"MOONCAKE_CONFIG_PATH points at {target}, not this bundle's "
                 f"mooncake.json: vLLM reads that file, not the one checked here", fix)
    return out.problems
