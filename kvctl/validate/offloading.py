"""Checks of KV offloading configs (OffloadingConnector specs, SimpleCPUOffloadConnector) against
one vLLM release. Being built (issue 27): until then it checks nothing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packaging.version import Version

from kvctl.validate.model import Collector


def check_offloading(cfg: Mapping[str, Any], v: Version, where: str, out: Collector) -> None:
    """Problems vLLM `v` has with the offloading settings of this (child) config."""
