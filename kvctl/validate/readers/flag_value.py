"""The value of a --kv-transfer-config flag or a Hydra override: JSON for vLLM's parser, YAML-like
for Hydra, with shell variables the script does not set kept as placeholders."""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from kvctl import yamlio
from kvctl.validate.readers.documents import loads

VARIABLE = re.compile(r"\$(?:\{(?P<braced>\w+)\}|(?P<plain>[A-Za-z_]\w*))")
JSON_STRING = re.compile(r'"(?:\\.|[^"\\])*"')


def parse_value(value: str, json_only: bool) -> dict[str, Any] | str:
    """A dict, or the reason it is not one. vLLM reads the flag with json.loads; Hydra values are
    YAML-like (`{a: 1}`, `{a:1}`). Variables the script does not set stay in, as strings."""
    try:
        parsed = loads(value)
    except json.JSONDecodeError as exc:
        reason: str = exc.msg
        try:  # "enable_async_transfers": $FLAG -> "$FLAG": a placeholder the checks skip
            parsed = loads(quote_variables(value))
        except json.JSONDecodeError:
            if json_only:
                return reason
            try:
                parsed = yamlio.safe_load(value)
            except yaml.YAMLError as yexc:
                return str(getattr(yexc, "problem", yexc))
    if not isinstance(parsed, dict):
        return f"it is a {type(parsed).__name__}"
    return parsed


def quote_variables(text: str) -> str:
    """Quote $VAR references that stand outside JSON strings."""
    out, last = [], 0
    for string in JSON_STRING.finditer(text):
        out.append(VARIABLE.sub(lambda m: json.dumps(m[0]), text[last:string.start()]))
        out.append(string[0])
        last = string.end()
    out.append(VARIABLE.sub(lambda m: json.dumps(m[0]), text[last:]))
    return "".join(out)


def scalar(value: str) -> Any:
    try:
        return loads(value)
    except json.JSONDecodeError:
        return value
