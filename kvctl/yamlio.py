"""YAML loading through libyaml when PyYAML has it (its wheels ship it): ~5x faster than the
pure-Python loader, which matters for 1000-replica inventories and every command's start-up.

Every document is checked first, in one streaming pass over its events, against what a config
never needs and an attacker can use: aliases that repeat more than MAX_ALIASED_NODES nodes (a few
hundred bytes of `*a` references can stand for millions), nesting deeper than MAX_DEPTH (Python's
recursion limit), files over MAX_BYTES.
"""

from __future__ import annotations

from typing import Any

import yaml

_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MAX_BYTES = 16 * 1024 * 1024
MAX_DEPTH = 100
MAX_ALIASED_NODES = 10_000  # what aliases may repeat in one document (a shared env block: tens)


class YamlLimitError(yaml.YAMLError):
    """A document kvctl refuses to expand (callers report it like any YAML error)."""


def check(text: str, unique_keys: bool = False) -> None:
    """Refuse alias bombs, deep nesting and huge input before anything is built from `text`.

    Aliases are real YAML (Kubernetes and CI files share env blocks with `&common` / `*common`):
    they are allowed as long as what they repeat stays small, counted as the nodes each alias
    stands for (an anchor's size includes the aliases inside it, so nesting multiplies).

    unique_keys: refuse a mapping that repeats a key (PyYAML keeps the last one silently, so a second
    `replicas:` in an inventory would drop the first list without a word)."""
    if len(text) > MAX_BYTES:
        raise YamlLimitError(f"{len(text)} bytes is more than kvctl reads ({MAX_BYTES // (1024 * 1024)} MB)")
    sizes: dict[str, int] = {}  # anchor -> nodes it stands for
    open_: list[tuple[str | None, int]] = []  # (anchor, nodes so far) of each open collection
    repeated = 0
    keys: list[tuple[set[str], list[bool]] | None] = []  # per open collection: a mapping's keys, "next is a key"
    for event in yaml.parse(text, Loader=_LOADER):
        if unique_keys and keys and keys[-1] is not None and not isinstance(
                event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            seen, at_key = keys[-1]
            if at_key[0] and isinstance(event, yaml.ScalarEvent) and event.value != "<<":
                if event.value in seen:
                    raise YamlLimitError(f"the key '{event.value}' at line {event.start_mark.line + 1} is repeated "
                                         "in its mapping (YAML would keep only the last one); write it once")
                seen.add(event.value)
            at_key[0] = not at_key[0]
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            open_.append((event.anchor, 1))
            keys.append((set(), [True]) if isinstance(event, yaml.MappingStartEvent) else None)
            if len(open_) > MAX_DEPTH:
                raise YamlLimitError(f"nesting deeper than {MAX_DEPTH} levels at line {event.start_mark.line + 1}")
            continue
        if isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            anchor, count = open_.pop()
            keys.pop()
        elif isinstance(event, yaml.ScalarEvent):
            anchor, count = event.anchor, 1
        elif isinstance(event, yaml.AliasEvent):
            anchor, count = None, sizes.get(event.anchor, 1)
            repeated += count
            if repeated > MAX_ALIASED_NODES:
                raise YamlLimitError(
                    f"the alias *{event.anchor} at line {event.start_mark.line + 1} makes the document "
                    f"repeat more than {MAX_ALIASED_NODES} nodes (an alias bomb?); write the values out")
        else:
            continue
        if anchor:
            sizes[anchor] = count
        if open_:
            parent_anchor, parent_count = open_[-1]
            open_[-1] = (parent_anchor, parent_count + count)


def safe_load(text: str, unique_keys: bool = False) -> Any:
    """yaml.safe_load, with libyaml when available (same safe constructors, no code runs), after check()."""
    check(text, unique_keys)
    try:
        return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a SafeLoader
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise YamlLimitError(str(exc)) from None


def compose(text: str) -> yaml.Node | None:
    """The node tree of one document (for the line of each key), through libyaml when present;
    callers have checked `text` (or parsed it as JSON, which has no aliases)."""
    return yaml.compose(text, Loader=_LOADER)


def safe_load_all(text: str) -> tuple[list[Any], list[yaml.Node]]:
    """Every document of a multi-document stream (Kubernetes manifests), with its composed node
    (for the line of each key), after check(). Empty documents are left out."""
    check(text)
    try:
        nodes = [n for n in yaml.compose_all(text, Loader=_LOADER) if n is not None]
        return [_construct(n) for n in nodes], nodes
    except ValueError as exc:
        raise YamlLimitError(str(exc)) from None


def _construct(node: yaml.Node) -> Any:
    loader = _LOADER("")  # a safe loader's constructor: plain data only
    try:
        return loader.construct_document(node)
    finally:
        loader.dispose()


__all__ = ["MAX_ALIASED_NODES", "MAX_BYTES", "MAX_DEPTH", "YamlLimitError", "check", "compose", "safe_load", "safe_load_all"]
