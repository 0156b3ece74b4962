"""Parameter expansion as bash does it, for the words of a script kvctl reads (never runs).

`$NAME`, `${NAME}`, and the defaults `${NAME:-word}`, `${NAME-word}`, `${NAME:=word}`,
`${NAME=word}` (`:` also when NAME is empty; `=` also assigns NAME). What the lookup says is
UNKNOWN (a value only running the script gives: a command substitution) or does not know (a name
the script never sets: it comes from an environment kvctl cannot see) stays as written, a
placeholder the checks do not judge; a default is taken where the script does not set the name.
Other forms (`${NAME:+x}`, `${NAME#x}`, `${#NAME}`, ...) stay as written too.
"""

from __future__ import annotations

import re
from collections.abc import Callable

UNKNOWN = "\x00unknown"  # what Lookup returns for a name set to a value kvctl cannot evaluate
Lookup = Callable[[str], "str | None"]  # NAME -> its value, UNKNOWN, or None (the script does not set it)
Assign = Callable[[str, str], None]

_NAME = re.compile(r"[A-Za-z_]\w*")
_BRACED = re.compile(r"(?P<name>[A-Za-z_]\w*)(?:(?P<op>:?[-=])(?P<word>.*))?$", re.S)
_MAX_DEPTH = 8  # defaults holding defaults holding ...


def expand(text: str, lookup: Lookup, assign: Assign | None = None, depth: int = 0) -> str:
    """`text` with every expansion kvctl can evaluate replaced (`assign` takes `:=` defaults)."""
    out, i = [], 0
    while i < len(text):
        j = text.find("$", i)
        if j < 0:
            out.append(text[i:])
            break
        out.append(text[i:j])
        if text.startswith("${", j):
            end = _closing(text, j + 1)
            if end < 0:
                out.append(text[j:])
                break
            out.append(_braced(text[j + 2:end], text[j:end + 1], lookup, assign, depth))
            i = end + 1
            continue
        name = _NAME.match(text, j + 1)
        if name is None:
            out.append("$")
            i = j + 1
            continue
        value = lookup(name[0])
        out.append(text[j:name.end()] if value is None or value == UNKNOWN else value)
        i = name.end()
    return "".join(out)


def _braced(inner: str, whole: str, lookup: Lookup, assign: Assign | None, depth: int) -> str:
    match = _BRACED.match(inner)
    if match is None or depth > _MAX_DEPTH:
        return whole
    value = lookup(match["name"])
    if value == UNKNOWN:
        return whole
    op = match["op"]
    if op is None:
        return whole if value is None else value
    if value is not None and (not op.startswith(":") or value != ""):
        return value
    default = expand(match["word"], lookup, assign, depth + 1)
    if op.endswith("=") and assign is not None:
        assign(match["name"], default)
    return default


def _closing(text: str, opening: int) -> int:
    """The index of the `}` closing the `{` at `opening` (nested braces counted), or -1."""
    level = 0
    for index in range(opening, len(text)):
        if text[index] == "{":
            level += 1
        elif text[index] == "}":
            level -= 1
            if level == 0:
                return index
    return -1


def substitution(value: str) -> str | None:
    """What makes `value` something only running the script gives, or None."""
    if "$((" in value:
        return "an arithmetic expansion $((...))"
    if "$(" in value:
        return "a command substitution $(...)"
    if "`" in value:
        return "a command substitution `...`"
    return None
