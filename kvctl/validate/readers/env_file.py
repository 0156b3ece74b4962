"""`export KEY='value'` files (kvctl's kvctl.env, a hand-written env file)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from kvctl.errors import UsageError
from kvctl.validate.model import SourceLines, join
from kvctl.validate.readers.documents import read_text

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def read_env_file(path: Path, where: str = "env", text: str | None = None) -> tuple[dict[str, str], SourceLines]:
    """Parse `export KEY='value'` lines (shell quoting) into a dict and the line of each key
    (`text`: the file's, when the caller has read it already)."""
    text = read_text(path) if text is None else text
    env: dict[str, str] = {}
    lines = SourceLines(str(path))
    for number, line in enumerate(text.splitlines(), start=1):
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError as exc:
            raise UsageError(f"{path}:{number}: cannot parse: {exc}",
                             "write each line as export KEY='value'") from None
        for token in tokens[1:] if tokens[:1] == ["export"] else tokens:
            key, sep, value = token.partition("=")
            if not sep or not _ENV_NAME.match(key):
                raise UsageError(f"{path}:{number}: {line.strip()!r} is not export KEY='value'",
                                 "write each line as export KEY='value'")
            env[key] = value
            lines[join(where, key)] = number
    return env, lines
