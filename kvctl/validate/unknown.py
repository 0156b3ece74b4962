"""What kvctl could not evaluate in a config, said rather than judged (issue 40: unknown is
unknown). Readers keep such a value as written (`$PORT`, `$(...)`, `{{ .Values.x }}`) or, for a
Python value computed when the code runs, as `${expression}`; every check skips a placeholder
(model.placeholder), and the report lists each one with where it is and what it is.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from kvctl.validate.model import Artifact, join, locate, placeholder

_SHELL_NAME = re.compile(r"^\$(?:\{\w+\}|[A-Za-z_]\w*)$")
_KINDS = ("kv_transfer_config", "mooncake", "lmcache", "kv_offloading")


def unread_values(artifact: Artifact) -> list[str]:
    """'FILE:LINE path '$PORT' (what it is, not judged)' for each value kvctl cannot evaluate."""
    if artifact.kind not in _KINDS:
        return []
    said = [f"{locate(artifact.where, artifact.lines)}: {artifact.unread}"] if artifact.unread else []
    return said + [f"{locate(path, artifact.lines)} {_short(value)!r} ({what(value)}): not judged"
                   for path, value in _placeholders(artifact.data, artifact.where)]


def what(value: str) -> str:
    """What kind of value kvctl could not evaluate."""
    if "{{" in value:
        return "a template value filled in later"
    if "$(" in value or "`" in value:
        return "a command substitution kvctl does not run"
    if _SHELL_NAME.search(value) or value.startswith("$") and "${" not in value:
        return "a name this file does not set"
    if value.startswith("${") and value.endswith("}") and not re.fullmatch(r"\$\{\w+\}", value):
        return "a value computed when the code runs"
    return "built from variables kvctl cannot see"


def _placeholders(node: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(node, Mapping):
        for key, value in node.items():
            yield from _placeholders(value, join(path, key))
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from _placeholders(item, f"{path}[{index}]")
    elif placeholder(node):
        yield path, node


def _short(value: str) -> str:
    return value if len(value) <= 60 else value[:57] + "..."
