"""The vLLM capability table (kvctl/data/capabilities.yaml) and the questions asked of it.

Everything version-dependent in kvctl asks this module; nothing else compares vLLM versions.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from packaging.version import Version

from kvctl import yamlio
from kvctl.errors import KvctlError
from kvctl.facts.offload_key import OffloadKey
from kvctl.facts.versions import parse_version

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
class Registration:
    """How one release registers a connector name (from the generated facts)."""

    name: str
    generation: str  # "v0" | "v1"
    module: str
    source: str  # "file:line in <release>"


@dataclass(frozen=True)
class ConfigField:
    name: str
    span: Span
    source: str


class CapabilityTable:
    """Typed view of capabilities.yaml, its spans resolved against the generated vllm_facts.json."""

    def __init__(self, raw: dict[str, Any], facts: dict[str, Any]) -> None:
        self.facts = facts
        self._registered: dict[tuple[str | Version, str], Registration | None] = {}  # asked per config
        releases = facts["releases"]
        self.first_known, self.newest_known = Version(releases[0]), Version(releases[-1])
        self.min_supported = Version(raw["min_supported"])
        self.matrix_versions = [Version(v) for v in raw["matrix_versions"]]
        self.capabilities = {row["id"]: self._capability(row) for row in raw["capabilities"]}
        self.connectors = {row["name"]: self._connector(row) for row in raw["connectors"]}
        self.fields = {
            name: ConfigField(name, _merge(fact["spans"], f"fields.{name}"), _source(fact["spans"]))
            for name, fact in sorted(facts["fields"].items())
        }

    def _capability(self, row: dict[str, Any]) -> Capability:
        if "fact" not in row:
            return Capability(row["id"], row["title"], _span(row), row["source"])
        rows = _fact_rows(self.facts, row["fact"], row.get("match", {}))
        source = _source(rows) + (f"; {row['note']}" if row.get("note") else "")
        return Capability(row["id"], row["title"], _merge(rows, row["id"]), source)

    def _connector(self, row: dict[str, Any]) -> Connector:
        registered = self.facts["connectors"].get(row["name"], {}).get("v1", [])
        return Connector(name=row["name"], span=_merge(registered, row["name"]),
                         reset=Span(_str(row.get("reset_since"))), store=row["store"],
                         cpu=bool(row["cpu"]), source=row["source"])

    # -- generated facts (kvctl/data/vllm_facts.json, from vLLM's released sources) --------
    def registered(self, version: str | Version, name: str) -> Registration | None:
        """How `version` registers connector `name` (V1 wins over V0), or None."""
        key = (version, name)
        if key not in self._registered:
            self._registered[key] = self._registration(parse_version(version), name)
        return self._registered[key]

    def _registration(self, v: Version, name: str) -> Registration | None:
        entry = self.facts.get("connectors", {}).get(name, {})
        for generation in ("v1", "v0"):
            row = _interval_at(entry.get(generation, []), v)
            if row is not None:
                return Registration(name, generation, row.get("module", ""), _where(row))
        return None

    def connectors_in(self, version: str | Version) -> list[str]:
        """Every connector name `version` registers (V0 and V1), sorted."""
        return sorted(n for n in self.facts["connectors"] if self.registered(version, n))

    def connector_history(self, name: str) -> str | None:
        """'V0 0.8.5-0.10.2, V1 >= 0.21.0' for a name some release registered, else None."""
        entry = self.facts.get("connectors", {}).get(name)
        if not entry:
            return None
        parts = [f"{gen.upper()} {_describe_interval(row)}"
                 for gen in ("v0", "v1") for row in entry.get(gen, [])]
        return f"registered {', '.join(parts)}" if parts else None

    def next_registration(self, version: str | Version, name: str) -> Version | None:
        """The first release after `version` that registers `name`, if any."""
        v = parse_version(version)
        rows = [r for gen in ("v0", "v1") for r in self.facts["connectors"].get(name, {}).get(gen, [])]
        return min((Version(r["since"]) for r in rows if Version(r["since"]) > v), default=None)

    def renamed_to(self, version: str | Version, name: str) -> str | None:
        """The name `version` registers the same connector class under, when `name` is gone."""
        v = parse_version(version)
        if self.registered(v, name) is not None:
            return None
        rows = [r for gen in ("v0", "v1") for r in self.facts.get("connectors", {}).get(name, {}).get(gen, [])]
        classes = {(r.get("module"), r.get("class")) for r in rows} | {(None, r.get("class")) for r in rows}
        for other in self.connectors_in(v):
            now = self.registered(v, other)
            entry = self.facts["connectors"][other]
            row = _interval_at(entry.get(now.generation, []), v) if now else None
            if row and ((row.get("module"), row.get("class")) in classes
                        or (None, row.get("class")) in classes) and other != name:
                return other
        return None

    def class_kind(self, version: str | Version) -> str:
        """How `version` builds KVTransferConfig: stdlib-dataclass (unknown keys raise TypeError,
        no type coercion), pydantic-*-ignore (unknown keys dropped), forbid (unknown keys refused)."""
        row = _interval_at(self.facts["config"]["class_kind"]["values"], parse_version(version))
        return "unknown" if row is None else str(row["value"])

    def connector_reset_is_master_wide(self, version: str | Version, name: str) -> bool:
        """Does `name`'s reset_cache() in `version` clear the whole Mooncake master (remove_all),
        every deployment sharing it included? (from the calls its source makes)"""
        rows = self.facts["connectors"].get(name, {}).get("reset_cache", [])
        row = _interval_at(rows, parse_version(version))
        return row is not None and any("remove_all(" in call for call in row.get("calls", []))

    def connector_lookup(self, version: str | Version) -> str | None:
        """What vLLM's connector factory consults first when kv_connector_module_path is set:
        "registry" or "module_path" (None: no module path in that release)."""
        row = _interval_at(self.facts["config"]["connector_lookup"]["values"], parse_version(version))
        return None if row is None else str(row["value"])

    def first_module_path_release(self) -> str | None:
        rows = self.facts["config"]["connector_lookup"]["values"]
        return next((r["since"] for r in rows if r["value"] == "module_path"), None)

    def field_type(self, version: str | Version, name: str) -> str | None:
        """The annotation vLLM `version` declares for KVTransferConfig field `name`."""
        row = _interval_at(self.facts.get("fields", {}).get(name, {}).get("types", []),
                           parse_version(version))
        return None if row is None else row.get("type")

    def mooncake_json_keys(self, version: str | Version, connector: str) -> tuple[str, ...] | None:
        """The mooncake.json keys `connector` reads in `version`, when the facts say."""
        values = self.facts["connectors"].get(connector, {}).get("mooncake_json_keys", {})
        row = _interval_at(values.get("values", []), parse_version(version))
        return None if row is None or not row.get("value") else tuple(sorted(row["value"]))

    def extra_config_keys(self, version: str | Version, connector: str) -> tuple[str, ...] | None:
        """The kv_connector_extra_config keys `connector` reads in `version`, when the facts say."""
        values = self.facts["connectors"].get(connector, {}).get("extra_config_keys", {})
        row = _interval_at(values.get("values", []), parse_version(version))
        return None if row is None or not row.get("value") else tuple(sorted(row["value"]))

    def extra_config_key_span(self, connector: str, key: str) -> tuple[str | None, str | None]:
        """(first release, first release no longer) in which `connector` reads extra-config `key`."""
        rows = [row for row in self.facts["connectors"].get(connector, {}).get("extra_config_keys", {})
                .get("values", []) if key in (row.get("value") or {})]
        if not rows:
            return None, None
        return rows[0]["since"], rows[-1].get("until")

    # -- offloading: section "offload_specs" (OffloadingSpecFactory's) or "offload_connectors" --
    def offload_specs(self, version: str | Version) -> dict[str, str]:
        """Spec name -> where it is registered, for the specs `version`'s factory knows."""
        v = parse_version(version)
        rows = {n: _interval_at(e.get("spans", []), v) for n, e in self.facts.get("offload_specs", {}).items()}
        return {n: _where(r) for n, r in sorted(rows.items()) if r is not None}

    def offload_releases(self, section: str, name: str, key: str | None = None) -> list[tuple[str, str | None]]:
        """[(since, until)] of the releases that register `name` (key None) or in which it reads `key`."""
        entry = self.facts.get(section, {}).get(name, {})
        spans = entry.get("spans", []) if key is None else entry.get("params", {}).get(key, {}).get("spans", [])
        return [(r["since"], r.get("until")) for r in spans]

    def offload_keys(self, version: str | Version, section: str, name: str) -> dict[str, OffloadKey]:
        """The kv_connector_extra_config keys spec / connector `name` reads in `version`."""
        v, params = parse_version(version), self.facts.get(section, {}).get(name, {}).get("params", {})
        rows = {key: _interval_at(fact["spans"], v) for key, fact in params.items()}
        return {key: OffloadKey.from_fact(key, r, _where(r)) for key, r in rows.items() if r is not None}

    def offload_fact(self, version: str | Version, section: str, name: str, attr: str) -> dict[str, Any] | None:
        """A one-value fact of `name` in `version`: OffloadingConnector's spec_lookup, a spec's tiers."""
        rows = self.facts.get(section, {}).get(name, {}).get(attr, {}).get("values", [])
        return _interval_at(rows, parse_version(version))

    def is_older_than_known(self, version: str | Version) -> bool:
        """True for releases before the first one the facts were taken from."""
        return parse_version(version) < self.first_known

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


def _interval_at(rows: list[dict[str, Any]], v: Version, exact: bool = False) -> dict[str, Any] | None:
    """The row of a generated [since, until) interval list that holds at release `v` (vLLM: by
    its release numbers, so 0.32.0+cpu is 0.32.0; exact: post releases count, as Mooncake's do)."""
    release = v if exact else Version(".".join(map(str, v.release)))
    for row in rows:
        if release >= _version(row["since"]) and (row.get("until") is None or release < _version(row["until"])):
            return row
    return None


def _describe_interval(row: dict[str, Any]) -> str:
    return describe_interval(row["since"], row.get("until"))


def describe_interval(since: str, until: str | None) -> str:
    """'>= 0.22.0' or '0.13.0 to before 0.20.0', as messages name a span of releases."""
    return f">= {since}" if until is None else f"{since} to before {until}"


def _where(row: dict[str, Any]) -> str:
    return f"{row.get('file', '?')}:{row.get('line', '?')} in {row.get('since')}"


def _fact_rows(facts: dict[str, Any], path: list[str], match: dict[str, Any]) -> list[dict[str, Any]]:
    """The intervals of the fact at `path` in vllm_facts.json that satisfy `match`."""
    node: Any = facts
    for key in path:
        if not isinstance(node, dict) or key not in node:
            raise KvctlError(f"capabilities.yaml: no fact {'/'.join(path)} in vllm_facts.json "
                             "(regenerate it: make capabilities)")
        node = node[key]
    rows = node.get("spans", node.get("values")) if isinstance(node, dict) else node
    return [r for r in rows if _matches(r, match)]


def _matches(row: dict[str, Any], match: dict[str, Any]) -> bool:
    for key, wanted in match.items():
        value = row.get("value")
        if key == "value" and value != wanted:
            return False
        if key == "value_prefix" and not str(value).startswith(wanted):
            return False
        if key == "has_key" and not (isinstance(value, (dict, list)) and wanted in value):
            return False
        if key not in ("value", "value_prefix", "has_key") and row.get(key) != wanted:
            return False
    return True


def _merge(rows: list[dict[str, Any]], what: str) -> Span:
    """One [since, until) span from contiguous intervals (a module moving is not a gap)."""
    if not rows:
        return Span("never")
    ordered = sorted(rows, key=lambda r: _version(r["since"]))
    for left, right in zip(ordered, ordered[1:]):
        if left["until"] is None or _version(left["until"]) != _version(right["since"]):
            raise KvctlError(f"{what}: present, gone, then back ({left['until']} to {right['since']}): "
                             "kvctl's spans cannot say that")
    return Span(ordered[0]["since"], ordered[-1]["until"])


def _source(rows: list[dict[str, Any]]) -> str:
    """Where the first interval was read: 'vllm/config.py:3244 (0.8.5)'."""
    if not rows:
        return "not in any release's source"
    first = min(rows, key=lambda r: _version(r["since"]))
    return f"{first.get('file', '?')}:{first.get('line', '?')} ({first['since']})"


# -- Mooncake master (kvctl/data/mooncake_facts.json, from Mooncake's release tags) -------------
@lru_cache(maxsize=1)
def mooncake_facts() -> dict[str, Any]:
    import json

    return json.loads(_read("mooncake_facts.json"))


def mooncake_release(version: str | Version) -> Version:
    """The release whose facts describe `version`: itself, or the newest known for a newer one."""
    v = Version(str(version)) if not isinstance(version, Version) else version
    newest = Version(mooncake_facts()["releases"][-1])
    return min(v, newest)


def mooncake_has(version: str | Version, kind: str, name: str) -> bool:
    """Does mooncake_master `version` have flag / route `name` (kind "flags" or "routes")?"""
    rows = mooncake_facts()[kind].get(name, {}).get("spans", [])
    return _interval_at(rows, mooncake_release(version), exact=True) is not None


def mooncake_since(kind: str, name: str) -> str | None:
    rows = mooncake_facts()[kind].get(name, {}).get("spans", [])
    return min((r["since"] for r in rows), key=Version, default=None)


def _read(name: str) -> str:
    # kvctl/data, as the wheel installs it (importlib.resources costs ~10 ms to import)
    return (Path(__file__).resolve().parents[1] / "data" / name).read_text("utf-8")


@lru_cache(maxsize=1)
def load_facts() -> dict[str, Any]:
    """kvctl/data/vllm_facts.json: generated from vLLM's released sources (make capabilities)."""
    import json

    return json.loads(_read("vllm_facts.json"))


@lru_cache(maxsize=1)
def table() -> CapabilityTable:
    """The shipped capability table (parsed once per process)."""
    return CapabilityTable(yamlio.safe_load(_read("capabilities.yaml")), load_facts())


def default_target_version() -> tuple[Version, str]:
    """The vLLM version to fit output to when none is given, and where it came from."""
    from kvctl.facts.versions import installed_vllm

    found = installed_vllm()
    if found is not None:
        return found.version, f"installed {found.distribution}"
    return table().newest_known, "newest release kvctl knows (no vLLM installed here)"


def resolve_target(version: str | None) -> tuple[Version, str]:
    """`--vllm-version` if given, else the default target. Rejects unparsable strings."""
    if version is not None:  # '' is a bad version, not "the default" (as compat check says too)
        return parse_version(version), "--vllm-version"
    return default_target_version()

