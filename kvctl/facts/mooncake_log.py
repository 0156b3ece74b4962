"""What Mooncake's transfer engine writes to a replica's log when a transfer stalls or fails.

vLLM answers a failed KV load with a bare HTTP 500 ("Internal server error"); the cause is only in
the replica's log, in Mooncake's glog lines. These patterns (Mooncake 0.3.13, TCP transport, P2P
handshake, store client) let kvctl name the transport as the cause in one line instead of leaving
a user with a 500 or a row of zeros.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# kind -> pattern; the order is the order of likely first cause
PATTERNS: dict[str, re.Pattern[str]] = {
    "tcp stall": re.compile(r"no transfer progress within \d+s|no status frame within \d+s"),
    "handshake timeout": re.compile(r"Socket read timed out|unexpected handshake message type|"
                                    r"SocketHandShakePlugin: failed to send"),
    "segment unreachable": re.compile(r"Failed to open segment"),
    "transfer failed": re.compile(r"TRANSFER_FAIL|batch_put failed|BatchGet failed"),
    "load failure": re.compile(r"KV load failure|due to KV load failure"),
}


@dataclass(frozen=True)
class TransportEvent:
    kind: str
    line: str


def scan(text: str) -> list[TransportEvent]:
    """Every transport error line in `text`, with its kind."""
    events = []
    for line in text.splitlines():
        for kind, pattern in PATTERNS.items():
            if pattern.search(line):
                events.append(TransportEvent(kind, line.strip()))
                break
    return events


def scan_file(path: str | Path, since: int = 0) -> list[TransportEvent]:
    """Transport error lines in a log file, from byte offset `since` on (0: the whole file)."""
    try:
        with open(path, "rb") as f:
            f.seek(since)
            return scan(f.read().decode("utf-8", "replace"))
    except OSError:
        return []


def size(path: str | Path) -> int:
    """A log file's current size: the offset to scan from for what happens next."""
    try:
        return Path(path).stat().st_size
    except OSError:
        return 0


def summary(events: list[TransportEvent]) -> str:
    """One line: counts by kind and the first line seen, or '' when there is nothing."""
    if not events:
        return ""
    counts: dict[str, int] = {}
    for e in events:
        counts[e.kind] = counts.get(e.kind, 0) + 1
    kinds = ", ".join(f"{k} x{n}" for k, n in counts.items())
    return f"Mooncake transport errors in the replica log ({kinds}); first: {events[0].line[:200]}"
