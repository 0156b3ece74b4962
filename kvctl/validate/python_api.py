"""Checks of vLLM Python API use found in scripts (KVTransferConfig.from_cli, ...) against one
vLLM release. Being built (issue 27): until then it checks nothing."""

from __future__ import annotations

from packaging.version import Version

from kvctl.validate.model import Artifact, Problem


def check_python_api(artifact: Artifact, v: Version) -> list[Problem]:
    """Problems vLLM `v` has with how the script built this artifact."""
    return []
