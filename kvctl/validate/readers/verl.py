"""verl's rollout section, in a YAML trainer config or in the Hydra overrides of a command line, read
into one Artifact of kind "verl" (kvctl.validate.verl judges it).

Only what verl's own rules are about is read: the keys of `actor_rollout_ref.rollout`. The
kv_transfer_config under it is read as a config of its own by the structured and shell readers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from kvctl.facts.verl import CONFIG_OPTIONS, HYBRID_ENGINE, ROLLOUT
from kvctl.validate.model import Artifact, HydraOverride, SourceLines, VerlConfig, value_at
from kvctl.validate.readers.flag_value import scalar

# Hydra's override grammar, the part verl configs use: [+|++|~]a.b.c=value
_OVERRIDE = re.compile(r"^(?P<prefix>\+\+|\+|~)?(?P<key>[A-Za-z_][\w-]*(?:\.[\w-]+)+)=(?P<value>.*)$", re.S)


def verl_in_document(data: Any, lines: SourceLines) -> Artifact | None:
    """The verl config a YAML / JSON document is, when it has verl's rollout section."""
    if not isinstance(value_at(data, ROLLOUT), dict):
        return None
    return Artifact("verl", VerlConfig(data), ROLLOUT, lines, origin="verl rollout section")


def verl_in_words(words: Iterable[tuple[str, int]], file: str) -> Artifact | None:
    """The verl config a command line's Hydra overrides of the rollout section build, or None."""
    words = list(words)
    overrides = tuple(_overrides(words))
    if not overrides:
        return None
    tree: dict[str, Any] = {}
    lines = SourceLines(file)
    for override in overrides:
        _put(tree, override.key.split("."), override.value)
        parts = override.key.split(".")
        for depth in range(1, len(parts) + 1):  # its parents too: a problem about one is located
            lines.setdefault(".".join(parts[:depth]), override.line)
    own = any(w.split("=", 1)[0] in CONFIG_OPTIONS for w, _ in words)
    first = min(o.line for o in overrides)
    return Artifact("verl", VerlConfig(tree, overrides, own), ROLLOUT, lines,
                    origin=f"Hydra overrides of {ROLLOUT} (line {first})")


def _overrides(words: list[tuple[str, int]]) -> Iterable[HydraOverride]:
    for text, line in words:
        match = _OVERRIDE.match(text)
        if match and ((match["key"] + ".").startswith(ROLLOUT + ".") or match["key"] == HYBRID_ENGINE):
            yield HydraOverride(match["prefix"] or "", match["key"], scalar(match["value"]), line)


def _put(tree: dict[str, Any], keys: list[str], value: Any) -> None:
    node = tree
    for key in keys[:-1]:
        child = node.get(key)
        node = node.setdefault(key, {}) if isinstance(child, dict) or child is None else {}
    node[keys[-1]] = value

