"""The Mooncake store shared by the replica and master test doubles: :class:`SharedStore`.

Part of :mod:`tests.doubles` (see its docstring); imports nothing from ``kvctl``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator


class SharedStore:
    """The Mooncake store shared by replicas: a set of block keys (thread-safe).

    Keys are block-hash strings, prefixed with the writing connector's ``cache_prefix`` and "@"
    when it has one (as vLLM writes them). ``lease()`` marks keys as under a read lease: a non-forced ``remove_all`` keeps them
    (what the real master does), a forced one removes them.
    """

    def __init__(self, keys: Iterable[str] = (), *, bytes_per_key: int = 4096,
                 capacity_bytes: int = 256 * 1024 * 1024) -> None:
        self._lock = threading.Lock()
        self._keys: dict[str, None] = dict.fromkeys(keys)
        self._leased: set[str] = set()
        self.bytes_per_key = bytes_per_key
        self.capacity_bytes = capacity_bytes

    def add(self, *keys: str) -> None:
        self.add_many(keys)

    def add_many(self, keys: Iterable[str]) -> None:
        with self._lock:
            for key in keys:
                self._keys[key] = None

    def keys(self) -> list[str]:
        """A snapshot of the keys, in insertion order."""
        with self._lock:
            return list(self._keys)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._keys

    def __len__(self) -> int:
        with self._lock:
            return len(self._keys)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __repr__(self) -> str:
        return f"SharedStore({len(self)} keys)"

    def lease(self, *keys: str) -> None:
        """Put ``keys`` (default: all current keys) under a read lease."""
        with self._lock:
            self._leased.update(keys or self._keys)

    def release(self, *keys: str) -> None:
        """Drop the read lease of ``keys`` (default: all)."""
        with self._lock:
            if keys:
                self._leased.difference_update(keys)
            else:
                self._leased.clear()

    @property
    def leased(self) -> set[str]:
        with self._lock:
            return self._leased & set(self._keys)

    def remove_all(self, force: bool = True) -> int:
        """Remove every key (leased ones survive unless ``force``); returns how many went."""
        with self._lock:
            if force:
                removed = len(self._keys)
                self._keys.clear()
                self._leased.clear()
                return removed
            keep = {k: None for k in self._keys if k in self._leased}
            removed = len(self._keys) - len(keep)
            self._keys = keep
            return removed

    def clear(self) -> int:
        return self.remove_all(force=True)

    def remove_prefix(self, prefix: str, force: bool = True) -> int:
        """Like the Python client's ``remove_by_regex("^" + prefix, force)``."""
        with self._lock:
            doomed = [k for k in self._keys
                      if k.startswith(prefix) and (force or k not in self._leased)]
            for key in doomed:
                del self._keys[key]
                self._leased.discard(key)
            return len(doomed)
