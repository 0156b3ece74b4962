"""Per-release snapshots <-> half-open release intervals (the layout of kvctl/data/vllm_facts.json).

A snapshot and the generated file share one nesting:
  section ("fields", "config", ...) -> name -> attribute -> leaf
where a leaf is one fact (a dict) in a snapshot and a list of intervals in the file. Under an
attribute named "params" the nesting repeats (name -> attribute -> leaf).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterator
from pathlib import Path

from packaging.version import Version

SECTIONS = ("fields", "config", "connectors", "routes", "engine", "offload_specs", "offload_connectors",
            "offload_args", "env_vars", "env_validation", "serve_flags")
NESTED = "params"
LOCATION = ("file", "line")
LEAF_ATTRS = {"spans", "types", "values", "v0", "v1", "reset_cache"}
WRAPPERS = {"spans", "values"}

Path_ = tuple[str, ...]


def leaves(snapshot: dict) -> Iterator[tuple[Path_, dict]]:
    for section in SECTIONS:
        yield from _names(snapshot.get(section, {}), (section,))


def _names(names: dict, prefix: Path_) -> Iterator[tuple[Path_, dict]]:
    for name, attrs in names.items():
        for attr, value in attrs.items():
            if attr == NESTED:
                yield from _names(value, prefix + (name, attr))
            elif attr not in LEAF_ATTRS and isinstance(value, dict) and value and set(value) <= WRAPPERS:
                # e.g. "answer": {"values": leaf}: a named attribute holding one wrapped leaf.
                for wrapper, leaf in value.items():
                    yield prefix + (name, attr, wrapper), leaf
            else:
                yield prefix + (name, attr), value


def _set(tree: dict, path: Path_, value) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _identity(fact: dict) -> str:
    """What must stay equal for two releases to share an interval (locations may move)."""
    return json.dumps({k: v for k, v in fact.items() if k not in LOCATION}, sort_keys=True)


def intervals(releases: list[str], facts: list[dict | None]) -> list[dict]:
    """Merge one leaf's per-release facts (None = absent) into [since, until) intervals."""
    out: list[dict] = []
    current: dict | None = None
    for version, fact in zip(releases, facts):
        if current is not None and (fact is None or _identity(fact) != current["_id"]):
            current["until"] = version
            current = None
        if fact is not None and current is None:
            current = {"since": version, "until": None, "_id": _identity(fact), **fact}
            out.append(current)
    for item in out:
        del item["_id"]
    return out


def build(releases: list[str], snapshots: dict[str, dict], header: dict) -> dict:
    """The whole facts document from one snapshot per release (in `releases` order)."""
    paths: dict[Path_, dict[str, dict]] = {}
    for version in releases:
        for path, fact in leaves(snapshots[version]):
            paths.setdefault(path, {})[version] = fact
    doc: dict = {**header, "releases": releases}
    for section in SECTIONS:
        doc[section] = {}
    for path in sorted(paths):
        _set(doc, path, intervals(releases, [paths[path].get(v) for v in releases]))
    return doc


def _position(releases: list[str], version: str) -> Version | int:
    return releases.index(version) if version in releases else Version(version)


def _contains(releases: list[str], item: dict, version: str) -> bool:
    """since <= version < until, in release-list order (versions outside the list by PEP 440)."""
    if version in releases:
        here = releases.index(version)
        since = releases.index(item["since"])
        until = releases.index(item["until"]) if item["until"] else len(releases)
        return since <= here < until
    v = Version(version)
    return Version(item["since"]) <= v and (item["until"] is None or v < Version(item["until"]))


def facts_at(facts: dict, version: str) -> dict:
    """The snapshot of one release, read back out of a facts document."""
    releases = facts["releases"]
    out: dict = {section: {} for section in SECTIONS}
    for path, spans in leaves(facts):
        for item in spans:
            if _contains(releases, item, version):
                _set(out, path, {k: v for k, v in item.items() if k not in ("since", "until")})
                break
    return out


def strip_locations(snapshot: dict) -> dict:
    """A snapshot without file/line (for comparing trees whose line numbers may differ)."""
    out: dict = {section: {} for section in SECTIONS}
    for path, fact in leaves(snapshot):
        _set(out, path, {k: v for k, v in fact.items() if k not in LOCATION})
    return out


def dumps(doc: dict) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def check_committed(output: Path, text: str, label: str, regenerate: str) -> int:
    """0 when the committed file equals `text` (freshly generated), else 1 and the first lines
    of the difference, saying how to regenerate it."""
    committed = output.read_text() if output.exists() else ""
    if committed == text:
        print(f"{label} is up to date")
        return 0
    diff = list(difflib.unified_diff(committed.splitlines(), text.splitlines(), "committed", "generated",
                                     lineterm="", n=1))
    print(f"{label} differs from the sources ({len(diff)} diff lines); run `{regenerate}`:")
    print("\n".join(diff[:80]))
    return 1
