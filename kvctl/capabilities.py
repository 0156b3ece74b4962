"""The vLLM capability table (kvctl/data/capabilities.yaml) and the questions asked of it.

Everything version-dependent in kvctl asks this module; nothing else compares vLLM versions.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Literal

from packaging.version import Version

from kvctl import yamlio
from kvctl.errors import KvctlError
from kvctl.versions import parse_version

Availability = Literal["yes", "no", "unknown"]
Position = Literal["never", "before", "inside", "after"]
# How a named field or connector stands in one release (validate words its message from it).
Presence = Literal["present", "not_yet", "removed", "never", "unknown"]
_PRESENCE: dict[str, Presence] = {
    "inside": "present", "before": "not_yet", "after": "removed", "never": "never",
}


@dataclass(frozen=True)
class Span:
    """A half-open range of releases [since, until). since=None: every supported release;
    since='never': no release."""

    since: str | None
    until: str | None = None

    @property
    def never(self) -> bool:
        return self.since == "never"

    def contains(self, version: Version) -> bool:
        return self.position(version) == "inside"

    def position(self, version: Version) -> Position:
        """Where `version` falls: before `since`, inside, at/after `until`, or never present."""
        if self.never:
            return "never"
        if self.since is not None and version < _version(self.since):
            return "before"
        if self.until is not None and version >= _version(self.until):
            return "after"
        return "inside"

    def describe(self) -> str:
        if self.never:
            return "never"
        start = f">= {self.since}" if self.since else "all supported"
        return f"{start}, < {self.until}" if self.until else start


@dataclass(frozen=True)
class Capability:
    id: str
    title: str
    span: Span
    source: str


@dataclass(frozen=True)
class Connector:
    name: str
    span: Span  # registered in vLLM
    reset: Span  # reset_cache() really clears its external KV
    store: str  # mooncake-master | none | children | other
    cpu: bool
    source: str


@dataclass(frozen=True)
class ConfigField:
    name: str
    span: Span
    source: str


class CapabilityTable:
    """Typed view of capabilities.yaml."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self.min_supported = Version(raw["min_supported"])
        self.newest_known = Version(raw["newest_known"])
        self.matrix_versions = [Version(v) for v in raw["matrix_versions"]]
        self.capabilities = {
            row["id"]: Capability(row["id"], row["title"], _span(row), row["source"])
            for row in raw["capabilities"]
        }
        self.connectors = {
            row["name"]: Connector(
                name=row["name"],
                span=_span(row),
                reset=Span(_str(row.get("reset_since"))),
                store=row["store"],
                cpu=bool(row["cpu"]),
                source=row["source"],
            )
            for row in raw["connectors"]
        }
        self.fields = {
            row["name"]: ConfigField(row["name"], _span(row), row["source"])
            for row in raw["kv_transfer_config_fields"]
        }

    # -- questions ------------------------------------------------------------------------
    def has(self, version: str | Version, capability: str) -> bool:
        """Does vLLM `version` have `capability` (an id of capabilities.yaml)?"""
        return self.capability(capability).span.contains(parse_version(version))

    def capability(self, capability: str) -> Capability:
        try:
            return self.capabilities[capability]
        except KeyError:
            raise KvctlError(f"unknown capability id '{capability}'") from None

    def connector(self, name: str) -> Connector | None:
        return self.connectors.get(name)

    def connectors_in(self, version: str | Version) -> list[str]:
        """Connector names registered in `version` (among those kvctl tracks)."""
        v = parse_version(version)
        return [c.name for c in self.connectors.values() if c.span.contains(v)]

    def connector_available(self, version: str | Version, name: str) -> Availability:
        known = self.connectors.get(name)
        if known is None:
            return "unknown"
        return "yes" if known.span.contains(parse_version(version)) else "no"

    def connector_resets_store(self, version: str | Version, name: str) -> Availability:
        known = self.connectors.get(name)
        if known is None:
            return "unknown"
        return "yes" if known.reset.contains(parse_version(version)) else "no"

    def fields_in(self, version: str | Version) -> list[str]:
        """KVTransferConfig fields that `version` accepts."""
        v = parse_version(version)
        return [f.name for f in self.fields.values() if f.span.contains(v)]

    def field(self, name: str) -> ConfigField | None:
        return self.fields.get(name)

    def field_presence(self, version: str | Version, name: str) -> Presence:
        """Is KVTransferConfig field `name` in `version`: present, not yet, removed, unknown?"""
        known = self.fields.get(name)
        return "unknown" if known is None else _PRESENCE[known.span.position(parse_version(version))]

    def connector_presence(self, version: str | Version, name: str) -> Presence:
        """Is connector `name` registered in `version`: present, not yet, removed, unknown?"""
        known = self.connectors.get(name)
        return "unknown" if known is None else _PRESENCE[known.span.position(parse_version(version))]

    def is_supported(self, version: str | Version) -> bool:
        return parse_version(version) >= self.min_supported

    def is_newer_than_known(self, version: str | Version) -> bool:
        """True for releases after the newest one the facts were checked against."""
        v = parse_version(version)
        return Version(".".join(map(str, v.release))) > self.newest_known


@lru_cache(maxsize=None)
def _version(text: str) -> Version:
    """Bounds of the table, parsed once (planning a 1024-replica fleet asks thousands of times)."""
    return Version(text)


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def _span(row: dict[str, Any]) -> Span:
    return Span(_str(row.get("since")), _str(row.get("until")))


@lru_cache(maxsize=1)
def table() -> CapabilityTable:
    """The shipped capability table (parsed once per process)."""
    text = resources.files("kvctl").joinpath("data/capabilities.yaml").read_text("utf-8")
    return CapabilityTable(yamlio.safe_load(text))


def default_target_version() -> tuple[Version, str]:
    """The vLLM version to fit output to when none is given, and where it came from."""
    from kvctl.versions import installed_vllm

    found = installed_vllm()
    if found is not None:
        return found.version, f"installed {found.distribution}"
    return table().newest_known, "newest release kvctl knows (no vLLM installed here)"


def resolve_target(version: str | None) -> tuple[Version, str]:
    """`--vllm-version` if given, else the default target. Rejects unparsable strings."""
    if version is not None:  # '' is a bad version, not "the default" (as compat check says too)
        return parse_version(version), "--vllm-version"
    return default_target_version()

