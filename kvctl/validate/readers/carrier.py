"""A launch line that hands its KV-transfer JSON to vLLM through another flag than
--kv-transfer-config (`--kv-connector-config "$VLLM_KV_TRANSFER_CONFIG"`,
`--kv-connector-extra-config '{...}'`): the config counts only if it reaches vLLM, so the line is
read as a config artifact whose carrier is that flag, and kvctl.validate.serve_flags judges the flag
against the release's parser (which refuses it: "unrecognized arguments") even when the JSON is fine.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvctl.validate.model import placeholder
from kvctl.validate.readers.flag_value import parse_value

# --<anything with kv ... config>[=value], or a kv_transfer_config field written as an option
# (--kv-connector X --kv-role kv_both), dashes or underscores; vLLM's own JSON flags excluded
_CARRIER = re.compile(r"^--(?P<name>[\w-]*kv[\w-]*config[\w-]*|kv[-_](?:connector|role|buffer|rank|parallel|ip|port|load)"
                      r"[\w-]*)(?:=(?P<value>.*))?$", re.S | re.I)
_VLLMS_OWN = frozenset({"kv-transfer-config", "kv-events-config"})


@dataclass(frozen=True)
class Carried:
    flag: str  # as written, without =value
    line: int  # the value's line
    value: str  # as expanded
    config: dict[str, Any] | None  # the JSON object it carries (None: kvctl cannot read it)


def carried(words: Sequence[tuple[str, int]], expand: Callable[[str], str]) -> Carried | None:
    """The first option of a command (other than vLLM's own JSON flags) that carries a JSON object
    or a value kvctl cannot read, with what it carries."""
    for index, (word, line) in enumerate(words):
        match = _CARRIER.match(word)
        if match is None or match["name"].lower().replace("_", "-") in _VLLMS_OWN:
            continue
        if match["value"] is not None:
            raw = match["value"]
        elif index + 1 < len(words):
            raw, line = words[index + 1]
        else:
            continue
        value = expand(raw)
        parsed = parse_value(value, json_only=True)
        if isinstance(parsed, dict):
            return Carried(word.partition("=")[0], line, value, parsed)
        if placeholder(value) or "config" not in match["name"].lower():  # --kv-role kv_both: one field
            return Carried(word.partition("=")[0], line, value, None)
    return None


def is_carrier_flag(word: str) -> bool:
    """A `--...kv...config` option that is not one of vLLM's own JSON flags."""
    match = _CARRIER.match(word)
    return match is not None and match["name"].lower().replace("_", "-") not in _VLLMS_OWN


def is_transfer_config(config: dict[str, Any] | None) -> bool:
    return config is not None and ("kv_connector" in config or "kv_role" in config)
