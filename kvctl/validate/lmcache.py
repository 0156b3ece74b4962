"""Checks of an LMCache config (LMCACHE_CONFIG_FILE) whose remote backend is a Mooncake store.

LMCache reads its Mooncake settings from `extra_config` (or a mooncake.json through
MOONCAKE_CONFIG_PATH), with keys of its own: only the checks common to every Mooncake client apply.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

from packaging.version import Version

from kvctl.validate.model import Collector, Problem, join
from kvctl.validate.mooncake_file import validate_mooncake_config

MOONCAKE_SCHEME = "mooncakestore"


def validate_lmcache_config(cfg: Any, version: Version | str, where: str = "lmcache",
                            lines: Mapping[str, int] | None = None) -> list[Problem]:
    out = Collector(lines)
    if not isinstance(cfg, Mapping):
        out.error(where, f"an LMCache config must be a mapping, got {type(cfg).__name__}",
                  "e.g. chunk_size: 256, remote_url: mooncakestore://127.0.0.1:50051/")
        return out.problems
    url = cfg.get("remote_url")
    if isinstance(url, str) and url.startswith(f"{MOONCAKE_SCHEME}://"):
        _check_remote_url(url, join(where, "remote_url"), out)
    extra = cfg.get("extra_config")
    problems = out.problems
    if isinstance(extra, Mapping) and "master_server_address" in extra:
        problems += validate_mooncake_config(extra, version, join(where, "extra_config"), lines,
                                             reader="lmcache")
    return problems


def _check_remote_url(url: str, path: str, out: Collector) -> None:
    parsed = urlparse(url)
    try:
        port = parsed.port
    except ValueError:
        port = None
    if not parsed.hostname or port is None:
        out.error(path, f"remote_url {url!r} has no host:port: LMCache cannot reach the Mooncake "
                  "master", f"e.g. remote_url: {MOONCAKE_SCHEME}://127.0.0.1:50051/")
