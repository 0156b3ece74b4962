"""Byte sizes as Mooncake configs write them: 268435456, "256MB", "4GB", "1.5GB".

The accepted units are those of vLLM's Mooncake config reader (MooncakeStoreConfig._parse_size):
B, KB, MB, GB, case-insensitive, powers of 1024. Anything else makes vLLM raise at start, so
kvctl refuses it too (one rule for --set, render and validate).
"""

from __future__ import annotations

import re

_UNITS = {"": 1, "b": 1, "kb": 1024, "mb": 1024**2, "gb": 1024**3}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$", re.ASCII)
MAX_SIZE = 1024**5  # 1 PB: beyond any machine's memory; larger values are typos that break later


def parse_size(value: object) -> int:
    """Bytes for an int or a size string; ValueError with the accepted forms otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size")
    if isinstance(value, float) and value >= 0 and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{value} is negative")
        return _capped(value)
    if isinstance(value, str):
        match = _SIZE.match(value)
        if match and match.group(2).lower() in _UNITS and len(match.group(1)) <= 30:
            return _capped(int(float(match.group(1)) * _UNITS[match.group(2).lower()]))
    raise ValueError(
        f"{value!r} is not a size: use bytes (268435456) or a number with a unit vLLM's Mooncake "
        "reader knows (B, KB, MB, GB; powers of 1024), e.g. \"256MB\""
    )


def _capped(size: int) -> int:
    if size > MAX_SIZE:
        raise ValueError(f"{size} bytes is larger than 1 PB: not a size any machine has")
    return size
