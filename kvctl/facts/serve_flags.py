"""The options `vllm serve` accepts per release (section "serve_flags" of vllm_facts.json, read by
tools/capabilities/cli_facts.py from each release's parser: EngineArgs / FrontendArgs add_cli_args,
make_arg_parser, the serve subcommand; argparse's --no-x of BooleanOptionalAction included)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from packaging.version import Version

from kvctl.facts.capabilities import _interval_at, _where, load_facts
from kvctl.facts.versions import parse_version, release


@dataclass(frozen=True)
class ServeOption:
    name: str  # the option string argparse knows: "--max-model-len", "-tp", "--no-enforce-eager"
    option: str  # the long name of its add_argument call (what a message suggests)
    deprecated: bool  # vLLM warns and still takes it
    source: str  # "file:line in <release>"


def _section() -> dict[str, Any]:
    return load_facts().get("serve_flags", {})


def known(version: str | Version) -> bool:
    """Do the facts cover `version`? (None of its options are known before the first release read.)"""
    v = parse_version(version)
    releases = load_facts().get("releases", [])
    return bool(_section()) and bool(releases) and Version(release(v)) >= Version(releases[0])


@lru_cache(maxsize=64)
def _options(release: Version) -> dict[str, ServeOption]:
    out: dict[str, ServeOption] = {}
    for name, entry in _section().items():
        row = _interval_at(entry.get("values", []), release)
        if row is not None:
            out[name] = ServeOption(name, row["option"], bool(row.get("deprecated")), _where(row))
    return out


def serve_options(version: str | Version) -> dict[str, ServeOption]:
    """Every option string `vllm serve` accepts in `version` (empty where the facts do not cover it)."""
    v = parse_version(version)
    return _options(Version(release(v))) if known(v) else {}


def removed_in(name: str, version: str | Version) -> str | None:
    """The release that dropped `name` when an earlier release than `version` had it."""
    v = Version(release(parse_version(version)))
    rows = _section().get(name, {}).get("values", [])
    starts = {r["since"] for r in rows}  # an interval ending where the next begins is a change, not a removal
    ends = [Version(r["until"]) for r in rows
            if r.get("until") and r["until"] not in starts and Version(r["until"]) <= v]
    return str(max(ends)) if ends else None


def first_in(name: str, version: str | Version) -> str | None:
    """The first release after `version` that accepts `name`."""
    v = Version(release(parse_version(version)))
    starts = [Version(r["since"]) for r in _section().get(name, {}).get("values", []) if Version(r["since"]) > v]
    return str(min(starts)) if starts else None


def last_source(name: str) -> str | None:
    """Where the last releases that had `name` define it: "file:line in <first of them>" (lines are
    those of the first release of the interval)."""
    rows = _section().get(name, {}).get("values", [])
    return _where(rows[-1]) if rows else None
